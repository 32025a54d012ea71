"""Self-tests of :class:`tests.support.fakes.slack_server.FakeSlack` against the real slack_sdk / slack_bolt.

No mocks: the real AsyncWebClient, AsyncApp and AsyncSocketModeHandler talk to the fake over loopback.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from tests.support.fakes.slack_server import FakeSlack

pytestmark = pytest.mark.timeout(60)

#: Seconds any wait below may take at most: generous, a passing test never waits that long (loaded machines).
WAIT_S = 15

_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeSlack]:
    # slack_sdk reads these (and ignores NO_PROXY): loopback calls would go to the proxy.
    for var in _PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    async with FakeSlack() as server:
        yield server


def _client(fake: FakeSlack, **kwargs: object) -> AsyncWebClient:
    return AsyncWebClient(token="xoxb-test", base_url=fake.api_url, **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------- (a) Web API


async def test_web_api_roundtrip(fake: FakeSlack) -> None:
    client = _client(fake)

    auth = await client.auth_test()
    assert auth["ok"] and auth["user_id"] == "UBOT" and auth["bot_id"] == "BBOT" and auth["team_id"] == "T1"

    parent = await client.chat_postMessage(channel="C1", text="parent")
    reply = await client.chat_postMessage(
        channel="C1",
        thread_ts=parent["ts"],
        text="reply",
        blocks=[{"type": "section", "text": {"type": "mrkdwn", "text": "*reply*"}}],
    )
    assert parent["channel"] == "C1"
    assert float(reply["ts"]) > float(parent["ts"])
    assert reply["message"]["thread_ts"] == parent["ts"]
    assert [m["thread_ts"] for m in fake.messages] == [None, parent["ts"]]
    assert fake.messages[1]["blocks"][0]["text"]["text"] == "*reply*"
    assert fake.thread_replies(parent["ts"])[0]["text"] == "reply"

    upd = await client.chat_update(channel="C1", ts=parent["ts"], text="parent (edited)")
    assert upd["ts"] == parent["ts"] and upd["text"] == "parent (edited)"
    assert fake.updates[0]["ts"] == parent["ts"]
    assert fake.messages[0]["text"] == "parent"  # posts are kept as posted
    assert fake.message_state(parent["ts"])["text"] == "parent (edited)"

    # Updating an unknown message fails like Slack does.
    with pytest.raises(SlackApiError) as err:
        await client.chat_update(channel="C1", ts="1.000000", text="x")
    assert err.value.response["error"] == "message_not_found"

    data = b"\x89PNG\r\n\x1a\n fake chart bytes"
    up = await client.files_upload_v2(
        content=data, filename="chart.png", title="GPU util", channel="C1", thread_ts=parent["ts"]
    )
    file_id = up["file"]["id"]
    assert fake.uploads[file_id] == data
    meta = fake.files[file_id]
    assert meta["filename"] == "chart.png" and meta["title"] == "GPU util"
    assert meta["channel_id"] == "C1" and meta["thread_ts"] == parent["ts"] and meta["length"] == len(data)
    complete = fake.calls_for("files.completeUploadExternal")[0]
    assert complete["params"]["thread_ts"] == parent["ts"]

    # Every Web API call carried the bot token as a Bearer header.
    assert {c["token"] for c in fake.calls} == {"xoxb-test"}
    assert [c["method"] for c in fake.calls] == [
        "auth.test",
        "chat.postMessage",
        "chat.postMessage",
        "chat.update",
        "chat.update",
        "files.getUploadURLExternal",
        "files.completeUploadExternal",
    ]

    await client.reactions_add(channel="C1", timestamp=parent["ts"], name="eyes")
    assert fake.reactions == [("add", "C1", parent["ts"], "eyes")]
    info = await client.users_info(user="U7")
    assert info["user"]["id"] == "U7"
    conv = await client.conversations_info(channel="C9")
    assert conv["channel"]["id"] == "C9"
    eph = await client.chat_postEphemeral(channel="C1", user="U1", text="psst")
    assert eph["message_ts"] and fake.ephemerals[0]["user"] == "U1"
    assert (await client.api_call("bookmarks.list"))["ok"] is True


async def test_set_error_and_wait_for_call(fake: FakeSlack) -> None:
    client = _client(fake)
    fake.set_error("chat.postMessage", "channel_not_found", times=1)
    with pytest.raises(SlackApiError) as err:
        await client.chat_postMessage(channel="CNOPE", text="x")
    assert err.value.response.status_code == 200
    assert err.value.response["error"] == "channel_not_found"

    # the wait starts before the call is made, and returns once it arrives
    waiter = asyncio.create_task(
        fake.wait_for_call("chat.postMessage", lambda c: c["params"]["channel"] == "C2", timeout=WAIT_S))
    await asyncio.sleep(0)  # let the waiter start
    assert not waiter.done()
    await client.chat_postMessage(channel="C2", text="second")
    call = await waiter
    assert call["params"]["text"] == "second" and call["response"]["ok"] is True

    with pytest.raises(TimeoutError):
        await fake.wait_for_call("chat.delete", timeout=0.1)


# ---------------------------------------------------------------- (b) failure injection


async def test_rate_limit_retry_handler(fake: FakeSlack) -> None:
    fake.fail("chat.postMessage", status=429, retry_after=1, times=1)
    client = _client(fake, retry_handlers=[AsyncRateLimitErrorRetryHandler(max_retry_count=1)])
    resp = await client.chat_postMessage(channel="C1", text="after 429")
    assert resp["ok"] is True
    assert len(fake.failed_calls) == 1 and fake.failed_calls[0]["status"] == 429
    # the retry came at least Retry-After seconds after the 429 (a lower bound: load only adds to it)
    (retried,) = fake.calls_for("chat.postMessage")
    assert retried["time"] - fake.failed_calls[0]["time"] >= 1.0
    assert len(fake.calls_for("chat.postMessage")) == 1
    assert len(fake.calls_for("chat.postMessage", include_failed=True)) == 2
    assert len(fake.messages) == 1


async def test_rate_limit_without_handler_raises(fake: FakeSlack) -> None:
    fake.fail("chat.postMessage", status=429, retry_after=1, times=1)
    client = _client(fake)
    with pytest.raises(SlackApiError) as err:
        await client.chat_postMessage(channel="C1", text="x")
    assert err.value.response.status_code == 429
    assert err.value.response.headers["Retry-After"] == "1"
    assert err.value.response["error"] == "ratelimited"
    assert len(fake.failed_calls) == 1
    # The rule was used up: the next call goes through.
    assert (await client.chat_postMessage(channel="C1", text="y"))["ok"] is True


async def test_server_error_for_seconds_and_clear(fake: FakeSlack) -> None:
    fake.fail(None, status=503, for_seconds=30)
    client = _client(fake)
    with pytest.raises(SlackApiError) as err:
        await client.auth_test()
    assert err.value.response.status_code == 503
    with pytest.raises(SlackApiError):
        await client.users_info(user="U1")
    assert [c["method"] for c in fake.failed_calls] == ["auth.test", "users.info"]
    fake.clear_failures()
    assert (await client.auth_test())["ok"] is True

    fake.fail("auth.test", status=500, times=1)
    retrying = _client(fake, retry_handlers=[AsyncServerErrorRetryHandler(max_retry_count=1)])
    assert (await retrying.auth_test())["ok"] is True
    assert len(fake.failed_calls) == 3


# ---------------------------------------------------------------- (c)/(d) Bolt over Socket Mode


def _make_app(fake: FakeSlack, hold: asyncio.Event | None = None) -> AsyncApp:
    """`/gpu TEXT` acks, then (after `hold` is set, for TEXT "status") posts `result: TEXT`."""
    app = AsyncApp(client=_client(fake), signing_secret="x")

    @app.command("/gpu")
    async def gpu(ack, command, client, respond) -> None:  # type: ignore[no-untyped-def]
        await ack(f"working on {command['text']}")
        if hold is not None and command["text"] == "status":
            await hold.wait()  # the listener's work takes as long as the test wants
        await client.chat_postMessage(channel=command["channel_id"], text=f"result: {command['text']}")
        if command["text"] == "respond":
            await respond(text="via response_url", response_type="ephemeral")

    @app.event("app_mention")
    async def mention(event, say) -> None:  # type: ignore[no-untyped-def]
        await say(text=f"hello <@{event['user']}>", thread_ts=event["ts"])

    @app.action("restart")
    async def restart(ack, body, respond) -> None:  # type: ignore[no-untyped-def]
        await ack()
        await respond(text=f"restart by {body['user']['id']}: {body['actions'][0]['value']}")

    return app


async def test_socket_mode_slash_command_and_reconnect(fake: FakeSlack) -> None:
    hold = asyncio.Event()
    app = _make_app(fake, hold)
    # Built inside the running loop (it creates an aiohttp session and a task in __init__).
    # ping_interval also bounds how fast an abruptly dropped socket is noticed (see drop below).
    handler = AsyncSocketModeHandler(app, app_token="xapp-test", ping_interval=1)
    try:
        await handler.connect_async()
        await fake.wait_connected(WAIT_S)
        assert fake.connection_count == 1
        assert fake.calls_for("apps.connections.open")[0]["token"] == "xapp-test"

        env_id = await fake.push_slash_command(command="/gpu", text="status", user_id="U1", channel_id="C42")
        payload, _latency = await fake.wait_for_ack(env_id, timeout=WAIT_S)
        assert payload == {"text": "working on status"}
        # acked while the listener is still at work: the ack never waits for the work
        assert not fake.calls_for("chat.postMessage")
        hold.set()
        post = await fake.wait_for_call("chat.postMessage", lambda c: c["params"]["channel"] == "C42", WAIT_S)
        assert post["params"]["text"] == "result: status" and post["token"] == "xoxb-test"
        # Bolt called auth.test lazily before the first listener ran.
        assert fake.calls_for("auth.test")

        # respond() goes to the response_url, keyed by the envelope id by default.
        env_r = await fake.push_slash_command(text="respond")
        await fake.wait_for_ack(env_r, timeout=WAIT_S)  # the ack may come after respond(): wait before dropping
        body = await fake.wait_for_response(env_r, timeout=WAIT_S)
        assert body["text"] == "via response_url" and body["response_type"] == "ephemeral"

        # Abrupt server-side drop: the SDK notices on its next monitor tick (~ping_interval),
        # calls apps.connections.open again and reconnects. An envelope pushed meanwhile is
        # queued by the fake and delivered on the new connection.
        assert await fake.drop_websocket() == 1
        env2 = await fake.push_slash_command(text="again", channel_id="C43")
        await fake.wait_connected(WAIT_S, count=2)
        assert fake.connection_count == 2
        payload2, _ = await fake.wait_for_ack(env2, timeout=WAIT_S)
        assert payload2 == {"text": "working on again"}
        await fake.wait_for_call("chat.postMessage", lambda c: c["params"]["channel"] == "C43", WAIT_S)
        assert len(fake.calls_for("apps.connections.open")) == 2

        # Slack's refresh: a disconnect message makes the client reconnect at once.
        await fake.send_disconnect("refresh_requested")
        await fake.wait_connected(WAIT_S, count=3)
        assert len(fake.calls_for("apps.connections.open")) == 3
        env3 = await fake.push_slash_command(text="third")
        payload3, _ = await fake.wait_for_ack(env3, timeout=WAIT_S)
        assert payload3 == {"text": "working on third"}
    finally:
        await handler.close_async()


async def test_socket_mode_app_mention_and_block_action(fake: FakeSlack) -> None:
    app = _make_app(fake)
    handler = AsyncSocketModeHandler(app, app_token="xapp-test", ping_interval=1)
    try:
        await handler.connect_async()
        await fake.wait_connected(WAIT_S)

        env_id = await fake.push_app_mention(text="<@UBOT> hi", user_id="U5", channel_id="C7")
        payload, _ = await fake.wait_for_ack(env_id, timeout=WAIT_S)
        assert payload is None  # events are acked with an empty body
        mention_ts = fake.envelopes[env_id]["payload"]["event"]["ts"]
        post = await fake.wait_for_call("chat.postMessage", lambda c: c["params"]["channel"] == "C7", WAIT_S)
        assert post["params"]["text"] == "hello <@U5>"
        assert post["params"]["thread_ts"] == mention_ts

        # Generic push_event with a retry header mapped by Bolt.
        env_ev = await fake.push_event(
            {
                "type": "app_mention",
                "user": "U6",
                "text": "<@UBOT> again",
                "ts": "1700000001.000100",
                "channel": "C8",
            },
            retry_attempt=1,
            retry_reason="timeout",
        )
        await fake.wait_for_ack(env_ev, timeout=WAIT_S)
        assert fake.envelopes[env_ev]["envelope"]["retry_attempt"] == 1
        await fake.wait_for_call("chat.postMessage", lambda c: c["params"]["channel"] == "C8", WAIT_S)

        env_a = await fake.push_block_action("restart", value="node-3", user_id="U9", channel_id="C7")
        await fake.wait_for_ack(env_a, timeout=WAIT_S)
        rid = fake.envelopes[env_a]["payload"]["response_url"].rsplit("/", 1)[1]
        body = await fake.wait_for_response(rid, timeout=WAIT_S)
        assert body["text"] == "restart by U9: node-3"
    finally:
        await handler.close_async()


async def test_close_is_clean_with_connected_client(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in _PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    fake = FakeSlack()
    await fake.start()
    handler = AsyncSocketModeHandler(_make_app(fake), app_token="xapp-test", ping_interval=1)
    try:
        await handler.connect_async()
        await fake.wait_connected(WAIT_S)
        await handler.close_async()
        # close() does not hang on the (closing) client: its waits are bounded; WAIT_S only guards a hang
        await asyncio.wait_for(fake.close(), WAIT_S)
        await asyncio.wait_for(fake.close(), WAIT_S)  # idempotent
        assert not fake.connected
    finally:
        await handler.close_async()
        await fake.close()
