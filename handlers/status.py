"""`/gpu status [HOST|all]`: per host a GPU table and who holds each GPU; hosts probed in parallel."""

from __future__ import annotations

from bot.core.grammar import CommandCall
from bot.core.models import HostFailure
from bot.present.render import Message, render
from bot.present.views import status_view
from bot.services.hosts import UnknownHost
from handlers.base import CommandContext, error_message

USAGE = "/gpu status [HOST|all]"


async def handle_status(call: CommandCall, ctx: CommandContext) -> Message:
    """Answer `/gpu status`. No host (or `all`) means every configured host.

    Returns the rendered status message; unknown hosts get an error listing the known ones.
    """
    if call.kwargs:
        return error_message("Bad arguments", f"status takes no key=value arguments ({', '.join(call.kwargs)})",
                             f"Usage: {USAGE}")
    names = call.args
    if not names or names == ["all"]:
        hosts = ctx.config.host_names()
        if not hosts:
            return error_message("No hosts", "no hosts are configured", "Add hosts to the config file.")
    else:
        hosts = []
        for n in names:
            try:
                hosts.append(ctx.hosts.resolve_host(n))
            except UnknownHost as e:
                return error_message(
                    "Unknown host", repr(n[:60]), f"Known hosts: {', '.join(e.known) or '(none configured)'}"
                )
        hosts = list(dict.fromkeys(hosts))
    results = await ctx.hosts.status(hosts)
    owners: dict[str, dict[int, str]] = {}
    if ctx.launches is not None:
        for r in results:
            if not isinstance(r, HostFailure):
                owners[r.host] = {h.pid: h.owner for h in ctx.launches.holders(r)}
    return render("status", **status_view(results, owners))
