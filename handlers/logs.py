"""`!logs [N]` in a launch thread, or `/gpu logs LAUNCH [N]`: the last N lines of a launch's log."""

from __future__ import annotations

from bot.core.commands import slash, thread
from bot.core.grammar import CommandCall
from bot.core.lifecycle import LaunchError
from bot.core.models import HostFailure
from bot.present.views import probe_view
from handlers import args
from handlers.context import Context, Role
from handlers.reply import Reply, UserError
from handlers.spec import CommandSpec

USAGE = f"{thread('logs', '[N]')} in a launch thread, or {slash('logs', 'LAUNCH [N]')}"
#: More lines than this go as a file into the thread.
LOGS_INLINE_MAX = 40
#: Most lines one `!logs` asks for (a probe reads at most 500 of them).
LOGS_MAX = 5000


async def handle(call: CommandCall, ctx: Context) -> Reply:
    """The last N lines (default 50) of the launch's log, with its size and seconds since the last write;
    more than LOGS_INLINE_MAX lines are attached as a file. In a launch's thread a lone number is N; outside
    one it names the launch (`/gpu logs 3`: launch 3; `/gpu logs 3 200` or `lines=200` for both)."""
    args.no_kwargs(call, USAGE, frozenset({"lines"}))
    ref, n_text = args.launch_and_number(call, USAGE)
    r = ctx.request
    if ref is None and n_text is not None and ctx.services.launches.thread_launch(r.channel_id, r.thread_ts) is None:
        ref, n_text = n_text, None  # outside a launch's thread a lone number names the launch: `/gpu logs 3`
    n = args.count(n_text or call.kwargs.get("lines", "50"), 1, LOGS_MAX, "N", USAGE)
    la = args.launch(ctx, ref, USAGE)
    try:
        snap = await ctx.services.launches.read_log(la, min(n, 500))
    except LaunchError as e:
        raise UserError("No log", str(e), launch_id=la.id) from None
    if isinstance(snap, HostFailure):
        raise UserError(f"Logs of {la.name} unavailable", snap.reason, audit="error", launch_id=la.id)
    view = probe_view(snap, la.name)["log"] or {}
    lines = view.get("tail", [])
    attach = len(lines) > LOGS_INLINE_MAX
    msg = ctx.render("logs", name=la.name, path=la.log_path, error=snap.log.error if snap.log else "not read",
                     lines=lines, total=view.get("lines"), total_exact=view.get("lines_exact", True),
                     size=view.get("size_bytes"),
                     since=view.get("since_write_s"), attach=attach)
    if attach and not msg.files:
        msg.files.append((f"{la.variant}-{la.id}.log.txt", "\n".join(lines).encode()))
    return ctx.reply(msg, launch=la)


COMMAND = CommandSpec("logs", handle, Role.VIEWER, USAGE, "last N lines of a launch's log (a file when long)")
