"""Launches placed on a host group (issue 25): a variant with `host: group:NAME` and `gpu_count: N` gets its host
and GPUs picked at launch (best fit), says where and why, and two launches at the same moment never get the same
GPUs: each is recorded with its GPUs under the host's launch lock before the next one chooses.

Three host names reach one real SSH server on loopback whose fake nvidia-smi has 4 GPUs; the server launched is the
fake TP server, which registers each worker's memory on the GPUs it was given (`--gpus {{ gpus }}`)."""

from __future__ import annotations

import asyncio

import pytest

from bot.config import Config, parse_config
from bot.core.models import LaunchState
from bot.demo.fakegpu import install_fake_gpu
from tests.support.builders import OPERATOR, launch_config
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(180)

WORKER_MIB = 8610


def _placed_config(ssh_server, fake_gpu, tmp_path, **variant) -> Config:
    cfg = launch_config(ssh_server, fake_gpu, tmp_path)
    install_fake_gpu(fake_gpu.state_dir.parent, gpu_count=4)
    data = cfg.model_dump(mode="json", exclude_none=True)
    host = data["hosts"].pop("gpu-host-1")
    data["host_groups"] = {"pool": host}
    data["hosts"] = {"pool-[1-3]": {"group": "pool"}}
    base = data["variants"].pop("base")
    data["variants"].pop("helper")
    base.pop("gpus")
    base.pop("port")
    base["command"] = base["command"].replace("--gpus 0,1", "--gpus {{ gpus }}").replace("--port {{ port }}",
                                                                                       "--port 1")
    data["variants"]["svc"] = {**base, "host": "group:pool", "gpu_count": 2, **variant}
    return parse_config(data)


async def _held_mib(bot, host: str = "pool-1") -> float:
    from bot.core.models import Snapshot
    from bot.core.probe import ProbeRequest
    snap = await bot.runtime.hosts.probe(host, ProbeRequest(health_path=None))
    assert isinstance(snap, Snapshot) and snap.gpu.ok
    return sum(g.memory_used_mib or 0 for g in snap.gpu.gpus)


async def test_two_launches_at_once_land_on_different_gpus_and_a_third_finds_no_room(ssh_server, fake_gpu,
                                                                                   make_bot, tmp_path):
    bot = await make_bot(_placed_config(ssh_server, fake_gpu, tmp_path))
    first, second = await asyncio.gather(bot.chat.say("/launch svc"), bot.chat.say("/launch svc"))
    for answer in (first, second):
        assert answer.audit == "started", answer.text
        assert "Placed on pool-1, GPUs " in answer.text and "best fit in group pool" in answer.text, answer.text
    a, b = bot.launch(1), bot.launch(2)
    assert a.host == b.host == "pool-1"  # best fit: the second fills the host the first started on
    assert sorted([tuple(a.gpus), tuple(b.gpus)]) == [(0, 1), (2, 3)]
    for la in (a, b):
        assert f"--gpus {','.join(map(str, la.gpus))}" in la.command
    audits = [e for e in bot.events(action="launch") if e.result == "started"]
    assert sorted(tuple(e.args["gpus"]) for e in audits) == [(0, 1), (2, 3)]

    async def all_held() -> bool:
        return await _held_mib(bot) == 4 * WORKER_MIB

    await wait_until(all_held, what="both launches' workers holding their GPUs")
    # every host name shows the same 4 GPUs (one machine): all held now, so a third has no room anywhere
    third = await bot.chat.say("/launch svc")
    assert third.audit == "refused", third.text
    assert "no host of group pool can take it now (it needs 2 free GPUs)" in third.text
    for host in ("pool-1", "pool-2", "pool-3"):
        assert f"{host}: too few free GPUs: 0 of 4 free" in third.text, third.text
    assert "/gpu free 2 group=pool" in third.text
    assert len(bot.runtime.store.launches.recent()) == 2  # nothing recorded for the refused one


async def test_a_relaunch_keeps_its_host_and_gpus_and_host_must_be_in_the_group(ssh_server, fake_gpu, make_bot,
                                                                              tmp_path):
    bot = await make_bot(_placed_config(ssh_server, fake_gpu, tmp_path))
    bot.runtime.store.launches.create(host="pool-2", variant="other", params={}, command="x", log_path=None,
                                      port=None, gpus=[0, 1, 2], created_by=OPERATOR)  # claims 3 of pool-2's GPUs
    there = await bot.chat.say("/launch svc host=pool-2")
    assert there.audit == "refused" and "pool-2 does not have 2 free GPUs now" in there.text, there.text
    outside = await bot.chat.say("/launch svc host=gpu-host-9")
    assert outside.audit == "invalid" and "unknown host" in outside.text
    first = await bot.chat.say("/launch svc")
    assert first.audit == "started", first.text
    la = bot.launch(2)
    assert la.host == "pool-1" and la.gpus == [0, 1]
    # the bot sees the launch's workers, then a relaunch stops it and starts the same variant on the same GPUs
    await wait_until(lambda: _held_mib(bot), what="the workers' memory")
    redo = await bot.chat.say(f"!relaunch {la.id}", thread=la.thread_ts)
    assert redo is not None and "Placed on pool-1, GPUs 0,1" in redo.text, redo.text
    new = bot.launch(3)
    assert new.host == "pool-1" and new.gpus == [0, 1] and new.relaunch_of == la.id
    assert bot.launch(la.id).state != LaunchState.RUNNING


async def test_a_busy_host_lock_is_said_as_busy_not_as_no_room(ssh_server, fake_gpu, make_bot, tmp_path):
    import contextlib

    from bot.adapters.locks import LockTimeout

    bot = await make_bot(_placed_config(ssh_server, fake_gpu, tmp_path))
    launches = bot.runtime.launches

    @contextlib.asynccontextmanager
    async def busy(host):
        raise LockTimeout(f"another launch decision on {host} holds its lock")
        yield

    launches.locks.host = busy
    answer = await bot.chat.say("/launch svc host=pool-1")
    assert answer.audit == "failed" and "busy deciding another launch; try again in a moment" in answer.text, \
        answer.text
    assert bot.runtime.store.launches.recent() == []
