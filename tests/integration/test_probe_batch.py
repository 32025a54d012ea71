"""The cheap looks of launches on one host, asked for at the same moment, go to the host in ONE script and come back
as the snapshots each would have got alone: its own processes, its own new log lines, its own cursor; the host's GPUs
read once for all of them. Real shell (this machine as the host), real processes writing real logs, the replaying
fake nvidia-smi."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from bot.config import Config, HostConfig
from bot.core.models import HostFailure, Snapshot
from bot.core.observe import cpu_seconds
from bot.core.probe import ProbeRequest
from bot.services.hosts import HostService

pytestmark = pytest.mark.timeout(120)

LOOP = 'i=0; while :; do i=$((i+1)); echo "INFO step $i of $TAG"; sleep 0.2; done'


@pytest.fixture
def launches(tmp_path):
    """Three shell loops, each writing its own log under tmp_path/logs; stopped (their sessions) at the end."""
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = []
    for k in range(3):
        fh = open(logs / f"l{k}.log", "wb")
        procs.append((subprocess.Popen(["sh", "-c", LOOP], stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                       env={"PATH": os.environ["PATH"], "TAG": f"launch-{k}"}), logs / f"l{k}.log"))
        fh.close()
    yield procs
    for proc, _ in procs:
        try:
            os.killpg(proc.pid, 9)
        except OSError:
            pass
        proc.wait()


def _service(tmp_path: Path, fake_gpu, **kw) -> HostService:
    host = HostConfig(local=True, use_nvml=False, nvidia_smi=str(fake_gpu.nvidia_smi),
                      log_dirs=[str(tmp_path / "logs")])
    return HostService(Config(hosts={"me": host}), **kw)


def _spy(svc: HostService) -> list[str]:
    """The scripts `svc`'s executor of host `me` runs, in order."""
    sent: list[str] = []
    ex = svc.executor("me")
    real = ex.run_script

    async def run_script(script, **kw):
        sent.append(script)
        return await real(script, **kw)

    ex.run_script = run_script  # type: ignore[method-assign]
    return sent


async def _cheap_requests(svc: HostService, launches) -> list[ProbeRequest]:
    """Each launch's cheap look, from a cursor a first full look of its log left."""
    out = []
    for proc, log in launches:
        first = await svc.probe("me", ProbeRequest(log_path=str(log), pid=proc.pid, gpu=False))
        assert isinstance(first, Snapshot) and first.log is not None and first.log.cursor is not None, first
        out.append(ProbeRequest(log_path=str(log), pid=proc.pid, ps_pids=(proc.pid,), log_cursor=first.log.cursor,
                                log_since=True, gpu=True, gpu_max_age_s=10.0))
    return out


async def _until_grown(launches, lines: int) -> None:
    sizes = [log.stat().st_size for _, log in launches]
    deadline = asyncio.get_running_loop().time() + 60
    while any(log.stat().st_size < s + 40 * lines for (_, log), s in zip(launches, sizes, strict=True)):
        assert asyncio.get_running_loop().time() < deadline, "the launches' logs did not grow"
        await asyncio.sleep(0.05)


async def test_looks_of_one_host_at_the_same_moment_share_one_script_and_get_their_own_answers(
        tmp_path, fake_gpu, launches):
    svc = _service(tmp_path, fake_gpu, batch_gather_s=0.2)
    try:
        reqs = await _cheap_requests(svc, launches)
        await _until_grown(launches, 3)
        sent = _spy(svc)
        snaps = await asyncio.gather(*(svc.probe("me", r) for r in reqs))
        assert len(sent) == 1, f"{len(sent)} scripts for 3 looks"
        assert sent[0].count("--query-gpu=") == 1  # the host's GPUs are read once, for all
        for k, (snap, (proc, log)) in enumerate(zip(snaps, launches, strict=True)):
            assert isinstance(snap, Snapshot), snap
            assert [p.pid for p in snap.processes] == [proc.pid]
            assert snap.log is not None and snap.log.path == str(log)
            assert snap.log.tail and all(f"launch-{k}" in line for line in snap.log.tail), snap.log.tail
            assert snap.log.cursor is not None and snap.log.cursor.offset > reqs[k].log_cursor.offset
            assert snap.gpu.ok and snap.gpu.gpus
            assert snap.gpu.gpus[0].memory_used_mib == snaps[0].gpu.gpus[0].memory_used_mib
    finally:
        await svc.close()


async def test_a_batched_look_sees_what_the_same_look_sees_alone(tmp_path, fake_gpu, launches):
    """The same requests, from the same cursors, once together and once each alone (no batching): the same lines up
    to the moment each read (the alone ones read later: they have at least as many), the same processes."""
    together, alone = _service(tmp_path, fake_gpu, batch_gather_s=0.2), _service(tmp_path, fake_gpu,
                                                                                 batch_gather_s=None)
    try:
        reqs = await _cheap_requests(together, launches)
        await _until_grown(launches, 2)
        batched = await asyncio.gather(*(together.probe("me", r) for r in reqs))
        sent = _spy(alone)
        single = [await alone.probe("me", r) for r in reqs]
        assert len(sent) == 3
        for b, s in zip(batched, single, strict=True):
            assert isinstance(b, Snapshot) and isinstance(s, Snapshot)
            assert [p.pid for p in b.processes] == [p.pid for p in s.processes]
            assert b.log is not None and s.log is not None
            assert s.log.tail[: len(b.log.tail)] == b.log.tail
            assert b.errors == s.errors == []
    finally:
        await together.close()
        await alone.close()


async def test_a_look_whose_log_went_away_fails_alone(tmp_path, fake_gpu, launches):
    svc = _service(tmp_path, fake_gpu, batch_gather_s=0.2)
    try:
        reqs = await _cheap_requests(svc, launches)
        launches[1][1].rename(tmp_path / "logs" / "moved.log")
        snaps = await asyncio.gather(*(svc.probe("me", r) for r in reqs))
        assert all(isinstance(s, Snapshot) for s in snaps)
        assert snaps[1].log is not None and not snaps[1].log.exists and snaps[1].log.error
        assert snaps[0].log is not None and snaps[0].log.exists and snaps[2].log is not None and snaps[2].log.exists
    finally:
        await svc.close()


async def test_cpu_time_spent_in_reaped_children_counts_as_the_parents(tmp_path, fake_gpu):
    """A launch whose work runs in short-lived children (a compiler's `ptxas`, one after another) gains no CPU time of
    its own; the probe reads its ended children's from /proc/PID/stat, and the watcher counts them as its CPU time."""
    busy = "while :; do ( i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done ) & wait; done"
    proc = subprocess.Popen(["sh", "-c", busy], start_new_session=True)
    svc = _service(tmp_path, fake_gpu, batch_gather_s=None)
    try:
        deadline = asyncio.get_running_loop().time() + 90
        while True:
            snap = await svc.probe("me", ProbeRequest(pid=proc.pid, ps_pids=(proc.pid,), stat_pids=(proc.pid,),
                                                      gpu=False))
            assert isinstance(snap, Snapshot), snap
            row = next(p for p in snap.processes if p.pid == proc.pid)
            cpu = cpu_seconds(snap.processes, snap)
            total = (cpu[str(proc.pid)] or 0.0) + (cpu.get(f"{proc.pid}c") or 0.0)
            if total >= 2:
                assert (row.cpu_time_s or 0) < 1 <= snap.children_cpu_s[proc.pid]  # its own TIME did not show it
                break
            assert asyncio.get_running_loop().time() < deadline, f"its CPU time stayed {total} s"
            await asyncio.sleep(0.5)
    finally:
        await svc.close()
        os.killpg(proc.pid, 9)
        proc.wait()


async def test_a_batch_past_its_deadline_answers_each_look_with_a_host_failure(tmp_path, fake_gpu, launches,
                                                                              monkeypatch):
    """A host that stops answering mid-batch (the adversarial review of 2026-12-08: a TypeError reached every
    caller): each look gets a HostFailure naming the deadline, the watcher's host-unreachable path."""
    svc = _service(tmp_path, fake_gpu, batch_gather_s=0.2)
    try:
        reqs = await _cheap_requests(svc, launches)
        async def silent(script, **kw):  # the host took the script and never answered
            await asyncio.sleep(60)

        monkeypatch.setattr(svc.executor("me"), "run_script", silent)
        monkeypatch.setattr(svc, "probe_deadline_s", lambda host: 1.0)
        got = await asyncio.gather(*(svc.probe("me", r) for r in reqs))
        assert all(isinstance(g, HostFailure) and "did not answer within 1 s" in g.reason for g in got), got
    finally:
        await svc.close()
