"""Stack dumps of a launch's processes with py-spy, over the host's pooled executor in one round trip."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from bot.adapters.remote import RemoteError
from bot.core.models import HostFailure, Launch, ProcessInfo
from bot.core.ranks import rank_view
from bot.core.stackdump import MAX_PIDS, ProcessDump, check_pids, dump_script, finish_dumps, script_budget_s
from bot.core.stackgroups import CrossRankSummary, rank_label, summarize_ranks
from bot.services.audit import Audit
from bot.services.hosts import HostService
from bot.services.launches import LaunchService


class StackDumpError(Exception):
    """The dump could not be taken at all (host unreachable, no process left); str() is user-facing."""


@dataclass
class StackDump:
    """A taken dump: the host, the pids asked for (at most MAX_PIDS), one ProcessDump per pid, and the rank each
    pid's command line names (`labels`, pid -> `TP3`; see bot.core.stackgroups.rank_label)."""

    host: str
    pids: list[int]
    dumps: list[ProcessDump] = field(default_factory=list)
    labels: dict[int, str] = field(default_factory=dict)

    def ranks(self) -> list[tuple[str, ProcessDump]]:
        """(label, dump) of every rank: the processes whose command line names a rank; when none does, every
        dumped process, labelled `pid N`."""
        named = [(self.labels[d.pid], d) for d in self.dumps if d.pid in self.labels]
        return named or [(f"pid {d.pid}", d) for d in self.dumps]

    def summary(self) -> CrossRankSummary:
        """The cross-rank summary of the ranks (bot.core.stackgroups.summarize_ranks)."""
        return summarize_ranks(self.ranks())

    @property
    def ok(self) -> bool:
        """True when at least one process was dumped."""
        return any(d.ok for d in self.dumps)


class StackService:
    """`py-spy dump --json` of every live process of a launch (`sudo -n` when the host's `py_spy_sudo`)."""

    def __init__(self, hosts: HostService, launches: LaunchService, audit: Audit):
        self._hosts = hosts
        self._launches = launches
        self._audit = audit

    async def dump(self, la: Launch, *, native: bool, user: str, channel: str | None = None,
                   timeout_s: int = 20, ranks_only: bool = False) -> StackDump:
        """Probe the launch's processes (no GPUs, no port: a wedged GPU must not delay the dump of a hung
        server), then `dump_processes`. Raises StackDumpError when the host cannot be read or no process of
        the launch is alive. A launch across nodes: every rank's node, in one StackDump (`_dump_ranks`)."""
        ranks = self._launches.runner(la).stack_targets(la)
        if ranks is not None:
            return await self._dump_ranks(la, ranks, native=native, user=user, channel=channel, timeout_s=timeout_s,
                                          ranks_only=ranks_only)
        req = self._launches.launch_probe_request(la, tail_lines=1, gpu=False, port=False)
        snap = await self._hosts.probe(la.host, req)
        if isinstance(snap, HostFailure):
            raise StackDumpError(snap.reason)
        return await self.dump_processes(la, self._launches.launch_processes_of(la, snap), native=native,
                                         user=user, channel=channel, timeout_s=timeout_s, ranks_only=ranks_only)

    async def _dump_ranks(self, la: Launch, ranks: list[tuple[int, str, str | None]], **options: Any) -> StackDump:
        """The dump of every rank of a launch across nodes, each on its node (bot.core.ranks.rank_view), merged:
        host `n1, n2`, each process labelled `NODE:LABEL` (its rank label, else `pid N`), so the cross-rank summary
        spans the nodes. A node that cannot be dumped is left out; raises StackDumpError when none could be."""
        errors = [f"rank {rank} on {node}: not a host of the config" for rank, node, host in ranks if host is None]
        reachable = [(rank, node, host) for rank, node, host in ranks if host is not None]
        got = await asyncio.gather(*(self.dump(rank_view(la, rank, host), **options) for rank, _, host in reachable),
                                   return_exceptions=True)  # every node at once: a hang alert waits for the slowest
        parts: list[tuple[str, StackDump]] = []
        for (rank, node, _), res in zip(reachable, got, strict=True):
            if isinstance(res, StackDumpError):
                errors.append(f"rank {rank} on {node}: {res}")
            elif isinstance(res, BaseException):
                raise res
            else:
                parts.append((node, res))
        if not parts:
            raise StackDumpError("; ".join(errors) or f"{la.name} runs on no node yet")
        merged = StackDump(", ".join(node for node, _ in parts), [pid for _, d in parts for pid in d.pids],
                           [x for _, d in parts for x in d.dumps])
        for node, d in parts:
            named = d.labels or {x.pid: f"pid {x.pid}" for x in d.dumps}
            merged.labels.update({pid: f"{node}:{label}" for pid, label in named.items()})
        return merged

    async def dump_processes(self, la: Launch, procs: list[ProcessInfo], *, native: bool, user: str,
                             channel: str | None = None, timeout_s: int = 20,
                             ranks_only: bool = False) -> StackDump:
        """Dump `procs` (the launch's live processes, from a probe just taken) but its wrapper shell, with
        `--native` C frames when `native`, each under a `timeout_s`-second py-spy timeout, all at once; the
        next readiness check does not count the CPU time of the dump as progress. Per-process failures
        (py-spy missing, no ptrace permission, sudo refused, py-spy timeout) are in the ProcessDumps; raises
        StackDumpError when no process is left or the host cannot run the script. `ranks_only`: only the
        processes whose command line names a rank, when any does (the watcher's dump on a hang). Audited as
        `stack_dump`."""
        # the launch's wrapper shell (its process group leader, the server's parent) has no Python stack
        wrapper = la.pgid if la.pgid is not None and la.pgid != la.pid else None
        candidates = [p for p in procs if p.pid != wrapper]
        if ranks_only and any(rank_label(p.args) for p in candidates):
            candidates = [p for p in candidates if rank_label(p.args)]
        pids = sorted({p.pid for p in candidates})[:MAX_PIDS]
        if not pids:
            raise StackDumpError("no process of this launch is alive")
        self._launches.note_activity(la.id)  # py-spy's own work is no progress of the launch
        try:
            out = await self.dump_pids(la.host, pids, native=native, timeout_s=timeout_s)
        finally:
            self._launches.note_activity(la.id)
        out.labels = {p.pid: label for p in procs if p.pid in out.pids and (label := rank_label(p.args))}
        self._audit.record(user_id=user, action="stack_dump", args={"launch": la.name, "pids": out.pids},
                           result="ok" if out.ok else "error", launch_id=la.id, host=la.host, channel=channel)
        return out

    async def dump_pids(self, host: str, pids: list[int], *, native: bool = False, timeout_s: int = 20) -> StackDump:
        """Dump the given pids on `host` in one command (each under `timeout -k 5 timeout_s`). Raises ValueError
        for bad pids (before anything runs) and StackDumpError when the host cannot run the script."""
        host_cfg = self._hosts.host_config(host)
        pid_list = check_pids(pids)
        script = dump_script(pid_list, sudo=host_cfg.py_spy_sudo, native=native, timeout_s=timeout_s,
                             py_spy=host_cfg.py_spy)
        try:
            res = await self._hosts.executor(host).run("sh -s", input=script.encode(),
                                                       timeout_s=script_budget_s(len(pid_list), timeout_s))
        except RemoteError as e:
            raise StackDumpError(str(e)) from None
        return StackDump(host, pid_list, finish_dumps(pid_list, res.stdout, res.stderr, res.exit_status,
                                                      res.exit_signal))
