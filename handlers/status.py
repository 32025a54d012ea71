"""`/gpu status [HOST|all]`: per host a GPU table and who holds each GPU; hosts probed in parallel."""

from __future__ import annotations

from bot.core.commands import slash
from bot.core.grammar import CommandCall
from bot.present.views import status_view
from handlers import args
from handlers.context import Context, Role
from handlers.reply import Reply, UserError
from handlers.spec import CommandSpec

USAGE = slash("status", "[HOST...|all] [group=GROUP]")


async def handle(call: CommandCall, ctx: Context) -> Reply:
    """Every named host (none or `all`: every configured host; `group=NAME`: the hosts of that host group, with any
    named hosts): its GPUs and their holders, each holder labelled with its launch (`base#12`, `orphan of base#12`,
    `foreign`). A host that fails is shown with its reason; the others still show."""
    args.no_kwargs(call, USAGE, frozenset({"group"}))
    if "group" in call.kwargs:
        group = call.kwargs["group"]
        members = ctx.config.group_hosts(group)
        if not members:
            known = ", ".join(ctx.config.host_groups) or "none are configured (host_groups:)"
            raise UserError("Unknown host group", repr(group[:60]), f"Host groups: {known}", audit="invalid")
        named = [args.host(ctx, name) for name in call.args if name.lower() != "all"]
        hosts = list(dict.fromkeys(named + members))
    elif not call.args or [a.lower() for a in call.args] == ["all"]:
        hosts = ctx.config.host_names()
        if not hosts:
            raise UserError("No hosts", "no hosts are configured", "Add hosts to the config file.")
    else:
        hosts = list(dict.fromkeys(args.host(ctx, name) for name in call.args))
    results, owners = await ctx.services.launches.status(hosts)
    return ctx.reply(ctx.render("status", **status_view(results, owners)))


COMMAND = CommandSpec(
    "status", handle, Role.VIEWER, USAGE, "GPU table per host and who holds each GPU", default_of="gpu",
    description="GPU and server status, probes and help", hint="status [HOST|all|group=G] | probe ... | help",
)
