"""`/probe [HOST|LAUNCH] [pgid=N|pid=N|sid=N|match=TEXT] [log=PATH] [port=N] [lines=N] [health=/PATH]`.

Shows the process tree, the log (lines, bytes, seconds since last write, last lines), the GPUs, whether the
port is listening and the health endpoint's answer: one probe, one SSH round trip. In a launch's thread (or
naming a launch: `probe 12`, `probe base#12`, `probe base`: its live launch) it probes that launch.
"""

from __future__ import annotations

from bot.core.commands import slash
from bot.core.grammar import CommandCall
from bot.core.models import HostFailure
from bot.core.probe import ProbeRequest, ProbeRequestError
from bot.present.views import probe_view
from handlers import args
from handlers.context import Context, Role
from handlers.reply import Reply, UserError
from handlers.spec import CommandSpec

USAGE = slash("probe", "[HOST|LAUNCH] [pgid=N|pid=N|sid=N|match=TEXT] [log=PATH] [port=N] [lines=N] [health=/PATH]")
_INT_KEYS = ("pid", "pgid", "sid", "port", "lines")
_ALLOWED = frozenset({"pid", "pgid", "sid", "match", "log", "port", "lines", "health", "host"})


def build_request(call: CommandCall) -> ProbeRequest:
    """The ProbeRequest `call`'s key=value arguments ask for. Raises ProbeRequestError (user-facing)."""
    unknown = sorted(set(call.kwargs) - _ALLOWED)
    if unknown:
        raise ProbeRequestError(f"unknown argument(s): {', '.join(k + '=' for k in unknown)}")
    ints: dict[str, int] = {}
    for k in _INT_KEYS:
        if k in call.kwargs:
            v = call.kwargs[k].strip()
            if not args.is_number(v) or len(v) > 9:
                raise ProbeRequestError(f"{k}= must be a positive integer, got {v[:40]!r}")
            ints[k] = int(v)
    req = ProbeRequest(pid=ints.get("pid"), pgid=ints.get("pgid"), sid=ints.get("sid"), match=call.kwargs.get("match"),
                       log_path=call.kwargs.get("log"), port=ints.get("port"), tail_lines=ints.get("lines", 20),
                       **({"health_path": call.kwargs["health"]} if "health" in call.kwargs else {}))
    req.validate()
    return req


def describe_selector(req: ProbeRequest) -> str:
    """Human-readable summary of what the probe selected, e.g. 'pgid=123, log=/x.log, port=8000'."""
    parts = [f"{k}={getattr(req, k)}" for k in ("pid", "pgid", "sid") if getattr(req, k) is not None]
    if req.match is not None:
        parts.append(f"match={req.match!r}")
    if req.log_path:
        parts.append(f"log={req.log_path}")
    if req.port:
        parts.append(f"port={req.port}")
    return ", ".join(parts) if parts else "GPU holders"


async def _probe_launch(call: CommandCall, ctx: Context, ref: str | None) -> Reply:
    other = sorted(set(call.kwargs) - {"lines"})
    if other:
        raise args.bad(f"a launch's probe takes only lines= ({', '.join(k + '=' for k in other)} are for a host)",
                       USAGE)
    lines = args.count(call.kwargs.get("lines", "20"), 1, 500, "lines", USAGE)
    la = args.launch(ctx, ref, USAGE, allow_only_live=False)
    snap = await ctx.services.launches.probe_launch(la, tail_lines=lines)
    if isinstance(snap, HostFailure):
        raise UserError(f"Probe of {la.name} failed", snap.reason, audit="error", launch_id=la.id)
    view = probe_view(snap, la.name + (f" (pgid={la.pgid})" if la.pgid is not None else ""),
                      ctx.services.launches.owners(snap))
    return ctx.reply(ctx.render("probe", **view), launch=la)


def _names_a_launch(ctx: Context, word: str) -> bool:
    """Whether `word` (not a host) names a launch: `12`, `base#12`, or a variant (its live launch)."""
    return word not in ctx.config.hosts and (args.is_launch_ref(word) or word in ctx.config.variants)


async def handle(call: CommandCall, ctx: Context) -> Reply:
    """A probe of a host with the given selectors, or of a launch (named, or the thread's; `lines=` applies)."""
    if len(call.args) > 1:
        raise args.bad(f"expected at most one host or launch, got {len(call.args)} words", USAGE)
    word = call.args[0] if call.args else None
    if word is not None and _names_a_launch(ctx, word):
        return await _probe_launch(call, ctx, word)
    if word is None and set(call.kwargs) <= {"lines"} and ctx.services.launches.thread_launch(
            ctx.channel, ctx.request.thread_ts):
        return await _probe_launch(call, ctx, None)
    host = args.host(ctx, word or call.kwargs.get("host"))
    try:
        req = build_request(call)
    except ProbeRequestError as e:
        raise args.bad(str(e), USAGE) from None
    try:
        result = await ctx.services.hosts.probe(host, req)
    except ProbeRequestError as e:  # the host's policy (e.g. allowed log directories) refused it
        raise UserError("Not allowed", str(e), f"Usage: {USAGE}") from None
    if isinstance(result, HostFailure):
        raise UserError(f"Probe of {host} failed", result.reason, audit="error")
    view = probe_view(result, describe_selector(req), ctx.services.launches.owners(result))
    return ctx.reply(ctx.render("probe", **view))


COMMAND = CommandSpec(
    "probe", handle, Role.VIEWER, USAGE, "process tree, log tail, GPUs, port and health, in one round trip",
    slash="probe", description="Probe an inference server (process, GPUs, port, log) in one round trip",
    hint="[HOST|LAUNCH] [pgid=N|pid=N|sid=N|match=TEXT] [log=PATH] [port=N] [lines=N] [health=/PATH]",
)
