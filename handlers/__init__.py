"""Command families and the dispatcher shared by Slack and the console.

`dispatch(call, ctx)` checks the user's role (by Slack user ID), runs the handler and always returns a
Message: bad input, unknown commands and internal errors become clear answers, never exceptions.
"""

from __future__ import annotations

import logging

from bot.core.grammar import CommandCall
from bot.present.render import Message
from handlers.base import CommandContext, CommandSpec, Role, error_message
from handlers.help import help_message, make_help_handler
from handlers.launch import (
    CHART_USAGE,
    KILL_USAGE,
    LAUNCH_USAGE,
    LOGS_USAGE,
    RELAUNCH_USAGE,
    SNOOZE_USAGE,
    STACK_USAGE,
    handle_chart,
    handle_kill,
    handle_launch,
    handle_logs,
    handle_relaunch,
    handle_snooze,
    handle_stack,
)
from handlers.probe import USAGE as PROBE_USAGE
from handlers.probe import handle_probe
from handlers.status import USAGE as STATUS_USAGE
from handlers.status import handle_status

log = logging.getLogger(__name__)

COMMANDS: list[CommandSpec] = [
    CommandSpec("status", STATUS_USAGE, "GPU table per host and who holds each GPU", Role.VIEWER, handle_status),
    CommandSpec("probe", PROBE_USAGE, "process tree, log tail, GPUs, port and health, in one round trip",
                Role.VIEWER, handle_probe),
    CommandSpec("logs", LOGS_USAGE, "last N lines of a launch's log (a file when long)", Role.VIEWER, handle_logs),
    CommandSpec("launch", LAUNCH_USAGE, "start a server variant in its own session, with an incident thread",
                Role.OPERATOR, handle_launch),
    CommandSpec("kill", KILL_USAGE, "stop every process of a launch and verify its GPU memory is released",
                Role.OPERATOR, handle_kill),
    CommandSpec("relaunch", RELAUNCH_USAGE, "kill (verified), then launch again in the same thread",
                Role.OPERATOR, handle_relaunch),
    CommandSpec("stack", STACK_USAGE, "py-spy stack dump of every process of a launch, as a file",
                Role.OPERATOR, handle_stack, aliases=("stackdump",)),
    CommandSpec("chart", CHART_USAGE, "timeline chart of a launch (PNG)", Role.VIEWER, handle_chart),
    CommandSpec("snooze", SNOOZE_USAGE, "no alerts for a launch for a while (checks go on)", Role.OPERATOR,
                handle_snooze),
]
COMMANDS.append(CommandSpec("help", "/gpu help", "this list", Role.NONE, make_help_handler(COMMANDS)))

_BY_NAME = {c.name: c for c in COMMANDS}


def find(name: str) -> CommandSpec | None:
    """The command spec for `name` (or one of its aliases), or None."""
    spec = _BY_NAME.get(name)
    if spec is None:
        spec = next((c for c in COMMANDS if name in c.aliases), None)
    return spec


def _audit(ctx: CommandContext, call: CommandCall, result: str, detail: str | None = None) -> None:
    """Record the command in the audit trail (when the bot has a store); never fails the command."""
    if ctx.launches is None:
        return
    try:
        la = ctx.launches.store.launch_for_thread(ctx.channel_id, ctx.thread_ts) if ctx.thread_ts else None
        ctx.launches.store.add_event(user_id=ctx.user_id, action=f"command:{call.name}",
                                     args={"text": call.raw[:500], "source": ctx.source}, result=result,
                                     detail=detail, launch_id=la.id if la else None, channel=ctx.channel_id)
    except Exception:
        log.exception("could not record the audit event of %s", call.name)


async def dispatch(call: CommandCall, ctx: CommandContext) -> Message:
    """Run `call` for `ctx.user_id`. Returns the answer Message; never raises for user input."""
    spec = find(call.name)
    if spec is None and (call.word in ctx.config.hosts or call.word == "all"):
        # "/gpu gpu-host-1" is "/gpu status gpu-host-1"; "/gpu all" is "/gpu status all"
        call = CommandCall(name="status", args=[call.word, *call.args], kwargs=call.kwargs, raw=call.raw)
        spec = find("status")
    if spec is None:
        what = "command or host" if call.raw.strip().split(" ", 1)[0] == call.word and ctx.source == "slash" \
            else "command"
        return help_message(ctx, COMMANDS, intro=f"Unknown {what} {call.word[:40] or call.name[:40]!r}. "
                                                 "Here is what I can do:")
    chans = ctx.config.permissions.channels
    if chans and ctx.source != "console" and ctx.channel_id not in chans and spec.role > Role.NONE:
        _audit(ctx, call, "denied", "channel not allowed")
        return error_message("Not allowed here", "gpubot does not take commands in this channel",
                             f"Allowed channel IDs: {', '.join(chans)}")
    if ctx.role < spec.role:
        log.info("denied %s to %s (role %s, needs %s)", call.name, ctx.user_id, ctx.role.name, spec.role.name)
        _audit(ctx, call, "denied", f"needs {spec.role.name.lower()}, has {ctx.role.name.lower()}")
        return error_message("Permission denied", f"`{spec.name}` needs the {spec.role.name.lower()} role",
                             "Ask an admin to add your Slack user ID to the config's permissions.")
    try:
        msg = await spec.handler(call, ctx)
        result = msg.audit_result or ("ok" if msg.ok else "refused")
        _audit(ctx, call, result, None if msg.ok else msg.text.splitlines()[0][:300])
        return msg
    except Exception as e:
        log.exception("command %s failed", call.name)
        _audit(ctx, call, "error", type(e).__name__)
        return error_message("Internal error", f"{call.name} failed: {type(e).__name__}",
                             "The bot logged the details; the state is unchanged.")
