"""Safe for a whole team, in Slack: a viewer cannot act by any route (slash command, thread message,
button), every attempt is audited; a typed kill waits for [Kill] and [Cancel] stops it."""

from __future__ import annotations

import pytest

from bot.core.models import LaunchState
from tests.support.builders import launch_config
from tests.support.procs import pids_of_launch, wait_log, wait_until

pytestmark = pytest.mark.timeout(240)


async def _launched(fake, stack):
    await fake.push_slash_command("/launch", "base mode=hang", user_id="U0OPERATOR", channel_id="C1")
    root = await fake.wait_for_call(  # (a "Working on launch..." placeholder may come first)
        "chat.postMessage", predicate=lambda c: c["params"].get("text", "").startswith("base#1 on gpu-host-1"),
        timeout=60)
    await fake.wait_for_answer(lambda c: "Launched base#1" in c["params"].get("text", ""), timeout=60)
    la = stack.runtime.launches.get(1)
    await wait_log(la.log_path, "Load weight end")
    return la, root["response"]["ts"]


async def test_a_viewer_cannot_launch_kill_relaunch_or_stack_dump_by_any_route(slack_stacks, ssh_server, fake_gpu,
                                                                              tmp_path):
    stack = await slack_stacks(launch_config(ssh_server, fake_gpu, tmp_path))
    fake = stack.fake
    audit = stack.runtime.audit
    la, root_ts = await _launched(fake, stack)
    slash = [("/launch", "base"), ("/kill", "1"), ("/kill", "1 --yes"), ("/relaunch", "1"),
             ("/gpu", "stack 1"), ("/gpu", "launch base"), ("/kill", f"pid={la.pid} --yes")]
    for cmd, text in slash:
        await fake.push_slash_command(cmd, text, user_id="U0VIEWER", channel_id="C1")
    thread = ["!kill", "!kill --yes", "!relaunch", "!stack", "!launch base"]
    for i, text in enumerate(thread):
        await fake.push_event({"type": "message", "channel": "C1", "user": "U0VIEWER",
                               "ts": f"1700000600.{i:06d}", "thread_ts": root_ts, "text": text})
    mentions = ["<@UBOT> kill --yes", "<@UBOT> relaunch", "<@UBOT> stack"]
    for text in mentions:
        await fake.push_app_mention(text, user_id="U0VIEWER", channel_id="C1", thread_ts=root_ts)
    # the operator's typed kill waits for a click: the viewer clicks its [Kill] and [Cancel]
    await fake.push_slash_command("/kill", "1", user_id="U0OPERATOR", channel_id="C1")
    ask = await fake.wait_for_answer(lambda c: "Kill base#1 on gpu-host-1?" in c["params"].get("text", ""),
                                     timeout=60)
    conf = next(b for b in ask["params"]["blocks"] if b["type"] == "actions")["elements"][0]["value"]
    buttons = [("gpubot_kill", "1"), ("gpubot_relaunch", "1"), ("gpubot_stack", "1"),
               ("gpubot_kill_confirm", conf), ("gpubot_killpid_confirm", conf), ("gpubot_kill_cancel", conf)]
    for action_id, value in buttons:
        await fake.push_block_action(action_id, value=value, user_id="U0VIEWER", channel_id="C1",
                                     message_ts=root_ts)
    # a forged value (not a confirmation id) does nothing and is audited as invalid
    await fake.push_block_action("gpubot_killpid_confirm", value=f"gpu-host-1|{la.pid}", user_id="U0VIEWER",
                                 channel_id="C1", message_ts=root_ts)
    attempts = len(slash) + len(thread) + len(mentions) + len(buttons)

    def denials() -> list:
        return [e for e in audit.events() if e.result == "denied" and e.user_id == "U0VIEWER"]

    await wait_until(lambda: len(denials()) >= attempts, 60, what=f"{attempts} denials")
    await stack.bot.drain()  # every command the bot took has finished: anything that would act, has
    assert len(denials()) == attempts, "; ".join(f"{e.action} {e.args}" for e in denials())
    sources = {e.args.get("source") for e in denials()}
    assert sources == {"slash", "prefix", "mention", "button"}
    # nothing happened: one launch, still running, never signalled, no stack dump
    assert [x.id for x in stack.runtime.launches.live()] == [1]
    assert stack.runtime.launches.get(1).state == LaunchState.RUNNING and pids_of_launch(la)
    assert not [e for e in audit.events() if e.action in ("kill", "kill_pid", "relaunch", "stack_dump")]
    invalid = [e for e in audit.events() if e.result == "invalid"]
    assert [(e.user_id, e.args["text"]) for e in invalid] == [
        ("U0VIEWER", f"[button gpubot_killpid_confirm gpu-host-1|{la.pid}]")]
    # every denial went to the viewer alone (chat.postEphemeral), none into the channel or a thread
    await wait_until(lambda: sum("Permission denied" in (e["text"] or "") for e in fake.ephemerals) >= attempts, 60,
                     what="the denials, each shown to the viewer alone")
    assert all(e["user"] == "U0VIEWER" for e in fake.ephemerals if "Permission denied" in (e["text"] or ""))
    assert not [c for c in fake.calls if c["method"] in ("chat.postMessage", "chat.update")
                and "Permission denied" in str(c["params"].get("text", ""))]


async def test_a_typed_kill_waits_for_confirmation_and_cancel_stops_it(slack_stacks, ssh_server, fake_gpu, tmp_path):
    stack = await slack_stacks(launch_config(ssh_server, fake_gpu, tmp_path))
    fake = stack.fake
    audit = stack.runtime.audit
    la, root_ts = await _launched(fake, stack)
    await fake.push_slash_command("/kill", "base", user_id="U0OPERATOR", channel_id="C1")
    ask = await fake.wait_for_answer(lambda c: "Kill base#1 on gpu-host-1?" in c["params"].get("text", ""),
                                     timeout=60)
    assert ask["method"] == "chat.postMessage" and ask["params"]["thread_ts"] == root_ts  # in the thread
    ask_ts = ask["response"]["ts"]
    await fake.push_block_action("gpubot_kill_cancel", value="1", user_id="U0OTHER", channel_id="C1",
                                 message_ts=ask_ts)
    cancelled = await fake.wait_for_call(
        "chat.update", predicate=lambda c: c["params"]["ts"] == ask_ts and "cancelled" in c["params"]["text"],
        timeout=60)
    assert "<@U0OTHER>" in str(cancelled["params"]["blocks"]) and "actions" not in str(cancelled["params"])
    await stack.bot.drain()
    assert stack.runtime.launches.get(1).state == LaunchState.RUNNING and pids_of_launch(la)
    assert not audit.events(action="kill")
    rows = [(e.action, e.user_id, e.result) for e in audit.events() if e.action.startswith("command:")]
    assert rows[-2:] == [("command:kill", "U0OPERATOR", "confirmation asked"),
                         ("command:cancel", "U0OTHER", "cancelled")], rows
    # --yes skips the question
    await fake.push_slash_command("/kill", "base --yes", user_id="U0OPERATOR", channel_id="C1")
    await fake.wait_for_answer(lambda c: "Killed base#1" in c["params"].get("text", ""), timeout=60)
    assert pids_of_launch(la) == [] and stack.runtime.launches.get(1).state == LaunchState.KILLED


async def test_a_confirmation_is_decided_once_kill_then_cancel_and_two_kills(slack_stacks, ssh_server, fake_gpu,
                                                                             tmp_path):
    """Two operators click [Kill] and another clicks [Cancel] right after: one kill, the others are told
    the kill was already confirmed; a second typed kill while the first runs is refused."""
    stack = await slack_stacks(launch_config(ssh_server, fake_gpu, tmp_path))
    fake = stack.fake
    audit = stack.runtime.audit
    la, root_ts = await _launched(fake, stack)
    await fake.push_slash_command("/kill", "1", user_id="U0OPERATOR", channel_id="C1")
    ask = await fake.wait_for_answer(lambda c: "Kill base#1 on gpu-host-1?" in c["params"].get("text", ""),
                                     timeout=60)
    ask_ts = ask["response"]["ts"]
    conf = next(b for b in ask["params"]["blocks"] if b["type"] == "actions")["elements"][0]["value"]
    for user, action in (("U0OPERATOR", "gpubot_kill_confirm"), ("U0OTHER", "gpubot_kill_confirm"),
                         ("U0OTHER", "gpubot_kill_cancel")):
        await fake.push_block_action(action, value=conf, user_id=user, channel_id="C1", message_ts=ask_ts)
    await fake.push_slash_command("/kill", "1 --yes", user_id="U0OTHER", channel_id="C1")
    await fake.wait_for_answer(lambda c: "Killed base#1" in c["params"].get("text", ""), timeout=60)
    await wait_until(lambda: len([e for e in audit.events() if e.result == "stale"]) == 2, 30,
                     what="the two late clicks audited")
    await stack.bot.drain()
    kills = [(e.user_id, e.result) for e in audit.events(action="kill")]
    assert kills == [("U0OPERATOR", "released")], kills
    stale = sorted((e.action, e.user_id) for e in audit.events() if e.result == "stale")
    assert stale == [("command:cancel", "U0OTHER"), ("command:confirm", "U0OTHER")]
    told = [c for c in fake.calls_for("chat.postMessage") if "already confirmed by" in c["params"]["text"]]
    assert len(told) == 2 and all(c["params"]["thread_ts"] == root_ts for c in told)
    assert stack.runtime.launches.get(1).state == LaunchState.KILLED and pids_of_launch(la) == []
