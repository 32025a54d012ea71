"""The edges of a launch's life on a real GPU (issue 23), run on the GPU host with tests/gpu/run-gpu-tests.sh:

- a ready SINGLE-process torch server (its own PID holds the GPU memory) killed with SIGKILL from outside gets
  `unknown ... killed by signal 9 (SIGKILL)` with the kernel OOM killer as runner-up (issue 44: no kernel log shows
  who sent the signal, so no cause is named), names no leftover (its launch wrapper is none) and does not call the
  GPU held while the driver frees the memory of the dying process;
- a ready server whose grandchild escaped with `setsid env -i` holding GPU memory: in a cgroup of its own (root,
  cgroup v2) `/kill` frees all of it; with `cgroup: off` the answer names the holder with `/kill pid=N` and says
  that not all memory was released, never just "Killed".

Reuses the stack and the readings of tests/gpu/test_real_gpu.py (like test_multi_gpu.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from bot.config import Config
from tests.gpu import test_real_gpu
from tests.gpu.test_real_gpu import (
    IDLE_SLACK_MIB,
    gpu_config,
    gpu_stack,  # noqa: F401 - the fixture
    is_alert,
    kill_launch,
    launch_torch,
    need_idle,
    nvml_read,
    real_ssh,  # noqa: F401 - the fixture
    record,
    record_log,
    text_of,
    wait_idle,
)
from tests.support.procs import pids_of_launch, wait_until

pytestmark = test_real_gpu.pytestmark

ESCAPEE_MARK = "escapee holds memory"


def escapees() -> list[int]:
    """PIDs of this machine's escaped grandchildren (their command line carries ESCAPEE_MARK)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if ESCAPEE_MARK.encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
    return out


@pytest.fixture
def no_escapee_left():
    """Kill every escaped grandchild at the end, whatever the test did (it has no tag of the launch)."""
    yield
    left = escapees()
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # the driver frees a killed process's memory some time after the signal: the next test needs GPU 0 idle
    deadline = time.monotonic() + 30
    while left and time.monotonic() < deadline:
        if not escapees() and not set(left) & set(nvml_read()["gpus"][0]["procs"]):
            break
        time.sleep(0.2)


def cgroup_off(srv, tmp_path) -> Config:
    """gpu_config with `cgroup: off` on gpu-host-1 (no systemd here either): the launch has no cgroup of its own."""
    data = gpu_config(srv, tmp_path).model_dump()
    data["hosts"]["gpu-host-1"]["cgroup"] = "off"
    data["hosts"]["gpu-host-1"]["systemd"] = "off"
    return Config.model_validate(data)


async def wait_ready_alert(stack) -> str:
    alert = await stack.fake.wait_for_call(
        "chat.postMessage", predicate=lambda c: is_alert(text_of(c)) and ": ready" in text_of(c).split("\n", 1)[0],
        timeout=180)
    await wait_until(lambda: stack.runtime.launches.get(1).ready_at is not None, 30, what="torch#1 ready")
    return text_of(alert)


async def test_a_sigkilled_single_process_server_is_unknown_by_signal_9_with_no_leftover(gpu_stack):  # noqa: F811
    idle = await asyncio.to_thread(nvml_read)
    g0 = idle["gpus"][0]
    need_idle(g0)
    stack = await gpu_stack()
    launches = stack.runtime.launches
    try:
        la = await launch_torch(stack, "mode=ready single=1 gib=6 kv_gib=1")
        await wait_ready_alert(stack)
        assert set(pids_of_launch(la)) == {la.pgid, la.pid}, "one server process (and its wrapper)"
        held = (await asyncio.to_thread(nvml_read))["gpus"][0]["procs"]
        assert la.pid in held, (la.pid, held)
        t0 = time.monotonic()
        os.kill(la.pid, signal.SIGKILL)  # `kill -9 <server pid>`
        alert = await stack.fake.wait_for_call(
            "chat.postMessage", predicate=lambda c: is_alert(text_of(c)) and any(
                f": {v}" in text_of(c).split("\n", 1)[0] for v in ("unknown", "crashed", "exited")), timeout=90)
        took = time.monotonic() - t0
        text = text_of(alert)
        after, idle_s = await wait_idle(g0["used_mib"], {la.pid})
        record(sigkill_single={"text": text, "seconds_kill_to_alert": round(took, 1),
                               "state": str(launches.get(1).state), "seconds_until_nvml_idle": round(idle_s, 2),
                               "exit_file": Path(la.log_path + ".exit").read_text(),
                               "unit": [la.unit, la.unit_manager]})
        assert ": unknown" in text.split("\n", 1)[0] and "killed by signal 9 (SIGKILL)" in text, text
        assert "runner-up host_oom" in text and "dmesg" in text, text
        assert "leftover" not in text and "still holds" not in text and "no exit status" not in text, text
        assert after["gpus"][0]["used_mib"] <= g0["used_mib"] + IDLE_SLACK_MIB, (g0, after)
    finally:
        record_log("sigkill_single_log", launches)


@pytest.mark.parametrize("cgroup", ["auto", "off"])
async def test_a_grandchild_that_escaped_with_gpu_memory_is_killed_or_named(gpu_stack, no_escapee_left,  # noqa: F811
                                                                            cgroup):
    idle = await asyncio.to_thread(nvml_read)
    g0 = idle["gpus"][0]
    need_idle(g0)
    stack = await (gpu_stack() if cgroup == "auto" else gpu_stack(cgroup_off))
    launches = stack.runtime.launches
    try:
        la = await launch_torch(stack, "mode=ready workers=1 gib=4 kv_gib=1 escape_gib=3")
        await wait_ready_alert(stack)
        pids = await wait_until(escapees, 120, what="the escaped grandchild")
        escapee = pids[0]

        async def escapee_holds() -> bool:
            return escapee in (await asyncio.to_thread(nvml_read))["gpus"][0]["procs"]

        await wait_until(escapee_holds, 120, what="the escapee holding GPU memory", every=0.5)
        before = (await asyncio.to_thread(nvml_read))["gpus"][0]
        killed, _ = await kill_launch(stack)
        text = text_of(killed)
        after, idle_s = await wait_idle(g0["used_mib"], {la.pid}, timeout=15)
        g = after["gpus"][0]
        record(**{f"escape_{cgroup}": {"text": text, "unit": [la.unit, la.unit_manager], "escapee": escapee,
                                       "before_mib": before["used_mib"], "after_mib": g["used_mib"],
                                       "after_procs": g["procs"], "state": str(launches.get(1).state),
                                       "seconds_until_nvml_idle": round(idle_s, 2)}})
        if la.unit_manager == "cgroup":
            assert "Killed torch#1" in text and "released" in text, text
            assert g["used_mib"] <= g0["used_mib"] + IDLE_SLACK_MIB and escapee not in g["procs"], (g0, g)
        else:
            assert cgroup == "off" or la.unit_manager is None
            assert "not all GPU memory was released" in text and f"/kill pid={escapee}" in text, text
            assert "Killed torch#1" not in text and escapee in g["procs"]
    finally:
        record_log(f"escape_{cgroup}_log", launches)
