"""One Slack call per answer: a slow command's placeholder that is still waiting in the outbox when the answer is
ready is never sent. The answer takes its place (one chat.postMessage instead of a post and a chat.update), or,
when the answer is for one person or for another thread, it is dropped (instead of a post and a chat.delete).
A placeholder already sent is edited as before (tests/e2e/test_slack_socket_mode.py,
test_ack_is_immediate_while_the_host_is_slow, and below).

"Still waiting" is made certain, not timed: the channel's pacing (`min_interval_s`) is stretched to a minute right
after a message went out, so nothing else can go to that channel until the test lowers it again, which it does
only once the outcome is decided (the placeholder's row changed, or an edit queued). The real Bolt app and
outbox against the fake Slack; the answers come from a host whose commands wait behind a gate, or from a
dispatcher call the test releases."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

from bot.core.records import OutboxItem
from bot.present.render import Message
from handlers import Reply, Request, Source
from tests.support.procs import wait_until
from tests.support.slack import SlackStack, text_of

pytestmark = pytest.mark.timeout(90)

#: Pacing that keeps the next message of a channel queued for the whole test.
HELD_S = 60.0
THREAD = "1700000000.000100"


async def _hold_channel(stack: SlackStack, channel: str) -> None:
    """Send a message to `channel`, then stretch the pacing: the channel's next message stays queued."""
    stack.runtime.outbox.min_interval_s = HELD_S
    assert await stack.runtime.surface.post(channel, Message("earlier")) is not None


def _let_go(stack: SlackStack) -> None:
    """Back to no pacing; a message to another channel wakes the sender, which then sees it at once."""
    stack.runtime.outbox.min_interval_s = 0.0
    stack.runtime.outbox.post("CWAKE", Message("wake up"))


def _queued_placeholder(stack: SlackStack, channel: str) -> OutboxItem | None:
    """The pending placeholder row of `channel`, once there is one."""
    rows = stack.runtime.store.outbox
    for row_id, ch, _next_at in rows.pending():
        row = rows.get(row_id)
        if ch == channel and row is not None and row.kind == "post" and row.text.startswith("Working on"):
            return row
    return None


def _calls(stack: SlackStack, method: str, channel: str = "C1") -> list[dict[str, Any]]:
    return [c for c in stack.fake.calls_for(method) if (c["params"].get("channel") or c["params"].get("channel_id"))
            == channel]


async def _run_held(stack: SlackStack, reply: Callable[[Request], Reply]) -> tuple[asyncio.Future, asyncio.Event]:
    """`SlackBot.run` of a command in C1 whose answer, `reply(request)`, is ready when the returned event is set;
    returns (the run, the event) once its placeholder waits in the outbox."""
    gate = asyncio.Event()

    async def work(request: Request) -> Reply:
        await gate.wait()
        return reply(request)

    run = asyncio.ensure_future(stack.bot.run(user_id="U1", channel_id="C1", thread_ts=None, source=Source.SLASH,
                                              word="probe", work=work))
    await wait_until(lambda: _queued_placeholder(stack, "C1"), 30, what="the placeholder queued behind the pacing")
    return run, gate


async def test_a_slow_answer_whose_placeholder_is_still_queued_is_one_post(gated_host, slack_stacks):
    """Through Bolt: `/gpu status` on a slow host; its placeholder waits behind the channel's pacing; when the
    host answers, the answer takes the placeholder's row: one chat.postMessage carrying it, no edit."""
    stack = await slack_stacks(gated_host.config())
    await _hold_channel(stack, "C1")
    env = await stack.fake.push_slash_command("/gpu", "status slow-host", user_id="U1", channel_id="C1")
    placeholder = await wait_until(lambda: _queued_placeholder(stack, "C1"), 30, what="the queued placeholder")
    gated_host.open()
    rows = stack.runtime.store.outbox
    answer = await wait_until(lambda: (r := rows.get(placeholder.id)) and r.text.startswith("GPU status") and r,
                              30, what="the answer in the placeholder's row")
    assert answer.state == "pending" and answer.key == placeholder.key
    _let_go(stack)
    await stack.settled(env)
    earlier, post = _calls(stack, "chat.postMessage")
    assert text_of(earlier) == "earlier" and text_of(post).startswith("GPU status") and "slow-host" in text_of(post)
    assert post["params"]["metadata"]["event_payload"]["key"] == placeholder.key
    assert not stack.fake.calls_for("chat.update") and not stack.fake.calls_for("chat.delete")
    assert rows.get(placeholder.id).result_ts == post["response"]["ts"]


async def test_a_placeholder_already_sent_is_edited_into_the_answer(slack):
    """No pacing in the way: the placeholder is sent at once, so the answer is its chat.update (2 calls)."""
    gate = asyncio.Event()

    async def work(request: Request) -> Reply:
        await gate.wait()
        return Reply(Message("the answer"), channel="C1")

    run = asyncio.ensure_future(slack.bot.run(user_id="U1", channel_id="C1", thread_ts=None, source=Source.SLASH,
                                              word="probe", work=work))
    placeholder = await slack.fake.wait_for_call("chat.postMessage", timeout=30)
    gate.set()
    ts = await asyncio.wait_for(run, 30)
    await slack.settled()
    assert slack.runtime.outbox.resolve(ts) == placeholder["response"]["ts"]  # the placeholder is the answer
    (update,) = slack.fake.calls_for("chat.update")
    assert update["params"]["ts"] == placeholder["response"]["ts"] and text_of(update) == "the answer"
    assert len(slack.fake.calls_for("chat.postMessage")) == 1 and not slack.fake.calls_for("chat.delete")


async def test_the_files_of_an_answer_in_a_queued_placeholder_follow_into_its_thread(slack):
    await _hold_channel(slack, "C1")
    run, gate = await _run_held(slack, lambda r: Reply(Message("the answer", files=[("full.txt", b"all of it")]),
                                                       channel="C1"))
    placeholder = _queued_placeholder(slack, "C1")
    gate.set()
    await wait_until(lambda: slack.runtime.store.outbox.get(placeholder.id).text == "the answer", 30,
                     what="the answer in the placeholder's row")
    _let_go(slack)
    ts = await asyncio.wait_for(run, 30)
    await slack.settled()
    _earlier, post = _calls(slack, "chat.postMessage")
    assert text_of(post) == "the answer" and slack.runtime.outbox.resolve(ts) == post["response"]["ts"]
    (upload,) = slack.fake.calls_for("files.completeUploadExternal")
    assert upload["params"]["thread_ts"] == post["response"]["ts"]  # into the answer's own thread
    assert not slack.fake.calls_for("chat.update") and not slack.fake.calls_for("chat.delete")


@pytest.mark.parametrize("where", ["for one person", "in the launch's thread"])
async def test_a_queued_placeholder_of_an_answer_that_goes_elsewhere_is_dropped_unsent(slack, where):
    """A private answer, or one for another thread, does not go into the placeholder: a placeholder still queued
    is dropped (never posted, so never deleted either) and the answer goes as if there had been none."""
    private = where == "for one person"
    await _hold_channel(slack, "C1")
    run, gate = await _run_held(slack, lambda r: Reply(Message("the answer"), channel="C1", private_to="U1")
                                if private else Reply(Message("the answer"), channel="C1", thread_ts=THREAD))
    placeholder = _queued_placeholder(slack, "C1")
    gate.set()
    await wait_until(lambda: slack.runtime.store.outbox.get(placeholder.id).state == "superseded", 30,
                     what="the placeholder dropped")
    _let_go(slack)
    await asyncio.wait_for(run, 30)
    await slack.settled()
    posts = _calls(slack, "chat.postMessage")
    assert not [c for c in posts if "Working on" in text_of(c)] and not slack.fake.calls_for("chat.delete")
    if private:
        assert [text_of(c) for c in posts] == ["earlier"]
        (ephemeral,) = slack.fake.ephemerals
        assert ephemeral["text"] == "the answer" and ephemeral["user"] == "U1"
    else:
        assert [(text_of(c), c["params"].get("thread_ts")) for c in posts] == [("earlier", None),
                                                                               ("the answer", THREAD)]
        assert not slack.fake.ephemerals  # nothing was shown in the channel: no pointer needed


async def test_a_placeholder_sent_straight_to_slack_while_the_database_is_locked_is_still_edited(slack):
    """The database's write lock is held by another connection: the placeholder goes straight to Slack (it has no
    queued row to change), and so does its edit: the answer arrives as that placeholder's chat.update."""
    slack.runtime.outbox.min_interval_s = 2.0  # the direct placeholder waits a little behind the pacing
    assert await slack.runtime.surface.post("C1", Message("earlier")) is not None
    holder = sqlite3.connect(slack.runtime.store.db.path, timeout=0, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        gate = asyncio.Event()

        async def work(request: Request) -> Reply:
            await gate.wait()
            return Reply(Message("the answer"), channel="C1")

        run = asyncio.ensure_future(slack.bot.run(user_id="U1", channel_id="C1", thread_ts=None,
                                                  source=Source.SLASH, word="probe", work=work))
        await wait_until(lambda: slack.runtime.outbox.pending("C1"), 30, what="the placeholder sent straight")
        gate.set()
        ts = await asyncio.wait_for(run, 60)
        update = await slack.fake.wait_for_call("chat.update", timeout=60)
        assert holder.in_transaction  # all of it while the lock was held
    finally:
        with contextlib.suppress(sqlite3.Error):
            holder.rollback()
        holder.close()
    await slack.settled()
    _earlier, placeholder = _calls(slack, "chat.postMessage")
    assert "Working on" in str(placeholder["params"]["blocks"]) and text_of(update) == "the answer"
    assert update["params"]["ts"] == placeholder["response"]["ts"] == slack.runtime.outbox.resolve(ts)
    assert len(slack.fake.calls_for("chat.update")) == 1 and not slack.fake.calls_for("chat.delete")
