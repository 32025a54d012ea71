"""`/launch`, `/kill`, `/relaunch` and the thread command `!logs N`.

Every launch opens one incident thread: a root message in the channel (variant, host, params, who, state)
that is edited in place when the state changes; everything else about the launch goes into its thread,
where commands apply to that launch without naming it.
"""

from __future__ import annotations

import logging
import time

from bot.adapters.remote import RemoteError
from bot.adapters.store import Launch
from bot.core.grammar import CommandCall
from bot.core.lifecycle import LaunchError
from bot.core.models import HostFailure
from bot.core.stackdump import render_stack_dump, take_stack_dump
from bot.present.render import Message, render
from bot.present.views import kill_confirm_view, kill_view, launch_outcome_view, launch_view, probe_view
from bot.services.launches import KillPreview, redact_params
from handlers.base import CommandContext, error_message

log = logging.getLogger(__name__)

LAUNCH_USAGE = "/launch VARIANT [host=HOST] [param=value ...]"
KILL_USAGE = "/kill [LAUNCH|VARIANT] [--yes] | /kill pid=N [host=HOST] [--yes]"
RELAUNCH_USAGE = "/relaunch [LAUNCH|VARIANT] [param=value ...]"
LOGS_USAGE = "!logs [N] in a launch thread, or /gpu logs LAUNCH [N]"
#: `!logs` with more lines than this goes as a file into the thread.
LOGS_INLINE_MAX = 40
LOGS_MAX = 5000


def _no_launch_service(ctx: CommandContext) -> Message | None:
    if ctx.launches is None:
        return error_message("Not available", "launches need the bot's state store, which is not configured here")
    return None


async def update_root(ctx: CommandContext, la: Launch) -> None:
    """Edit the launch's root message (its thread parent) to show the current state; failures are logged."""
    if ctx.surface is None or not la.channel or not la.thread_ts:
        return
    assert ctx.launches is not None
    newest = ctx.launches.store.launch_for_thread(la.channel, la.thread_ts)
    if newest is not None and newest.id != la.id:
        return  # the thread's root now shows its relaunch; an old launch must not overwrite it
    ok = await ctx.surface.update(la.channel, la.thread_ts, render("launch_root", **launch_view(la)))
    if not ok:
        log.warning("could not update the root message of %s", la.name)


async def handle_launch(call: CommandCall, ctx: CommandContext) -> Message:
    """`/launch VARIANT [host=H] [param=value ...]`: pre-launch checks, record, root message, start."""
    if (err := _no_launch_service(ctx)) is not None:
        return err
    assert ctx.launches is not None
    if len(call.args) != 1:
        known = ", ".join(ctx.config.variants) or "(none configured)"
        return error_message("Bad arguments", "name exactly one variant", f"Usage: {LAUNCH_USAGE}. Variants: {known}")
    variant = call.args[0]
    params = dict(call.kwargs)
    host = params.pop("host", None)

    async def on_created(la: Launch) -> str | None:
        if ctx.surface is None:
            return None
        return await ctx.surface.post(ctx.channel_id, render("launch_root", **launch_view(la)))

    try:
        # every launch opens its own incident thread (typed in another launch's thread or not)
        outcome = await ctx.launches.launch(variant, params, user=ctx.user_id, channel=ctx.channel_id, host=host,
                                            on_created=on_created)
    except LaunchError as e:
        ctx.launches.store.add_event(user_id=ctx.user_id, action="launch",
                                     args={"variant": variant, **redact_params(dict(call.kwargs))},
                                     result="invalid", detail=str(e), channel=ctx.channel_id)
        return error_message("Cannot launch", str(e), f"Usage: {LAUNCH_USAGE}")
    if outcome.launch is not None:
        ctx.reply_thread_ts = outcome.launch.thread_ts
        await update_root(ctx, outcome.launch)
    msg = render("launch_result", **launch_outcome_view(outcome, variant, host))
    msg.ok = outcome.ok
    return msg


def _resolve(call: CommandCall, ctx: CommandContext, usage: str) -> Launch | Message:
    """The launch `call` acts on (see `_target`), with the answer routed to that launch's thread; or an
    error Message naming the live launches."""
    try:
        la = _target(call, ctx)
    except LaunchError as e:
        return error_message("Which launch?", str(e), f"Usage: {usage}")
    if la.thread_ts and la.channel == ctx.channel_id:
        ctx.reply_thread_ts = la.thread_ts
    return la


def _target(call: CommandCall, ctx: CommandContext) -> Launch:
    """The launch a kill/relaunch acts on: named, or the launch of this thread. Never a guess: outside a
    launch thread the launch must be named."""
    assert ctx.launches is not None
    if len(call.args) > 1:
        raise LaunchError("name at most one launch")
    return ctx.launches.find(call.args[0] if call.args else None, channel=ctx.channel_id, thread_ts=ctx.thread_ts,
                             allow_only_live=False)


async def handle_kill(call: CommandCall, ctx: CommandContext) -> Message:
    """`/kill [LAUNCH|VARIANT]` or `/kill pid=N [host=H]`: stop every process, verify GPU memory released."""
    if (err := _no_launch_service(ctx)) is not None:
        return err
    assert ctx.launches is not None
    if "pid" in call.kwargs:
        pid_text = call.kwargs["pid"].strip()
        if not (pid_text.isascii() and pid_text.isdigit()) or not 1 < int(pid_text) <= 4_194_304:
            return error_message("Bad arguments", "pid= must be a process id (2..4194304)", f"Usage: {KILL_USAGE}")
        try:
            host = ctx.hosts.resolve_host(call.kwargs.get("host") or (call.args[0] if call.args else None))
        except KeyError:
            return error_message("Unknown host", repr(call.kwargs.get("host")),
                                 f"Known hosts: {', '.join(ctx.config.hosts)}")
        if "yes" not in call.flags:
            pv = await ctx.launches.kill_pid_preview(host, int(pid_text))
            if pv.refusal:
                return error_message("Nothing to kill", pv.refusal)
            if pv.error:  # nothing seen to confirm (and no command line to check a reused pid against)
                return error_message(f"Cannot read {host}", pv.error, "Try again, or kill with --yes.")
            return _kill_confirmation(ctx, pv, f"/kill pid={pid_text} host={host} --yes", "gpubot_killpid_confirm")
        out = await ctx.launches.kill_pid(host, int(pid_text), user=ctx.user_id, channel=ctx.channel_id,
                                          expect_command=call.kwargs.get("expect_command"))
        msg = render("kill_result", **kill_view(out))
        msg.ok = not out.error and not out.remaining
        return msg
    la = _resolve(call, ctx, KILL_USAGE)
    if isinstance(la, Message):
        return la
    if la.state == "stopping":
        return error_message("Already stopping", f"{la.name} is being stopped by another kill; its answer follows")
    if "yes" not in call.flags:
        pv = await ctx.launches.kill_preview(la)
        if pv.processes or pv.error:
            return _kill_confirmation(ctx, pv, f"/kill {la.id} --yes", "gpubot_kill_confirm")
        if not la.live:
            return error_message("Nothing to kill", f"{la.name} is {la.state} and has no process left on {la.host}")
        # live but without a process: nothing to confirm, the kill only records the end
    out = await ctx.launches.kill(la, user=ctx.user_id, channel=ctx.channel_id)
    la = ctx.launches.store.get_launch(la.id) or la
    await update_root(ctx, la)
    msg = render("kill_result", **kill_view(out, la.gpus))
    msg.ok = not out.error and not out.remaining
    return msg


def _kill_confirmation(ctx: CommandContext, pv: KillPreview, confirm_command: str, action_id: str) -> Message:
    """The answer to a typed kill without `--yes`: what would be killed, with [Kill] [Cancel] buttons
    whose value is a one-shot confirmation recorded in the store (the first click decides it)."""
    assert ctx.launches is not None
    conf_id = ctx.launches.store.add_confirmation(
        asked_by=ctx.user_id, host=pv.host, launch_id=pv.launch_id, pid=pv.pid,
        command=pv.processes[0].args if pv.pid is not None and pv.processes else None)
    msg = render("kill_confirm", **kill_confirm_view(pv, confirm_command=confirm_command, value=str(conf_id),
                                                     action_id=action_id), decided=None)
    msg.audit_result = "confirmation asked"
    return msg


async def handle_relaunch(call: CommandCall, ctx: CommandContext) -> Message:
    """`/relaunch [LAUNCH|VARIANT] [param=value ...]`: kill (verified), then launch in the same thread."""
    if (err := _no_launch_service(ctx)) is not None:
        return err
    assert ctx.launches is not None
    try:
        la = _target(call, ctx)
        k, new = await ctx.launches.relaunch(la, dict(call.kwargs), user=ctx.user_id, channel=ctx.channel_id)
    except LaunchError as e:
        return error_message("Cannot relaunch", str(e), f"Usage: {RELAUNCH_USAGE}")
    if la.thread_ts and la.channel == ctx.channel_id:
        ctx.reply_thread_ts = la.thread_ts
    old = ctx.launches.store.get_launch(la.id) or la
    kill_msg = render("kill_result", **kill_view(k, old.gpus))
    if new is None:
        await update_root(ctx, old)
        note = "Relaunch cancelled: the old launch did not stop cleanly."
        return Message(text=kill_msg.text + "\n" + note,
                       blocks=(kill_msg.blocks or []) + [{"type": "section", "text": {"type": "mrkdwn",
                                                                                      "text": f":no_entry: {note}"}}])
    if new.launch is not None:
        await update_root(ctx, new.launch)
    started = render("launch_result", **launch_outcome_view(new, la.variant, la.host))
    return Message(text=kill_msg.text + "\n" + started.text, blocks=(kill_msg.blocks or []) + (started.blocks or []),
                   files=kill_msg.files + started.files)


async def handle_logs(call: CommandCall, ctx: CommandContext) -> Message:
    """`!logs [N]`: the last N lines (default 50) of the launch's log; more than 40 lines go as a file."""
    if (err := _no_launch_service(ctx)) is not None:
        return err
    assert ctx.launches is not None
    # `!logs N` in a thread; `/logs LAUNCH N` anywhere (LAUNCH: 12, base#12 or a variant)
    words = list(call.args)
    nums = [a for a in words if a.isascii() and a.isdigit()]
    refs = [a for a in words if not (a.isascii() and a.isdigit())]
    if len(nums) == 2 and not refs:
        refs, nums = [nums[0]], [nums[1]]
    if len(nums) > 1 or len(refs) > 1:
        return error_message("Bad arguments", "expected at most a launch and a line count", f"Usage: {LOGS_USAGE}")
    n_text = nums[0] if nums else call.kwargs.get("lines", "50")
    if not (n_text.isascii() and n_text.isdigit()) or not 1 <= int(n_text) <= LOGS_MAX:
        return error_message("Bad arguments", f"N must be 1..{LOGS_MAX}", f"Usage: {LOGS_USAGE}")
    try:
        la = ctx.launches.find(refs[0] if refs else None, channel=ctx.channel_id, thread_ts=ctx.thread_ts)
    except LaunchError as e:
        return error_message("Which launch?", str(e), f"Usage: {LOGS_USAGE}")
    if not la.log_path:
        return error_message("No log", f"{la.name} has no log path")
    req = ctx.launches.launch_probe_request(la, tail_lines=min(int(n_text), 500), gpu=False)
    req.port = None
    if int(n_text) > 500:
        req.tail_lines = 500
    snap = await ctx.hosts.probe(la.host, req)
    if isinstance(snap, HostFailure):
        return error_message(f"Logs of {la.name} unavailable", snap.reason)
    lg = snap.log
    view = probe_view(snap, la.name)["log"] or {}
    lines = view.get("tail", [])
    attach = len(lines) > LOGS_INLINE_MAX
    msg = render("logs", name=la.name, path=la.log_path, error=lg.error if lg else "not read", lines=lines,
                 total=view.get("lines"), size=view.get("size_bytes"), since=view.get("since_write_s"), attach=attach)
    if attach and not msg.files:
        msg.files.append((f"{la.variant}-{la.id}.log.txt", "\n".join(lines).encode()))
    return msg


SNOOZE_USAGE = "!snooze [MINUTES] (in a launch thread; default 15)"


async def handle_snooze(call: CommandCall, ctx: CommandContext) -> Message:
    """`!snooze [MINUTES]`: no alerts for this launch for MINUTES (1..1440, default 15); checks go on."""
    if (err := _no_launch_service(ctx)) is not None:
        return err
    assert ctx.launches is not None
    nums = [a for a in call.args if a.isascii() and a.isdigit()]
    refs = [a for a in call.args if not (a.isascii() and a.isdigit())]
    minutes = int(nums[0]) if nums else 15
    if not 1 <= minutes <= 1440 or len(refs) > 1:
        return error_message("Bad arguments", "minutes must be 1..1440", f"Usage: {SNOOZE_USAGE}")
    try:
        la = ctx.launches.find(refs[0] if refs else None, channel=ctx.channel_id, thread_ts=ctx.thread_ts,
                               allow_only_live=False)
    except LaunchError as e:
        return error_message("Which launch?", str(e), f"Usage: {SNOOZE_USAGE}")
    until = time.time() + minutes * 60
    ctx.launches.store.update_launch(la.id, snoozed_until=until)
    ctx.launches.store.add_event(user_id=ctx.user_id, action="snooze", args={"launch": la.name, "minutes": minutes},
                                 launch_id=la.id, host=la.host, channel=ctx.channel_id)
    if la.thread_ts and la.channel == ctx.channel_id:
        ctx.reply_thread_ts = la.thread_ts
    return render("error", title=f"Alerts of {la.name} snoozed", detail=f"for {minutes} min; checks go on",
                  hint=None)


CHART_USAGE = "!chart [LAUNCH]"


async def handle_chart(call: CommandCall, ctx: CommandContext) -> Message:
    """`!chart [LAUNCH]`: the launch's timeline chart from its readiness checks, attached as a PNG."""
    from bot.services.watch import chart_png

    if (err := _no_launch_service(ctx)) is not None:
        return err
    assert ctx.launches is not None
    try:
        la = ctx.launches.find(call.args[0] if call.args else None, channel=ctx.channel_id,
                               thread_ts=ctx.thread_ts)
    except LaunchError as e:
        return error_message("Which launch?", str(e), f"Usage: {CHART_USAGE}")
    if la.thread_ts and la.channel == ctx.channel_id:
        ctx.reply_thread_ts = la.thread_ts
    records = ctx.launches.store.observations(la.id)
    png = chart_png(la, records)
    msg = render("error", title=f"Timeline of {la.name}", detail=f"{len(records)} checks", hint=None)
    msg.files.append((f"{la.variant}-{la.id}-timeline.png", png))
    return msg


STACK_USAGE = "!stack [LAUNCH] [--native]"


async def handle_stack(call: CommandCall, ctx: CommandContext) -> Message:
    """`!stack [LAUNCH] [--native]`: `py-spy dump` of every process of the launch, summarized in the thread
    with the full dump attached as a file; clear messages when py-spy is missing or not permitted."""
    if (err := _no_launch_service(ctx)) is not None:
        return err
    assert ctx.launches is not None
    la = _resolve(call, ctx, STACK_USAGE)
    if isinstance(la, Message):
        return la
    snap = await ctx.launches.probe_launch(la, tail_lines=1)
    if isinstance(snap, HostFailure):
        return error_message(f"Stack dump of {la.name} failed", snap.reason)
    pids = sorted({p.pid for p in ctx.launches.launch_processes_of(la, snap)})
    if not pids:
        return error_message(f"Stack dump of {la.name}", "no process of this launch is alive")
    host_cfg = ctx.config.hosts[la.host]
    try:
        dumps = await take_stack_dump(ctx.hosts.executor(la.host), pids[:64], sudo=host_cfg.py_spy_sudo,
                                      native="native" in call.flags, py_spy=host_cfg.py_spy)
    except RemoteError as e:
        return error_message(f"Stack dump of {la.name} failed", str(e))
    ctx.launches.store.add_event(user_id=ctx.user_id, action="stack_dump", args={"launch": la.name, "pids": pids},
                                 result="ok" if any(d.ok for d in dumps) else "error", launch_id=la.id,
                                 host=la.host, channel=ctx.channel_id)
    return render_stack_dump(la.host, dumps, native="native" in call.flags)


async def handle_thread_probe(call: CommandCall, ctx: CommandContext) -> Message | None:
    """`!probe` with no selector inside a launch thread: a probe of that launch. None when not applicable."""
    if ctx.launches is None or not ctx.thread_ts or call.args or call.kwargs:
        return None
    la = ctx.launches.store.launch_for_thread(ctx.channel_id, ctx.thread_ts)
    if la is None:
        return None
    snap = await ctx.launches.probe_launch(la)
    if isinstance(snap, HostFailure):
        return error_message(f"Probe of {la.name} failed", snap.reason)
    owners = {h.pid: h.owner for h in ctx.launches.holders(snap)}
    return render("probe", **probe_view(snap, f"{la.name} (pgid={la.pgid})", owners))
