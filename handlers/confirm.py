"""`confirm ID`: confirm a typed kill (what its [Kill] button runs) and run it. The first operator's decision
wins; later ones are told who decided. The console can type it. The helpers here serve `cancel` too."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.core.commands import slash
from bot.core.grammar import CommandCall
from handlers import args
from handlers.context import Context, Role
from handlers.kill import kill_result
from handlers.reply import Reply, UserError
from handlers.spec import CommandSpec

if TYPE_CHECKING:
    from bot.present.render import Message
    from bot.services.confirmations import Decision

CONFIRM_USAGE = f"{slash('confirm', 'ID')} (the [Kill] button of a typed {slash('kill')})"
#: Largest confirmation id accepted.
MAX_ID = 10**12 - 1


def conf_id(call: CommandCall, usage: str) -> int:
    """The one confirmation id `call` names (1..MAX_ID), or UserError with `usage`."""
    args.no_kwargs(call, usage)
    if len(call.args) != 1:
        raise args.bad("name the confirmation id", usage)
    return args.count(call.args[0], 1, MAX_ID, "the confirmation id", usage)


def decided(ctx: Context, text: str) -> list[tuple[str, Message]]:
    """The edit that replaces the clicked confirmation message with `text` and who decided (none when the
    decision was typed)."""
    if not ctx.request.message_ts:
        return []
    return [(ctx.request.message_ts, ctx.render("kill_confirm", decided=text, by=ctx.user))]


def not_decided(ctx: Context, d: Decision, conf_id: int) -> UserError:
    """The answer to a click that did not decide: no such confirmation (invalid), or already decided /
    expired (stale), in the launch's thread."""
    if d.confirmation is None:
        return UserError("Nothing done", f"there is no kill confirmation {conf_id}", audit="invalid")
    la = ctx.services.launches.get(d.confirmation.launch_id) if d.confirmation.launch_id is not None else None
    return UserError("Nothing done", f"this kill was {d.why}", audit="stale", thread_ts=ctx.thread_for(la),
                     launch_id=d.confirmation.launch_id)


async def handle(call: CommandCall, ctx: Context) -> Reply:
    """Confirm and run the kill (a launch, or one pid whose command line must still be the one shown)."""
    from bot.services.confirmations import Decision  # here: the services import the SSH library and the database

    cid = conf_id(call, CONFIRM_USAGE)
    result = await ctx.services.confirmations.confirm(cid, user=ctx.user, channel=ctx.channel)
    if isinstance(result, Decision):
        raise not_decided(ctx, result, cid)
    reply = kill_result(ctx, result.outcome, result.launch)
    reply.edits = decided(ctx, f":white_check_mark: Kill of {result.decision.what()} confirmed")
    return reply


COMMAND = CommandSpec("confirm", handle, Role.OPERATOR, CONFIRM_USAGE, "confirm a typed kill: it runs now")
