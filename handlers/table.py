"""THE command table: the only list of gpubot's commands. The grammar (slash commands, `/gpu` subcommands,
`!` and mention words, aliases), the help text, the Bolt registration and the Slack manifest all derive from
it (handlers.vocabulary)."""

from __future__ import annotations

from handlers import (
    bundle,
    cancel,
    chart,
    confirm,
    free,
    help,
    kill,
    launch,
    logs,
    probe,
    relaunch,
    snooze,
    stack,
    status,
    whois,
)
from handlers.spec import CommandSpec

COMMANDS: tuple[CommandSpec, ...] = (
    status.COMMAND,
    free.COMMAND,
    whois.COMMAND,
    probe.COMMAND,
    logs.COMMAND,
    launch.COMMAND,
    kill.COMMAND,
    relaunch.COMMAND,
    stack.COMMAND,
    bundle.COMMAND,
    chart.COMMAND,
    snooze.COMMAND,
    confirm.COMMAND,
    cancel.COMMAND,
    help.COMMAND,
)
