"""`confirm ID` and `cancel ID`: decide a typed kill's confirmation (what its [Kill] and [Cancel] buttons
run). The first operator's decision wins; later ones are told who decided. The console can type them."""

from __future__ import annotations

from bot.core.grammar import CommandCall
from bot.present.render import Message
from bot.services.confirmations import Decision
from handlers import args
from handlers.context import Context, Role
from handlers.kill import kill_result
from handlers.reply import Reply, UserError
from handlers.spec import CommandSpec

CONFIRM_USAGE = "confirm ID (the [Kill] button of a typed /kill)"
CANCEL_USAGE = "cancel ID (the [Cancel] button of a typed /kill)"
#: Largest confirmation id accepted.
MAX_ID = 10**12 - 1


def _conf_id(call: CommandCall, usage: str) -> int:
    args.no_kwargs(call, usage)
    if len(call.args) != 1:
        raise args.bad("name the confirmation id", usage)
    return args.count(call.args[0], 1, MAX_ID, "the confirmation id", usage)


def _decided(ctx: Context, text: str) -> list[tuple[str, Message]]:
    """The clicked confirmation message replaced by who decided (nothing to edit when typed)."""
    if not ctx.request.message_ts:
        return []
    return [(ctx.request.message_ts, ctx.render("kill_confirm", decided=text, by=ctx.user))]


def _not_decided(ctx: Context, d: Decision, conf_id: int) -> UserError:
    if d.confirmation is None:
        return UserError("Nothing done", f"there is no kill confirmation {conf_id}", audit="invalid")
    la = ctx.services.launches.get(d.confirmation.launch_id) if d.confirmation.launch_id is not None else None
    return UserError("Nothing done", f"this kill was {d.why}", audit="stale", thread_ts=ctx.thread_for(la),
                     launch_id=d.confirmation.launch_id)


async def handle_confirm(call: CommandCall, ctx: Context) -> Reply:
    """Confirm and run the kill (a launch, or one pid whose command line must still be the one shown)."""
    conf_id = _conf_id(call, CONFIRM_USAGE)
    result = await ctx.services.confirmations.confirm(conf_id, user=ctx.user, channel=ctx.channel)
    if isinstance(result, Decision):
        raise _not_decided(ctx, result, conf_id)
    reply = kill_result(ctx, result.outcome, result.launch)
    reply.edits = _decided(ctx, f":white_check_mark: Kill of {result.decision.what()} confirmed")
    return reply


async def handle_cancel(call: CommandCall, ctx: Context) -> Reply:
    """Cancel the kill: nothing is stopped; the confirmation message says who cancelled it."""
    conf_id = _conf_id(call, CANCEL_USAGE)
    d = ctx.services.confirmations.cancel(conf_id, user=ctx.user)
    if not d.won:
        raise _not_decided(ctx, d, conf_id)
    text = f":no_entry_sign: Nothing was stopped: kill of {d.what()} cancelled"
    edits = _decided(ctx, text)
    message = None if edits else ctx.services.renderer.error("Kill cancelled",
                                                             f"kill of {d.what()}: nothing was stopped")
    return Reply(message, audit="cancelled", launch_id=d.confirmation.launch_id if d.confirmation else None,
                 edits=edits)


CONFIRM = CommandSpec("confirm", handle_confirm, Role.OPERATOR, CONFIRM_USAGE, "confirm a typed kill: it runs now")
CANCEL = CommandSpec("cancel", handle_cancel, Role.OPERATOR, CANCEL_USAGE, "cancel a typed kill: nothing is stopped")
