"""Slack-side robustness: failures of Slack itself, chat that is not a command, permissions by user group,
oversized answers, links Slack adds, HTTP health endpoint."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from bot.config import Config
from tests.conftest import ssh_host
from tests.e2e.conftest import start_stack

pytestmark = pytest.mark.timeout(60)


async def test_post_failure_500_is_retried_and_delivered_once(slack):
    slack.fake.fail("chat.postMessage", status=500, times=3)
    env_id = await slack.fake.push_slash_command("/gpu", "help")
    await slack.fake.wait_for_ack(env_id, 5)
    call = await slack.fake.wait_for_call("chat.postMessage", timeout=30)  # the first one answered 200
    assert "/gpu status" in call["params"]["text"]
    await asyncio.sleep(1.5)
    assert len(slack.fake.calls_for("chat.postMessage")) == 1  # delivered exactly once
    assert len(slack.fake.failed_calls) == 3
    assert not slack.fake.responses  # no private fallback: the answer was only late, not refused


async def test_not_in_channel_falls_back_to_response_url(slack):
    slack.fake.set_error("chat.postMessage", "not_in_channel", times=1)
    await slack.fake.push_slash_command("/gpu", "help")
    body = await slack.fake.wait_for_response(timeout=10)
    assert "not_in_channel" in body["text"]


async def test_bang_chat_that_is_not_a_command_is_ignored(slack):
    for i, text in enumerate(["!important: prod is down", "!nice one", "!don't do that"]):
        await slack.fake.push_event({"type": "message", "channel": "C1", "user": "U2",
                                     "ts": f"1700000300.00030{i}", "text": text})
    await slack.fake.push_event({"type": "message", "channel": "C1", "user": "U2", "ts": "1700000300.000400",
                                 "text": "!help"})
    call = await slack.fake.wait_for_call("chat.postMessage", timeout=10)
    await asyncio.sleep(0.5)
    assert len(slack.fake.calls_for("chat.postMessage")) == 1
    assert call["params"]["thread_ts"] == "1700000300.000400"


async def test_events_without_user_or_channel_are_ignored(slack):
    await slack.fake.push_event({"type": "message", "channel": "C1", "ts": "1.1", "text": "!help"})
    await slack.fake.push_event({"type": "message", "user": "U1", "ts": "1.2", "text": "!help"})
    await slack.fake.push_event({"type": "message", "channel": "C1", "user": "U1", "text": "!help"})
    call = await slack.fake.wait_for_call("chat.postMessage", timeout=10)
    assert call["params"]["channel"] == "C1"  # the one complete event (no ts: answered, not deduplicated away)
    await asyncio.sleep(0.3)
    assert len(slack.fake.calls_for("chat.postMessage")) == 1


async def test_gpu_all_and_slack_autolinked_host_name(slack):
    await slack.fake.push_slash_command("/gpu", "all")
    call = await slack.fake.wait_for_call("chat.postMessage", timeout=20)
    assert call["params"]["text"].startswith("GPU status: 1 host")
    await slack.fake.push_slash_command("/probe", "<http://gpu-host-1|gpu-host-1> pid=1")
    call = await slack.fake.wait_for_call(
        "chat.postMessage", predicate=lambda c: "Probe of gpu-host-1" in c["params"].get("text", ""), timeout=20)
    assert "pid=1" in call["params"]["text"]


async def test_permissions_by_user_group(ssh_server):
    cfg = Config(hosts={"gpu-host-1": ssh_host(ssh_server)}, permissions={"viewers": ["S0GPUTEAM"]})
    stack, stop = await start_stack(cfg)
    try:
        stack.fake.usergroups["S0GPUTEAM"] = ["UMEMBER"]
        await stack.fake.push_slash_command("/gpu", "status", user_id="UOUTSIDER")
        denied = await stack.fake.wait_for_call("chat.postMessage", timeout=10)
        assert "Permission denied" in denied["params"]["text"] and "viewer" in denied["params"]["text"]
        await stack.fake.push_slash_command("/gpu", "status", user_id="UMEMBER")
        ok = await stack.fake.wait_for_call(
            "chat.postMessage", predicate=lambda c: c["params"]["text"].startswith("GPU status"), timeout=20)
        assert "H200" in ok["params"]["text"]
        assert len(stack.fake.calls_for("usergroups.users.list")) == 1  # cached
    finally:
        await stop()


async def test_oversized_answer_is_cut_and_full_output_attached(ssh_server):
    hosts = {f"h{i:02d}": ssh_host(ssh_server) for i in range(40)}
    stack, stop = await start_stack(Config(hosts=hosts))
    try:
        await stack.fake.push_slash_command("/gpu", "status all")
        answer = await stack.fake.wait_for_answer(lambda c: c["params"]["text"].startswith("GPU status"), timeout=40)
        done = await stack.fake.wait_for_call("files.completeUploadExternal", timeout=20)
    finally:
        await stop()
    blocks = answer["params"]["blocks"]
    assert len(blocks) <= 50
    assert "truncated, full output attached" in str(blocks)
    answer_ts = answer["params"]["ts"] if answer["method"] == "chat.update" else answer["response"]["ts"]
    assert done["params"]["thread_ts"] == answer_ts  # the full output goes into the answer's thread
    (data,) = stack.fake.uploads.values()
    text = data.decode()
    assert all(f"== h{i:02d}" in text for i in range(40))


async def test_http_mode_health_endpoint(ssh_config, monkeypatch):
    from bot.slack import runner

    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "s")
    stop = asyncio.Event()
    from tests.conftest import free_port

    port = free_port()
    task = asyncio.create_task(runner.run_http(ssh_config, port=port, host="127.0.0.1", stop=stop))
    try:
        for _ in range(50):
            try:
                async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/healthz") as r:
                    assert r.status == 200 and await r.text() == "ok"
                    break
            except aiohttp.ClientConnectorError:
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("serve-http never listened")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_gpubot_run_entrypoint_over_socket_mode(ssh_config, monkeypatch):
    """`gpubot run` as deployed: tokens and the API URL from the environment, Socket Mode to the fake."""
    from bot.slack import runner
    from tests.support.fakes.slack_server import FakeSlack

    async with FakeSlack() as fake:
        monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-env")
        monkeypatch.setenv("SLACK_APP_TOKEN", "xapp-env")
        monkeypatch.setenv("SLACK_API_URL", fake.api_url)
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run_socket_mode(ssh_config, stop=stop))
        try:
            await fake.wait_connected(10)
            await fake.push_slash_command("/gpu", "status")
            call = await fake.wait_for_call("chat.postMessage", timeout=20)
            assert call["token"] == "xoxb-env" and call["params"]["text"].startswith("GPU status")
            opened = fake.calls_for("apps.connections.open")
            assert opened and opened[0]["token"] == "xapp-env"
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)


def test_cli_refuses_to_start_without_tokens(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from bot.cli import main

    for k in ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET"):
        monkeypatch.delenv(k, raising=False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("hosts:\n  me: {local: true}\n")
    res = CliRunner().invoke(main, ["run", "--config", str(cfg)])
    assert res.exit_code == 2 and "SLACK_BOT_TOKEN is not set" in res.output
    res = CliRunner().invoke(main, ["serve-http", "--config", str(cfg), "--port", "3999"])
    assert res.exit_code == 2 and "SLACK_BOT_TOKEN is not set" in res.output


async def test_slack_web_api_down_commands_are_answered_once_in_order_when_it_is_back(slack):
    """The Web API answers 503 to everything for 8 s (the websocket stays up): commands are acked at once,
    and every answer is delivered exactly once after recovery, in the order queued within each thread."""
    from sqlalchemy import select

    from bot.adapters.store import OutboxRow

    fake = slack.fake
    fake.fail(None, status=503, for_seconds=8.0)
    env_ids = [await fake.push_slash_command("/gpu", "help", channel_id="C1"),
               await fake.push_slash_command("/gpu", "status", channel_id="C1")]
    for i, text in enumerate(["!help", "!status", "!help"]):
        await fake.push_event({"type": "message", "channel": "C1", "user": "U1", "ts": f"1700000700.{i:06d}",
                               "thread_ts": "1700000700.000000", "text": text})
    for env_id in env_ids:
        _, ack_s = await fake.wait_for_ack(env_id, 5)
        assert ack_s < 1.0
    await asyncio.sleep(6.0)
    assert not fake.calls_for("chat.postMessage")  # nothing got through yet
    outbox = slack.bot.outbox
    assert outbox.pending() >= 5  # answers (and placeholders) wait in the database
    for _ in range(300):
        if not outbox.pending() and len(fake.calls_for("chat.postMessage")) >= 5:
            break
        await asyncio.sleep(0.1)
    assert await outbox.flush(30)
    with outbox.store._tx() as s:
        rows = s.scalars(select(OutboxRow).order_by(OutboxRow.id)).all()
        sent = [(r.id, r.kind, r.thread_ts, r.result_ts, r.state) for r in rows]
    assert all(state in ("sent", "superseded") for *_, state in sent), sent
    posts = fake.calls_for("chat.postMessage")
    assert len(posts) == len([r for r in sent if r[1] == "post"])  # each post exactly once
    in_thread = [c for c in posts if c["params"].get("thread_ts") == "1700000700.000000"]
    assert len(in_thread) >= 3  # the three thread commands were answered there (an answer may be an edit)
    thread_rows = [r for r in sent if r[1] == "post" and r[2] == "1700000700.000000"]
    assert [c["response"]["ts"] for c in in_thread] == [r[3] for r in thread_rows]  # sent in queue order


async def test_slow_answer_in_a_channel_that_refuses_posts_goes_to_the_user_privately(tmp_path, fake_gpu):
    """The placeholder of a slow command fails with not_in_channel: the answer is not lost as an edit of a
    message that never existed; it goes through the response_url instead."""
    from tests.support.fakes.ssh_server import LoopbackSSHServer

    env = {"PATH": f"{fake_gpu.bin_dir}:/usr/bin:/bin"}
    async with LoopbackSSHServer(tmp_path / "slow", env=env, exec_delay_s=2.0) as srv:
        stack, stop = await start_stack(Config(hosts={"slow-host": ssh_host(srv)}))
        try:
            stack.fake.set_error("chat.postMessage", "not_in_channel")  # the bot was removed from C1
            await stack.fake.push_slash_command("/gpu", "status slow-host")
            body = await stack.fake.wait_for_response(timeout=20)
        finally:
            await stop()
    assert "GPU status" in body["text"] and "not_in_channel" in body["text"]
    assert body.get("response_type") == "ephemeral"
    assert not stack.fake.calls_for("chat.update")
