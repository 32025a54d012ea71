"""`cancel ID`: cancel a typed kill (what its [Cancel] button runs): nothing is stopped, and the confirmation
message says who cancelled it. The first decision wins; later ones are told who decided."""

from __future__ import annotations

from bot.core.commands import slash
from bot.core.grammar import CommandCall
from handlers.confirm import conf_id, decided, not_decided
from handlers.context import Context, Role
from handlers.reply import Reply
from handlers.spec import CommandSpec

USAGE = f"{slash('cancel', 'ID')} (the [Cancel] button of a typed {slash('kill')})"


async def handle(call: CommandCall, ctx: Context) -> Reply:
    """Cancel the kill: nothing is stopped; the confirmation message says who cancelled it."""
    cid = conf_id(call, USAGE)
    d = ctx.services.confirmations.cancel(cid, user=ctx.user)
    if not d.won:
        raise not_decided(ctx, d, cid)
    text = f":no_entry_sign: Nothing was stopped: kill of {d.what()} cancelled"
    edits = decided(ctx, text)
    message = None if edits else ctx.services.renderer.notice(
        "Kill cancelled", f"kill of {d.what()}: nothing was stopped", icon=":no_entry_sign:")
    return Reply(message, audit="cancelled", launch_id=d.confirmation.launch_id if d.confirmation else None,
                 edits=edits)


COMMAND = CommandSpec("cancel", handle, Role.OPERATOR, USAGE, "cancel a typed kill: nothing is stopped")
