"""Issue 14: a real NCCL server, one process per GPU, on a host with 2 or more GPUs (skipped with fewer).

`tests/gpu/torch_server.py --device per-rank` puts rank N on cuda:N; every rank joins init_process_group("nccl")
and runs a real all_reduce. Three launches, each through the real Bolt app against the fake Slack servers:

- nccl_ready: becomes ready and serves /health;
- collective_hang: every rank but the last waits in all_reduce, the last never enters it;
- init_hang: every rank but the last waits in init_process_group (the TCPStore rendezvous), the last never joins.

For both hangs: a silent_hang alert in the right phase whose cross-rank stack summary (py-spy, taken by the
watcher itself) names the odd rank; `/gpu status` shows every GPU held by the launch; `/kill` frees every GPU
(NVML, on each device). NCCL's NVLink multicast stays off (NCCL_NVLS_ENABLE=0), and the NCCL_* variables the
machine sets are passed to the launch, whose environment the variant replaces."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from bot.config import Config
from tests.gpu import test_real_gpu
from tests.gpu.test_real_gpu import (
    IDLE_SLACK_MIB,
    POLICY,
    TORCH_INFO,
    WHY_NOT,
    gpu_config,
    is_alert,
    kill_launch,
    launch_torch,
    nvml_read,
    parse_status_text,
    post_and_wait,
    record,
    record_log,
    text_of,
    wait_ranks_logged,
)
from tests.support.builders import VIEWER
from tests.support.procs import pids_of_launch, wait_until

GPUS = int(TORCH_INFO.get("count") or 0)
# test_real_gpu's fixtures: the loopback SSH server and the stack factory (given multi_config below)
real_ssh = test_real_gpu.real_ssh
gpu_stack = test_real_gpu.gpu_stack

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "a GPU is present"),
    pytest.mark.skipif(WHY_NOT is None and GPUS < 2, reason=f"needs 2 or more GPUs for NCCL, this host has {GPUS}"),
    pytest.mark.timeout(420),
]


def multi_config(srv, tmp_path) -> Config:
    """gpu_config with the `torchn` variant: one rank per GPU on every GPU of the host, NCCL_NVLS_ENABLE=0."""
    base = gpu_config(srv, tmp_path).model_dump(mode="json", exclude_none=True)
    variant = dict(base["variants"]["torch"])
    variant["command"] += " --device per-rank"
    variant["params"] = {**variant["params"], "workers": {"type": "int", "default": GPUS, "min": 2, "max": GPUS},
                         "mode": {"type": "str", "default": "nccl_ready",
                                  "choices": ["nccl_ready", "collective_hang", "init_hang"]}}
    variant["gpus"] = list(range(GPUS))
    variant["env"] = {**{k: v for k, v in os.environ.items() if k.startswith("NCCL_")}, "NCCL_NVLS_ENABLE": "0"}
    base["variants"] = {"torchn": variant}
    return Config.model_validate(base)


def used_per_gpu() -> dict[int, float]:
    """MiB in use on every GPU (NVML)."""
    return {g["index"]: g["used_mib"] for g in nvml_read()["gpus"]}


async def _status_holds_every_gpu(stack, la, gib: float) -> None:
    """`/gpu status`: every GPU of the host shows the launch's memory, and every rank is listed as a holder."""
    call = await post_and_wait(stack, "/gpu", "status gpu-host-1", lambda t: t.startswith("GPU status"), user=VIEWER)
    text = text_of(call)
    host = parse_status_text(text).get("gpu-host-1", {"gpus": {}, "holders": {}})
    workers = set(pids_of_launch(la)) - {la.pid, la.pgid}
    record(**{f"status_{la.id}": text})
    assert sorted(host["gpus"]) == list(range(GPUS)), text
    assert all(g["used_gib"] >= 0.9 * gib for g in host["gpus"].values()), text
    assert workers and workers <= set(host["holders"]), (workers, text)


async def _kill_frees_every_gpu(stack, la, idle: dict[int, float]) -> None:
    workers = set(pids_of_launch(la))
    killed, _ = await kill_launch(stack)
    assert "Killed torchn#1" in text_of(killed), text_of(killed)

    async def free() -> bool:
        now = await asyncio.to_thread(used_per_gpu)
        return all(now[i] <= idle[i] + IDLE_SLACK_MIB for i in range(GPUS))

    await wait_until(free, 60, what="every GPU back at its idle level (NVML)", every=0.5)
    after = await asyncio.to_thread(used_per_gpu)
    record(**{f"kill_{la.id}": {"text": text_of(killed), "idle_mib": idle, "after_mib": after}})
    assert not workers & set(pids_of_launch(la))


async def test_nccl_server_on_every_gpu_becomes_ready_and_kill_frees_every_gpu(gpu_stack):
    idle = await asyncio.to_thread(used_per_gpu)
    stack = await gpu_stack(multi_config)
    la = await launch_torch(stack, "mode=nccl_ready gib=2", "torchn")
    try:
        await wait_ranks_logged(la, "NCCL communicator ready", GPUS, timeout=180)
        alert = await stack.fake.wait_for_call(
            "chat.postMessage", predicate=lambda c: is_alert(text_of(c)) and ": ready" in text_of(c), timeout=180)
        record(nccl_ready_alert=text_of(alert), gpus=GPUS, environment_torch=TORCH_INFO)
        await _status_holds_every_gpu(stack, la, 2.0)
        await _kill_frees_every_gpu(stack, la, idle)
    finally:
        record_log("nccl_ready_log", stack.runtime.launches)


@pytest.mark.parametrize(("mode", "marker", "phase", "waits_in"), [
    ("collective_hang", "Load weight end", None, "all_reduce"),
    ("init_hang", "Init torch distributed begin.", "comm_init", "_create_c10d_store"),
])
async def test_a_rank_that_never_comes_is_named_in_the_hang_alert_and_kill_frees_every_gpu(
        gpu_stack, mode, marker, phase, waits_in):
    idle = await asyncio.to_thread(used_per_gpu)
    stack = await gpu_stack(multi_config)
    la = await launch_torch(stack, f"mode={mode} gib=2", "torchn")
    odd = f"rank {GPUS - 1}"
    try:
        await wait_ranks_logged(la, marker, GPUS, timeout=180)
        t0 = time.monotonic()
        alert = await stack.fake.wait_for_call(
            "chat.postMessage", predicate=lambda c: is_alert(text_of(c)) and ": silent_hang" in text_of(c),
            timeout=max(POLICY.phase_grace_s.values()) + 180)
        text = text_of(alert) + json.dumps(alert["params"].get("blocks") or [])
        record(**{f"{mode}_alert": text_of(alert), f"{mode}_seconds_to_alert": round(time.monotonic() - t0, 1)})
        headline = text_of(alert).split("\n", 1)[0]
        if phase:
            assert f"silent_hang in {phase}" in headline, headline
        assert f"stacks (py-spy, {GPUS} ranks): {odd} is in " in text, text
        assert f"wait in {waits_in}" in text or f"waits in {waits_in}" in text, text
        await _status_holds_every_gpu(stack, la, 2.0)
        await _kill_frees_every_gpu(stack, la, idle)
    finally:
        record_log(f"{mode}_log", stack.runtime.launches)

