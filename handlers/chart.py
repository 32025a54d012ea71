"""`!chart [LAUNCH]`: the launch's timeline chart from its readiness checks, attached as a PNG."""

from __future__ import annotations

from bot.core.commands import thread
from bot.core.grammar import CommandCall
from bot.core.text import counted
from handlers import args
from handlers.context import Context, Role
from handlers.reply import Reply
from handlers.spec import CommandSpec

USAGE = thread("chart", "[LAUNCH]")


async def handle(call: CommandCall, ctx: Context) -> Reply:
    """Per-GPU memory and utilization and log lines over the launch's life, phases and verdicts marked."""
    args.no_kwargs(call, USAGE)
    if len(call.args) > 1:
        raise args.bad("name at most one launch", USAGE)
    la = args.launch(ctx, call.args[0] if call.args else None, USAGE)
    png, checks = await ctx.services.watcher.timeline(la)
    msg = ctx.services.renderer.notice(f"Timeline of {la.name}", counted(checks, "check"),
                                       icon=":chart_with_upwards_trend:")
    msg.files.append((f"{la.variant}-{la.id}-timeline.png", png))
    return ctx.reply(msg, launch=la)


COMMAND = CommandSpec("chart", handle, Role.VIEWER, USAGE, "timeline chart of a launch (PNG)")
