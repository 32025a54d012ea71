"""A fleet in one screen (pure): each host's status as one line (free and used GPUs, utilisation, memory, the launches
on it), the fleet's totals, and which hosts have N free GPUs, best first.

A GPU is free when it uses less than `gpu_free_mib` MiB and no live launch of ours claims it: a launch claims the
GPUs its variant names, or every GPU of its host when it names none (the same rule as the pre-launch checks of
bot.core.lifecycle), so a launch still loading its weights, whose memory does not show yet, already holds its GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bot.core.commands import slash
from bot.core.lifecycle import Holder
from bot.core.models import GpuSection, HostFailure, Launch, LaunchState, Snapshot

#: A status of more hosts than this is a fleet view (one line per host) unless every table is asked for.
TABLES_UP_TO = 8


@dataclass(frozen=True)
class HostLine:
    """One host of the fleet: `free` the indexes of its free GPUs, `gpus` how many it has, `util_pct` its GPUs'
    mean utilisation (None when unknown), `used_mib` / `total_mib` memory over all its GPUs, `launches` the names of
    the live launches of ours on it, `foreign` how many GPU holders are no launch of ours (`foreign_users`: their users
    on the host); `reason` why it could not be read (then `failed`)."""

    name: str
    group: str | None = None
    failed: bool = False
    reason: str = ""
    gpus: int = 0
    free: tuple[int, ...] = ()
    util_pct: float | None = None
    used_mib: float = 0.0
    total_mib: float = 0.0
    launches: tuple[str, ...] = ()
    foreign: int = 0
    foreign_users: tuple[str, ...] = ()

    @property
    def used(self) -> int:
        """GPUs that are not free."""
        return self.gpus - len(self.free)


@dataclass(frozen=True)
class FleetSummary:
    """Totals over a fleet's lines: hosts up and down, GPUs free and used, live launches, and the lines by group
    (`groups`: group name or "" -> its lines, in the order given)."""

    hosts: int
    up: int
    down: int
    gpus: int
    free: int
    launches: int
    groups: dict[str, list[HostLine]] = field(default_factory=dict)


def free_gpus(gpu: GpuSection, live: Iterable[Launch], gpu_free_mib: float) -> tuple[int, ...]:
    """Indexes of the GPUs of `gpu` that use less than `gpu_free_mib` MiB and that no launch of `live` (the host's
    live launches) claims; () when the GPUs could not be read."""
    if not gpu.ok:
        return ()
    claimed: set[int] = set()
    for la in live:
        if not la.gpus:
            return ()  # a launch that names no GPUs may use all of them
        claimed.update(la.gpus)
    return tuple(g.index for g in gpu.gpus
                 if g.memory_used_mib is not None and g.memory_used_mib < gpu_free_mib and g.index not in claimed)


def host_line(result: Snapshot | HostFailure, live: Sequence[Launch], holders: Sequence[Holder],
              gpu_free_mib: float, group: str | None = None) -> HostLine:
    """The line of one host from its status probe, its live launches and its GPU holders (attributed:
    bot.core.lifecycle.attribute_holders; one without a launch is foreign)."""
    if isinstance(result, HostFailure):
        return HostLine(name=result.host, group=group, failed=True, reason=result.reason,
                        launches=tuple(la.name for la in live))
    gpu = result.gpu
    if not gpu.ok:
        return HostLine(name=result.host, group=group, failed=True, reason=gpu.error or "GPU readings missing",
                        launches=tuple(la.name for la in live))
    utils = [g.utilization_gpu_pct for g in gpu.gpus if g.utilization_gpu_pct is not None]
    strangers = [h for h in holders if h.launch_id is None]
    users = tuple(sorted({h.user for h in strangers if h.user}))
    return HostLine(
        name=result.host, group=group, gpus=len(gpu.gpus), free=free_gpus(gpu, live, gpu_free_mib),
        util_pct=sum(utils) / len(utils) if utils else None,
        used_mib=sum(g.memory_used_mib or 0.0 for g in gpu.gpus),
        total_mib=sum(g.memory_total_mib or 0.0 for g in gpu.gpus),
        launches=tuple(la.name for la in live), foreign=len(strangers), foreign_users=users)


def summarize(lines: Sequence[HostLine]) -> FleetSummary:
    """The fleet's totals and its lines by group (hosts without a group under "")."""
    groups: dict[str, list[HostLine]] = {}
    for line in lines:
        groups.setdefault(line.group or "", []).append(line)
    up = [line for line in lines if not line.failed]
    return FleetSummary(hosts=len(lines), up=len(up), down=len(lines) - len(up), gpus=sum(h.gpus for h in up),
                        free=sum(len(h.free) for h in up), launches=len({n for h in lines for n in h.launches}),
                        groups=groups)


def with_free(lines: Iterable[HostLine], n: int) -> list[HostLine]:
    """The hosts with at least `n` free GPUs, best first: most free GPUs, then the least busy (mean utilisation),
    then by name."""
    fit = [line for line in lines if not line.failed and len(line.free) >= n]
    return sorted(fit, key=lambda h: (-len(h.free), h.util_pct if h.util_pct is not None else 101.0, h.name))


#: A GPU holder older than this (seconds), on a GPU at 0 % utilisation, is an idle GPU held (the digest lists it).
IDLE_HELD_S = 3600.0
#: Verdicts of a launch that is fine or not yet judged: any other one on a live launch is a failure left standing.
_FINE_VERDICTS = frozenset({None, "", "loading", "unknown", "ready"})


@dataclass(frozen=True)
class DigestNotes:
    """What the fleet digest points out, one line each: `idle` GPUs held for more than IDLE_HELD_S at 0 % now (host,
    GPUs, memory, holders and for how long), `uncleaned` failed launches not yet cleaned up (a live launch whose last
    verdict is a failure, a kill that failed, an ended launch whose processes still hold GPUs), `unreachable` hosts
    (and why)."""

    idle: list[str] = field(default_factory=list)
    uncleaned: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)


def _age(seconds: float) -> str:
    """`5 h`, `2 d`, `45 min`."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 60:.0f} min"


def digest_notes(results: Sequence[Snapshot | HostFailure], holders: Mapping[str, Sequence[Holder]],
                 launches: Sequence[Launch], *, now: float, gpu_free_mib: float,
                 idle_after_s: float = IDLE_HELD_S) -> DigestNotes:
    """The digest's lines from one status of the fleet (`results`), its GPU holders (host -> attributed holders:
    bot.core.lifecycle.attribute_holders) and the recent launches (store Launch objects; `now` epoch seconds). A GPU
    is idle held when it uses at least `gpu_free_mib` MiB, reads 0 % utilisation now, and every process on it has
    run for `idle_after_s` (seconds) or more (one reading: a GPU between requests reads 0 % too, which the line
    says). Never raises for a well-formed status."""
    notes = DigestNotes()
    holding: dict[tuple[str, int], set[int]] = {}  # (host, launch id) -> GPUs its orphaned processes still hold
    for r in results:
        if isinstance(r, HostFailure):
            notes.unreachable.append(f"{r.host}: {' '.join(r.reason.split())[:200]}")
            continue
        if not r.gpu.ok:
            notes.unreachable.append(f"{r.host}: GPUs unreadable: {' '.join((r.gpu.error or '?').split())[:200]}")
            continue
        ages = {p.pid: p.elapsed_s for p in r.table}
        on_gpu: dict[int, list[Holder]] = {}
        for h in holders.get(r.host, ()):
            if h.gpu_index is None:
                continue
            on_gpu.setdefault(h.gpu_index, []).append(h)
            if h.orphan and h.launch_id is not None:
                holding.setdefault((r.host, h.launch_id), set()).add(h.gpu_index)
        idle: dict[tuple[str, ...], list[tuple[int, float, float]]] = {}
        for g in r.gpu.gpus:
            held_by = on_gpu.get(g.index, [])
            known = [ages.get(h.pid) for h in held_by]
            if (not held_by or g.memory_used_mib is None or g.memory_used_mib < gpu_free_mib
                    or g.utilization_gpu_pct is None or g.utilization_gpu_pct > 0
                    or any(a is None or a < idle_after_s for a in known)):
                continue
            who = tuple(sorted({h.label for h in held_by}))
            idle.setdefault(who, []).append((g.index, g.memory_used_mib, min(a for a in known if a is not None)))
        for who, gpus in idle.items():
            indexes = ",".join(str(i) for i, _, _ in gpus)
            gib = sum(m for _, m, _ in gpus) / 1024
            notes.idle.append(f"{r.host} GPU{'' if len(gpus) == 1 else 's'} {indexes}: {gib:.0f} GiB held for "
                              f"{_age(min(a for _, _, a in gpus))}+ at 0% util now, by {'; '.join(who)}")
    for la in launches:
        gpus = sorted(holding.get((la.host, la.id), ()))
        held = f"; its processes still hold GPU{'' if len(gpus) == 1 else 's'} {','.join(map(str, gpus))}" \
            if gpus else ""
        kill = f": `{slash('kill', la.id)}`"
        if la.state == LaunchState.KILL_FAILED:
            notes.uncleaned.append(f"{la.name} on {la.host}: the kill did not finish{held}{kill}")
        elif la.live and la.alert_state not in _FINE_VERDICTS:
            verdict = f"{la.alert_state} at its last check"
            notes.uncleaned.append(f"{la.name} on {la.host}: {verdict}, still live{held}{kill}")
        elif la.state == LaunchState.FAILED and gpus:
            ended = f" {_age(now - la.ended_at)} ago" if la.ended_at else ""
            notes.uncleaned.append(f"{la.name} on {la.host}: failed{ended}{held}{kill}")
    return notes
