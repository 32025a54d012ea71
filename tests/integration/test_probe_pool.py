"""`/gpu status` of a fleet through the probe workers (bot.adapters.probe_pool, bot.services.probe_worker): the
same answer as probing in the bot's own process, secrets the bot learnt masked in the workers too (also those learnt
after a worker started), a worker that is killed or stopped replaced without a host going missing, and no worker
for a few hosts or for local ones.

The hosts are one real SSH server on loopback under several names (each name its own pooled connection), with the
replaying fake nvidia-smi; the GPU holders are real processes started here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bot.adapters.probe_pool import POOL_MIN_HOSTS
from bot.config import Config, HostConfig
from bot.core.models import HostFailure, Snapshot
from bot.core.probe import ProbeRequest
from bot.services.hosts import HostService
from tests.support.builders import ssh_host
from tests.support.fakes.ssh_server import LoopbackSSHServer
from tests.support.procs import wait_until, wait_until_sync

pytestmark = pytest.mark.timeout(120)

SECRET = "zq9PLAINvalue7781"
LATER = "kx4OTHERvalue3302"


def _fleet(ssh_server, n: int = POOL_MIN_HOSTS, **overrides) -> Config:
    return Config(hosts={f"gpu-{i:02d}": ssh_host(ssh_server, **overrides) for i in range(n)})


@pytest.fixture
def holder(fake_gpu):
    """A real process holding 8610 MiB of GPU 0 (the fake GPUs' holders), with SECRET and LATER in its command
    line; killed at the end."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "--model-path",
                             f"/data/{SECRET}", "--revision", LATER])
    (fake_gpu.holders_dir / str(proc.pid)).write_text("0 8610\n")
    yield proc
    proc.kill()
    proc.wait()
    (fake_gpu.holders_dir / str(proc.pid)).unlink(missing_ok=True)


@pytest.fixture
async def services():
    """HostServices made by the test, closed (their workers ended) at the end."""
    made: list[HostService] = []
    yield made
    for svc in made:
        await svc.close()


def _holder_command(result: Snapshot | HostFailure, pid: int) -> str:
    assert isinstance(result, Snapshot), result
    (row,) = [p for p in result.processes if p.pid == pid]
    return row.args


async def test_a_fleet_status_from_the_workers_is_the_status_probed_here(ssh_server, holder, services):
    cfg = _fleet(ssh_server)
    pooled = HostService(cfg, probe_workers=2)
    here = HostService(cfg, probe_workers=0)
    services += [pooled, here]
    names = cfg.host_names()
    seen: list[object] = []

    async def both_with_gpus():
        # a loaded machine may time out a replayed nvidia-smi on either side: compare two answers that both read
        # the GPUs (a pool that never does fails here)
        a, b = await pooled.status(names), await here.status(names)
        seen[:] = [s.gpu.error if isinstance(s, Snapshot) else s for s in (*a, *b)]
        return (a, b) if all(isinstance(s, Snapshot) and s.gpu.ok for s in (*a, *b)) else None

    a, b = await wait_until(both_with_gpus, 90, every=0.5, what=lambda: f"both sides reading the GPUs; {seen}")
    assert len(pooled.worker_pids) >= 1 and os.getpid() not in pooled.worker_pids
    assert here.worker_pids == []
    for x, y in zip(a, b, strict=True):
        assert isinstance(x, Snapshot) and isinstance(y, Snapshot), (x, y)
        assert x.host == y.host
        assert x.hostname == y.hostname
        assert [(g.index, g.uuid, g.memory_used_mib) for g in x.gpu.gpus] == \
            [(g.index, g.uuid, g.memory_used_mib) for g in y.gpu.gpus]
        assert [(p.pid, p.gpu_index, p.used_memory_mib) for p in x.gpu.processes] == \
            [(p.pid, p.gpu_index, p.used_memory_mib) for p in y.gpu.processes]
        assert [p.pid for p in x.processes] == [p.pid for p in y.processes]
        assert holder.pid in [p.pid for p in x.processes]
        # the worker sends only the rows that label the holders: the holder and its ancestors, not the whole table
        assert holder.pid in [p.pid for p in x.table] and os.getpid() in [p.pid for p in x.table]
        assert len(x.table) < len(y.table)
        assert x.all_process_count > len(x.table)  # still the count of the whole table
    # what the bot makes of them (holders labelled by launch) is the same
    assert [(h.pid, h.owner) for h in pooled_holders(a)] == [(h.pid, h.owner) for h in pooled_holders(b)]


def pooled_holders(results):
    from bot.core.lifecycle import attribute_holders

    return [h for r in results for h in attribute_holders(r.gpu, r.table, [], r.launch_tags)]


async def test_secret_values_the_bot_learns_are_masked_by_the_workers_too(ssh_server, holder, services):
    cfg = _fleet(ssh_server)
    svc = HostService(cfg, probe_workers=2)
    services.append(svc)
    svc.redactor.add_values([SECRET])
    first = await svc.status(cfg.host_names())
    for r in first:
        cmd = _holder_command(r, holder.pid)
        assert SECRET not in cmd and "/data/" in cmd and LATER in cmd
    svc.redactor.add_values([LATER])  # learnt after the workers started: sent with the next call
    for r in await svc.status(cfg.host_names()):
        cmd = _holder_command(r, holder.pid)
        assert SECRET not in cmd and LATER not in cmd and "--revision" in cmd


async def test_a_killed_worker_loses_no_host_and_is_replaced(ssh_server, services):
    cfg = _fleet(ssh_server)
    svc = HostService(cfg, probe_workers=2)
    services.append(svc)
    names = cfg.host_names()
    assert all(isinstance(r, Snapshot) for r in await svc.status(names))
    before = list(svc.worker_pids)
    for pid in before:
        os.kill(pid, signal.SIGKILL)
    results = await svc.status(names)  # a dead worker's hosts are probed here
    assert [r.host for r in results] == names
    assert all(isinstance(r, Snapshot) for r in results), [r for r in results if not isinstance(r, Snapshot)]
    # the next fleet status has workers again, none of them the killed ones
    await wait_until(lambda: _fresh_workers(svc, names, before), 60, what="new probe workers after the kill")


async def _fresh_workers(svc: HostService, names: list[str], old: list[int]) -> bool:
    results = await svc.status(names)
    assert all(isinstance(r, Snapshot) for r in results)
    return bool(svc.worker_pids) and not set(svc.worker_pids) & set(old)


async def test_a_stopped_worker_is_given_up_and_its_hosts_probed_here(ssh_server, services):
    # deadlines of seconds (16 s: 5 + 5 + 1 + the margin): the call to a stopped worker is given up after its
    # hosts' deadline; connects of 5 s, as 1 s failed on a loaded 2-CPU machine (8 SSH handshakes at once)
    cfg = _fleet(ssh_server, connect_timeout_s=5, command_timeout_s=5, nvidia_smi_timeout_s=1)
    svc = HostService(cfg, probe_workers=1)
    services.append(svc)
    names = cfg.host_names()

    async def all_up() -> bool:  # the worker's connections made (a loaded machine may need a second try)
        return all(isinstance(r, Snapshot) for r in await svc.status(names))

    await wait_until(all_up, 45, what="every host probed through the worker")
    (pid,) = svc.worker_pids
    os.kill(pid, signal.SIGSTOP)
    try:
        results = await asyncio.wait_for(svc.status(names), 60)
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed and reaped, as it should be
            os.kill(pid, signal.SIGCONT)
    assert all(isinstance(r, Snapshot) for r in results), [r for r in results if not isinstance(r, Snapshot)]
    assert pid not in svc.worker_pids


async def test_a_burst_of_fleet_statuses_shares_the_workers_probes(ssh_server, services):
    cfg = _fleet(ssh_server)
    svc = HostService(cfg, probe_workers=2)
    services.append(svc)
    names = cfg.host_names()
    await svc.status(names)
    agents_before = ssh_server.exec_count
    answers = await asyncio.gather(*(svc.status(names) for _ in range(5)))
    assert all(isinstance(r, Snapshot) for ans in answers for r in ans)
    # five callers at once: each host probed once (shared), each caller with its own copy
    assert answers[0][0] is not answers[1][0]
    assert ssh_server.exec_count == agents_before  # warm probe agents: no new channel for any of them


async def test_a_few_hosts_or_local_ones_never_start_a_worker(ssh_server, services, tmp_path):
    few = _fleet(ssh_server, n=POOL_MIN_HOSTS - 1)
    svc = HostService(few, probe_workers=4)
    services.append(svc)
    assert all(isinstance(r, Snapshot) for r in await svc.status(few.host_names()))
    assert svc.worker_pids == []
    local = Config(hosts={f"local-{i}": HostConfig(local=True, use_nvml=False) for i in range(POOL_MIN_HOSTS)})
    svc2 = HostService(local, probe_workers=4)
    services.append(svc2)
    results = await svc2.status(local.host_names())
    assert [r.host for r in results] == local.host_names()
    assert svc2.worker_pids == []


async def test_close_ends_every_worker(ssh_server, services):
    cfg = _fleet(ssh_server)
    svc = HostService(cfg, probe_workers=2)
    await svc.status(cfg.host_names())
    pids = list(svc.worker_pids)
    assert pids
    await svc.close()
    for pid in pids:
        await wait_until(lambda pid=pid: not _alive(pid), 30, what=f"probe worker {pid} to end")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_workers_end_with_a_sigkilled_bot_and_hold_none_of_its_streams():
    # a bot process that starts two probe workers (a call with no host: answered at once), says their pids, then
    # waits to be killed; its stdout and stderr are pipes
    script = textwrap.dedent("""
        import asyncio, time
        from bot.adapters.probe_pool import ProbePool
        from bot.config import Config
        async def main():
            pool = ProbePool(2, (Config(), None))
            assert await pool.call(0, [], [], 30) == {} and await pool.call(1, [], [], 30) == {}
            print(*pool.pids, flush=True)
            time.sleep(600)
        asyncio.run(main())
    """)
    bot = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           cwd=str(Path(__file__).resolve().parents[2]))
    try:
        workers = [int(w) for w in bot.stdout.readline().split()]
        assert len(workers) == 2
        bot.kill()
        bot.wait()
        for w in workers:
            wait_until_sync(lambda w=w: not _alive(w), 30, what=f"probe worker {w} to exit after its bot was killed")
        assert bot.stdout.read() == b"" and bot.stderr.read() is not None  # nothing holds the bot's pipes open
    finally:
        bot.kill()
        bot.wait()


async def test_a_secret_learnt_while_the_workers_probe_is_masked_in_what_they_send(tmp_path, fake_gpu, holder,
                                                                                    services):
    # a host whose first command (the workers' connections starting their probe agents) waits 1 s: the value is
    # learnt by the bot meanwhile, after the call to the workers was sent
    env = {"PATH": f"{fake_gpu.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    async with LoopbackSSHServer(tmp_path / "slow", env=env, exec_delay_s=1.0) as slow:
        cfg = _fleet(slow)
        svc = HostService(cfg, probe_workers=2)
        services.append(svc)
        call = asyncio.ensure_future(svc.status(cfg.host_names()))
        await wait_until(lambda: svc.worker_pids, 30, what="the probe workers to start")
        svc.redactor.add_values([LATER])
        results = await call
        await svc.close()
    for r in results:
        cmd = _holder_command(r, holder.pid)
        assert LATER not in cmd and "--revision" in cmd, cmd


async def test_the_workers_probe_agents_are_left_out_of_the_bot_s_own_probes(ssh_server, services):
    # one reachable host and seven that refuse: the only probe agents on this machine are that host's
    cfg = _fleet(ssh_server)
    dead = ssh_host(ssh_server, port=_closed_port(), connect_timeout_s=2)
    cfg = Config(hosts={"gpu-00": cfg.hosts["gpu-00"], **{f"gpu-{i:02d}": dead for i in range(1, POOL_MIN_HOSTS)}})
    svc = HostService(cfg, probe_workers=2)
    services.append(svc)
    first = await svc.status(cfg.host_names())
    assert isinstance(first[0], Snapshot) and all(isinstance(r, HostFailure) for r in first[1:])
    snap = await svc.probe("gpu-00", ProbeRequest())  # the bot's own connection, its own agent
    # this test's SSH server runs in this process: the agents of its sessions are its children (other tests running
    # beside it have agents of their own on this machine)
    mine = [p for p in snap.table if "gpubot-agent" in p.args and p.ppid == os.getpid()]
    assert mine == [], mine
    # while the bot's own agent and the worker's both run here
    assert len(ssh_server.commands) >= 2 and sum("gpubot-agent" in c for c in ssh_server.commands) >= 2


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_worker_that_cannot_start_leaves_the_bot_probing_itself_for_a_while(ssh_server, services,
                                                                                   monkeypatch, caplog):
    from bot.adapters import probe_pool

    monkeypatch.setattr(probe_pool, "WORKER_MODULE", "bot.no_such_module")  # a broken install
    caplog.set_level(logging.INFO, logger="bot.adapters.probe_pool")
    cfg = _fleet(ssh_server)
    svc = HostService(cfg, probe_workers=2)
    services.append(svc)
    for _ in range(3):
        results = await svc.status(cfg.host_names())
        assert all(isinstance(r, Snapshot) for r in results)  # probed in the bot instead
    assert svc.worker_pids == []
    started = [r for r in caplog.records if "started (pid" in r.getMessage()]
    assert 1 <= len(started) <= 2  # not one more per status: the pool waits RETRY_AFTER_S before it tries again
    await wait_until(lambda: any("No module named" in r.getMessage() for r in caplog.records), 30,
                     what="the worker's own error in the bot's log")
