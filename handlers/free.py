"""`/gpu free [N] [group=G]`: the hosts with at least N free GPUs, best first (bot.core.fleet)."""

from __future__ import annotations

from dataclasses import replace

from bot.core.commands import slash
from bot.core.fleet import summarize, with_free
from bot.core.grammar import CommandCall
from bot.present.views import fleet_view
from handlers import args
from handlers.context import Context, Role
from handlers.reply import Reply
from handlers.spec import CommandSpec

USAGE = slash("free", "[N] [group=GROUP]")
#: The most GPUs `/gpu free N` asks for.
MAX_N = 1024


async def handle(call: CommandCall, ctx: Context) -> Reply:
    """Probe every host (or the hosts of `group=`) and list those with at least N (default 1) free GPUs: under the
    config's `gpu_free_mib` and claimed by no live launch. Best first: most free GPUs, then the least busy."""
    args.no_kwargs(call, USAGE, frozenset({"group"}))
    if len(call.args) > 1:
        raise args.bad("one number at most: how many free GPUs a host must have", USAGE)
    n = args.count(call.args[0], 1, MAX_N, "N (free GPUs)", USAGE) if call.args else 1
    hosts = args.hosts(ctx, [], call.kwargs.get("group"))
    lines = await ctx.services.launches.gpu_holders.fleet(hosts)
    fit = with_free(lines, n)
    failed = [h.name for h in lines if h.failed]
    down = len(failed)
    where = f" in group {call.kwargs['group']}" if "group" in call.kwargs else ""
    totals = (f"{len(fit)} of {len(lines)} host{'' if len(lines) == 1 else 's'}{where} "
              f"{'has' if len(lines) == 1 else 'have'} {n} or more free GPU{'' if n == 1 else 's'}"
              + (f"; {down} could not be read ({', '.join(failed[:3])}{', ...' if down > 3 else ''}: "
                 f"`{slash('status', 'HOST')}` says why)" if down else ""))
    hint = (f"Free: under lifecycle.gpu_free_mib used and claimed by no live launch. Launch on one: "
            f"{slash('launch', 'VARIANT host=HOST')}")
    # best first over the whole fleet: one list, not one per host group
    view = fleet_view(summarize([replace(h, group=None) for h in fit]),
                      title=f"Hosts with {n}+ free GPU{'' if n == 1 else 's'}", hint=hint, show_free=True,
                      totals=totals)
    return ctx.reply(ctx.render("fleet", **view))


COMMAND = CommandSpec("free", handle, Role.VIEWER, USAGE, "hosts with at least N free GPUs, best first")
