"""`help`: the commands this user may run, and the configured hosts."""

from __future__ import annotations

from bot.core.grammar import CommandCall
from bot.present.render import Message, render
from handlers.base import CommandContext, CommandSpec


def help_message(ctx: CommandContext, table: list[CommandSpec], intro: str | None = None) -> Message:
    """Render the help text listing only the commands allowed for `ctx.role`, plus the host names."""
    allowed = [c for c in table if c.role <= ctx.role]
    return render(
        "help",
        intro=intro,
        commands=[{"usage": c.usage, "summary": c.summary} for c in allowed],
        hosts=ctx.config.host_names(),
        bot_name=ctx.config.slack.bot_name,
        prefix=ctx.config.slack.command_prefix,
    )


def make_help_handler(table: list[CommandSpec]):
    """Return the `help` handler bound to the command table."""

    async def handle_help(call: CommandCall, ctx: CommandContext) -> Message:
        return help_message(ctx, table)

    return handle_help
