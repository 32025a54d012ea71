"""End to end: real Bolt AsyncApp over Socket Mode against a local fake Slack, probing a real SSH host."""

from __future__ import annotations

import asyncio
import time

import pytest

from bot.config import Config
from tests.support.builders import ssh_host
from tests.support.fakes.slack_server import BOT_USER_ID
from tests.support.paths import H200
from tests.support.procs import wait_until
from tests.support.slack import text_of, thread_of

pytestmark = pytest.mark.timeout(60)


def block_texts(message: dict) -> str:
    out = []
    for b in message.get("blocks") or []:
        t = b.get("text")
        if isinstance(t, dict):
            out.append(t.get("text", ""))
        for el in b.get("elements", []) or []:
            out.append(el.get("text", ""))
    return "\n".join(out)


async def test_gpu_status_over_socket_mode_posts_fixture_values(slack, start_fake_server):
    server = start_fake_server(mode="hang", workers=2, load_s=0.1)
    # each TP rank registers its GPU memory, then logs "Load weight end"
    await wait_until(lambda: server.log_path.read_text(errors="replace").count("Load weight end") == 2, 30,
                     what="both ranks loaded")
    env = await slack.fake.push_slash_command("/gpu", "status", user_id="U1", channel_id="C1")
    _, ack_s = await slack.fake.wait_for_ack(env, 20)
    call = await slack.fake.wait_for_answer(lambda c: text_of(c).startswith("GPU status"), timeout=30)
    print(f"acked after {ack_s:.3f} s")
    assert slack.fake.acks[env][1] <= call["time"]  # acked first, answered after the probe
    assert call["params"]["channel"] == "C1"
    assert call["token"] == "xoxb-test"
    text = block_texts(call["params"])
    cells = [c.strip() for c in (H200 / "freed.query-gpu.csv").read_text().split(",")]
    total_gib = f"{float(cells[4]) / 1024:.1f}"  # 143771 MiB -> 140.4
    used_gib = f"{2 * 8610 / 1024:.1f}"  # two TP workers holding 8610 MiB each -> 16.8
    assert "H200" in text
    assert f"{used_gib} / {total_gib}" in text
    assert f"{float(cells[7]):.0f}C" in text and f"{float(cells[8]):.0f}W" in text
    for line in text.splitlines():
        if "pid " in line and "GiB" in line:
            assert "8.4 GiB" in line
    assert text.count("8.4 GiB") == 2
    assert text_of(call).startswith("GPU status")  # text fallback next to blocks
    assert len(call["params"]["blocks"]) <= 50


async def test_ack_is_immediate_while_the_host_is_slow(gated_host, slack_stacks):
    srv = gated_host.server
    stack = await slack_stacks(Config(hosts={"slow-host": ssh_host(srv, command_timeout_s=60)}))
    fake = stack.fake
    t0 = time.monotonic()
    env_id = await fake.push_slash_command("/gpu", "status slow-host")
    _, ack_s = await fake.wait_for_ack(env_id, 20)
    # progress is visible while the host cannot answer: a placeholder message, later edited into the answer
    placeholder = await fake.wait_for_call("chat.postMessage", timeout=20)
    await wait_until(lambda: srv.exec_count >= 1, 20, what="the probe to reach the host")
    print(f"acked after {ack_s:.3f} s, placeholder after {placeholder['time'] - t0:.3f} s")
    assert gated_host.opened_at is None and not fake.calls_for("chat.update")  # acked before any answer
    assert "Working on `status`" in str(placeholder["params"]["blocks"])
    gated_host.open()
    call = await fake.wait_for_call("chat.update", timeout=30)
    print(f"answered {call['time'] - gated_host.opened_at:.3f} s after the host could answer")
    assert call["time"] > gated_host.opened_at  # the answer is the slow host's, not something earlier
    assert call["params"]["ts"] == placeholder["response"]["ts"]
    assert "slow-host" in text_of(call)
    await stack.settled(env_id)
    assert len(fake.calls_for("chat.postMessage")) == 1  # the answer replaced the placeholder


async def test_bang_probe_in_thread_answers_in_that_thread(slack, start_fake_server):
    server = start_fake_server(mode="ready", workers=2)
    await asyncio.to_thread(server.wait_ready)
    await slack.fake.push_event({
        "type": "message", "channel": "C1", "user": "U2", "ts": "1700000100.000200",
        "thread_ts": "1700000000.000100",
        "text": f"!probe pgid={server.pid} log={server.log_path} port={server.port}",
    })
    call = await slack.fake.wait_for_answer(lambda c: f"pgid={server.pid}" in text_of(c), timeout=30)
    p = call["params"]
    assert thread_of(slack.fake, call) == "1700000000.000100"
    text = block_texts(p)
    assert "fired up and ready to roll" in text
    assert f"Port {server.port}*: listening" in text and "ok" in text


async def test_app_mention_at_channel_level_replies_in_a_thread_of_it(slack):
    env_id = await slack.fake.push_app_mention(f"<@{BOT_USER_ID}> help", user_id="U3", channel_id="C9")
    await slack.fake.wait_for_ack(env_id, 20)
    call = await slack.fake.wait_for_answer(lambda c: "/gpu status" in text_of(c), timeout=20)
    event_ts = slack.fake.envelopes[env_id]["payload"]["event"]["ts"]
    assert call["params"]["channel"] == "C9" and thread_of(slack.fake, call) == event_ts
    assert "/gpu status" in text_of(call) and "/probe" in text_of(call)


async def test_unknown_command_and_unknown_host_get_help_and_host_list(slack):
    def ephemeral(word: str):
        return next((e for e in slack.fake.ephemerals if word in (e["text"] or "")), None)

    # usage errors go to the person who typed them alone (chat.postEphemeral), with the real mention intact
    await slack.fake.push_slash_command("/gpu", "frobnicate now")
    first = await wait_until(lambda: ephemeral("frobnicate"), 20, what="the unknown-command answer")
    assert "Unknown host or command: 'frobnicate'" in first["text"] and "/probe" in first["text"]
    assert first["user"] == "U1" and first["channel"] == "C1"
    await slack.fake.push_slash_command("/probe", "no-such-host pgid=1")
    second = await wait_until(lambda: ephemeral("Known hosts"), 20, what="the unknown-host answer")
    assert "Known hosts: gpu-host-1" in second["text"]
    assert not [c for c in slack.fake.calls_for("chat.postMessage") if "frobnicate" in text_of(c)
                or "no-such-host" in text_of(c)]


async def test_duplicate_delivery_of_a_message_is_answered_once(slack):
    event = {"type": "message", "channel": "C1", "user": "U2", "ts": "1700000200.000300", "text": "!help"}
    first = await slack.fake.push_event(event)
    again = await slack.fake.push_event(event, retry_attempt=1, retry_reason="timeout")
    await slack.fake.wait_for_answer(lambda c: "/gpu status" in text_of(c), timeout=20)
    await slack.settled(first, again)  # both deliveries handled, everything sent
    assert len(slack.fake.calls_for("chat.postMessage")) == 1


async def test_a_refused_private_answer_comes_through_the_response_url(slack):
    slack.fake.set_error("chat.postEphemeral", "not_in_channel")  # e.g. the bot is not in that channel
    await slack.fake.push_slash_command("/gpu", "frobnicate")
    await wait_until(lambda: any("frobnicate" in str(body) for _, body in slack.fake.responses), 30,
                     what="the answer through the response_url")
    (body,) = [b for _r, b in slack.fake.responses if "frobnicate" in str(b)]
    assert body.get("response_type") == "ephemeral" and "Unknown host or command" in body.get("text", "")
    assert not [c for c in slack.fake.calls_for("chat.postMessage") if "frobnicate" in text_of(c)]


async def test_an_edited_command_is_not_run_but_audited_and_answered_to_its_author(slack):
    env_id = await slack.fake.push_event({
        "type": "message", "subtype": "message_changed", "channel": "C1", "event_ts": "1700000300.000500",
        "message": {"type": "message", "user": "U2", "ts": "1700000300.000400", "text": "!kill 1 --yes"},
        "previous_message": {"type": "message", "user": "U2", "ts": "1700000300.000400", "text": "!kil 1"},
    })
    await slack.fake.wait_for_ack(env_id, 20)
    note = await wait_until(lambda: next((e for e in slack.fake.ephemerals if "edited message" in (e["text"] or "")),
                                         None), 20, what="the note to the edit's author")
    assert note["user"] == "U2" and note["channel"] == "C1"
    event = await wait_until(lambda: next(iter(slack.runtime.audit.events(action="command:edit")), None), 20,
                             what="the audit row of the edit")
    assert (event.result, event.user_id, event.channel) == ("ignored", "U2", "C1")
    assert event.args["text"] == "!kill 1 --yes"
    assert not slack.runtime.audit.events(action="command:kill")  # nothing ran
    # an edit of ordinary chat is chat: nothing answered, nothing audited
    chat = await slack.fake.push_event({
        "type": "message", "subtype": "message_changed", "channel": "C1", "event_ts": "1700000301.000500",
        "message": {"type": "message", "user": "U2", "ts": "1700000301.000400", "text": "lunch at noon?"}})
    await slack.settled(env_id, chat)
    assert len(slack.runtime.audit.events(action="command:edit")) == 1
