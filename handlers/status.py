"""`/gpu status [HOST...|all] [group=G]`: per host a GPU table and who holds each GPU, or for a fleet one line per
host; hosts probed in parallel."""

from __future__ import annotations

from bot.core.commands import slash
from bot.core.fleet import TABLES_UP_TO, summarize
from bot.core.grammar import CommandCall
from bot.present.views import fleet_view, status_view
from handlers import args
from handlers.context import Context, Role
from handlers.reply import Reply
from handlers.spec import CommandSpec

USAGE = slash("status", "[HOST...|all] [group=GROUP] [detail=yes]")
DETAIL_HINT = (f"Each host's GPU table: {slash('status', 'HOST')}, or {slash('status', 'group=GROUP detail=yes')}. "
               f"Hosts with free GPUs: {slash('free', 'N')}")


async def handle(call: CommandCall, ctx: Context) -> Reply:
    """Every named host (none or `all`: every configured host; `group=NAME`: the hosts of that host group, with any
    named hosts): its GPUs and their holders, each holder labelled with its launch (`base#12`, `orphan of base#12`,
    `foreign`). More than TABLES_UP_TO hosts (without `detail=yes`) are one line each, grouped by host group, under
    the fleet's totals (bot.core.fleet). A host that fails is shown with its reason; the others still show."""
    args.no_kwargs(call, USAGE, frozenset({"group", "detail"}))
    detail = call.kwargs.get("detail", "no").lower()
    if detail not in ("yes", "no"):
        raise args.bad(f"detail={call.kwargs['detail'][:20]!r}: say detail=yes or detail=no", USAGE)
    hosts = args.hosts(ctx, call.args, call.kwargs.get("group"))
    if len(hosts) > TABLES_UP_TO and detail == "no":
        lines = await ctx.services.launches.gpu_holders.fleet(hosts)
        return ctx.reply(ctx.render("fleet", **fleet_view(summarize(lines), title="GPU fleet", hint=DETAIL_HINT)))
    results, holders, _ = await ctx.services.launches.gpu_holders.status(hosts)
    return ctx.reply(ctx.render("status", **status_view(results, holders)))


COMMAND = CommandSpec(
    "status", handle, Role.VIEWER, USAGE, "GPU table per host and who holds each GPU", default_of="gpu",
    description="GPU and server status, probes and help",
    hint="status [HOST|all|group=G] | free N | whois HOST:GPU | probe ... | help",
)
