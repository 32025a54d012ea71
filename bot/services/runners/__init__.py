"""Runners: how a launch of each kind runs (bot.core.models.LaunchKind), behind one protocol that every kind answers:
render and start it, look at it (rank 0 and every rank), stop it, where its log and its stacks are, the parts of its
bundle. `runner_for` chooses the runner of a variant, `Runners.of` the runner of a recorded launch: the only places
that read the kind. A runner gets narrow collaborators (host access, probes of a launch, the process killer, a Slurm
client), never `LaunchService`, and it *returns* outcomes (`Begun`, KillOutcome) that `LaunchService` applies once for
every kind: the record, the thread, the transitions (bot.core.transitions), the audit, the hooks. Two writes of a
runner's own remain, of what only a stop learns: the nodes a Slurm job ran on (SlurmRunner.stop) and the processes a
kill saw (ProcessKiller: `seen_pids`).

What a runner cannot do, it says by raising `Unsupported` (a LaunchError: the user is told why).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from bot.config import Config
from bot.core.lifecycle import KillOutcome, LaunchError, RenderedLaunch
from bot.core.models import Launch, LaunchKind, Snapshot
from bot.core.ranks import NodeLook

#: (rank, node, host) of one rank of a launch: `host` the config's host (or job step) that reaches its node, None
#: when nothing can.
Rank = tuple[int, str, str | None]


class Unsupported(LaunchError):
    """What a runner cannot do (said to the user as a LaunchError)."""


@dataclass
class Begun:
    """What a runner's `start` did, for LaunchService to apply. `fields`: recorded with the `started` event (the
    server's PID and process group, or the Slurm job); None when it did not start, then `failed` says why (the
    `start_failed` state detail and the audit's) and `error` what the launcher is told. `cancelled`: it was killed
    while it started and the runner stopped what it had started (why; `fields` recorded with it). `detail`: the
    audit's detail once started; `passed`: checks the start itself passed (sbatch accepted it); `first_look`: a
    process tree that is looked at once `start_check_s` after it started (gone: its early exit); `host`: where it
    ran, as the outcome names it; `audit_host`: the host the audit names. `then`: what the runner does once this
    outcome is recorded (a Slurm job read back once its id is recorded, so a kill meanwhile cancels it; the ranks a
    failed start left, stopped once the failure is recorded); it returns fields to record then, on a launch still
    `running` (none for a failure)."""

    fields: dict[str, Any] | None = None
    failed: str | None = None
    error: str | None = None
    cancelled: str | None = None
    detail: str = ""
    passed: list[str] = field(default_factory=list)
    first_look: bool = False
    host: str | None = None
    audit_host: str | None = None
    then: Callable[[Launch], Awaitable[dict[str, Any]]] | None = None


class Runner(Protocol):
    """One kind of launch. Every method but the starts answers for a recorded launch of this kind."""

    kind: LaunchKind
    #: it runs beyond one process tree on its host (ranks on nodes, a job): its own checks (its job, every rank)
    #: decide when it ended, never one host's look, and a kill before its PID was recorded still stops it
    spans: bool
    #: its host and GPUs are picked by placement (bot.core.placement) under each host's launch decision
    placed: bool
    #: a scheduler owns its life (a Slurm job): each check reads the job first, and Slurm's word decides whether it
    #: waits, was requeued or ended
    scheduled: bool

    def plan(self, variant: str, params: Mapping[str, str]) -> list[RenderedLaunch]:
        """The variant rendered for its pre-launch checks (one per rank; ids 0). Raises LaunchError for bad input."""
        ...

    def decides_on(self, previews: Sequence[RenderedLaunch]) -> list[str]:
        """The hosts whose launch decision a start takes (each locked and checked first); [] for none."""
        ...

    def shown_host(self, previews: Sequence[RenderedLaunch]) -> str:
        """Where it runs, as a refused launch's outcome names it."""
        ...

    def row(self, variant: str, previews: Sequence[RenderedLaunch]) -> dict[str, Any]:
        """The fields its row is recorded with (host, port, gpus, nodes)."""
        ...

    def audit_args(self, variant: str, previews: Sequence[RenderedLaunch], params: Mapping[str, Any]
                   ) -> dict[str, Any]:
        """The audit's args of its launch (`params` as recorded: secrets masked)."""
        ...

    def render(self, variant: str, params: Mapping[str, str], la: Launch) -> list[RenderedLaunch]:
        """The launch recorded as `la`, rendered (rank 0 first)."""
        ...

    async def start(self, la: Launch, rendered: Sequence[RenderedLaunch]) -> Begun:
        """Start `rendered` for `la` (recorded `starting`). Never raises for remote failures (`Begun.failed`)."""
        ...

    async def undo(self, la: Launch, out: KillOutcome) -> KillOutcome:
        """Stop what `start` started of `la`, killed while it started. Raises RemoteError."""
        ...

    async def stop(self, la: Launch, out: KillOutcome) -> KillOutcome:
        """Stop all of `la`, verified, into `out`. Raises RemoteError."""
        ...

    def rank0(self, la: Launch) -> Launch:
        """`la` as the launch on the host its rank 0 (its server, its log) can be probed on."""
        ...

    def ranks(self, la: Launch) -> list[Rank]:
        """Every rank of `la`, rank order ([] for a launch on one host)."""
        ...

    def where(self, la: Launch) -> str:
        """Where `la` runs, as a kill's preview names it."""
        ...

    def stack_targets(self, la: Launch) -> list[Rank] | None:
        """The ranks whose processes a stack dump reaches, each on its node; None: `la` itself, on its host."""
        ...

    async def look_ranks(self, la: Launch, ranks: Sequence[Rank]) -> list[NodeLook]:
        """One look at each of `ranks`. Never raises. Raises Unsupported for a launch on one host."""
        ...

    def node_look(self, view: Launch, rank: int, node: str, snap: Snapshot, verdict: str | None = None) -> NodeLook:
        """What `snap`, a probe of rank `rank` as `view`, says of it. Raises Unsupported for a launch on one host."""
        ...

    async def bundle_parts(self, la: Launch) -> tuple[dict[str, str], list[str]]:
        """The files its bundle holds beyond every rank's (name -> text), and what could not be collected."""
        ...

    def unreachable_rank0(self, la: Launch, node: str) -> str:
        """Why rank 0 on `node` (no host of the config) cannot be collected."""
        ...


def runner_for(config: Config, variant: str, host: str | None, runners: Mapping[LaunchKind, Runner]
               ) -> Runner | None:
    """The runner of `variant` (a Slurm variant, one with `hosts:`, else one process tree on a host), chosen from
    `runners`; None for a variant the config does not have. Raises LaunchError for a `host=` a variant that spans
    nodes cannot take."""
    if variant not in config.variants:
        return None
    v = config.resolved_variant(variant)
    kind = config.runner_of(v)
    if kind != "slurm" and not v.hosts:
        return runners[LaunchKind.HOST]
    if host is not None and host != v.host:
        where = "where Slurm places it" if kind == "slurm" else f"on its hosts {', '.join(v.hosts or [])}"
        raise LaunchError(f"{variant} runs {where}; leave out host=")
    return runners[LaunchKind.SLURM if kind == "slurm" else LaunchKind.HOSTS]


__all__ = ["Begun", "Rank", "Runner", "Unsupported", "runner_for"]
