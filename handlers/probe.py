"""`/probe [HOST] [pgid=N|pid=N|sid=N|match=TEXT] [log=PATH] [port=N] [lines=N] [health=/PATH]`.

Shows the process tree, the log (lines, bytes, seconds since last write, last lines), the GPUs, whether
the port is listening and the health endpoint's answer: one probe, one SSH round trip.
"""

from __future__ import annotations

from bot.core.grammar import CommandCall
from bot.core.models import HostFailure
from bot.core.probe import ProbeRequest, ProbeRequestError
from bot.present.render import Message, render
from bot.present.views import probe_view
from bot.services.hosts import UnknownHost
from handlers.base import CommandContext, error_message

USAGE = "/probe [HOST] [pgid=N|pid=N|sid=N|match=TEXT] [log=PATH] [port=N] [lines=N] [health=/PATH]"
_INT_KEYS = ("pid", "pgid", "sid", "port", "lines")
_ALLOWED = {"pid", "pgid", "sid", "match", "log", "port", "lines", "health", "host"}


def build_request(call: CommandCall) -> ProbeRequest:
    """ProbeRequest from `call.kwargs`. Raises ProbeRequestError with a user-facing message."""
    unknown = sorted(set(call.kwargs) - _ALLOWED)
    if unknown:
        raise ProbeRequestError(f"unknown argument(s): {', '.join(k + '=' for k in unknown)}")
    ints: dict[str, int] = {}
    for k in _INT_KEYS:
        if k in call.kwargs:
            v = call.kwargs[k].strip()
            if not (v.isascii() and v.isdigit()) or len(v) > 9:
                raise ProbeRequestError(f"{k}= must be a positive integer, got {v[:40]!r}")
            ints[k] = int(v)
    req = ProbeRequest(
        pid=ints.get("pid"),
        pgid=ints.get("pgid"),
        sid=ints.get("sid"),
        match=call.kwargs.get("match"),
        log_path=call.kwargs.get("log"),
        port=ints.get("port"),
        tail_lines=ints.get("lines", 20),
    )
    if "health" in call.kwargs:
        req.health_path = call.kwargs["health"]
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


async def handle_probe(call: CommandCall, ctx: CommandContext) -> Message:
    """Answer `/probe`. Returns the rendered probe, or an error message for bad arguments, an unknown
    host, or a host that could not be reached (with the reason)."""
    from handlers.launch import handle_thread_probe

    thread_answer = await handle_thread_probe(call, ctx)
    if thread_answer is not None:
        return thread_answer
    if len(call.args) > 1:
        return error_message("Bad arguments", f"expected at most one host name, got {len(call.args)} words",
                             f"Usage: {USAGE}")
    host_arg = call.args[0] if call.args else call.kwargs.get("host")
    try:
        host = ctx.hosts.resolve_host(host_arg)
    except UnknownHost as e:
        what = repr(host_arg[:60]) if host_arg else "no host given and no default host"
        return error_message("Unknown host", what, f"Known hosts: {', '.join(e.known) or '(none configured)'}")
    try:
        req = build_request(call)
    except ProbeRequestError as e:
        return error_message("Bad arguments", str(e), f"Usage: {USAGE}")
    try:
        result = await ctx.hosts.probe(host, req)
    except ProbeRequestError as e:  # the host's policy (e.g. allowed log directories) refused it
        return error_message("Not allowed", str(e), f"Usage: {USAGE}")
    if isinstance(result, HostFailure):
        return error_message(f"Probe of {host} failed", result.reason)
    owners = {h.pid: h.owner for h in ctx.launches.holders(result)} if ctx.launches is not None else None
    return render("probe", **probe_view(result, describe_selector(req), owners))
