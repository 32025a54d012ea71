"""End to end: real Bolt AsyncApp over Socket Mode against a local fake Slack, probing a real SSH host."""

from __future__ import annotations

import asyncio
import time

import pytest

from bot.config import Config
from tests.conftest import H200, ssh_host
from tests.e2e.conftest import start_stack
from tests.support.fakes.slack_server import BOT_USER_ID
from tests.support.fakes.ssh_server import LoopbackSSHServer

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
    await asyncio.to_thread(server.wait_log, "Load weight end", 20)
    await asyncio.sleep(0.3)
    env = await slack.fake.push_slash_command("/gpu", "status", user_id="U1", channel_id="C1")
    _, ack_s = await slack.fake.wait_for_ack(env, 5)
    assert ack_s < 1.0
    call = await slack.fake.wait_for_call("chat.postMessage", timeout=20)
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
    assert call["params"]["text"].startswith("GPU status")  # text fallback next to blocks
    assert len(call["params"]["blocks"]) <= 50


async def test_ack_is_immediate_while_the_host_is_slow(tmp_path, fake_gpu):
    env = {"PATH": f"{fake_gpu.bin_dir}:/usr/bin:/bin"}
    async with LoopbackSSHServer(tmp_path / "slow", env=env, exec_delay_s=5.0) as srv:
        cfg = Config(hosts={"slow-host": ssh_host(srv)})
        stack, stop = await start_stack(cfg)
        try:
            t0 = time.monotonic()
            env_id = await stack.fake.push_slash_command("/gpu", "status slow-host")
            _, ack_s = await stack.fake.wait_for_ack(env_id, 5)
            placeholder = await stack.fake.wait_for_call("chat.postMessage", timeout=5)
            call = await stack.fake.wait_for_call("chat.update", timeout=30)
        finally:
            await stop()
    assert ack_s < 1.0, f"ack took {ack_s:.2f} s"
    # progress is visible within a second: a placeholder message, later edited into the answer
    assert placeholder["time"] - t0 < 1.0, f"placeholder after {placeholder['time'] - t0:.2f} s"
    assert "Working on `status`" in str(placeholder["params"]["blocks"])
    answered = call["time"] - t0
    assert answered >= 5.0, f"answer came after {answered:.2f} s, before the slow host could answer"
    assert call["params"]["ts"] == placeholder["response"]["ts"]
    assert "slow-host" in call["params"]["text"]
    assert len(stack.fake.calls_for("chat.postMessage")) == 1  # the answer replaced the placeholder


async def test_bang_probe_in_thread_answers_in_that_thread(slack, start_fake_server):
    server = start_fake_server(mode="ready", workers=2)
    await asyncio.to_thread(server.wait_ready)
    await slack.fake.push_event({
        "type": "message", "channel": "C1", "user": "U2", "ts": "1700000100.000200",
        "thread_ts": "1700000000.000100",
        "text": f"!probe pgid={server.pid} log={server.log_path} port={server.port}",
    })
    call = await slack.fake.wait_for_call("chat.postMessage", timeout=20)
    p = call["params"]
    assert p["thread_ts"] == "1700000000.000100"
    text = block_texts(p)
    assert f"pgid={server.pid}" in p["text"]
    assert "fired up and ready to roll" in text
    assert f"Port {server.port}*: listening" in text and "ok" in text


async def test_app_mention_at_channel_level_replies_in_a_thread_of_it(slack):
    env_id = await slack.fake.push_app_mention(f"<@{BOT_USER_ID}> help", user_id="U3", channel_id="C9")
    await slack.fake.wait_for_ack(env_id, 5)
    call = await slack.fake.wait_for_call("chat.postMessage", timeout=10)
    event_ts = slack.fake.envelopes[env_id]["payload"]["event"]["ts"]
    assert call["params"]["channel"] == "C9" and call["params"]["thread_ts"] == event_ts
    assert "/gpu status" in call["params"]["text"] and "/probe" in call["params"]["text"]


async def test_unknown_command_and_unknown_host_get_help_and_host_list(slack):
    await slack.fake.push_slash_command("/gpu", "frobnicate now")
    first = await slack.fake.wait_for_call("chat.postMessage", timeout=10)
    assert "Unknown command or host 'frobnicate'" in first["params"]["text"]
    assert "/probe" in first["params"]["text"]
    await slack.fake.push_slash_command("/probe", "no-such-host pgid=1")
    second = await slack.fake.wait_for_call(
        "chat.postMessage", predicate=lambda c: "Unknown host" in c["params"].get("text", ""), timeout=10)
    assert "Known hosts: gpu-host-1" in second["params"]["text"]


async def test_duplicate_delivery_of_a_message_is_answered_once(slack):
    event = {"type": "message", "channel": "C1", "user": "U2", "ts": "1700000200.000300", "text": "!help"}
    await slack.fake.push_event(event)
    await slack.fake.push_event(event, retry_attempt=1, retry_reason="timeout")
    await slack.fake.wait_for_call("chat.postMessage", timeout=10)
    await asyncio.sleep(0.5)
    assert len(slack.fake.calls_for("chat.postMessage")) == 1
