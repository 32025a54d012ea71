"""`/relaunch [LAUNCH|VARIANT] [param=value ...]`: kill (verified), then launch again, in the same thread."""

from __future__ import annotations

from bot.core.commands import slash
from bot.core.grammar import CommandCall
from bot.core.lifecycle import LaunchError
from bot.present.views import kill_view, launch_outcome_view
from handlers import args
from handlers.context import Context, Role
from handlers.reply import Reply, UserError
from handlers.spec import CommandSpec

USAGE = slash("relaunch", "[LAUNCH|VARIANT] [param=value ...]")


async def handle(call: CommandCall, ctx: Context) -> Reply:
    """Relaunch the named launch (or the thread's) with the same params, changed by the given ones. Outside
    a launch thread the launch must be named: the bot never guesses which server to stop."""
    if len(call.args) > 1:
        raise args.bad("name at most one launch", USAGE)
    la = args.launch(ctx, call.args[0] if call.args else None, USAGE, allow_only_live=False)
    try:
        killed, new = await ctx.services.launches.relaunch(la, dict(call.kwargs), user=ctx.user, channel=ctx.channel)
    except LaunchError as e:
        raise UserError("Cannot relaunch", str(e), f"Usage: {USAGE}", thread_ts=ctx.thread_for(la),
                        launch_id=la.id) from None
    old = ctx.services.launches.get(la.id) or la
    msg = ctx.render("kill_result", **kill_view(killed, old.gpus))
    if new is None:
        note = "Relaunch cancelled: the old launch did not stop cleanly."
        msg.text += "\n" + note
        note_block = {"type": "section", "text": {"type": "mrkdwn", "text": f":no_entry: {note}"}}
        msg.blocks = [*(msg.blocks or []), note_block]
        return ctx.reply(msg, launch=old, audit="refused", detail=killed.describe())
    msg = msg.then(ctx.render("launch_result", **launch_outcome_view(new, la.variant, la.host)))
    return ctx.reply(msg, launch=old, audit="started" if new.ok else "failed",
                     detail=new.launch.name if new.launch else None)


COMMAND = CommandSpec(
    "relaunch", handle, Role.OPERATOR, USAGE, "kill (verified), then launch again in the same thread",
    slash="relaunch", description="Kill (verified), then launch again in the same thread",
    hint="[LAUNCH|VARIANT] [param=value ...]",
)
