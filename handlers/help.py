"""`help` (`/gpu help`, `/gpubot`): the commands this user may run, and the configured hosts."""

from __future__ import annotations

from bot.core.commands import slash
from bot.core.grammar import CommandCall
from bot.present.render import Message
from handlers.context import Context, Role
from handlers.reply import Reply
from handlers.spec import CommandSpec

USAGE = slash("help")


def help_message(ctx: Context, intro: str | None = None) -> Message:
    """The help text listing only the commands allowed for the user's role, plus the host names."""
    allowed = [c for c in ctx.commands if c.role <= ctx.role]
    return ctx.render("help", intro=intro, commands=[{"usage": c.usage, "summary": c.summary} for c in allowed],
                      hosts=ctx.config.host_names(), bot_name=ctx.config.slack.bot_name,
                      prefix=ctx.config.slack.command_prefix)


async def handle(call: CommandCall, ctx: Context) -> Reply:
    """The help text."""
    return ctx.reply(help_message(ctx))


COMMAND = CommandSpec("help", handle, Role.NONE, USAGE, "this list", default_of="gpubot",
                      description=f"gpubot commands (try {slash('help')})", hint="help | status [HOST|all] | probe ...")
