"""The one table of how a launch's state changes (bot.core.transitions), and its one writer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bot.core.models import LaunchState as S
from bot.core.transitions import TRANSITIONS, InvalidTransition, LaunchEvent, next_state

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("state", "event", "to", "expected"), [
    (S.STARTING, LaunchEvent.STARTED, None, S.RUNNING),
    (S.STARTING, LaunchEvent.START_FAILED, None, S.FAILED),
    (S.RUNNING, LaunchEvent.GONE, None, S.EXITED),
    (S.RUNNING, LaunchEvent.ENDED, S.FAILED, S.FAILED),
    (S.KILL_FAILED, LaunchEvent.ENDED, S.EXITED, S.EXITED),
    (S.STARTING, LaunchEvent.CANCELLED, None, S.KILLED),
    (S.RUNNING, LaunchEvent.KILL_BEGUN, None, S.STOPPING),
    (S.FAILED, LaunchEvent.KILL_BEGUN, None, S.STOPPING),  # the leftovers of an ended launch
    (S.STOPPING, LaunchEvent.KILL_ENDED, S.KILLED, S.KILLED),
    (S.STOPPING, LaunchEvent.KILL_ENDED, S.RUNNING, S.RUNNING),  # a kill that could not reach the host
    (S.STOPPING, LaunchEvent.KILL_INTERRUPTED, None, S.KILL_FAILED),
])
def test_allowed_transitions(state, event, to, expected) -> None:
    assert next_state(state, event, to) == expected


@pytest.mark.parametrize(("state", "event", "to"), [
    (S.STOPPING, LaunchEvent.KILL_BEGUN, None),  # one kill at a time
    (S.KILLED, LaunchEvent.ENDED, S.FAILED),  # a verdict never revives nor re-ends an ended launch
    (S.STOPPING, LaunchEvent.ENDED, S.EXITED),  # a deliberate stop is no verdict's business
    (S.RUNNING, LaunchEvent.STARTED, None),
    (S.RUNNING, LaunchEvent.ENDED, S.KILLED),  # a verdict does not kill
    (S.RUNNING, LaunchEvent.ENDED, None),  # ended how? it must say
    (S.EXITED, LaunchEvent.GONE, None),
])
def test_refused_transitions(state, event, to) -> None:
    with pytest.raises(InvalidTransition):
        next_state(state, event, to)


def test_every_event_is_in_the_table_and_no_event_leaves_stopping_but_a_kills_end() -> None:
    assert set(TRANSITIONS) == set(LaunchEvent)
    leaving_stopping = {e for e, (sources, _) in TRANSITIONS.items() if S.STOPPING in sources}
    assert leaving_stopping == {LaunchEvent.KILL_ENDED, LaunchEvent.KILL_INTERRUPTED}


def test_launch_states_are_written_by_launch_service_alone() -> None:
    # any `state=` handed to a launch row's update, outside LaunchService.transition
    writes = []
    for f in sorted((ROOT / "bot").rglob("*.py")) + sorted((ROOT / "handlers").rglob("*.py")):
        text = f.read_text()
        for m in re.finditer(r"(?:_launches|_launch_rows|launches)\.update(?:_if)?\([^)]*\bstate=", text):
            writes.append(f"{f.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}")
    assert writes == ["bot/services/launches.py:" + str(_transition_write_line())], writes


def _transition_write_line() -> int:
    text = (ROOT / "bot/services/launches.py").read_text()
    start = text.index("    def transition(")
    m = re.search(r"self\._launches\.update_if\(la\.id, \{\"state\": current\.state\}, state=state", text[start:])
    assert m is not None
    return text[:start + m.start()].count("\n") + 1


def test_a_launch_being_stopped_is_said_one_way_everywhere() -> None:
    from bot.core.transitions import being_stopped

    said = being_stopped("base#3")
    assert said == "base#3 is being stopped by another kill; its answer follows in its thread"
    for where in ("bot/services/launches.py", "handlers/kill.py"):
        text = (ROOT / where).read_text()
        assert "being_stopped(" in text and "being stopped by another kill" not in text, where
