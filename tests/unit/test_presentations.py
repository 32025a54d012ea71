"""The same evidence in another layout gets the same diagnosis (issue 44: read structure, not layout).

Every shared and rule-writing bundle that `gpubot diagnose` gets fully right is laid out again the ways users paste
logs (tests/support/presentations.py: a terminal's hard wrap at 80 and 120 columns, compose / journald / kubectl
prefixes, colour codes, CR LF, ps without its header, a traceback cut before its last line) and must stay fully
right. The bundles known to change are listed with why; the list is strict: a bundle that stops changing fails too,
so the list only shrinks.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from bot.adapters.bundle import diagnose_bundle
from tests.support.presentations import PRESENTATIONS, fully_right, laid_out, rule_writing_bundles

pytestmark = pytest.mark.timeout(300)

#: presentation -> {bundle number: what the diagnosis misses in that layout}
KNOWN: dict[str, dict[str, str]] = {
    # a log of one or two long lines: too few rows at the width to tell a terminal's cut from a line's end
    "wrap80": {
        "136": "a quote is not whole in the evidence: 'Request failed during generation: Server error: CU'",
        "201": "a quote is not whole in the evidence: 'Engine core proc EngineCore_DP0 died unexpectedly,'",
        "222": "a quote is not whole in the evidence: 'metrics_port is used by a process already'",
        "225": "a quote is not whole in the evidence: '\"GET /health HTTP/1.1\" 503 Service Unavailable'",
        "229": "a quote is not whole in the evidence: 'Watchdog timeout (self.watchdog_timeout=300)'",
        "251": "a quote is not whole in the evidence: 'no CUDA-capable device is detected'",
        "263": "a quote is not whole in the evidence: 'NCCL error /opt/lmdeploy/src/turbomind/utils/nccl_'",
        "272": "a quote is not whole in the evidence: 'warming up the model with an empty run - please wa'",
        "286": "a quote is not whole in the evidence: '\"POST /openai/v1/chat/completions HTTP/1.1\" 200 OK'",
        "296": "a quote is not whole in the evidence: 'ray.exceptions.RayTaskError(RuntimeError): ray::5-'",
        "297": "a quote is not whole in the evidence: 'WorkNCCL(SeqNum=4, OpType=BROADCAST, NumelIn=112, '",
        "37": "crashed/cuda_graph_capture, not nccl_error/serving",
        "414": "a quote is not whole in the evidence: 'CUDA out of memory. Tried to allocate 96.00 MiB. G'",
        "422": "a quote is not whole in the evidence: 'torch.OutOfMemoryError: CUDA out of memory. Tried '",
        "430": "crashed/serving, not nccl_error/serving",
        "434": "a quote is not whole in the evidence: 'CANCELLED AT 2025-08-19T17:09:34 DUE TO TIME LIMIT'",
        "490": "a quote is not whole in the evidence: 'Starting to load model neuralmagic/Meta-Llama-3.1-40'",
        "500": "a quote is not whole in the evidence: 'WorkerProc hit an exception'",
        "505": "crashed/None, not crashed/weight_loading (the cut traceback's last code line wrapped)",
    },
    "wrap120": {
        "109": "crashed/cuda_graph_capture, not nccl_error/cuda_graph_capture",
        "15": "a quote is not whole in the evidence: 'EADDRINUSE'",
        "201": "a quote is not whole in the evidence: 'Engine core proc EngineCore_DP0 died unexpectedly,'",
        "212": "crashed/None, not crashed/weight_loading",
        "217": "a quote is not whole in the evidence: 'c10_cuda_check_implementation'",
        "223": "a quote is not whole in the evidence: 'nranks 16 cudaDev 3 nvmlDev 3 busId 5a000 commId 0'",
        "272": "unknown/warmup, not crashed/warmup",
        "295": "a quote is not whole in the evidence: 'handle = pynvml.nvmlDeviceGetHandleByIndex(device)'",
        "297": "a quote is not whole in the evidence: 'WorkNCCL(SeqNum=4, OpType=BROADCAST, NumelIn=112, '",
        "400": "a quote is not whole in the evidence: \"unable to find backend library for backend 'tensor\"",
        "460": "a quote is not whole in the evidence: 'Running: 3 reqs'",
        "469": "ready/serving, not crashed/serving",
        "427": "a quote is not whole in the evidence: 'Shard process was signaled to shutdown with signal 6'",
        "479": "a quote is not whole in the evidence: 'Engine core proc EngineCore_DP0 died unexpectedly,'",
        "481": "a quote is not whole in the evidence: '| 200 |  7.316823498s |'",
        "273": "unknown/serving, not crashed/serving (the assert glued to a `Generating` counter, cut at 120)",
    },
    "compose": {},
    "journald": {
        "297": "a quote is not whole in the evidence: 'WorkNCCL(SeqNum=4, OpType=BROADCAST, NumelIn=112, '",
    },
    "kubectl": {
        "241": "a quote is not whole in the evidence: 'PromptTuningBuffers::fill'",
        "254": "a quote is not whole in the evidence: 'The following component could not be created: Addi'",
        "297": "a quote is not whole in the evidence: 'WorkNCCL(SeqNum=4, OpType=BROADCAST, NumelIn=112, '",
    },
    "journald_iso": {
        "297": "a quote is not whole in the evidence: 'WorkNCCL(SeqNum=4, OpType=BROADCAST, NumelIn=112, '",
    },
    "srun_label": {},
    "ansi": {},
    "crlf": {},
    "ps_noheader": {},
    "tb_cut": {
        "212": "crashed/None, not crashed/weight_loading",
    },
}


@cache
def _fully_right() -> tuple[tuple[Path, dict], ...]:
    out = []
    for b in rule_writing_bundles():
        exp = json.loads((b / "expected.json").read_text(encoding="utf-8"))
        if fully_right(b, exp):
            out.append((b, exp))
    return tuple(out)


@pytest.mark.parametrize("name", sorted(PRESENTATIONS))
def test_a_bundle_laid_out_another_way_gets_the_same_diagnosis(name, tmp_path):
    changed, missed = 0, {}
    for bundle, exp in _fully_right():
        copy = laid_out(bundle, name, tmp_path)
        if copy is None:
            continue
        changed += 1
        if not fully_right(copy, exp, loose=name == "tb_cut"):
            got = diagnose_bundle(copy)
            missed[bundle.name.split("-", 1)[0]] = f"{got.verdict}/{got.phase}"
    assert changed > 0 or name == "ps_noheader", f"{name} changed no bundle"
    assert set(missed) == set(KNOWN[name]), {k: v for k, v in missed.items() if k not in KNOWN[name]} \
        or f"no longer missed: {sorted(set(KNOWN[name]) - set(missed))}"
