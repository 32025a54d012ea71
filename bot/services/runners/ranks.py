"""What every launch across nodes shares (bot.core.ranks): its ranks, each on its node (rank K on `nodes[K]`, its
processes tagged `<tag>-rK`, its own log), rank 0 as the launch's face (its server, its log), one look at every rank,
and a kill of every rank, verified on its node as any kill is, their outcomes merged into one.

Guarantees: a node that is no host of the config (and that its runner cannot reach otherwise) is never probed nor
signalled: its rank is told as not reachable; looks and kills of the ranks run in parallel and never raise for one
rank's host (its error is in its NodeLook or its part of the kill).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from bot.adapters.remote import RemoteError
from bot.config import Config
from bot.core.lifecycle import KillOutcome
from bot.core.models import HostFailure, Launch, Snapshot
from bot.core.ranks import NodeLook, rank_view
from bot.services.hosts import HostService
from bot.services.probes import LaunchProbes
from bot.services.runners import Rank
from bot.services.runners.kill import ProcessKiller


class RankedRunner:
    """The part of a runner of launches across nodes that does not depend on how their ranks were started."""

    def __init__(self, config: Config, hosts: HostService, probes: LaunchProbes, killer: ProcessKiller) -> None:
        self.config = config
        self.hosts = hosts
        self.probes = probes
        self.killer = killer

    def _reach(self, la: Launch, node: str) -> str | None:
        """The host that reaches `node`, a node that is no host of the config; None: nothing does."""
        return None

    def ranks(self, la: Launch) -> list[Rank]:
        """(rank, node, host) of each rank of `la`, rank order: host is the config's host of that name, probed over
        SSH, else what the runner reaches the node through (`_reach`); None for a node nothing can reach (then rank
        0's files are read on the launch's host, rank0)."""
        hosts = self.config.hosts
        return [(k, node, node if node in hosts else self._reach(la, node)) for k, node in enumerate(la.nodes)]

    def rank0(self, la: Launch) -> Launch:
        """Rank 0 as a launch on its node (bot.core.ranks.rank_view); a launch on no node yet, or whose first node
        nothing reaches, is `la` itself (on its host)."""
        ranks = self.ranks(la)
        if not ranks or ranks[0][2] is None:
            return la
        return rank_view(la, 0, ranks[0][2])

    def stack_targets(self, la: Launch) -> list[Rank] | None:
        """Every rank, each dumped on its node."""
        return self.ranks(la)

    async def look_ranks(self, la: Launch, ranks: Sequence[Rank]) -> list[NodeLook]:
        """One probe of each of `ranks` (in parallel): whether its processes run, how long its log has been silent,
        its last log line and its GPUs' utilisation. Never raises (a node that cannot be read says why)."""
        async def one(rank: int, node: str, host: str | None) -> NodeLook:
            if host is None:
                return NodeLook(rank, node, None, error="not a host of the config; it cannot be probed")
            view = rank_view(la, rank, host)
            res = await self.probes.probe(host, self.probes.request(view, tail_lines=5, port=False))
            if isinstance(res, HostFailure):
                return NodeLook(rank, node, None, error=res.reason)
            return self.node_look(view, rank, node, res)

        return list(await asyncio.gather(*(one(*r) for r in ranks)))

    def node_look(self, view: Launch, rank: int, node: str, snap: Snapshot, verdict: str | None = None) -> NodeLook:
        """What `snap` (a probe of rank `rank` as `view`) says of that rank (bot.core.ranks.NodeLook)."""
        procs = self.probes.processes_of(view, snap)
        pids = {p.pid for p in procs}
        held = {gp.gpu_index for gp in snap.gpu.processes if gp.pid in pids} if snap.gpu.ok else set()
        utils = [g.utilization_gpu_pct for g in snap.gpu.gpus if g.index in held and g.utilization_gpu_pct is not None]
        silent = snap.log.seconds_since_write(snap.clock) if snap.log is not None else None
        last = next((ln for ln in reversed(snap.log.tail) if ln.strip()), None) if snap.log else None
        return NodeLook(rank, node, bool(procs), silent_s=silent, last_line=last,
                        gpu_util=sum(utils) / len(utils) if utils else None, verdict=verdict)

    async def bundle_parts(self, la: Launch) -> tuple[dict[str, str], list[str]]:
        """No files beyond every rank's."""
        return {}, []

    def unreachable_rank0(self, la: Launch, node: str) -> str:
        """Why rank 0 on `node` cannot be collected."""
        return f"node {node} is not a host of the config"

    async def stop_ranks(self, la: Launch, out: KillOutcome, said: list[str], *, partial: bool = False,
                         whole_job: bool = False) -> KillOutcome:
        """Stop, on every rank's node, what is left of the rank (its tagged processes), verified as any kill is; the
        outcomes of all ranks merged into `out` with what was `said` already. `partial`: part of it was stopped
        already; `whole_job`: something beyond the ranks (a job) was there to stop. A node reached through the
        runner (no host of the config) is the runner's to clean and is left alone."""
        parts = await asyncio.gather(*(self._kill_rank(la, k, node, host if host in self.config.hosts else None)
                                       for k, node, host in self.ranks(la)))
        for part in parts:
            out.signalled += part.signalled
            out.remaining += part.remaining
            out.still_holding += part.still_holding
            out.used_sigkill = out.used_sigkill or part.used_sigkill
            for name in ("mem_before_mib", "mem_after_mib"):
                a, b = getattr(out, name), getattr(part, name)
                setattr(out, name, b if a is None else a if b is None else a + b)
            if part.error:
                said.append(part.error)
            if part.gpu_error:
                out.gpu_error = part.gpu_error
        if said:
            out.error = "; ".join(said)
            # part of it was stopped: the job's scancel accepted, or a rank's host reached and its processes stopped
            out.partial = partial or any(not p.error and p.signalled for p in parts)
        out.nothing_to_kill = not whole_job and all(p.nothing_to_kill for p in parts)
        out.released = not out.error and all(p.released or p.nothing_to_kill for p in parts)
        return out

    async def _kill_rank(self, la: Launch, rank: int, node: str, host: str | None) -> KillOutcome:
        target = f"{la.name} rank {rank} on {node}"
        if host is None:
            return KillOutcome(target=target, nothing_to_kill=True, released=True)
        try:
            return await self.killer.stop(rank_view(la, rank, host), KillOutcome(target=target, host=host))
        except RemoteError as e:
            return KillOutcome(target=target, host=host, error=f"{node}: {e}")
