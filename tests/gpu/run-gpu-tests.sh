#!/bin/sh
# Run the GPU tests on the GPU host itself and keep what they measured.
#   tests/gpu/run-gpu-tests.sh [OUTDIR [TEST...]]   (from the repository root; OUTDIR defaults to ./gpu-test-out,
#   the tests to the whole tests/gpu directory: name files or node ids to re-run only those)
# Writes OUTDIR/env.txt (OS, tools, torch, nvidia-smi before), OUTDIR/gpu-test.log (pytest -v -s),
# OUTDIR/gpu-results.json (every figure the tests measured, see tests/gpu/RESULTS.md) and OUTDIR/after.txt.
# Python packages: gpubot's dependencies must be importable by $PYTHON (default python3; pip install -e '.[dev]'),
# or lie as wheels in .whl/, installed into /tmp/site (a host without internet gets them carried that way).
# A host without `ps` may bring Debian's procps in .debs/ (unpacked into /tmp/procps, not onto /).
set -u
out="${1:-gpu-test-out}"
[ $# -gt 0 ] && shift
[ $# -eq 0 ] && set -- tests/gpu
mkdir -p "$out"
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import slack_bolt, asyncssh, apscheduler, pytest_asyncio' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH="/tmp/site:$PWD"
    if ! "$PY" -c 'import pytest, sys; sys.exit(tuple(map(int, pytest.__version__.split(".")[:2])) < (8, 4))' \
        && ls .whl/opt/*.whl >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/opt/*.whl || exit 1
    fi
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! command -v ps >/dev/null 2>&1 && ls .debs/*.deb >/dev/null 2>&1; then
    mkdir -p /tmp/procps
    for f in .debs/*.deb; do dpkg -x "$f" /tmp/procps; done
    export PATH="$PATH:/tmp/procps/bin:/tmp/procps/usr/bin"
    export LD_LIBRARY_PATH="/tmp/procps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
{
    date -u; uname -a; head -2 /etc/os-release
    for c in ps curl timeout setsid nohup stat sh nvidia-smi; do echo "$c: $(command -v $c || echo MISSING)"; done
    "$PY" -c 'import sys, torch, pytest; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "pytest", pytest.__version__)'
    "$PY" -m pip list 2>/dev/null | grep -i -E '^(nvidia-ml-py|pytest|typing.extensions|aiohttp|jinja2|matplotlib) '
    df -m /dev/shm; nproc; free -m
    nvidia-smi
    nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.used,memory.total,memory.reserved,utilization.gpu,temperature.gpu,power.draw,power.limit,pstate,persistence_mode --format=csv
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv
} >"$out/env.txt" 2>&1
{
    GPUBOT_GPU_RESULTS="$out/gpu-results.json" PYTHONUNBUFFERED=1 timeout 540 "$PY" -m pytest "$@" -v -s -rs \
        -p no:cacheprovider 2>&1
    echo $? >"$out/rc"
} | tee "$out/gpu-test.log"
rc=$(cat "$out/rc")
nvidia-smi >"$out/after.txt" 2>&1
exit $rc
