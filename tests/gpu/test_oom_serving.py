"""A real CUDA out-of-memory while serving, on the GPU host (issue 24), run with tests/gpu/run-gpu-tests.sh.

A ready one-rank torch server (tests/gpu/torch_server.py `--oom-after`) logs decode lines for a few seconds, then a
forward pass asks for twice the GPU's memory: torch raises its real `OutOfMemoryError`, prints the traceback and
the rank exits 1 (the launcher after it). The thread's alert must say `oom in serving` and quote the
`...OutOfMemoryError: CUDA out of memory. Tried to allocate ...` line as the decisive failure: not the traceback's
header, not the source line of the frame that allocated.

Reuses the stack and the readings of tests/gpu/test_real_gpu.py (like test_edges.py)."""

from __future__ import annotations

import asyncio
import re
import time

from tests.gpu import test_real_gpu
from tests.gpu.test_edges import wait_ready_alert
from tests.gpu.test_real_gpu import (
    IDLE_SLACK_MIB,
    gpu_stack,  # noqa: F401 - the fixture
    is_alert,
    launch_torch,
    need_idle,
    nvml_read,
    real_ssh,  # noqa: F401 - the fixture
    record,
    record_log,
    text_of,
    wait_idle,
)

pytestmark = test_real_gpu.pytestmark

OOM_LINE = re.compile(r"(?:torch\.)?(?:cuda\.)?OutOfMemoryError: CUDA out of memory\. Tried to allocate")


async def test_a_real_oom_while_serving_is_oom_in_serving_quoted_by_its_out_of_memory_error_line(
        gpu_stack):  # noqa: F811
    idle = await asyncio.to_thread(nvml_read)
    g0 = idle["gpus"][0]
    need_idle(g0)
    stack = await gpu_stack()
    launches = stack.runtime.launches
    try:
        la = await launch_torch(stack, "mode=ready workers=1 gib=4 kv_gib=1 oom_after=6")
        await wait_ready_alert(stack)
        t0 = time.monotonic()
        alert = await stack.fake.wait_for_call(
            "chat.postMessage", predicate=lambda c: is_alert(text_of(c)) and any(
                f": {v}" in text_of(c).split("\n", 1)[0] for v in ("oom", "crashed", "exited", "cuda_error")),
            timeout=120)
        text = text_of(alert)
        after, idle_s = await wait_idle(g0["used_mib"], {la.pid})
        log = open(la.log_path, errors="replace").read()
        record(oom_serving={"text": text, "seconds_ready_to_alert": round(time.monotonic() - t0, 1),
                            "state": str(launches.get(1).state), "seconds_until_nvml_idle": round(idle_s, 2)})
        assert OOM_LINE.search(log), "the server raised no OutOfMemoryError"
        head = text.split("\n", 1)[0]
        assert ": oom in serving" in head, text
        quotes = re.findall(r"`([^`]+)`", text)
        assert quotes and OOM_LINE.search(quotes[0]), text  # the first thing quoted is what the error says
        assert "Traceback (most recent call last)" not in text, text
        assert not any(q.lstrip().startswith(("return torch.empty", "File \"")) for q in quotes[:1]), text
        assert after["gpus"][0]["used_mib"] <= g0["used_mib"] + IDLE_SLACK_MIB, (g0, after)  # the driver freed it
    finally:
        record_log("oom_serving_log", launches)
