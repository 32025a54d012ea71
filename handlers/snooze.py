"""`!snooze [LAUNCH] [MINUTES]`: no alerts for a launch for a while; its checks go on."""

from __future__ import annotations

from bot.core.commands import thread
from bot.core.grammar import CommandCall
from handlers import args
from handlers.context import Context, Role
from handlers.reply import Reply, UserError
from handlers.spec import CommandSpec

USAGE = f"{thread('snooze', '[LAUNCH] [MINUTES]')} (in a launch thread; default 15)"


async def handle(call: CommandCall, ctx: Context) -> Reply:
    """Hold back the launch's alerts for MINUTES (1..1440, default 15); changes are posted after."""
    from bot.services.launches import MAX_SNOOZE_MIN  # here: the services import the SSH library and the database

    args.no_kwargs(call, USAGE)
    ref, minutes_text = args.launch_and_number(call, USAGE)
    minutes = args.count(minutes_text or "15", 1, MAX_SNOOZE_MIN, "minutes", USAGE)
    la = args.launch(ctx, ref, USAGE, allow_only_live=False)
    if not la.live:
        raise UserError(f"{la.name} has ended", f"it is {la.state.value}: no checks run and no alerts come, so there "
                        "is nothing to snooze", audit="stale", launch_id=la.id)
    la = ctx.services.launches.snooze(la, minutes, user=ctx.user, channel=ctx.channel)
    return ctx.reply(ctx.services.renderer.notice(f"Alerts of {la.name} snoozed", f"for {minutes} min; checks go on",
                                                 icon=":zzz:"),
                     launch=la)


COMMAND = CommandSpec("snooze", handle, Role.OPERATOR, USAGE, "no alerts for a launch for a while (checks go on)")
