"""Who holds which GPU: the GPU holders of a snapshot attributed to the bot's launches (by tag; else orphan or
foreign), the GPU status of hosts with their holders, one GPU's holders (`whois`), and the fleet's lines and the
digest's notes built from a status already probed.

Guarantees: the launches are read once for every host of a status (not once per host); a launch across nodes holds
GPUs on each of its nodes; nothing here raises for a host that cannot be read (a HostFailure, or `error`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from bot.config import Config
from bot.core.clock import Clock
from bot.core.fleet import DigestNotes, HostLine, digest_notes, host_line
from bot.core.lifecycle import DEFAULT_GPU_FREE_MIB, Holder, attribute_holders, holder_labels
from bot.core.models import GpuReading, HostFailure, Launch, Snapshot
from bot.services.hosts import HostService


class LaunchReader(Protocol):
    """What GPU holders read of the launches (bot.adapters.store.launches.LaunchRepository's reads)."""

    def recent(self, limit: int = 20) -> list[Launch]: ...

    def live(self, host: str | None = None, variant: str | None = None) -> list[Launch]: ...


@dataclass
class GpuWhois:
    """Who holds one GPU (GpuHolders.whois): `gpu` its reading (None when the host has no such index; `gpus`
    the indexes it has), `holders` the processes with memory on it, `elapsed_s` each holder's age (pid -> seconds),
    `launches` the launches they belong to (id -> Launch), `claims` the live launches that claim the GPU, `error`
    why the host or its GPUs could not be read."""

    host: str
    index: int
    gpu: GpuReading | None = None
    gpus: list[int] = field(default_factory=list)
    holders: list[Holder] = field(default_factory=list)
    elapsed_s: dict[int, int | None] = field(default_factory=dict)
    launches: dict[int, Launch] = field(default_factory=dict)
    claims: list[Launch] = field(default_factory=list)
    error: str | None = None
    gpu_free_mib: float = DEFAULT_GPU_FREE_MIB


class GpuHolders:
    """GPU holders of `hosts`, attributed to the launches `rows` reads; free below the config's `gpu_free_mib`."""

    def __init__(self, config: Config, hosts: HostService, rows: LaunchReader, clock: Clock) -> None:
        self.config = config
        self.hosts = hosts
        self._rows = rows
        self._clock = clock

    def holders(self, snap: Snapshot, host_launches: Sequence[Launch] | None = None) -> list[Holder]:
        """GPU holders of a snapshot, attributed to this host's launches by tag (or orphan / foreign).
        `host_launches`: the host's recent launches when the caller has read them already (else read here)."""
        if host_launches is None:
            host_launches = [la for la in self._rows.recent(200) if la.host == snap.host or snap.host in la.nodes]
        return attribute_holders(snap.gpu, snap.table, host_launches, snap.launch_tags)

    def owners(self, snap: Snapshot, host_launches: Sequence[Launch] | None = None) -> dict[int, str]:
        """pid -> owner label (`base#12 by U0ALICE`, `orphan of base#12 by U0ALICE`, `foreign · bob`: Holder.label)
        of each GPU holder in `snap` (`host_launches` as `holders` takes them)."""
        return holder_labels(self.holders(snap, host_launches))

    async def status(self, hosts: Sequence[str]
                     ) -> tuple[list[Snapshot | HostFailure], dict[str, list[Holder]], dict[str, list[Launch]]]:
        """GPU status of `hosts` probed in parallel (one result per host, in order; a failing host is a
        HostFailure), each host's GPU holders attributed to its launches (Holder; labels: Holder.label), and each
        host's recent launches (read once for every host)."""
        by_host: dict[str, list[Launch]] = {}
        for la in self._rows.recent(200):  # read once for every host, not once per host
            for h in dict.fromkeys([la.host, *la.nodes]):  # a launch across nodes holds GPUs on each
                by_host.setdefault(h, []).append(la)
        keep = {h: [la.pid for la in by_host.get(h, ()) if la.pid] for h in hosts}
        results = await self.hosts.status(list(hosts), keep_pids=keep)
        holders = {r.host: self.holders(r, by_host.get(r.host, [])) for r in results
                   if not isinstance(r, HostFailure)}
        return results, holders, by_host

    async def whois(self, host: str, index: int) -> GpuWhois:
        """Who holds GPU `index` of `host` now: its reading, each holder (its launch and the Slack user who launched
        it, or foreign with its user on the host), how long each has run (seconds), and the live launches that claim
        the GPU (a launch still loading holds no memory yet). Never raises for remote failures (`error`)."""
        results, holders_of, recent_of = await self.status([host])
        result = results[0]
        live = [la for la in self._rows.live(host) if not la.gpus or index in la.gpus]
        if isinstance(result, HostFailure):
            return GpuWhois(host=host, index=index, error=result.reason, claims=live)
        if not result.gpu.ok:
            return GpuWhois(host=host, index=index, error=result.gpu.error or "GPU readings missing", claims=live)
        gpu = next((g for g in result.gpu.gpus if g.index == index), None)
        holders = [h for h in holders_of.get(host, ()) if h.gpu_index == index]
        rows = {p.pid: p for p in result.table}
        by_id = {la.id: la for la in recent_of.get(host, ())}
        return GpuWhois(host=host, index=index, gpu=gpu, gpus=[g.index for g in result.gpu.gpus], holders=holders,
                        elapsed_s={h.pid: rows[h.pid].elapsed_s for h in holders if h.pid in rows},
                        launches={h.launch_id: by_id[h.launch_id] for h in holders
                                  if h.launch_id is not None and h.launch_id in by_id},
                        claims=live, gpu_free_mib=self.config.lifecycle.gpu_free_mib)

    async def fleet(self, hosts: Sequence[str]) -> list[HostLine]:
        """One line per host of `hosts`, in order (bot.core.fleet): its GPUs free and used (free: under the config's
        `gpu_free_mib` and claimed by no live launch), utilisation, memory, its live launches and foreign holders,
        or why it could not be read."""
        results, holders, _ = await self.status(hosts)
        return self.fleet_lines(results, holders)

    def fleet_lines(self, results: Sequence[Snapshot | HostFailure],
                    holders: Mapping[str, Sequence[Holder]]) -> list[HostLine]:
        """`fleet`'s lines from a status already probed (`status`'s results and holders)."""
        live: dict[str, list[Launch]] = {}
        for la in self._rows.live():
            for h in dict.fromkeys([la.host, *la.nodes]):
                live.setdefault(h, []).append(la)
        free_mib = self.config.lifecycle.gpu_free_mib
        return [host_line(r, live.get(r.host, []), holders.get(r.host, ()), free_mib,
                          cfg.group if (cfg := self.config.hosts.get(r.host)) is not None else None)
                for r in results]

    def digest_notes(self, results: Sequence[Snapshot | HostFailure], holders: Mapping[str, Sequence[Holder]],
                     recent: Mapping[str, Sequence[Launch]]) -> DigestNotes:
        """The digest's notes (bot.core.fleet.digest_notes) from a status already probed (`status`'s three parts):
        idle GPUs held for more than an hour, failed launches not cleaned up, unreachable hosts."""
        return digest_notes(results, holders, [la for las in recent.values() for la in las], now=self._clock.time(),
                            gpu_free_mib=self.config.lifecycle.gpu_free_mib)
