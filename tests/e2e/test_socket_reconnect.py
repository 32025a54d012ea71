"""Socket Mode connection health: the real Bolt app and the real AsyncSocketModeHandler (aiohttp) against the
fake Slack, whose side drops the websocket. The handler must reconnect on its own, commands pushed after
the drop must be acked and answered, an answer in flight when the socket drops must still be posted (it
goes through the Web API, not the socket), and an envelope Slack delivers again after the reconnect must
be acked again but answered only once.

The stack uses ping_interval=1 (tests/e2e/conftest.py): after an abrupt drop the handler notices within
about one ping interval, so reconnects here take 1-3 s.

A slow command first gets a placeholder that is edited into its answer, so "the answer" below is a
chat.postMessage or a chat.update (`fake.wait_for_answer`), and "answered once" means one message in the
channel whose final text is the answer."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from bot.config import Config
from tests.conftest import ssh_host
from tests.e2e.conftest import start_stack
from tests.support.fakes.ssh_server import LoopbackSSHServer

pytestmark = pytest.mark.timeout(60)

#: With ping_interval=1 a dropped socket is noticed within ~1 s and replaced within ~2 s; generous on 2 cores.
RECONNECT_WITHIN_S = 8.0


def _is_status(call: dict, channel: str | None = None) -> bool:
    p = call["params"]
    return (p.get("text") or "").startswith("GPU status") and (channel is None or p.get("channel") == channel)


def _messages(fake, channel: str) -> list[str]:
    """The final text (every chat.update applied) of each message posted in `channel`. A slow command's
    placeholder is edited into its answer, so one command is one message either way; a command run twice
    would leave two."""
    return [fake.message_state(m["ts"])["text"] or "" for m in fake.messages if m["channel"] == channel]


async def _status_round_trip(fake, channel: str) -> dict:
    """Push `/gpu status` in `channel`; return its answer after checking the ack came at once."""
    env_id = await fake.push_slash_command("/gpu", "status", user_id="U1", channel_id=channel)
    _, ack_s = await fake.wait_for_ack(env_id, 5)
    assert ack_s < 2.0, f"ack took {ack_s:.2f} s"
    call = await fake.wait_for_answer(lambda c: _is_status(c, channel), timeout=20)
    assert "gpu-host-1" in call["params"]["text"]
    return call


def _slow_host_env(fake_gpu) -> dict[str, str]:
    return {"PATH": f"{fake_gpu.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


@pytest.mark.parametrize("abrupt", [True, False], ids=["tcp-abort", "close-frame"])
async def test_dropped_socket_reconnects_and_commands_keep_working(slack, abrupt):
    fake = slack.fake
    await _status_round_trip(fake, "C0")
    for n in (2, 3):  # two drops in a row: the handler keeps reconnecting, not only once
        t0 = time.monotonic()
        # abrupt: TCP abort without a close frame (a network drop); else a websocket close frame from Slack
        assert await fake.drop_websocket(abrupt=abrupt) == 1
        assert not fake.connected
        await fake.wait_connected(RECONNECT_WITHIN_S, count=n)
        assert time.monotonic() - t0 < RECONNECT_WITHIN_S
        assert fake.connection_count == n
        # each reconnect asks for a fresh websocket URL (apps.connections.open with the app token)
        opens = fake.calls_for("apps.connections.open")
        assert len(opens) == n and opens[-1]["token"] == "xapp-test"
        await _status_round_trip(fake, f"C{n}")
    for channel in ("C0", "C2", "C3"):  # one answer per command, none repeated by the reconnects
        texts = _messages(fake, channel)
        assert len(texts) == 1 and texts[0].startswith("GPU status"), texts


async def test_command_pushed_while_disconnected_is_delivered_after_the_reconnect(slack):
    fake = slack.fake
    assert await fake.drop_websocket(abrupt=True) == 1
    env_id = await fake.push_slash_command("/gpu", "status", channel_id="C7")  # queued: no socket open
    await fake.wait_connected(RECONNECT_WITHIN_S, count=2)
    await fake.wait_for_ack(env_id, 5)
    await fake.wait_for_answer(lambda c: _is_status(c, "C7"), timeout=20)


@pytest.mark.parametrize("reason", ["refresh_requested", "warning"])
async def test_disconnect_envelope_reconnects_at_once(slack, reason):
    fake = slack.fake
    await _status_round_trip(fake, "C0")
    t0 = time.monotonic()
    await fake.send_disconnect(reason)
    await fake.wait_connected(RECONNECT_WITHIN_S, count=2)
    # a disconnect envelope is acted on when it arrives (no wait for a ping tick)
    assert time.monotonic() - t0 < 3.0
    assert len(fake.calls_for("apps.connections.open")) == 2
    # the client closes the old connection itself once the new one is up (Slack would close it later)
    deadline = time.monotonic() + 5
    while sum(not c.closed for c in fake._connections) > 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert sum(not c.closed for c in fake._connections) == 1
    await _status_round_trip(fake, "C1")
    assert [len(_messages(fake, ch)) for ch in ("C0", "C1")] == [1, 1]


async def test_answer_in_flight_when_the_socket_drops_is_still_posted(tmp_path, fake_gpu):
    async with LoopbackSSHServer(tmp_path / "slow", env=_slow_host_env(fake_gpu), exec_delay_s=3.0) as srv:
        stack, stop = await start_stack(Config(hosts={"slow-host": ssh_host(srv)}))
        fake = stack.fake
        try:
            env_id = await fake.push_slash_command("/gpu", "status slow-host", channel_id="C5")
            await fake.wait_for_ack(env_id, 5)
            assert not any(_is_status(c) for c in fake.calls)  # the host is still answering
            dropped_at = time.monotonic()
            assert await fake.drop_websocket(abrupt=True) == 1
            call = await fake.wait_for_answer(lambda c: _is_status(c, "C5"), timeout=30)
            await fake.wait_connected(RECONNECT_WITHIN_S, count=2)
            await asyncio.sleep(0.5)
            texts = _messages(fake, "C5")
        finally:
            await stop()
    assert call["time"] > dropped_at  # answered after the drop, through the Web API
    assert "slow-host" in call["params"]["text"]
    assert len(texts) == 1 and texts[0].startswith("GPU status")
    assert fake.ack_count(env_id) == 1  # acked once, before the drop


async def test_redelivery_while_the_first_delivery_is_still_running_is_answered_once(tmp_path, fake_gpu):
    async with LoopbackSSHServer(tmp_path / "slow", env=_slow_host_env(fake_gpu), exec_delay_s=2.0) as srv:
        stack, stop = await start_stack(Config(hosts={"slow-host": ssh_host(srv)}))
        fake = stack.fake
        try:
            env_id = await fake.push_slash_command("/gpu", "status slow-host", channel_id="C6")
            await fake.wait_for_ack(env_id, 5)
            assert await fake.drop_websocket(abrupt=True) == 1
            await fake.redeliver(env_id)  # queued; goes out on the new connection
            await fake.wait_connected(RECONNECT_WITHIN_S, count=2)
            await fake.wait_for_ack_count(env_id, 2, timeout=5)  # acked again, so Slack stops retrying
            answered_before_redelivery_acked = any(_is_status(c) for c in fake.calls)
            await fake.wait_for_answer(lambda c: _is_status(c, "C6"), timeout=30)
            await asyncio.sleep(3.0)  # longer than the host's delay: a second run would have answered by now
            texts = _messages(fake, "C6")
            answers = [c for c in fake.calls if _is_status(c)]
        finally:
            await stop()
    assert not answered_before_redelivery_acked  # the redelivery really overlapped the first run
    assert len(texts) == 1 and "slow-host" in texts[0]
    assert len(answers) == 1


@pytest.mark.parametrize("kind", ["slash", "message"])
async def test_envelope_redelivered_after_reconnect_is_acked_again_and_answered_once(slack, kind):
    fake = slack.fake
    if kind == "slash":
        env_id = await fake.push_slash_command("/gpu", "help", channel_id="C8")
    else:
        env_id = await fake.push_event({"type": "message", "channel": "C8", "user": "U2",
                                        "ts": "1700000900.000100", "text": "!help"})
    await fake.wait_for_ack(env_id, 5)
    first = await fake.wait_for_answer(lambda c: "/gpu status" in (c["params"].get("text") or ""), timeout=10)
    assert first["params"]["channel"] == "C8"
    # The socket drops; Slack, unsure the ack arrived, delivers the same envelope again on the new one.
    assert await fake.drop_websocket(abrupt=True) == 1
    await fake.wait_connected(RECONNECT_WITHIN_S, count=2)
    await fake.redeliver(env_id)
    assert fake.envelopes[env_id]["envelope"]["retry_attempt"] == 1  # same id and payload, a retry
    await fake.wait_for_ack_count(env_id, 2, timeout=5)  # acked again, so Slack stops retrying
    # a fresh command on the same connection is still answered (the redelivery did not wedge anything)
    env2 = await fake.push_slash_command("/gpu", "help", channel_id="C9")
    await fake.wait_for_ack(env2, 5)
    await fake.wait_for_answer(lambda c: c["params"].get("channel") == "C9", timeout=10)
    await asyncio.sleep(0.5)
    assert len(_messages(fake, "C8")) == 1


async def test_watchdog_fetches_a_fresh_url_when_the_old_one_has_expired(slack):
    """The socket drops during an outage of the websocket edge, and the URL the client got meanwhile
    expires: slack_sdk alone retries that dead URL forever; the runner's watchdog makes it ask
    apps.connections.open for a new one, and commands work again."""
    from bot.slack.runner import socket_watchdog

    fake = slack.fake
    watchdog = asyncio.get_running_loop().create_task(socket_watchdog(slack.handler, every_s=1.0, misses=2))
    try:
        fake.refuse_websockets(for_seconds=4.0, link_ttl_s=2.0)
        assert await fake.drop_websocket(abrupt=True) == 1
        await fake.wait_connected(RECONNECT_WITHIN_S + 6, count=2)
        await _status_round_trip(fake, "C1")
    finally:
        watchdog.cancel()
