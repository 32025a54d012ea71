"""Button action ids, and the command each click stands for (pure; defined once).

A click is not a command of its own kind: it becomes the text of a command that names its target, and goes
through the same dispatcher as anything typed (channel filter, role filter, handler, audit). So the console
can do everything a button can (`confirm 12`, `relaunch 7`), and every button acts on the launch or the
confirmation it was made for, never on "the thread's newest launch".
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType


class ActionId(StrEnum):
    """Block Kit `action_id`s of gpubot's buttons. Alert buttons carry a launch id as their value; the
    [Kill] / [Cancel] buttons under a typed kill carry a confirmation id."""

    PROBE = "gpubot_probe"
    STACK = "gpubot_stack"
    KILL = "gpubot_kill"
    RELAUNCH = "gpubot_relaunch"
    SNOOZE = "gpubot_snooze"
    KILL_CONFIRM = "gpubot_kill_confirm"
    KILLPID_CONFIRM = "gpubot_killpid_confirm"
    KILL_CANCEL = "gpubot_kill_cancel"


#: Minutes the alert's [Snooze] button holds alerts back (its label says so).
SNOOZE_BUTTON_MIN = 15

#: The command text each button runs; `{id}` is the button's value. Alert [Kill] carries Block Kit's own
#: confirm dialog, so its click is the confirmation (`--yes`). `#7` is launch 7 whatever the hosts are named (a host
#: may be "7").
CLICK_COMMANDS: Mapping[ActionId, str] = MappingProxyType({
    ActionId.PROBE: "probe #{id}",
    ActionId.STACK: "stack #{id}",
    ActionId.KILL: "kill #{id} --yes",
    ActionId.RELAUNCH: "relaunch #{id}",
    ActionId.SNOOZE: f"snooze #{{id}} {SNOOZE_BUTTON_MIN}",
    ActionId.KILL_CONFIRM: "confirm {id}",
    ActionId.KILLPID_CONFIRM: "confirm {id}",
    ActionId.KILL_CANCEL: "cancel {id}",
})

#: Largest id a button value may carry (a launch or confirmation id; 12 digits).
MAX_BUTTON_ID = 10**12 - 1


def click_command(action_id: str, value: str) -> str | None:
    """The command text a click on button `action_id` with `value` stands for (e.g. "kill #7 --yes"), or None
    when the action id is not gpubot's or the value is not a plain id (1..MAX_BUTTON_ID, ASCII digits): a
    forged or garbled click."""
    try:
        aid = ActionId(action_id)
    except ValueError:
        return None
    v = (value or "").strip()
    if not (v.isascii() and v.isdigit()) or len(v) > 12 or not 0 < int(v) <= MAX_BUTTON_ID:
        return None
    return CLICK_COMMANDS[aid].format(id=int(v))
