"""How a launch's state may change (pure): one table of events, each with the states it may happen in and the
states it may lead to. LaunchService alone applies it (bot.services.launches.LaunchService.transition); the
watcher reports what it saw as an event (`ENDED` by a verdict) instead of writing a state itself."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from bot.core.models import LaunchState

__all__ = ["TRANSITIONS", "InvalidTransition", "LaunchEvent", "being_stopped", "next_state"]

S = LaunchState


class LaunchEvent(StrEnum):
    """What happens to a launch."""

    STARTED = "started"  # its server process (or its Slurm job) was recorded, in the same write: only from starting
    START_FAILED = "start_failed"  # the launch script could not start it
    GONE = "gone"  # no process left: at its first look, or seen at a later launch
    ENDED = "ended"  # a check's verdict ended it (its server is gone): exited, or failed
    CANCELLED = "cancelled"  # killed while starting, before its process was recorded
    KILL_BEGUN = "kill_begun"  # a kill started (of a live launch, or of an ended one's leftovers)
    KILL_ENDED = "kill_ended"  # a kill finished: killed, kill_failed, or the state it had (an error; leftovers)
    KILL_INTERRUPTED = "kill_interrupted"  # a kill broke off (a host error, or the bot stopped during it)
    LEFTOVERS_GONE = "leftovers_gone"  # what a kill left (kill_failed) ended since, its GPU memory released


_LIVE = frozenset({S.STARTING, S.RUNNING, S.KILL_FAILED})
_ENDED = frozenset({S.KILLED, S.EXITED, S.FAILED})

#: event -> (the states it may happen in, the states it may lead to)
TRANSITIONS: Mapping[LaunchEvent, tuple[frozenset[LaunchState], frozenset[LaunchState]]] = MappingProxyType({
    LaunchEvent.STARTED: (frozenset({S.STARTING}), frozenset({S.RUNNING})),
    LaunchEvent.START_FAILED: (frozenset({S.STARTING}), frozenset({S.FAILED})),
    LaunchEvent.GONE: (_LIVE, frozenset({S.EXITED})),
    LaunchEvent.ENDED: (_LIVE, frozenset({S.EXITED, S.FAILED})),
    LaunchEvent.CANCELLED: (frozenset({S.STARTING}), frozenset({S.KILLED})),
    LaunchEvent.KILL_BEGUN: (_LIVE | _ENDED, frozenset({S.STOPPING})),
    LaunchEvent.KILL_ENDED: (frozenset({S.STOPPING}), _LIVE | _ENDED),
    LaunchEvent.KILL_INTERRUPTED: (frozenset({S.STOPPING}), frozenset({S.KILL_FAILED})),
    LaunchEvent.LEFTOVERS_GONE: (frozenset({S.KILL_FAILED}), frozenset({S.KILLED})),
})


class InvalidTransition(ValueError):
    """An event that cannot happen in the launch's state, or cannot lead where it was asked to."""


def next_state(state: LaunchState, event: LaunchEvent, to: LaunchState | None = None) -> LaunchState:
    """The state `event` leads to from `state`: `to` when the event may lead to several (it must be one of them),
    else its only one. Raises InvalidTransition for an event that cannot happen in `state`, or a `to` it cannot
    lead to."""
    sources, targets = TRANSITIONS[event]
    if state not in sources:
        raise InvalidTransition(f"{event.value} cannot happen to a launch that is {state.value}")
    if to is None:
        if len(targets) != 1:
            raise InvalidTransition(f"{event.value} leads to one of {sorted(t.value for t in targets)}: say which")
        (to,) = targets
    if to not in targets:
        raise InvalidTransition(f"{event.value} cannot make a {state.value} launch {to.value}")
    return to


def being_stopped(name: str) -> str:
    """What a command that meets a launch in `stopping` says, wherever it met it (kill, relaunch, the kill's own
    check): one wording."""
    return f"{name} is being stopped by another kill; its answer follows in its thread"
