"""Where a launch goes when its variant names a host group (`host: group:h200`) or a number of GPUs (`gpu_count`)
instead of fixed GPUs (pure): which hosts to try, in which order, and which of a host's free GPUs to take.

The order is best fit: of the hosts with enough free GPUs, first the one with the fewest free GPUs (so whole hosts
stay free for launches that need a whole host), then the least busy, then by name. The choice is made twice: once
over a status of every host of the group (the order), then again on each host tried, under that host's launch lock,
from a fresh probe and the launches recorded in the database (the claims): a launch is recorded with its GPUs
before it starts, so a second launch placed at the same moment sees the first one's GPUs as taken.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bot.core.fleet import HostLine

#: The prefix of a variant's `host:` that names a host group.
GROUP_PREFIX = "group:"


@dataclass(frozen=True)
class PlacementPlan:
    """What a launch must find: `hosts` to choose from (a group's hosts, or the one host named), `count` GPUs
    (`gpus` when fixed indexes are needed), the `group` named (None for one host) and `prefer`, the GPUs to take
    when all of them are free (a relaunch keeps its GPUs)."""

    hosts: tuple[str, ...]
    count: int
    gpus: tuple[int, ...] = ()
    group: str | None = None
    prefer: tuple[int, ...] = ()

    @property
    def stand_in_gpus(self) -> tuple[int, ...]:
        """GPUs to render the variant with before any are picked (checking its params and templates): the fixed
        ones, else indexes 0..count-1."""
        return self.gpus or tuple(range(self.count))

    @property
    def where(self) -> str:
        """`group h200` or `host gpu-01`, for messages."""
        return f"group {self.group}" if self.group else f"host {self.hosts[0]}"


@dataclass
class PlacementNote:
    """Why a launch went where it did: `host`, its `gpus`, how many free GPUs the host had (`free_there`), and the
    hosts passed over, each with its reason (`skipped`: host -> reason), and how many hosts had room (`fitting`)."""

    host: str
    gpus: tuple[int, ...]
    free_there: int
    plan: PlacementPlan
    skipped: dict[str, str] = field(default_factory=dict)
    fitting: int = 1

    def describe(self) -> str:
        """One line for the thread: `Placed on gpu-03, GPUs 2,3: best fit in group h200 (gpu-03 had 4 free GPUs, the
        fewest of the 12 hosts with room); passed over: 1 down (gpu-07), 3 too few free GPUs`."""
        gpus = ",".join(map(str, self.gpus))
        head = f"Placed on {self.host}, GPU{'' if len(self.gpus) == 1 else 's'} {gpus}"
        free = f"{self.free_there} free GPU{'' if self.free_there == 1 else 's'}"
        if not self.plan.group:
            return f"{head} ({free} there)"
        hosts: dict[str, list[str]] = {}
        for host, reason in self.skipped.items():
            hosts.setdefault(reason.split(":", 1)[0], []).append(host)
        # the hosts that are down are named (someone should look at them); the others are counted
        rest = ", ".join(f"{len(names)} {kind}" + (f" ({', '.join(sorted(names)[:5])}"
                                                   f"{', …' if len(names) > 5 else ''})" if kind == "down" else "")
                         for kind, names in sorted(hosts.items()))
        room = f"the fewest of the {self.fitting} hosts with room" if self.fitting > 1 else "the only host with room"
        return f"{head}: best fit in {self.plan.where} ({self.host} had {free}, {room})" + (
            f"; passed over: {rest}" if rest else "")


def order_hosts(lines: Sequence[HostLine], plan: PlacementPlan) -> tuple[list[str], dict[str, str]]:
    """The hosts of `lines` to try for `plan`, best fit first, and the others with why they cannot take it now
    (`down: ...`, `too few free GPUs: ...`, `GPUs taken: ...`)."""
    fits: list[HostLine] = []
    skipped: dict[str, str] = {}
    for line in lines:
        if line.failed:
            skipped[line.name] = f"down: {line.reason[:120]}"
        elif plan.gpus and not set(plan.gpus) <= set(line.free):
            taken = sorted(set(plan.gpus) - set(line.free))
            skipped[line.name] = f"GPUs taken: {','.join(map(str, taken))} not free"
        elif len(line.free) < plan.count:
            skipped[line.name] = f"too few free GPUs: {len(line.free)} of {line.gpus} free"
        else:
            fits.append(line)
    fits.sort(key=lambda h: (len(h.free), h.util_pct if h.util_pct is not None else 101.0, h.name))
    return [h.name for h in fits], skipped


def pick_gpus(free: Sequence[int], plan: PlacementPlan) -> tuple[int, ...] | None:
    """The GPUs to take of a host's `free` ones: the plan's fixed `gpus` when all are free, else its `prefer`red
    ones when all are free, else the `count` lowest free indexes; None when there are too few."""
    have = set(free)
    if plan.gpus:
        return tuple(plan.gpus) if set(plan.gpus) <= have else None
    if plan.prefer and len(plan.prefer) == plan.count and set(plan.prefer) <= have:
        return tuple(sorted(plan.prefer))
    chosen = sorted(have)[:plan.count]
    return tuple(chosen) if len(chosen) == plan.count else None
