"""`/gpu whois HOST:GPU`: who holds one GPU now: each process on it with its launch and the Slack user who launched it,
or `[foreign]` with its user on the host and its command, and the live launches that claim it (bot.services.launches
.LaunchService.whois)."""

from __future__ import annotations

from bot.core.commands import slash
from bot.core.grammar import CommandCall
from bot.present.views import whois_view
from handlers import args
from handlers.context import Context, Role
from handlers.reply import Reply
from handlers.spec import CommandSpec

USAGE = slash("whois", "HOST:GPU")
#: The highest GPU index asked about (nvidia-smi numbers GPUs from 0; 255 is the config's bound too).
MAX_GPU_INDEX = 255


def _target(call: CommandCall) -> tuple[str, str]:
    """(host, GPU index text) from `HOST:GPU` or `HOST GPU`. Raises UserError otherwise."""
    words = list(call.args)
    if len(words) == 1 and ":" in words[0]:
        host, _, gpu = words[0].rpartition(":")
    elif len(words) == 2:
        host, gpu = words
    else:
        raise args.bad("name one GPU as HOST:GPU, e.g. gpu-01:3", USAGE)
    if not host or not gpu:
        raise args.bad("name one GPU as HOST:GPU, e.g. gpu-01:3", USAGE)
    return host, gpu


async def handle(call: CommandCall, ctx: Context) -> Reply:
    """Probe the host and answer for one GPU: its reading, its holders and claims, and the command that frees it."""
    args.no_kwargs(call, USAGE)
    name, gpu = _target(call)
    index = args.count(gpu, 0, MAX_GPU_INDEX, "GPU (its index, as nvidia-smi numbers it)", USAGE)
    host = args.host(ctx, name)
    who = await ctx.services.launches.gpu_holders.whois(host, index)
    return ctx.reply(ctx.render("whois", **whois_view(who)))


COMMAND = CommandSpec("whois", handle, Role.VIEWER, USAGE, "who holds one GPU: its launch and launcher, or its user")
