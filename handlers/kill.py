"""`/kill [LAUNCH|VARIANT] [--yes]` and `/kill pid=N [host=HOST] [--yes]`: stop every process of a launch (or
one foreign GPU-holding process) and verify its GPU memory is released. Without `--yes` it asks first:
host, process group, processes, GPUs and GiB, with [Kill] [Cancel] (the first operator's click decides)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.core.commands import slash
from bot.core.grammar import CommandCall
from bot.core.lifecycle import KillOutcome
from bot.core.models import Launch, LaunchState
from bot.core.transitions import being_stopped
from bot.present.actions import ActionId
from bot.present.views import kill_confirm_view, kill_view
from handlers import args
from handlers.context import Context, Role
from handlers.reply import Reply, UserError
from handlers.spec import CommandSpec

if TYPE_CHECKING:
    from bot.services.confirmations import KillRequest

USAGE = f"{slash('kill', '[LAUNCH|VARIANT] [--yes]')} | {slash('kill', 'pid=N [host=HOST] [--yes]')}"


def kill_result(ctx: Context, out: KillOutcome, la: Launch | None = None) -> Reply:
    """The answer to a kill that ran: what was signalled, what is left, GPU memory before/after."""
    msg = ctx.render("kill_result", **kill_view(out, la.gpus if la is not None else None))
    # an error before anything was signalled is a refusal (nothing was done); after, the kill failed midway
    audit = ("refused" if not out.signalled else "error") if out.error else ("released" if out.clean else "incomplete")
    return ctx.reply(msg, launch=la, audit=audit, detail=out.describe())


def confirmation(ctx: Context, req: KillRequest, confirm_command: str, action_id: ActionId,
                 la: Launch | None = None) -> Reply:
    """The answer to a typed kill without `--yes`: what would be killed, with [Kill] [Cancel] buttons whose
    value is the one-shot confirmation id (in the launch's thread for a launch)."""
    assert req.confirmation is not None
    msg = ctx.render("kill_confirm", decided=None, **kill_confirm_view(
        req.preview, confirm_command=confirm_command, value=str(req.confirmation.id), action_id=action_id))
    return ctx.reply(msg, launch=la, audit="confirmation asked")


async def _kill_pid(call: CommandCall, ctx: Context) -> Reply:
    pid = args.pid(call.kwargs["pid"], USAGE)
    host = args.host(ctx, call.kwargs.get("host") or (call.args[0] if call.args else None))
    if "yes" not in call.flags:
        req = await ctx.services.confirmations.ask_kill_pid(host, pid, user=ctx.user)
        if req.preview.refusal:
            raise UserError("Nothing to kill", req.preview.refusal)
        if req.preview.error:  # nothing seen to confirm (and no command line to check a reused pid against)
            raise UserError(f"Cannot read {host}", req.preview.error, "Try again, or kill with --yes.", audit="error")
        return confirmation(ctx, req, slash("kill", f"pid={pid}", f"host={host}", "--yes"), ActionId.KILLPID_CONFIRM)
    out = await ctx.services.launches.kill_pid(host, pid, user=ctx.user, channel=ctx.channel,
                                               expect_command=call.kwargs.get("expect_command"))
    return kill_result(ctx, out)


async def handle(call: CommandCall, ctx: Context) -> Reply:
    """Kill a launch (named, or the thread's; outside a thread it must be named) or one pid."""
    args.no_kwargs(call, USAGE, frozenset({"pid", "host", "expect_command"}))
    if "pid" in call.kwargs:
        return await _kill_pid(call, ctx)
    if len(call.args) > 1:
        raise args.bad("name at most one launch", USAGE)
    la = args.launch(ctx, call.args[0] if call.args else None, USAGE, allow_only_live=False)
    if la.state == LaunchState.STOPPING:
        raise UserError("Already stopping", being_stopped(la.name),
                        thread_ts=ctx.thread_for(la), launch_id=la.id)
    if "yes" not in call.flags:
        req = await ctx.services.confirmations.ask_kill(la, user=ctx.user)
        if req.confirmation is not None:
            return confirmation(ctx, req, slash("kill", la.id, "--yes"), ActionId.KILL_CONFIRM, la)
        if not la.live:
            raise UserError("Nothing to kill", f"{la.name} is {la.state} and has no process left on {la.host}",
                            thread_ts=ctx.thread_for(la), launch_id=la.id)
        # live but without a process: nothing to confirm, the kill only records the end
    out = await ctx.services.launches.kill(la, user=ctx.user, channel=ctx.channel)
    return kill_result(ctx, out, ctx.services.launches.get(la.id) or la)


COMMAND = CommandSpec(
    "kill", handle, Role.OPERATOR, USAGE, "stop every process of a launch and verify its GPU memory is released",
    slash="kill", description="Stop every process of a launch and verify its GPU memory is released",
    hint="[LAUNCH|VARIANT] | pid=N [host=HOST]", flags=frozenset({"yes"}),
)
