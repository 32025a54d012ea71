"""A fleet in one screen (pure): each host's status as one line (free and used GPUs, utilisation, memory, the launches
on it), the fleet's totals, and which hosts have N free GPUs, best first.

A GPU is free when it uses less than `gpu_free_mib` MiB and no live launch of ours claims it: a launch claims the
GPUs its variant names, or every GPU of its host when it names none (the same rule as the pre-launch checks of
bot.core.lifecycle), so a launch still loading its weights, whose memory does not show yet, already holds its GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bot.core.models import GpuSection, HostFailure, Launch, Snapshot

#: A status of more hosts than this is a fleet view (one line per host) unless every table is asked for.
TABLES_UP_TO = 8


@dataclass(frozen=True)
class HostLine:
    """One host of the fleet: `free` the indexes of its free GPUs, `gpus` how many it has, `util_pct` its GPUs'
    mean utilisation (None when unknown), `used_mib` / `total_mib` memory over all its GPUs, `launches` the names of
    the live launches of ours on it, `foreign` how many GPU holders are no launch of ours; `reason` why it could not
    be read (then `failed`)."""

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


def host_line(result: Snapshot | HostFailure, live: Sequence[Launch], owners: Mapping[int, str],
              gpu_free_mib: float, group: str | None = None) -> HostLine:
    """The line of one host from its status probe, its live launches and its holders' owner labels (pid -> label,
    `foreign` for a holder that is no launch of ours)."""
    if isinstance(result, HostFailure):
        return HostLine(name=result.host, group=group, failed=True, reason=result.reason,
                        launches=tuple(la.name for la in live))
    gpu = result.gpu
    if not gpu.ok:
        return HostLine(name=result.host, group=group, failed=True, reason=gpu.error or "GPU readings missing",
                        launches=tuple(la.name for la in live))
    utils = [g.utilization_gpu_pct for g in gpu.gpus if g.utilization_gpu_pct is not None]
    foreign = sum(1 for p in gpu.processes if owners.get(p.pid, "foreign") == "foreign")
    return HostLine(
        name=result.host, group=group, gpus=len(gpu.gpus), free=free_gpus(gpu, live, gpu_free_mib),
        util_pct=sum(utils) / len(utils) if utils else None,
        used_mib=sum(g.memory_used_mib or 0.0 for g in gpu.gpus),
        total_mib=sum(g.memory_total_mib or 0.0 for g in gpu.gpus),
        launches=tuple(la.name for la in live), foreign=foreign)


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
