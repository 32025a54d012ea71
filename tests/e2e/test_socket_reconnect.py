"""Socket Mode connection health: the real Bolt app and the real AsyncSocketModeHandler (aiohttp) against the
fake Slack, whose side drops the websocket. The handler must reconnect on its own, commands pushed after
the drop must be acked and answered, an answer in flight when the socket drops must still be posted (it
goes through the Web API, not the socket), and an envelope Slack delivers again after the reconnect must
be acked again but answered only once.

The stack uses ping_interval=5 (tests/support/slack.py): an abrupt drop is noticed by the aborted TCP
connection, or at the latest after about one ping interval (reconnect times are printed; the waits below are
generous). On a loaded machine the client may also drop a connection by itself (aiohttp closes a websocket
whose pong is late) and make a new one: the counts below are relative to what was there before each drop.

A slow command first gets a placeholder that is edited into its answer, so "the answer" below is a
chat.postMessage or a chat.update (`fake.wait_for_answer`), and "answered once" means one message in the
channel whose final text is the answer. "Slow" is a host whose commands wait for the test to open a gate."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(90)

#: Generous bound on a reconnect (normally 1-3 s) for a loaded 2-core machine.
RECONNECT_TIMEOUT_S = 30.0


def _is_status(call: dict, channel: str | None = None) -> bool:
    p = call["params"]
    return (p.get("text") or "").startswith("GPU status") and (channel is None or p.get("channel") == channel)


def _messages(fake, channel: str) -> list[str]:
    """The final text (every chat.update applied) of each message posted in `channel`. A slow command's
    placeholder is edited into its answer, so one command is one message either way; a command run twice
    would leave two."""
    return [fake.message_state(m["ts"])["text"] or "" for m in fake.messages if m["channel"] == channel]


async def _status_round_trip(fake, channel: str) -> dict:
    """Push `/gpu status` in `channel`; return its answer after checking it was acked before it was answered."""
    env_id = await fake.push_slash_command("/gpu", "status", user_id="U1", channel_id=channel)
    _, ack_s = await fake.wait_for_ack(env_id, 20)
    call = await fake.wait_for_answer(lambda c: _is_status(c, channel), timeout=30)
    print(f"{channel}: acked after {ack_s:.3f} s")
    assert fake.acks[env_id][1] <= call["time"]  # acked first; the answer needs the SSH probe
    assert "gpu-host-1" in call["params"]["text"]
    return call


async def _drop(fake, *, abrupt: bool = True) -> tuple[int, int]:
    """Drop the open websocket from Slack's side (waiting for one first, should the client be replacing its
    connection by itself); returns (connections made, apps.connections.open calls) before the drop."""
    async def drop() -> tuple[int, int] | None:
        await fake.wait_connected(RECONNECT_TIMEOUT_S)
        before = fake.connection_count, len(fake.calls_for("apps.connections.open"))
        return before if await fake.drop_websocket(abrupt=abrupt) else None

    before = await wait_until(drop, RECONNECT_TIMEOUT_S, what="an open websocket to drop")
    assert not fake.connected
    return before


async def _reconnected(fake, before: tuple[int, int]) -> None:
    """Wait for a connection made after the drop; check it asked for a fresh websocket URL (with the app
    token) rather than reusing the old one."""
    t0 = time.monotonic()
    await fake.wait_connected(RECONNECT_TIMEOUT_S, count=before[0] + 1)
    print(f"reconnected after {time.monotonic() - t0:.2f} s")
    opens = fake.calls_for("apps.connections.open")
    assert len(opens) > before[1] and all(o["token"] == "xapp-test" for o in opens)
    assert len(opens) >= fake.connection_count  # no connection without its own URL


@pytest.mark.parametrize("abrupt", [True, False], ids=["tcp-abort", "close-frame"])
async def test_dropped_socket_reconnects_and_commands_keep_working(slack, abrupt):
    fake = slack.fake
    await _status_round_trip(fake, "C0")
    for n in (2, 3):  # two drops in a row: the handler keeps reconnecting, not only once
        # abrupt: TCP abort without a close frame (a network drop); else a websocket close frame from Slack
        before = await _drop(fake, abrupt=abrupt)
        await _reconnected(fake, before)  # each reconnect asks for a fresh websocket URL
        await _status_round_trip(fake, f"C{n}")
    await slack.settled()
    for channel in ("C0", "C2", "C3"):  # one answer per command, none repeated by the reconnects
        texts = _messages(fake, channel)
        assert len(texts) == 1 and texts[0].startswith("GPU status"), texts


async def test_command_pushed_while_disconnected_is_delivered_after_the_reconnect(slack):
    fake = slack.fake
    before = await _drop(fake)
    env_id = await fake.push_slash_command("/gpu", "status", channel_id="C7")  # queued: no socket open
    await _reconnected(fake, before)
    await fake.wait_for_ack(env_id, 20)
    await fake.wait_for_answer(lambda c: _is_status(c, "C7"), timeout=30)


@pytest.mark.parametrize("reason", ["refresh_requested", "warning"])
async def test_disconnect_envelope_reconnects_at_once(slack, reason):
    fake = slack.fake
    await _status_round_trip(fake, "C0")
    await fake.wait_connected(RECONNECT_TIMEOUT_S)
    (old,) = [c for c in fake._connections if not c.closed]
    before = fake.connection_count, len(fake.calls_for("apps.connections.open"))
    await fake.send_disconnect(reason)
    # acted on when it arrived: the old connection was healthy (its pings answered, nothing dropped it), so
    # only the envelope can have made the client open a new one
    await _reconnected(fake, before)
    # the client closes the old connection itself once the new one is up (Slack would close it later)
    await wait_until(lambda: old.closed and sum(not c.closed for c in fake._connections) == 1, 20,
                     what="the client to close the old connection")
    await _status_round_trip(fake, "C1")
    await slack.settled()
    assert [len(_messages(fake, ch)) for ch in ("C0", "C1")] == [1, 1]


async def test_answer_in_flight_when_the_socket_drops_is_still_posted(gated_host, slack_stacks):
    stack = await slack_stacks(gated_host.config())
    fake = stack.fake
    srv = gated_host.server
    env_id = await fake.push_slash_command("/gpu", "status slow-host", channel_id="C5")
    await fake.wait_for_ack(env_id, 20)
    await wait_until(lambda: srv.exec_count >= 1, 20, what="the probe to reach the host")
    assert not any(_is_status(c) for c in fake.calls)  # the host is still answering (its gate is shut)
    dropped_at = time.monotonic()
    before = await _drop(fake)
    gated_host.open()
    call = await fake.wait_for_answer(lambda c: _is_status(c, "C5"), timeout=30)
    await _reconnected(fake, before)
    await stack.settled()
    texts = _messages(fake, "C5")
    assert call["time"] > dropped_at  # answered after the drop, through the Web API
    assert "slow-host" in call["params"]["text"]
    assert len(texts) == 1 and texts[0].startswith("GPU status")
    assert fake.ack_count(env_id) == 1  # acked once, before the drop


async def test_redelivery_while_the_first_delivery_is_still_running_is_answered_once(gated_host, slack_stacks):
    stack = await slack_stacks(gated_host.config())
    fake = stack.fake
    srv = gated_host.server
    env_id = await fake.push_slash_command("/gpu", "status slow-host", channel_id="C6")
    await fake.wait_for_ack(env_id, 20)
    await wait_until(lambda: srv.exec_count >= 1, 20, what="the first delivery's probe to reach the host")
    before = await _drop(fake)
    await fake.redeliver(env_id)  # queued; goes out on the new connection
    await _reconnected(fake, before)
    await fake.wait_for_ack_count(env_id, 2, timeout=20)  # acked again, so Slack stops retrying
    answered_before_redelivery_acked = any(_is_status(c) for c in fake.calls)
    gated_host.open()
    await fake.wait_for_answer(lambda c: _is_status(c, "C6"), timeout=30)
    # every run the bot started (a second one would have been started before the redelivery's ack) is over
    await stack.settled(env_id)
    texts = _messages(fake, "C6")
    answers = [c for c in fake.calls if _is_status(c)]
    assert not answered_before_redelivery_acked  # the redelivery really overlapped the first run
    assert len(texts) == 1 and "slow-host" in texts[0]
    assert len(answers) == 1
    # the host was asked once: the redelivery did not run the command again
    assert gated_host.script_runs() == 1, srv.commands


@pytest.mark.parametrize("kind", ["slash", "message"])
async def test_envelope_redelivered_after_reconnect_is_acked_again_and_answered_once(slack, kind):
    fake = slack.fake
    if kind == "slash":
        env_id = await fake.push_slash_command("/gpu", "help", channel_id="C8")
    else:
        env_id = await fake.push_event({"type": "message", "channel": "C8", "user": "U2",
                                        "ts": "1700000900.000100", "text": "!help"})
    await fake.wait_for_ack(env_id, 20)
    first = await fake.wait_for_answer(lambda c: "/gpu status" in (c["params"].get("text") or ""), timeout=20)
    assert first["params"]["channel"] == "C8"
    # The socket drops; Slack, unsure the ack arrived, delivers the same envelope again on the new one.
    await _reconnected(fake, await _drop(fake))
    await fake.redeliver(env_id)
    assert fake.envelopes[env_id]["envelope"]["retry_attempt"] == 1  # same id and payload, a retry
    await fake.wait_for_ack_count(env_id, 2, timeout=20)  # acked again, so Slack stops retrying
    # a fresh command on the same connection is still answered (the redelivery did not wedge anything)
    env2 = await fake.push_slash_command("/gpu", "help", channel_id="C9")
    await fake.wait_for_ack(env2, 20)
    await fake.wait_for_answer(lambda c: c["params"].get("channel") == "C9", timeout=20)
    await slack.settled()  # the redelivery's work, had it been started, is over and sent by now
    assert len(_messages(fake, "C8")) == 1
    assert len([e for e in slack.runtime.audit.events() if e.action == "command:help"]) == 2  # C8 once, C9 once


async def test_watchdog_fetches_a_fresh_url_when_the_old_one_has_expired(slack):
    """The socket drops during an outage of the websocket edge, and the URL the client got meanwhile
    expires: slack_sdk alone retries that dead URL forever; the runner's watchdog makes it ask
    apps.connections.open for a new one, and commands work again."""
    from bot.slack.runner import socket_watchdog

    fake = slack.fake
    watchdog = asyncio.get_running_loop().create_task(socket_watchdog(slack.handler, every_s=1.0, misses=2))
    try:
        await fake.wait_connected(RECONNECT_TIMEOUT_S)
        before = fake.connection_count
        fake.refuse_websockets(for_seconds=4.0, link_ttl_s=2.0)
        assert await fake.drop_websocket(abrupt=True) == 1
        await fake.wait_connected(RECONNECT_TIMEOUT_S + 6, count=before + 1)
        await _status_round_trip(fake, "C1")
    finally:
        watchdog.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watchdog
