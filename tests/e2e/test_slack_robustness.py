"""Slack-side robustness: failures of Slack itself, chat that is not a command, permissions by user group,
oversized answers, links Slack adds, HTTP health endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import aiohttp
import pytest

from bot.config import Config
from tests.support.builders import ssh_host
from tests.support.fakes.slack_server import FakeSlack
from tests.support.procs import free_port, wait_until
from tests.support.slack import text_of

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def own_state(ssh_config, tmp_path) -> Config:
    """ssh_config with its database under tmp_path (the runner's default is the user's state directory,
    where an earlier run's queued answers would be sent first)."""
    return ssh_config.model_copy(update={"state_dir": str(tmp_path / "state")})


@pytest.fixture
async def runner_tasks():
    """Runner tasks started by a test (`tasks.append((task, stop_event))`); stopped at teardown."""
    tasks: list[tuple[asyncio.Task, asyncio.Event]] = []
    yield tasks
    for _task, stop in tasks:
        stop.set()
    for task, _ in tasks:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 15)


async def test_post_failure_500_is_retried_and_delivered_once(slack):
    slack.fake.fail("chat.postMessage", status=500, times=3)
    env_id = await slack.fake.push_slash_command("/gpu", "help")
    await slack.fake.wait_for_ack(env_id, 20)
    call = await slack.fake.wait_for_call("chat.postMessage", timeout=60)  # the first one answered 200
    assert "/gpu status" in text_of(call)
    await slack.settled(env_id)  # nothing left to retry
    assert len(slack.fake.calls_for("chat.postMessage")) == 1  # delivered exactly once
    assert len(slack.fake.failed_calls) == 3
    assert not slack.fake.responses  # no private fallback: the answer was only late, not refused


async def test_not_in_channel_falls_back_to_response_url(slack):
    slack.fake.set_error("chat.postMessage", "not_in_channel", times=1)
    await slack.fake.push_slash_command("/gpu", "help")
    body = await slack.fake.wait_for_response(timeout=20)
    assert "not_in_channel" in body["text"]


async def test_bang_chat_that_is_not_a_command_is_ignored(slack):
    env_ids = []
    for i, text in enumerate(["!important: prod is down", "!nice one", "!don't do that"]):
        env_ids.append(await slack.fake.push_event({"type": "message", "channel": "C1", "user": "U2",
                                                    "ts": f"1700000300.00030{i}", "text": text}))
    env_ids.append(await slack.fake.push_event({"type": "message", "channel": "C1", "user": "U2",
                                                "ts": "1700000300.000400", "text": "!help"}))
    call = await slack.fake.wait_for_answer(lambda c: "/gpu status" in text_of(c), timeout=20)
    await slack.settled(*env_ids)
    assert len(slack.fake.calls_for("chat.postMessage")) == 1
    assert call["method"] == "chat.postMessage" and call["params"]["thread_ts"] == "1700000300.000400"
    # chat never reached the dispatcher: the one command is the only one audited
    assert [(e.action, e.args.get("text")) for e in slack.runtime.audit.events()] == [("command:help", "!help")]


async def test_events_without_user_or_channel_are_ignored(slack):
    env_ids = [
        await slack.fake.push_event({"type": "message", "channel": "C1", "ts": "1.1", "text": "!help"}),
        await slack.fake.push_event({"type": "message", "user": "U1", "ts": "1.2", "text": "!help"}),
        await slack.fake.push_event({"type": "message", "channel": "C1", "user": "U1", "text": "!help"}),
    ]
    call = await slack.fake.wait_for_answer(lambda c: "/gpu status" in text_of(c), timeout=20)
    assert call["params"]["channel"] == "C1"  # the one complete event (no ts: answered, not deduplicated away)
    await slack.settled(*env_ids)
    assert len(slack.fake.calls_for("chat.postMessage")) == 1
    assert [e.action for e in slack.runtime.audit.events()] == ["command:help"]  # the others never dispatched


async def test_gpu_all_and_slack_autolinked_host_name(slack):
    await slack.fake.push_slash_command("/gpu", "all")
    call = await slack.fake.wait_for_answer(lambda c: text_of(c).startswith("GPU status"), timeout=30)
    assert text_of(call).startswith("GPU status: 1 host")
    await slack.fake.push_slash_command("/probe", "<http://gpu-host-1|gpu-host-1> pid=1")
    call = await slack.fake.wait_for_answer(lambda c: "Probe of gpu-host-1" in text_of(c), timeout=30)
    assert "pid=1" in text_of(call)


async def test_permissions_by_user_group(slack_stacks, ssh_server):
    cfg = Config(hosts={"gpu-host-1": ssh_host(ssh_server)}, permissions={"viewers": ["S0GPUTEAM"]})
    stack = await slack_stacks(cfg)
    stack.fake.usergroups["S0GPUTEAM"] = ["UMEMBER"]
    await stack.fake.push_slash_command("/gpu", "status", user_id="UOUTSIDER")
    denied = await stack.fake.wait_for_ephemeral(lambda c: "Permission denied" in text_of(c), timeout=20)
    assert "viewer" in text_of(denied) and denied["params"]["user"] == "UOUTSIDER"
    await stack.fake.push_slash_command("/gpu", "status", user_id="UMEMBER")
    ok = await stack.fake.wait_for_answer(lambda c: text_of(c).startswith("GPU status"), timeout=30)
    assert "H200" in text_of(ok)
    assert len(stack.fake.calls_for("usergroups.users.list")) == 1  # cached


async def test_oversized_answer_is_cut_and_full_output_attached(slack_stacks, ssh_server):
    hosts = {f"h{i:02d}": ssh_host(ssh_server) for i in range(40)}
    stack = await slack_stacks(Config(hosts=hosts))
    env_id = await stack.fake.push_slash_command("/gpu", "status all detail=yes")  # every host's table
    answer = await stack.fake.wait_for_answer(lambda c: text_of(c).startswith("GPU status"), timeout=60)
    done = await stack.fake.wait_for_call("files.completeUploadExternal", timeout=30)
    await stack.settled(env_id)
    blocks = answer["params"]["blocks"]
    assert len(blocks) <= 50
    assert "truncated, full output attached" in str(blocks)
    answer_ts = answer["params"]["ts"] if answer["method"] == "chat.update" else answer["response"]["ts"]
    assert done["params"]["thread_ts"] == answer_ts  # the full output goes into the answer's thread
    (data,) = stack.fake.uploads.values()
    text = data.decode()
    assert all(f"== h{i:02d}" in text for i in range(40))


async def test_http_mode_health_endpoint(own_state, monkeypatch, runner_tasks):
    from bot.slack import runner

    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "s")
    port = free_port()
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run_http(own_state, port=port, host="127.0.0.1", stop=stop))
    runner_tasks.append((task, stop))

    async def healthy() -> tuple[int, str] | None:
        if task.done():
            task.result()  # it ended: raise what it raised
            raise AssertionError("serve-http returned before it was stopped")
        try:
            async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/healthz") as r:
                return r.status, await r.text()
        except aiohttp.ClientConnectorError:
            return None

    status, body = await wait_until(healthy, 30, what="serve-http to listen")
    vitals = json.loads(body)
    assert status == 200 and vitals["healthy"] is True and vitals["database"] is True
    assert vitals["slack"] is None  # HTTP mode: Slack calls in, the bot cannot tell
    stop.set()
    await asyncio.wait_for(task, 15)  # it stops when asked


async def test_gpubot_run_entrypoint_over_socket_mode(own_state, monkeypatch, runner_tasks):
    """`gpubot run` as deployed: tokens and the API URL from the environment, Socket Mode to the fake."""
    from bot.slack import runner

    async with FakeSlack() as fake:
        monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-env")
        monkeypatch.setenv("SLACK_APP_TOKEN", "xapp-env")
        monkeypatch.setenv("SLACK_API_URL", fake.api_url)
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run_socket_mode(own_state, stop=stop))
        runner_tasks.append((task, stop))
        try:
            await fake.wait_connected(20)
            await fake.push_slash_command("/gpu", "status")
            call = await fake.wait_for_answer(lambda c: text_of(c).startswith("GPU status"), timeout=30)
            assert call["token"] == "xoxb-env"
            opened = fake.calls_for("apps.connections.open")
            assert opened and opened[0]["token"] == "xapp-env"
        finally:
            stop.set()  # before the fake closes: the runner flushes its outbox into it
            await asyncio.wait_for(task, 15)


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


async def test_slack_web_api_down_commands_are_answered_once_in_order_when_it_is_back(slack_stacks, ssh_config):
    """The Web API answers 503 to everything (the websocket stays up) until the test ends the outage:
    commands are acked at once, nothing gets through meanwhile, and every answer is delivered exactly once
    after recovery, in the order queued within each thread."""
    stack = await slack_stacks(ssh_config, outbox_options={"backoff_max_s": 2.0})  # quick retries after it
    fake = stack.fake
    rows = stack.runtime.store.outbox
    fake.fail(None, status=503, for_seconds=600)
    env_ids = [await fake.push_slash_command("/gpu", "help", channel_id="C1"),
               await fake.push_slash_command("/gpu", "status", channel_id="C1")]
    for i, text in enumerate(["!help", "!status", "!help"]):
        env_ids.append(await fake.push_event({"type": "message", "channel": "C1", "user": "U1",
                                              "ts": f"1700000700.{i:06d}", "thread_ts": "1700000700.000000",
                                              "text": text}))
    for env_id in env_ids:
        _, ack_s = await fake.wait_for_ack(env_id, 20)
        print(f"{env_id} acked after {ack_s:.3f} s")

    async def idle() -> bool:
        await stack.bot.drain(30)
        return not stack.bot.tasks

    await wait_until(idle, 60, what="every command to have its answer queued")
    assert not fake.calls_for("chat.postMessage")  # nothing got through yet
    assert rows.pending_count() >= 5  # answers (and placeholders) wait in the database
    assert fake.failed_calls  # the outbox kept trying
    t_back = time.monotonic()
    fake.clear_failures()  # Slack is back
    await wait_until(lambda: rows.pending_count() == 0 and len(fake.calls_for("chat.postMessage")) >= 5, 60,
                     what="the queued answers to go out")
    print(f"everything sent {time.monotonic() - t_back:.1f} s after Slack came back")
    sent = []
    row_id = 1
    while (row := rows.get(row_id)) is not None:
        sent.append((row.id, row.kind, row.thread_ts, row.result_ts, row.state))
        row_id += 1
    assert all(state in ("sent", "superseded") for *_, state in sent), sent
    posts = fake.calls_for("chat.postMessage")
    assert len(posts) == len([r for r in sent if r[1] == "post"])  # each post exactly once
    in_thread = [c for c in posts if c["params"].get("thread_ts") == "1700000700.000000"]
    assert len(in_thread) >= 3  # the three thread commands were answered there (an answer may be an edit)
    thread_rows = [r for r in sent if r[1] == "post" and r[2] == "1700000700.000000"]
    assert [c["response"]["ts"] for c in in_thread] == [r[3] for r in thread_rows]  # sent in queue order


async def test_slow_answer_in_a_channel_that_refuses_posts_goes_to_the_user_privately(gated_host, slack_stacks):
    """The placeholder of a slow command fails with not_in_channel: the answer is not lost as an edit of a
    message that never existed; it goes through the response_url instead."""
    stack = await slack_stacks(Config(hosts={"slow-host": ssh_host(gated_host.server, command_timeout_s=60)}))
    fake = stack.fake
    fake.set_error("chat.postMessage", "not_in_channel")  # the bot was removed from C1
    env_id = await fake.push_slash_command("/gpu", "status slow-host")
    # the host has not answered yet: the command is slow, so a placeholder was tried, and refused
    refused = await fake.wait_for_call("chat.postMessage", timeout=20)
    assert refused["response"]["error"] == "not_in_channel"
    assert not fake.responses
    gated_host.open()
    body = await fake.wait_for_response(timeout=30)
    await stack.settled(env_id)
    assert "GPU status" in body["text"] and "not_in_channel" in body["text"]
    assert body.get("response_type") == "ephemeral"
    assert not fake.calls_for("chat.update")


async def test_a_fleet_s_status_is_one_answer_with_nothing_attached(slack_stacks, ssh_server):
    # 40 hosts' nvidia-smi at once on this machine's cores: no host may be called down for being slow here (the
    # test is about one answer, not about timeouts)
    hosts = {f"h{i:02d}": ssh_host(ssh_server, nvidia_smi_timeout_s=60, command_timeout_s=90) for i in range(40)}
    stack = await slack_stacks(Config(hosts=hosts))
    env_id = await stack.fake.push_slash_command("/gpu", "status all")
    answer = await stack.fake.wait_for_answer(lambda c: text_of(c).startswith("GPU fleet"), timeout=180)
    await stack.settled(env_id)
    blocks = answer["params"]["blocks"]
    assert len(blocks) <= 50 and "truncated" not in str(blocks) and not stack.fake.uploads
    shown = "".join(b["text"]["text"] for b in blocks if b["type"] == "section")
    assert all(f"h{i:02d} " in shown for i in range(40))
    assert text_of(answer).startswith("GPU fleet: 40 hosts · 40 GPUs, 40 free · 0 live launches")
