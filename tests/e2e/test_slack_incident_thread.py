"""A launch's incident thread in Slack: root message, in-place updates, thread commands, log files."""

from __future__ import annotations

import re

import pytest

from bot.core.models import LaunchState
from tests.support.builders import FAST_WATCH, launch_config
from tests.support.procs import pids_of_launch, wait_log, wait_until
from tests.support.slack import thread_of

pytestmark = pytest.mark.timeout(240)


async def test_launch_opens_a_thread_and_everything_goes_there(slack_stacks, ssh_server, fake_gpu, tmp_path):
    stack = await slack_stacks(launch_config(ssh_server, fake_gpu, tmp_path))
    fake = stack.fake
    launches = stack.runtime.launches
    await fake.push_slash_command("/launch", "base mode=hang", user_id="U0OPERATOR", channel_id="C1")
    root = await fake.wait_for_call(  # (a "Working on launch..." placeholder may come first)
        "chat.postMessage", predicate=lambda c: c["params"].get("text", "").startswith("base#1 on gpu-host-1"),
        timeout=60)
    assert root["params"]["channel"] == "C1" and root["params"].get("thread_ts") is None
    assert root["params"]["text"].startswith("base#1 on gpu-host-1: starting")
    root_ts = root["response"]["ts"]
    reply = await fake.wait_for_call(
        "chat.postMessage", predicate=lambda c: c["params"].get("thread_ts") == root_ts, timeout=60)
    assert "Launched base#1" in reply["params"]["text"]
    upd = await fake.wait_for_call("chat.update", timeout=60)
    assert upd["params"]["ts"] == root_ts and "running" in upd["params"]["text"]
    assert "<@U0OPERATOR>" in str(upd["params"]["blocks"])  # whoever launched it is mentioned

    la = launches.get(1)
    await wait_log(la.log_path, "Load weight end")
    # a viewer may look but not kill, even from inside the thread
    await fake.push_event({"type": "message", "channel": "C1", "user": "U0VIEWER", "ts": "1700000500.000100",
                           "thread_ts": root_ts, "text": "!kill"})
    denied = await fake.wait_for_ephemeral(lambda c: "Permission denied" in c["params"].get("text", ""), timeout=60)
    assert denied["params"]["thread_ts"] == root_ts and denied["params"]["user"] == "U0VIEWER"  # the viewer alone
    assert launches.get(1).state == LaunchState.RUNNING

    with open(la.log_path, "a") as f:  # a chattier server: 80 more lines
        f.writelines(f"[TP0] decode batch {i}: 12 tokens\n" for i in range(80))
    await fake.push_event({"type": "message", "channel": "C1", "user": "U0VIEWER", "ts": "1700000500.000200",
                           "thread_ts": root_ts, "text": "!logs 100"})
    await fake.wait_for_call("files.completeUploadExternal", timeout=60)
    (upload,) = fake.uploads.values()
    assert b"Load weight end" in upload and upload.count(b"decode batch") == 80
    logs_msg = await fake.wait_for_call(
        "chat.postMessage", predicate=lambda c: "Last 85 lines" in c["params"].get("text", ""), timeout=60)
    assert logs_msg["params"]["thread_ts"] == root_ts and "full text attached" in str(logs_msg["params"]["blocks"])

    # a typed !kill asks first: host, process group, process count, GPUs, GiB, and [Kill] [Cancel]
    await fake.push_event({"type": "message", "channel": "C1", "user": "U0OPERATOR", "ts": "1700000500.000300",
                           "thread_ts": root_ts, "text": "!kill"})
    ask = await fake.wait_for_answer(lambda c: "Kill base#1 on gpu-host-1?" in c["params"].get("text", ""),
                                     timeout=60)
    ask_ts = ask["params"]["ts"] if ask["method"] == "chat.update" else ask["response"]["ts"]
    assert f"process group {la.pgid}, 4 processes, GPUs 0,1," in ask["params"]["text"]
    assert re.search(r"GPUs 0,1, \d+\.\d GiB\.", ask["params"]["text"])
    buttons = next(b for b in ask["params"]["blocks"] if b["type"] == "actions")["elements"]
    assert [(b["action_id"], b["value"]) for b in buttons] == [("gpubot_kill_confirm", "1"),
                                                                ("gpubot_kill_cancel", "1")]
    assert pids_of_launch(la) and launches.get(1).state == LaunchState.RUNNING  # nothing happened yet
    # a viewer's click on [Kill] is refused on the server; the operator's click kills
    await fake.push_block_action("gpubot_kill_confirm", value="1", user_id="U0VIEWER", channel_id="C1",
                                 message_ts=ask_ts)
    await fake.wait_for_ephemeral(lambda c: "Permission denied" in c["params"].get("text", ""), timeout=60)
    assert launches.get(1).state == LaunchState.RUNNING
    await fake.push_block_action("gpubot_kill_confirm", value="1", user_id="U0OPERATOR", channel_id="C1",
                                 message_ts=ask_ts)
    decided = await fake.wait_for_call("chat.update", predicate=lambda c: c["params"]["ts"] == ask_ts
                                       and "confirmed by" in c["params"]["text"], timeout=60)
    assert "<@U0OPERATOR>" in str(decided["params"]["blocks"]) and "actions" not in str(decided["params"]["blocks"])
    killed = await fake.wait_for_answer(lambda c: "Killed base#1" in c["params"].get("text", ""), timeout=60)
    assert thread_of(fake, killed) == root_ts  # a post in the thread, or the placeholder there edited into it
    assert "released" in killed["params"]["text"]
    await fake.wait_for_call("chat.update", predicate=lambda c: "killed" in c["params"]["text"], timeout=60)
    assert pids_of_launch(la) == []
    events = stack.runtime.audit.events()
    assert [(e.action, e.user_id, e.result) for e in events if e.action == "kill"] == [
        ("kill", "U0OPERATOR", "released")]


async def test_alert_buttons_act_in_the_thread_with_server_side_permissions(slack_stacks, ssh_server, fake_gpu,
                                                                            tmp_path):
    stack = await slack_stacks(launch_config(ssh_server, fake_gpu, tmp_path), watch=True, watch_policy=FAST_WATCH)
    fake = stack.fake
    launches = stack.runtime.launches
    audit = stack.runtime.audit
    await fake.push_slash_command("/launch", "base mode=hang", user_id="U0OPERATOR", channel_id="C1")
    alert = await fake.wait_for_call(
        "chat.postMessage", predicate=lambda c: "silent_hang" in c["params"].get("text", ""), timeout=60)
    root_ts = launches.get(1).thread_ts
    assert alert["params"]["thread_ts"] == root_ts
    actions = next(b for b in alert["params"]["blocks"] if b["type"] == "actions")["elements"]
    assert [a["action_id"] for a in actions] == ["gpubot_probe", "gpubot_stack", "gpubot_kill",
                                                 "gpubot_relaunch", "gpubot_snooze"]
    assert "confirm" in actions[2] and "<@U0OPERATOR>" in str(alert["params"]["blocks"])
    alert_ts = alert["response"]["ts"]
    # a viewer clicks Kill: refused on the server, audited, nothing killed
    await fake.push_block_action("gpubot_kill", value="1", user_id="U0VIEWER", channel_id="C1",
                                 message_ts=alert_ts)
    await fake.wait_for_ephemeral(lambda c: "Permission denied" in c["params"].get("text", ""), timeout=60)
    assert launches.get(1).state == LaunchState.RUNNING
    # the operator double-clicks Kill: one kill, answered in the thread
    for _ in range(2):
        await fake.push_block_action("gpubot_kill", value="1", user_id="U0OPERATOR", channel_id="C1",
                                     message_ts=alert_ts)
    killed = await fake.wait_for_answer(lambda c: "Killed base#1" in c["params"].get("text", ""), timeout=60)
    assert thread_of(fake, killed) == root_ts  # a post in the thread, or the placeholder there edited into it
    await wait_until(lambda: audit.events(action="kill"), what="the kill audited")
    await stack.bot.drain()  # the double click's second delivery has been handled (dropped) by now
    kills = audit.events(action="kill")
    assert len(kills) == 1 and kills[0].user_id == "U0OPERATOR"
    denied = [e for e in audit.events(action="command:kill") if e.result == "denied"]
    assert denied and denied[0].user_id == "U0VIEWER"
