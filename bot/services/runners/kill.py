"""The kill of processes on one host, verified: one escalation loop (SIGTERM to the processes, their confirmed process
group and their cgroup; a grace; SIGKILL to what is left; a wait), then the launch's GPU memory polled until it is
released. Every runner stops a process tree with it (a launch on one host, each rank of a launch across nodes), and
`/kill pid=` a foreign GPU holder.

Guarantees: a PID whose start time a probe read is signalled only while it is still that process (a reused PID is a
stranger's), and a process group only when it is confirmed the launch's; nothing is signalled before the processes
were listed. Limits: `kill_grace_s` then `sigkill_wait_s` for the processes, `release_timeout_s` for the GPU memory.
Raises RemoteError when the host cannot be read or reached (the caller records the kill as failed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from bot.adapters.remote import RemoteError
from bot.core.commands import slash
from bot.core.lifecycle import (
    Holder,
    KillOutcome,
    KillPreview,
    gpu_memory,
    group_confirmed,
    signal_script,
    unit_cleanup_script,
)
from bot.core.models import Launch, LaunchState, ProcessInfo, Snapshot
from bot.core.observe import ended_by, remember_processes, started_after
from bot.core.probe import ProbeRequest
from bot.services.hosts import HostService
from bot.services.probes import LaunchProbes


class KillRows(Protocol):
    """What a kill reads and writes of the launches: the live launches of a host (a holder of another one is never
    "left" by this kill) and the processes a kill saw of its launch (`seen_pids`, `seen_starts`)."""

    def live(self, host: str | None = None, variant: str | None = None) -> list[Launch]: ...

    def update(self, launch_id: int, **fields: Any) -> Launch: ...


@dataclass(frozen=True)
class KillPolicy:
    """Seconds a kill waits: `kill_grace_s` after SIGTERM, `sigkill_wait_s` after SIGKILL, `release_timeout_s` for
    the GPU memory (free under `gpu_free_mib` MiB), looking again every `poll_s`."""

    kill_grace_s: float
    sigkill_wait_s: float
    release_timeout_s: float
    gpu_free_mib: float
    poll_s: float


class ProcessKiller:
    """Verified kills of process trees on the hosts of `hosts`, launches' processes found by `probes`."""

    def __init__(self, hosts: HostService, probes: LaunchProbes, holders: Callable[[Snapshot], list[Holder]],
                 rows: KillRows, policy: KillPolicy) -> None:
        self.hosts = hosts
        self.probes = probes
        self._holders = holders
        self._rows = rows
        self.policy = policy

    async def has_processes(self, la: Launch) -> bool:
        """Whether any process carries the launch's tag now (a launch whose PID was never recorded, e.g. the
        bot stopped between starting it and recording it). An unreadable host counts as yes (kill it properly)."""
        try:
            snap = await self.probes.snapshot(la.host, ProbeRequest(select_tag=la.tag or None, health_path=None,
                                                                    gpu=False))
        except RemoteError:
            return True
        return bool(self.probes.processes_of(la, snap))

    async def stop(self, la: Launch, out: KillOutcome) -> KillOutcome:
        """Stop `la`'s process tree on `la.host`, verified (its processes gone, its GPUs released), into `out`.
        Raises RemoteError."""
        probes = self.probes
        snap = await probes.snapshot(la.host, ProbeRequest(select_tag=la.tag or None, health_path=None,
                                                           stat_pids=probes.stat_pids(la)))
        procs = probes.processes_of(la, snap)
        out.mem_before_mib = gpu_memory(snap.gpu, la.gpus)
        if not procs:
            out.mem_after_mib = out.mem_before_mib
            # a kill again after one that left memory held: the holders it named (escaped, untagged) are still
            # not "nothing left"
            held = self.left_holding(la, snap, set()) if la.state == LaunchState.KILL_FAILED else []
            if held:
                out.still_holding = held
            else:
                out.nothing_to_kill = out.released = True
            return out
        remembered = remember_processes(la, snap, procs, whole_table=True)
        if remembered is not None:
            self._rows.update(la.id, seen_pids=remembered[0], seen_starts=remembered[1])
        out.signalled = procs
        # only a group confirmed ours is signalled as a whole (a reused PGID may be a stranger's)
        pgid = la.pgid if group_confirmed(snap.table, probes.tagged(la, snap), la.pgid,
                                          ended_by=ended_by(snap, la)) else None
        out.remaining, out.used_sigkill = await self.signal_and_wait(
            la.host, [p.pid for p in procs], pgid, tag=la.tag or None,
            survivors=lambda s: probes.processes_of(la, s), unit=la.unit, manager=la.unit_manager,
            starts=snap.start_ticks, stat_pids=probes.stat_pids(la))
        cleanup = unit_cleanup_script(la.unit, la.unit_manager)
        if cleanup and not out.remaining:
            await self.hosts.executor(la.host).run("sh -s", input=cleanup.encode(), timeout_s=15)
        return await self._wait_released(la, out, {p.pid for p in out.signalled})

    async def signal_and_wait(self, host: str, pids: list[int], pgid: int | None, *, tag: str | None,
                              survivors: Callable[[Snapshot], list[ProcessInfo]], unit: str | None = None,
                              manager: str | None = None, starts: Mapping[int, int] | None = None,
                              stat_pids: tuple[int, ...] = ()) -> tuple[list[ProcessInfo], bool]:
        """The one escalation loop: SIGTERM `pids` (and the group `pgid`, and the launch's whole cgroup `unit`
        through its `manager`), wait up to `kill_grace_s` for `survivors(snapshot)` to be empty, then SIGKILL
        what is left and wait `sigkill_wait_s` more. A PID whose start time the probe read (`starts`: PID -> clock
        ticks; `stat_pids` are read again by each later look) is signalled only while it is still that process.
        Returns (what is still alive, zombies left out; whether SIGKILL was needed). Raises RemoteError."""
        ex = self.hosts.executor(host)
        left: list[ProcessInfo] = []
        # the group leader's start time, as first read: a later look no longer lists a leader that is gone, and a
        # stranger may take its PID as a group of its own between the rounds
        leader = {pgid: starts[pgid]} if pgid and starts and pgid in starts else {}
        for sig, budget_s in (("TERM", self.policy.kill_grace_s), ("KILL", self.policy.sigkill_wait_s)):
            targets = pids if sig == "TERM" else [p.pid for p in left]
            script = signal_script(targets, pgid, sig, unit=unit, manager=manager, starts={**(starts or {}), **leader})
            await ex.run("sh -s", input=script.encode(), timeout_s=15)
            left, starts = await self._wait_gone(host, budget_s, tag, survivors, stat_pids)
            if not left:
                return [], sig == "KILL"
        return left, True

    async def _wait_gone(self, host: str, budget_s: float, tag: str | None,
                         survivors: Callable[[Snapshot], list[ProcessInfo]],
                         stat_pids: tuple[int, ...] = ()) -> tuple[list[ProcessInfo], dict[int, int]]:
        """Look again every `poll_s` until `survivors` of a look is empty or `budget_s` has passed. Returns the
        survivors of the last look (zombies left out) and the start times it read (PID -> clock ticks)."""
        deadline = time.monotonic() + budget_s
        while True:
            snap = await self.probes.snapshot(host, ProbeRequest(select_tag=tag, health_path=None, gpu=False,
                                                                 stat_pids=stat_pids))
            procs = [p for p in {p.pid: p for p in survivors(snap)}.values() if p.state != "Z"]
            if not procs or time.monotonic() >= deadline:
                return procs, snap.start_ticks
            await asyncio.sleep(self.policy.poll_s)

    async def _wait_released(self, la: Launch, out: KillOutcome, pids: set[int]) -> KillOutcome:
        deadline = time.monotonic() + self.policy.release_timeout_s
        while True:
            snap = await self.probes.snapshot(la.host, ProbeRequest(health_path=None))
            out.mem_after_mib = gpu_memory(snap.gpu, la.gpus)
            out.gpu_error = None if snap.gpu.ok else snap.gpu.error
            out.still_holding = self.left_holding(la, snap, pids)
            if not snap.gpu.ok:
                out.released = not out.still_holding and not out.remaining
                return out
            gpus_free = not la.gpus or all((g.memory_used_mib or 0) < self.policy.gpu_free_mib
                                           for g in snap.gpu.gpus if g.index in la.gpus)
            if not out.still_holding and gpus_free:
                out.released = True
                return out
            if time.monotonic() >= deadline:
                out.released = False
                return out
            await asyncio.sleep(self.policy.poll_s)

    def left_holding(self, la: Launch, snap: Snapshot, pids: set[int]) -> list[Holder]:
        """The GPU holders a kill of `la` leaves (pure over `snap`): the processes it signalled, any process tagged
        as its own, and, on the launch's GPUs, any other holder that started after the launch did (a child that
        escaped its session and environment, where no cgroup holds the launch): none of those is another live
        launch's."""
        by_pid = {p.pid: p for p in snap.table}
        others = {x.id for x in self._rows.live(la.host) if x.id != la.id}

        def newer(h: Holder) -> bool:
            return (h.pid in by_pid and h.launch_id not in others and (not la.gpus or h.gpu_index in la.gpus)
                    and started_after(snap, by_pid[h.pid], la.created_at) is True)

        return [h for h in self._holders(snap) if h.pid in pids or h.launch_id == la.id or newer(h)]

    async def preview(self, la: Launch, out: KillPreview) -> KillPreview:
        """What a kill of `la`'s process tree on `la.host` would stop now, into `out`. Never raises: an unreadable
        host is reported in `error`."""
        try:
            snap = await self.probes.snapshot(la.host, ProbeRequest(select_tag=la.tag or None, health_path=None))
        except RemoteError as e:
            out.error = str(e)
            return out
        out.processes = self.probes.processes_of(la, snap)
        pids = {p.pid for p in out.processes}
        if snap.gpu.ok:
            held = [gp for gp in snap.gpu.processes if gp.pid in pids]
            if held:
                out.gpu_mib = float(sum(gp.used_memory_mib or 0 for gp in held))
                out.gpus = sorted({gp.gpu_index for gp in held if gp.gpu_index is not None} | set(la.gpus))
            elif pids:  # per-process readings missing (some VMs): the memory used on the launch's GPUs
                out.gpu_mib = gpu_memory(snap.gpu, la.gpus)
            else:
                out.gpu_mib = 0.0
        return out

    async def pid_preview(self, host: str, pid: int) -> KillPreview:
        """What `kill_pid(host, pid)` would stop now. Never raises; `refusal` is set when the pid does not
        exist or holds no GPU memory (kill_pid would refuse it too)."""
        out = KillPreview(target=f"pid {pid}", host=host, pid=pid)
        try:
            snap = await self.probes.snapshot(host, ProbeRequest(pid=pid, health_path=None))
        except RemoteError as e:
            out.error = str(e)
            return out
        row = next((p for p in snap.table if p.pid == pid), None)
        held = [gp for gp in snap.gpu.processes if gp.pid == pid]
        if row is None:
            out.refusal = f"no process {pid} on {host}"
        elif not snap.gpu.ok:
            out.refusal = f"cannot tell whether pid {pid} holds a GPU ({snap.gpu.error})"
        elif not held:
            out.refusal = (f"pid {pid} holds no GPU memory; `{slash('kill', 'pid=')}` only stops processes that "
                           "hold a GPU")
        else:
            out.processes = [row]
            out.gpus = sorted({gp.gpu_index for gp in held if gp.gpu_index is not None})
            out.gpu_mib = float(sum(gp.used_memory_mib or 0 for gp in held))
        return out

    async def kill_pid(self, host: str, pid: int, out: KillOutcome, expect_command: str | None = None) -> KillOutcome:
        """Kill one (foreign) process that holds GPU memory, into `out`: SIGTERM, grace, SIGKILL; its GPU memory
        released or not. With `expect_command`, a pid that now runs another command (reused) is not killed.
        Raises RemoteError."""
        snap = await self.probes.snapshot(host, ProbeRequest(pid=pid, health_path=None, stat_pids=(pid,)))
        row = next((p for p in snap.table if p.pid == pid), None)
        held = sum(gp.used_memory_mib or 0 for gp in snap.gpu.processes if gp.pid == pid)
        out.mem_before_mib = float(held) if snap.gpu.ok else None
        if row is None:
            out.nothing_to_kill = out.released = True
        elif expect_command is not None and row.args != expect_command:
            out.error = (f"pid {pid} now runs another command ({row.args[:60]}); the process that was "
                         "confirmed is gone, nothing was killed")
        elif not snap.gpu.ok:
            out.error = f"cannot tell whether pid {pid} holds a GPU ({snap.gpu.error}); not killed"
        elif not any(gp.pid == pid for gp in snap.gpu.processes):
            out.error = (f"pid {pid} ({row.args[:60]}) holds no GPU memory; `{slash('kill', 'pid=')}` only "
                         "stops processes that hold a GPU")
        else:
            out.signalled = [row]
            out.remaining, out.used_sigkill = await self.signal_and_wait(
                host, [pid], None, tag=None, survivors=lambda s: [p for p in s.table if p.pid == pid],
                starts=snap.start_ticks, stat_pids=(pid,))
            after = await self.probes.snapshot(host, ProbeRequest(health_path=None))
            out.still_holding = [h for h in self._holders(after) if h.pid == pid]
            out.mem_after_mib = float(sum(h.mib or 0 for h in out.still_holding)) if after.gpu.ok else None
            out.released = not out.remaining and not out.still_holding
        return out
