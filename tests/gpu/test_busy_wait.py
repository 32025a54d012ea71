"""CPU time spent waiting is no progress; CPU time spent working is (issue 44), on a real GPU, run on the GPU host with
tests/gpu/run-gpu-tests.sh:

- a server whose kernel spins during CUDA graph capture (torch's own spin kernel, `torch.cuda._sleep`) while its host
  thread busy-waits in `torch.cuda.synchronize()`: the GPU at 100 % at low power, one core at 100 %, the log silent
  after the capture bar's 0 %, the port closed. The live watch alerts `silent_hang in cuda_graph_capture` within the
  phase's grace plus two check intervals (the stacks it takes say: a busy-wait, not work), and the bundle of the same
  launch, diagnosed offline, says the same;
- the same server with 40 s of silent torch.compile (the GPU idle, the host thread compiling): no hang is alerted,
  and it goes on to ready.

The py-spy dumps both took (the watcher's, the bundle's) are written beside the results (GPUBOT_GPU_RESULTS's folder)
as the recorded stacks of tests/unit/test_busy_stacks.py. Reuses the stack of tests/gpu/test_real_gpu.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from bot.adapters.bundle import read_bundle
from bot.core.diagnose import diagnose
from tests.gpu import test_real_gpu
from tests.gpu.test_real_gpu import (
    OPERATOR,
    POLICY,
    gpu_config,
    is_alert,
    launch_torch,
    real_ssh,  # noqa: F401 - the fixture
    record,
    record_log,
    text_of,
)
from tests.support.procs import wait_until
from tests.support.slack import start_stack

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(420), pytest.mark.skipif(test_real_gpu.WHY_NOT is not None,
                                                                              reason=str(test_real_gpu.WHY_NOT))]

#: The graph capture's grace in these tests (seconds); the checks run every POLICY.interval_s (1 s).
CAPTURE_GRACE_S = 15.0
BUSY_POLICY = POLICY.model_copy(
    update={"phase_grace_s": {**POLICY.phase_grace_s, "cuda_graph_capture": CAPTURE_GRACE_S}})


def _out_dir() -> Path | None:
    path = os.environ.get("GPUBOT_GPU_RESULTS")
    return Path(path).parent if path else None


def _keep_stacks(name: str, files: dict[str, bytes]) -> None:
    """Write a bundle's py-spy dumps beside the results (they come back as recorded stacks for the unit tests)."""
    out = _out_dir()
    if out is None:
        return
    for rel, data in files.items():
        if rel.startswith("py-spy/"):
            (out / f"{name}-{rel.split('/', 1)[1]}").write_bytes(data)


@pytest.fixture
async def busy_stack(real_ssh, tmp_path):  # noqa: F811 - the fixture above, by name
    stacks = []

    async def start():
        stack = await start_stack(gpu_config(real_ssh, tmp_path), watch=True, watch_policy=BUSY_POLICY)
        stacks.append(stack)
        return stack

    yield start
    for stack in reversed(stacks):
        await stack.stop()


async def test_a_kernel_spinning_under_synchronize_during_capture_is_a_hang_live_and_offline(busy_stack, tmp_path):
    stack = await busy_stack()
    launches = stack.runtime.launches
    try:
        la = await launch_torch(stack, "mode=capture_spin gib=1 kv_gib=0.5 single=1")
        log = Path(la.log_path)
        await wait_until(lambda: log.exists() and "Capturing batches" in log.read_text(errors="replace"), 240,
                         what="the capture bar's 0 %")
        silent_from = time.time()
        alert = await stack.fake.wait_for_call(
            "chat.postMessage", predicate=lambda c: is_alert(text_of(c)) and ": silent_hang" in text_of(c),
            timeout=CAPTURE_GRACE_S + 120)
        took = time.time() - silent_from
        text = text_of(alert) + json.dumps(alert["params"].get("blocks") or [])
        record(capture_spin_alert={"text": text_of(alert)[:1500], "seconds_silence_to_alert": round(took, 1),
                                   "allowed_s": CAPTURE_GRACE_S + 2 * BUSY_POLICY.interval_s})
        assert "silent_hang in cuda_graph_capture" in text_of(alert).split("\n", 1)[0], text_of(alert)
        assert "busy-wait" in text, text
        # within the grace plus two check intervals of the log's last line (a second of slack for the probe's own
        # round trip and the outbox)
        assert took <= CAPTURE_GRACE_S + 2 * BUSY_POLICY.interval_s + 1.0 + 5.0, took
        bundle = await stack.runtime.services.bundles.collect(launch=la, user=OPERATOR)
        _keep_stacks("capture_spin", bundle.files)
        v = diagnose(read_bundle(bundle.write(tmp_path / "bundle")))
        record(capture_spin_offline={"verdict": v.verdict, "phase": v.phase, "evidence": v.evidence[:6]})
        assert (v.verdict, v.phase) == ("silent_hang", "cuda_graph_capture"), v.summary
    finally:
        record_log("capture_spin_server_log", launches)


async def test_a_silent_torch_compile_with_the_gpu_idle_is_progress_not_a_hang(busy_stack, tmp_path):
    stack = await busy_stack()
    launches = stack.runtime.launches
    try:
        la = await launch_torch(stack, "mode=compile_silent compile_s=40 gib=1 kv_gib=0.5 single=1")
        log = Path(la.log_path)
        await wait_until(lambda: log.exists() and "Capture cuda graph begin" in log.read_text(errors="replace"), 240,
                         what="the capture's begin")
        t0 = time.time()
        await wait_until(lambda: time.time() - t0 > CAPTURE_GRACE_S + 8, CAPTURE_GRACE_S + 30, what="past the grace")
        bundle = await stack.runtime.services.bundles.collect(launch=la, user=OPERATOR)  # while it compiles
        _keep_stacks("compile_silent", bundle.files)
        ready = await stack.fake.wait_for_call(
            "chat.postMessage", predicate=lambda c: is_alert(text_of(c)) and ": ready" in text_of(c), timeout=240)
        hangs = [text_of(c) for c in stack.fake.calls
                 if c["method"] == "chat.postMessage" and is_alert(text_of(c)) and ": silent_hang" in text_of(c)]
        record(compile_silent={"ready_alert": text_of(ready)[:400], "hang_alerts": hangs})
        assert hangs == [], hangs
    finally:
        record_log("compile_silent_server_log", launches)
