"""The outbox: database first, one sender, >= `min_interval_s` per channel, Retry-After, backoff, restarts
that send nothing twice.

The queue, pacing, retry and exactly-once rules are tested through an in-memory Transport (FakeTransport,
below) that misbehaves on demand and holds calls in flight until the test lets them go, so every test
waits on conditions, never on the clock. What depends on Slack's wire behaviour (Retry-After headers, error
codes, message metadata lookups, uploads into threads, `blocks: []` clearing an edit) goes through the real
SlackTransport and slack_sdk client against a local fake of Slack's servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_slack_response import AsyncSlackResponse
from sqlalchemy.exc import OperationalError

from bot.adapters.store import Store
from bot.core.records import OutboxItem
from bot.present.render import Message
from bot.services.outbox import MAX_RETRY_AFTER_S, DeliveryFailed, DeliveryRetry, Outbox, ref, ref_id
from bot.services.surface import OutboxSurface
from bot.slack.client import make_client
from bot.slack.transport import METADATA_EVENT, SlackTransport, classify
from tests.support.fakes.slack_server import FakeSlack
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(60)

#: Seconds a wait below may take at most: generous (a loaded machine); a passing test never needs them.
WAIT_S = 30.0


# ----------------------------------------------------------------------------------------- the fake transport


@dataclass
class Call:
    """One transport call: `method` (post, update, upload, find_posted), its channel and arguments, when it
    started (`at`, epoch seconds: the outbox paces by time.time()), and how it ended (`outcome`: "ok", the
    error it raised, or "pending" while in flight)."""

    method: str
    channel: str
    args: dict[str, Any]
    at: float = field(default_factory=time.time)
    outcome: str = "pending"

    @property
    def done(self) -> bool:
        return self.outcome != "pending"


@dataclass
class StoredThen:
    """A scripted failure that comes after the transport did its work: Slack stored the post, then the answer
    was lost (`error`, e.g. an HTTP 503: the ambiguous case)."""

    error: Exception


class FakeTransport:
    """The outbox's Transport in memory (bot.services.outbox.Transport).

    Records every call (`calls`) and what "Slack" holds (`messages`, each with its key, thread and current
    text/blocks; `uploads`). Misbehaves on demand: `down` (every call fails with that retryable, ambiguous
    error), `fail_next(method, *errors)` (the next calls of `method` raise these; a `StoredThen` stores first),
    and `hold(channel)`: calls in that channel do their work, then stay in flight until `release(channel)`.
    """

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.messages: list[dict[str, Any]] = []
        self.uploads: list[dict[str, Any]] = []
        self.down: str | None = None
        self._failures: dict[str, list[Exception | StoredThen]] = defaultdict(list)
        self._gates: dict[str, asyncio.Event] = {}
        self._ts = itertools.count(1)

    # -- scripting ------------------------------------------------------------------------------------------
    def fail_next(self, method: str, *errors: Exception | StoredThen) -> None:
        self._failures[method].extend(errors)

    def hold(self, channel: str) -> None:
        self._gates[channel] = asyncio.Event()

    def release(self, channel: str) -> None:
        gate = self._gates.pop(channel, None)
        if gate is not None:
            gate.set()

    # -- what happened ----------------------------------------------------------------------------------------
    def calls_for(self, method: str, channel: str | None = None, *, outcome: str | None = None) -> list[Call]:
        return [c for c in self.calls if c.method == method and channel in (None, c.channel)
                and outcome in (None, c.outcome)]

    def posted(self, channel: str | None = None) -> list[dict[str, Any]]:
        """Messages as stored, in posting order (optionally of one channel)."""
        return [m for m in self.messages if channel in (None, m["channel"])]

    def message(self, ts: str) -> dict[str, Any] | None:
        return next((m for m in self.messages if m["ts"] == ts), None)

    # -- the Transport protocol ---------------------------------------------------------------------------
    async def _call(self, method: str, channel: str, work: Callable[[], Any], **args: Any) -> Any:
        call = Call(method, channel, args)
        self.calls.append(call)
        try:
            if self.down:
                raise DeliveryRetry(self.down, None, ambiguous=True)
            queued = self._failures[method]
            failure = queued.pop(0) if queued else None
            if isinstance(failure, StoredThen):
                work()
                raise failure.error
            if failure is not None:
                raise failure
            result = work()
            gate = self._gates.get(channel)
            if gate is not None:
                await gate.wait()
            call.outcome = "ok"
            return result
        except BaseException as e:
            call.outcome = getattr(e, "error", None) or str(e) or type(e).__name__
            raise

    async def post(self, *, channel: str, text: str, blocks: list | None, thread_ts: str | None, key: str) -> str:
        def store() -> str:
            ts = f"1700000000.{next(self._ts):06d}"
            self.messages.append({"channel": channel, "ts": ts, "thread_ts": thread_ts, "text": text,
                                  "blocks": blocks, "key": key, "edits": []})
            return ts

        return await self._call("post", channel, store, text=text, blocks=blocks, thread_ts=thread_ts, key=key)

    async def update(self, *, channel: str, ts: str, text: str, blocks: list | None) -> None:
        def edit() -> None:
            m = self.message(ts)
            if m is None or m["channel"] != channel:
                raise DeliveryFailed("message_not_found")
            m["edits"].append({"text": text, "blocks": blocks})
            m["text"], m["blocks"] = text, blocks

        await self._call("update", channel, edit, ts=ts, text=text, blocks=blocks)

    async def upload(self, *, channel: str, thread_ts: str | None, filename: str, content: bytes, title: str) -> None:
        def store() -> None:
            self.uploads.append({"channel": channel, "thread_ts": thread_ts, "filename": filename,
                                 "content": content, "title": title})

        await self._call("upload", channel, store, thread_ts=thread_ts, filename=filename)

    async def find_posted(self, *, channel: str, thread_ts: str | None, key: str, oldest: float) -> str | None:
        def look() -> str | None:
            return next((m["ts"] for m in self.messages
                         if m["channel"] == channel and m["thread_ts"] == thread_ts and m["key"] == key), None)

        return await self._call("find_posted", channel, look, thread_ts=thread_ts, key=key)


# ----------------------------------------------------------------------------------------- fixtures, helpers


@pytest.fixture
def store(db_url):
    s = Store(db_url)
    yield s
    s.close()


@pytest.fixture
def transport() -> FakeTransport:
    return FakeTransport()


@contextlib.asynccontextmanager
async def outbox_with(store: Store, transport: Any, **kw: Any) -> AsyncIterator[Outbox]:
    """An Outbox on `store`'s rows over `transport`; stopped (not flushed) on exit."""
    kw.setdefault("min_interval_s", 0.0)
    kw.setdefault("backoff_base_s", 0.05)
    kw.setdefault("backoff_max_s", 0.4)
    ob = Outbox(store.outbox, transport, **kw)
    try:
        yield ob
    finally:
        if isinstance(transport, FakeTransport):
            for channel in list(transport._gates):
                transport.release(channel)
        await ob.stop()


def msg(text: str, files: list[tuple[str, bytes]] | None = None) -> Message:
    return Message(text=text, blocks=[{"type": "section", "text": {"type": "mrkdwn", "text": text}}],
                   files=files or [])


async def sent(ob: Outbox, row_id: int) -> Any:
    """Wait for row `row_id` to be done; it must have been sent."""
    d = await ob.wait(row_id, WAIT_S)
    assert d.state == "sent", d
    return d


# ----------------------------------------------------------------------------------------- queue and pacing


async def test_sends_in_order_per_channel_at_least_the_interval_apart(store, transport):
    interval = 0.5
    transport.hold("C1")  # C1's first post stays in flight until C2 has been served
    async with outbox_with(store, transport, min_interval_s=interval) as ob:
        for i in range(3):
            ob.post("C1", msg(f"c1-{i}"))
            ob.post("C2", msg(f"c2-{i}"))
        assert ob.pending() == 6  # in the database before anything is sent
        # the two channels are served side by side, not one after the other
        await wait_until(lambda: transport.calls_for("post", "C2", outcome="ok"), WAIT_S, what="C2's first post")
        assert [c.done for c in transport.calls_for("post", "C1")] == [False]  # one call in flight per channel
        transport.release("C1")
        assert await ob.flush(WAIT_S)
    for ch in ("C1", "C2"):
        calls = transport.calls_for("post", ch)
        assert [c.args["text"] for c in calls] == [f"{ch.lower()}-{i}" for i in range(3)]
        assert [m["text"] for m in transport.posted(ch)] == [f"{ch.lower()}-{i}" for i in range(3)]
        # lower bounds only (load can stretch the gaps, never shrink them)
        gaps = [b.at - a.at for a, b in itertools.pairwise(calls)]
        assert all(g >= interval - 1e-3 for g in gaps), gaps


async def test_a_new_leader_paces_a_channel_from_a_call_the_old_one_left_in_flight(store, transport):
    """Two bots on one database: the leader died while its call to C1 was in flight (the row stays `sending`; the
    call may have reached Slack a moment before). The next leader's first post to C1 comes at least the interval
    after it took over, not right after the last send recorded as done; C2, with nothing in flight, goes at once."""
    interval = 0.5
    async with outbox_with(store, transport, min_interval_s=interval) as dead:
        dead.hold()
        cut = dead.post("C1", msg("cut off"))
    assert store.outbox.claim(cut) is not None  # the dead leader's claim, never finished
    async with outbox_with(store, transport, min_interval_s=interval) as ob:
        ob.shared = True
        ob.hold()
        ob.post("C1", msg("next"))
        ob.post("C2", msg("other"))
        took_over = time.time()
        ob.start()
        await wait_until(lambda: transport.calls_for("post", "C1") and transport.calls_for("post", "C2"), WAIT_S,
                         what="both channels' posts")
    (c1,) = transport.calls_for("post", "C1")
    (c2,) = transport.calls_for("post", "C2")
    assert c1.args["text"] == "next" and c1.at >= took_over + interval - 1e-3, (c1.at - took_over)
    assert c2.at < c1.at  # the channel without a call in flight was not held back


async def test_a_retry_waits_the_delay_it_was_given_then_sends_once(store, transport):
    transport.fail_next("post", DeliveryRetry("ratelimited", 1.0, ambiguous=False))
    async with outbox_with(store, transport) as ob:
        d = await sent(ob, ob.post("C1", msg("hello")))
    first, second = transport.calls_for("post")
    assert first.outcome == "ratelimited" and second.outcome == "ok"
    assert second.at - first.at >= 1.0  # the delay honoured (a lower bound)
    assert [m["ts"] for m in transport.posted()] == [d.ts] and d.attempts == 2
    assert not transport.calls_for("find_posted")  # not ambiguous: Slack said it did not take it


async def test_a_permanent_failure_fails_that_message_and_the_next_goes(store, transport):
    transport.fail_next("post", DeliveryFailed("channel_not_found"))
    async with outbox_with(store, transport) as ob:
        surface = OutboxSurface(ob, wait_s=WAIT_S)
        assert await surface.post("C1", msg("lost")) is None
        assert surface.last_error == "channel_not_found"
        ts = await surface.post("C1", msg("next"))
    assert ts == transport.posted()[-1]["ts"]
    assert [(c.args["text"], c.outcome) for c in transport.calls_for("post")] == [("lost", "channel_not_found"),
                                                                                 ("next", "ok")]


async def test_a_newer_edit_supersedes_a_queued_one(store, transport):
    async with outbox_with(store, transport, min_interval_s=0.5) as ob:
        root = ob.post("C1", msg("root"))
        for i in range(5):
            ob.update("C1", ref(root), msg(f"edit {i}"))
        assert await ob.flush(WAIT_S)
    (update,) = transport.calls_for("update")
    assert update.args["text"] == "edit 4" and transport.posted()[0]["text"] == "edit 4"


async def test_wait_on_a_superseded_update_returns_at_once(store, transport):
    async with outbox_with(store, transport) as ob:
        d = await sent(ob, ob.post("C1", msg("root")))
        transport.hold("C1")
        ob.post("C1", msg("blocker"))  # in flight until released: the channel is busy
        await wait_until(lambda: transport.calls_for("post", "C1")[1:], WAIT_S, what="the blocker in flight")
        u1 = ob.update("C1", d.ts, msg("v1"))
        waiter = asyncio.ensure_future(ob.wait(u1, 3600))
        await asyncio.sleep(0)  # the wait has started
        ob.update("C1", d.ts, msg("v2"))
        # the channel is still held: only the supersede can end this wait before its hour is up
        d1 = await asyncio.wait_for(waiter, WAIT_S)
        assert d1.state == "superseded"
        assert not transport.calls_for("post", "C1")[1].done
        transport.release("C1")
        assert await ob.flush(WAIT_S)
    (update,) = transport.calls_for("update")
    assert update.args["text"] == "v2"


async def test_retry_after_is_capped(store, transport):
    """A Retry-After of 1e9 s (proxy, bug) would park the channel's head row ~forever: it is capped."""
    transport.fail_next("post", DeliveryRetry("ratelimited", 10.0**9, ambiguous=False))
    async with outbox_with(store, transport) as ob:
        rid = ob.post("C1", msg("one"))

        def after_the_429() -> OutboxItem | None:
            row = store.outbox.get(rid)
            return row if row is not None and row.error == "ratelimited" else None

        row = await wait_until(after_the_429, WAIT_S, what="the 429 to be recorded")
        nxt = row.next_at - time.time()
    assert row.state == "pending"
    assert nxt <= MAX_RETRY_AFTER_S < 3600, f"head row parked for {nxt:.0f} s; channel blocked"


async def test_done_rows_are_purged_while_running(store, transport, monkeypatch):
    monkeypatch.setattr("bot.services.outbox.PURGE_EVERY_S", 0.2)
    retention = 0.5
    async with outbox_with(store, transport, retention_s=retention) as ob:
        old = [ob.post("C1", msg(f"m{i}")) for i in range(3)]
        assert await ob.flush(WAIT_S)
        def aged(row_id: int) -> bool:
            row = store.outbox.get(row_id)
            return row is None or time.time() - row.created_at > retention

        await wait_until(lambda: all(aged(r) for r in old), WAIT_S, what="the sent rows to outlive the retention")
        later = ob.post("C1", msg("later"))  # wakes the sender
        born = store.outbox.get(later).created_at
        assert await ob.flush(WAIT_S)

        def old_purged() -> bool:
            # the row sent later is kept while it is younger than the retention (on a loaded machine the wait may
            # outlast the retention: then it may go too)
            if ob.delivery(later) is None:
                assert time.time() - born > retention, "a row younger than the retention was purged"
            return all(store.outbox.get(r) is None for r in old)

        await wait_until(old_purged, WAIT_S, what="the old rows to be purged (not only at start)")


# ----------------------------------------------------------------------------------------- exactly once


async def test_a_send_cut_short_by_a_stop_is_looked_up_after_the_restart(store, transport):
    """Slack stored the post, the bot stopped before its answer came: the restart looks the key up and
    records the stored message instead of posting it again."""
    transport.hold("C1")
    async with outbox_with(store, transport) as ob:
        rid = ob.post("C1", msg("once"))
        await wait_until(lambda: transport.posted("C1"), WAIT_S, what="the post to reach 'Slack'")
        await ob.stop(timeout_s=0.1)  # the call in flight is cut short
    assert store.outbox.get(rid).state == "pending"
    async with outbox_with(store, transport) as ob2:
        ob2.start()
        assert await ob2.flush(WAIT_S)
        again = ob2.delivery(rid)
    (stored,) = transport.posted()
    assert again.state == "sent" and again.ts == stored["ts"]
    assert [c.args["key"] for c in transport.calls_for("find_posted")] == [stored["key"]]
    assert len(transport.calls_for("post")) == 1


async def test_a_lookup_that_must_wait_still_looks_before_posting_again(store, transport):
    """Stored, then 503 -> the retry looks first -> the lookup is answered 'retry later' (429): the next
    attempt must look again, not post blind (that would be a duplicate)."""
    transport.fail_next("post", StoredThen(DeliveryRetry("HTTP 503", None, ambiguous=True)))
    transport.fail_next("find_posted", DeliveryRetry("ratelimited", 0.0, ambiguous=False))
    async with outbox_with(store, transport) as ob:
        d = await sent(ob, ob.post("C1", msg("hello")))
        assert await ob.flush(WAIT_S)
    assert [m["text"] for m in transport.posted()] == ["hello"], "posted twice"
    assert d.ts == transport.posted()[0]["ts"]
    assert [c.outcome for c in transport.calls_for("find_posted")] == ["ratelimited", "ok"]


@pytest.mark.timeout(120)
async def test_slack_down_with_a_restart_delivers_everything_once_in_order(store, transport):
    """Acceptance: every call fails (5xx) for a long outage, then Slack recovers: every queued message is
    delivered exactly once, in order within each thread; a restart during the outage sends nothing twice."""
    transport.down = "HTTP 503"
    threads = [("C1", "1700000000.000100"), ("C1", "1700000000.000200"), ("C2", "1700000000.000300")]
    expected: dict[tuple[str, str | None], list[str]] = {k: [] for k in [*threads, ("C2", None)]}

    def produce(ob: Outbox, round_: int) -> None:
        for i in range(3):
            for (ch, th) in expected:
                text = f"{ch}/{th}/r{round_}/m{i}"
                ob.post(ch, msg(text), thread_ts=th)
                expected[(ch, th)].append(text)

    def failed() -> int:
        return sum(c.outcome == "HTTP 503" for c in transport.calls)

    options = {"min_interval_s": 0.05, "backoff_base_s": 0.05, "backoff_max_s": 0.4}
    async with outbox_with(store, transport, **options) as ob:
        produce(ob, 0)
        await wait_until(lambda: {c.channel for c in transport.calls} == {"C1", "C2"} and failed() >= 4, WAIT_S,
                         what="attempts in both channels")
        assert not transport.messages and ob.pending() == 12
    # restarted mid-outage: a new process, the same database
    async with outbox_with(store, transport, **options) as ob2:
        ob2.start()
        produce(ob2, 1)
        before = failed()
        await wait_until(lambda: failed() >= before + 10, WAIT_S, what="10 more failed attempts")
        assert not transport.messages  # nothing got through while Slack was down
        # the outbox kept trying, backing off: the first row's attempts (posts, then lookups before each
        # retry) came further apart each time (lower bounds: backoff_base_s doubling up to backoff_max_s)
        head = transport.calls[0].args["key"]
        times = [c.at for c in transport.calls if c.args.get("key") == head]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        floors = [min(0.4, 0.05 * 2 ** i) for i in range(len(gaps))]
        assert len(gaps) >= 3 and all(g >= f - 1e-3 for g, f in zip(gaps, floors, strict=True)), (gaps, floors)
        transport.down = None
        assert await ob2.flush(WAIT_S)
    stored = transport.posted()
    assert len(stored) == sum(len(v) for v in expected.values()) == 24
    assert len({m["text"] for m in stored}) == 24  # each exactly once
    for (ch, th), texts in expected.items():
        got = [m["text"] for m in stored if m["channel"] == ch and m["thread_ts"] == th]
        assert got == texts, (ch, th)


# ----------------------------------------------------------------------------------------- a failing database


async def test_a_locked_database_when_claiming_a_row_loses_nothing(store, transport, monkeypatch):
    """One 'database is locked' when claiming a row (before anything is sent): the row is sent later."""
    claim = store.outbox.claim
    armed = [True]

    def locked_once(row_id: int):
        if armed[0]:
            armed[0] = False
            raise OperationalError("UPDATE", {}, Exception("database is locked"))
        return claim(row_id)

    monkeypatch.setattr(store.outbox, "claim", locked_once)
    async with outbox_with(store, transport) as ob:
        d = await ob.wait(ob.post("C1", msg("important")), WAIT_S)
    assert not armed[0], "injection did not fire"
    assert d.state == "sent", f"row {d}; posts={[m['text'] for m in transport.messages]}"
    assert [m["text"] for m in transport.posted()] == ["important"]


async def test_a_database_error_in_the_loop_does_not_stop_the_sender(store, transport, monkeypatch):
    """One DB error while the sender reads the queue must not end the sender task."""
    transport.fail_next("post", DeliveryRetry("ratelimited", 1.0, ambiguous=False))
    pending = store.outbox.pending
    armed = [False]

    def locked_when_armed():
        if armed[0]:
            armed[0] = False
            raise OperationalError("SELECT", {}, Exception("database is locked"))
        return pending()

    monkeypatch.setattr(store.outbox, "pending", locked_when_armed)
    async with outbox_with(store, transport) as ob:
        rid = ob.post("C1", msg("one"))
        await wait_until(lambda: transport.calls_for("post", outcome="ratelimited"), WAIT_S, what="the 429")
        armed[0] = True
        await sent(ob, rid)
        assert not armed[0], "injection did not fire"
        await sent(ob, ob.post("C1", msg("two")))  # the sender is still there
    assert [m["text"] for m in transport.posted()] == ["one", "two"]


async def test_a_database_error_after_a_post_keeps_it_sent_and_its_thread(store, transport, monkeypatch):
    """The post went out, writing 'sent' hits a transient DB error: the row still ends 'sent', on_posted runs,
    and the replies queued for its thread go into that thread (not to channel level)."""
    write = store.outbox.set
    armed = [True]
    hooked: list[tuple[str, str]] = []

    def locked_once(row_id: int, **values: Any) -> None:
        if armed[0] and values.get("state") == "sent":
            armed[0] = False
            raise OperationalError("UPDATE", {}, Exception("database is locked"))
        write(row_id, **values)

    monkeypatch.setattr(store.outbox, "set", locked_once)
    async with outbox_with(store, transport, on_posted=lambda a, b: hooked.append((a, b))) as ob:
        root = ob.post("C1", msg("root"))
        reply = ob.post("C1", msg("reply"), thread_ts=ref(root))
        await sent(ob, reply)
        d = ob.delivery(root)
    assert not armed[0], "injection did not fire"
    root_msg, reply_msg = transport.posted()
    assert d.state == "sent" and d.ts == root_msg["ts"] and reply_msg["thread_ts"] == root_msg["ts"]
    assert hooked[0] == (ref(root), root_msg["ts"])  # the launch thread hook ran for the root


async def test_blocks_the_transport_refuses_are_replaced_by_the_text(store, transport):
    transport.fail_next("post", DeliveryFailed("invalid_blocks", blocks_refused=True))
    async with outbox_with(store, transport) as ob:
        await sent(ob, ob.post("C1", msg("still readable")))
    first, second = transport.calls_for("post")
    assert first.args["blocks"] and second.args["blocks"] is None
    assert second.args["text"] == "still readable" and transport.posted()[0]["text"] == "still readable"


# ----------------------------------------------------------------------------------------- Slack's wire behaviour


@pytest.fixture
async def fake():
    async with FakeSlack() as f:
        yield f


@contextlib.asynccontextmanager
async def outbox_on(store: Store, fake: FakeSlack, **kw: Any) -> AsyncIterator[Outbox]:
    """An Outbox over the real SlackTransport, with a retry-less slack_sdk client pointed at `fake`."""
    async with aiohttp.ClientSession() as session:
        kw.setdefault("min_interval_s", 1.0)
        kw.setdefault("backoff_base_s", 0.2)
        kw.setdefault("backoff_max_s", 2.0)
        transport = SlackTransport(make_client("xoxb-test", fake.api_url, retries=False, session=session))
        async with outbox_with(store, transport, **kw) as ob:
            yield ob


def posts(fake: FakeSlack, channel: str | None = None) -> list[dict]:
    return [c for c in fake.calls_for("chat.postMessage") if channel is None or c["params"]["channel"] == channel]


async def test_429_waits_for_retry_after_then_sends_once(fake, store):
    fake.fail("chat.postMessage", status=429, retry_after=2, times=1)
    async with outbox_on(store, fake, min_interval_s=0.0) as ob:
        d = await sent(ob, ob.post("C1", msg("hello")))
    assert d.ts == posts(fake)[0]["response"]["ts"]
    (failed,) = fake.failed_calls
    assert posts(fake)[0]["time"] - failed["time"] >= 1.9  # Retry-After honoured (a lower bound)
    assert len(posts(fake)) == 1 and d.attempts == 2
    meta = posts(fake)[0]["params"]["metadata"]  # the row key rides along, for a lookup before a retry
    assert meta["event_type"] == METADATA_EVENT and meta["event_payload"]["key"] == store.outbox.get(d.id).key


async def test_permanent_slack_error_fails_that_message_and_the_next_goes(fake, store):
    fake.set_error("chat.postMessage", "channel_not_found", times=1)
    async with outbox_on(store, fake, min_interval_s=0.0) as ob:
        surface = OutboxSurface(ob, wait_s=WAIT_S)
        assert await surface.post("C1", msg("lost")) is None
        assert surface.last_error == "channel_not_found"
        ts = await surface.post("C1", msg("next"))
    assert ts == posts(fake)[-1]["response"]["ts"]
    assert [(c["params"]["text"], c["response"]["ok"]) for c in posts(fake)] == [("lost", False), ("next", True)]


async def test_thread_replies_queued_before_their_root_is_sent_land_in_its_thread(fake, store):
    la = store.launches.create(host="h", variant="base", params={}, command="x", log_path=None, port=None,
                               gpus=[0], created_by="U1", channel="C1")
    fake.fail(None, status=503, for_seconds=3600)  # Slack is down until the test says otherwise
    async with outbox_on(store, fake, min_interval_s=0.1, on_posted=store.launches.replace_thread_ts) as ob:
        surface = OutboxSurface(ob, wait_s=0.3)
        root = await surface.post("C1", msg("root"))
        assert ref_id(root) is not None  # Slack is down: a reference stands in for the ts
        store.launches.update(la.id, thread_ts=root)
        await surface.post("C1", msg("reply 1", files=[("out.txt", b"full output")]), thread_ts=root, wait_s=0)
        await surface.update("C1", root, msg("root, edited"))
        await surface.post("C1", msg("reply 2"), thread_ts=root, wait_s=0)
        assert not posts(fake)
        fake.clear_failures()  # Slack is back
        assert await ob.flush(WAIT_S)
    root_ts = posts(fake)[0]["response"]["ts"]
    assert [c["params"].get("thread_ts") for c in posts(fake)] == [None, root_ts, root_ts]
    assert fake.calls_for("files.completeUploadExternal")[0]["params"]["thread_ts"] == root_ts
    assert fake.message_state(root_ts)["text"] == "root, edited"
    assert store.launches.get(la.id).thread_ts == root_ts  # the launch now points at the real thread
    assert store.launches.for_thread("C1", root_ts).id == la.id


async def test_restart_after_a_crash_mid_send_does_not_post_twice(fake, store):
    async with outbox_on(store, fake, min_interval_s=0.0) as ob:
        rid = ob.post("C1", msg("once"))
        d = await sent(ob, rid)
        # a crash between Slack's answer and the database write leaves the row "sending"
        store.outbox.set(rid, state="sending", result_ts=None)
        thread_rid = ob.post("C1", msg("in thread"), thread_ts=d.ts)
        await sent(ob, thread_rid)
        store.outbox.set(thread_rid, state="sending")
    async with outbox_on(store, fake, min_interval_s=0.0) as ob2:
        ob2.start()
        assert await ob2.flush(WAIT_S)
        again = ob2.delivery(rid)
        assert again.state == "sent" and again.ts == d.ts  # found by its metadata key, not posted again
        assert ob2.delivery(thread_rid).state == "sent"
    assert [c["params"]["text"] for c in posts(fake)] == ["once", "in thread"]
    assert fake.calls_for("conversations.history") and fake.calls_for("conversations.replies")


def store_then_503(fake, times=1):
    """chat.postMessage is stored by Slack, but the answer is an HTTP 503 (the ambiguous case)."""
    orig = fake._answer
    left = [times]

    def answer(method, params, token):
        res = orig(method, params, token)
        if method == "chat.postMessage" and left[0] > 0:
            left[0] -= 1
            raise web.HTTPServiceUnavailable(text="stored, then 503")
        return res
    fake._answer = answer


async def test_a_lookup_answered_429_still_looks_before_posting_again(fake, store):
    """503 after Slack stored the post -> the retry does a lookup -> the lookup is answered 429 -> the next
    attempt must look again (conversations.history), not post a duplicate."""
    store_then_503(fake)
    fake.fail("conversations.history", status=429, retry_after=0, times=1)
    async with outbox_on(store, fake, min_interval_s=0.0, backoff_base_s=0.1) as ob:
        d = await sent(ob, ob.post("C1", msg("hello")))
        assert await ob.flush(WAIT_S)
    texts = [m["text"] for m in fake.messages if m["channel"] == "C1"]
    assert texts.count("hello") == 1, f"posted {texts.count('hello')} times: {texts}"
    assert d.ts == fake.messages[0]["ts"]
    assert len(fake.calls_for("conversations.history", include_failed=True)) == 2


async def test_blocks_slack_refuses_are_replaced_by_the_text(fake, store):
    fake.set_error("chat.postMessage", "invalid_blocks", times=1)
    async with outbox_on(store, fake, min_interval_s=0.0) as ob:
        await sent(ob, ob.post("C1", msg("still readable")))
    first, second = posts(fake)
    assert first["params"].get("blocks") and not second["params"].get("blocks")
    assert second["params"]["text"] == "still readable"


async def test_an_edit_whose_blocks_are_refused_clears_the_old_blocks(fake, store):
    async with outbox_on(store, fake, min_interval_s=0.0) as ob:
        d = await sent(ob, ob.post("C1", msg("with buttons")))
        fake.set_error("chat.update", "invalid_blocks", times=1)
        await sent(ob, ob.update("C1", d.ts, msg("decided")))
    first, second = fake.calls_for("chat.update")
    assert first["params"]["blocks"] and second["params"]["blocks"] == []  # no stale [Kill] [Cancel] left
    assert second["params"]["text"] == "decided"


def _api_error(status: int, data, headers=None) -> SlackApiError:
    resp = AsyncSlackResponse(client=None, http_verb="POST", api_url="x", req_args={}, data=data,
                              headers=headers or {}, status_code=status)
    return SlackApiError("x", resp)


def test_classify_sorts_slack_failures():
    r = classify(_api_error(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "7"}))
    assert isinstance(r, DeliveryRetry) and r.delay_s == 7.0 and not r.ambiguous
    r = classify(_api_error(503, "503 down"))
    assert isinstance(r, DeliveryRetry) and r.delay_s is None and r.ambiguous and r.error == "HTTP 503"
    assert isinstance(classify(_api_error(200, {"ok": False, "error": "internal_error"})), DeliveryRetry)
    p = classify(_api_error(200, {"ok": False, "error": "not_in_channel"}))
    assert isinstance(p, DeliveryFailed) and str(p) == "not_in_channel" and not p.blocks_refused
    b = classify(_api_error(200, {"ok": False, "error": "invalid_blocks"}))
    assert isinstance(b, DeliveryFailed) and b.blocks_refused
    assert isinstance(classify(TimeoutError()), DeliveryRetry)
    assert isinstance(classify(aiohttp.ClientConnectionError("reset")), DeliveryRetry)
    assert isinstance(classify(ValueError("bug")), DeliveryFailed)
    assert ref_id(ref(12)) == 12 and ref_id("1700000000.000100") is None and ref_id(None) is None


# ----------------------------------------------------------------------------------------- the last redaction gate


async def test_the_outbox_redacts_text_blocks_and_text_files_but_not_charts(store, transport):
    from bot.core.redact import Redactor

    known = "Gz7xKq2mVb9pLw4t"  # a secret the bot knows by value (no shape)
    png = b"\x89PNG\r\n\x1a\n" + known.encode()  # binary: never rewritten
    raw = msg(f"HF_TOKEN=Qm7vR2xPz9LkW4tN and {known}",
              files=[("evidence.txt", f"password:\n  Nl4iNe5vAl6u\n{known}\n".encode()), ("chart.png", png)])
    async with outbox_with(store, transport, redactor=Redactor(values=[known])) as ob:
        row = ob.post("C1", raw)
        await sent(ob, row)
        assert await ob.flush(WAIT_S)
    (post,) = transport.calls_for("post", "C1")
    uploads = {u["filename"]: u["content"] for u in transport.uploads}
    shown = post.args["text"] + repr(post.args["blocks"]) + uploads["evidence.txt"].decode()
    for secret in ("Qm7vR2xPz9LkW4tN", "Nl4iNe5vAl6u", known):
        assert secret not in shown
    assert "HF_TOKEN=[REDACTED]" in post.args["text"] and "password:" in uploads["evidence.txt"].decode()
    assert uploads["chart.png"] == png


# ------------------------------------------------------------------------------------ a queued post changed in place


async def _queued_behind_a_call_in_flight(ob: Outbox, transport: FakeTransport, **post: Any) -> int:
    """A post of C1 that stays queued: the channel's call before it is held in flight. Returns the post's row id."""
    transport.hold("C1")
    ob.post("C1", msg("blocker"))
    await wait_until(lambda: transport.calls_for("post", "C1"), WAIT_S, what="the blocker in flight")
    return ob.post("C1", post.pop("message", msg("Working on status...")), **post)


async def test_a_queued_post_takes_the_answer_in_its_place_and_goes_once(store, transport):
    """The answer takes the queued placeholder's row: one post carrying the answer (redacted like any row), no
    edit; what was queued against the placeholder's reference (a reply in its thread) and the answer's files
    follow into its thread."""
    from bot.core.redact import Redactor

    known = "Gz7xKq2mVb9pLw4t"
    async with outbox_with(store, transport, redactor=Redactor(values=[known])) as ob:
        surface = OutboxSurface(ob, wait_s=WAIT_S)
        rid = await _queued_behind_a_call_in_flight(ob, transport)
        key = store.outbox.get(rid).key
        reply = ob.post("C1", msg("a reply in its thread"), thread_ts=ref(rid))
        answer = msg(f"GPU status with {known}", files=[("full.txt", b"the whole table")])
        assert surface.take_place("C1", ref(rid), answer)
        transport.release("C1")
        ts = await surface.settled(ref(rid))
        assert await ob.flush(WAIT_S)
        assert ob.delivery(rid).ts == ts and ob.delivery(reply).state == "sent"
    _blocker, post, in_thread = transport.calls_for("post", "C1")
    assert post.args["text"] == "GPU status with [REDACTED]" and known not in repr(post.args["blocks"])
    assert post.args["key"] == key and post.args["thread_ts"] is None  # the same row, at channel level
    assert in_thread.args["thread_ts"] == ts and not transport.calls_for("update")
    (upload,) = transport.uploads
    assert upload["filename"] == "full.txt" and upload["thread_ts"] == ts  # into the answer's own thread


async def test_a_post_the_sender_has_claimed_or_sent_is_not_changed(store, transport):
    """Atomic with respect to the sender: once a post is claimed (in flight) or sent, neither take_place nor
    withdraw changes it; the edit then goes as before (a post, then its chat.update)."""
    async with outbox_with(store, transport) as ob:
        surface = OutboxSurface(ob, wait_s=WAIT_S)
        transport.hold("C1")
        rid = ob.post("C1", msg("Working on status..."))
        await wait_until(lambda: transport.calls_for("post", "C1"), WAIT_S, what="the placeholder in flight")
        assert store.outbox.get(rid).state == "sending"
        assert not surface.take_place("C1", ref(rid), msg("answer"))
        assert not surface.withdraw("C1", ref(rid))
        assert store.outbox.get(rid).text == "Working on status..."
        transport.release("C1")
        d = await sent(ob, rid)
        assert not surface.take_place("C1", ref(rid), msg("answer")) and not surface.take_place("C1", d.ts, msg("x"))
        await surface.update("C1", ref(rid), msg("answer"))
        assert await ob.flush(WAIT_S)
    (update,) = transport.calls_for("update")
    assert update.args["ts"] == d.ts and transport.message(d.ts)["text"] == "answer"


async def test_a_post_an_earlier_attempt_may_have_delivered_is_not_changed(store, transport):
    """A queued post whose earlier attempt may have reached Slack (a 5xx after storing, a restart mid-send:
    `needs_lookup`) may already show the old text: it is not changed (the lookup would record the old message
    as the answer), nor one of another channel."""
    async with outbox_with(store, transport) as ob:
        surface = OutboxSurface(ob, wait_s=WAIT_S)
        rid = await _queued_behind_a_call_in_flight(ob, transport)
        assert not surface.take_place("C2", ref(rid), msg("answer"))
        store.outbox.set(rid, needs_lookup=1)
        assert not surface.take_place("C1", ref(rid), msg("answer")) and not surface.withdraw("C1", ref(rid))
        assert store.outbox.get(rid).text == "Working on status..."


async def test_a_withdrawn_post_is_never_sent_and_nothing_waits_for_it(store, transport):
    async with outbox_with(store, transport) as ob:
        surface = OutboxSurface(ob, wait_s=WAIT_S)
        rid = await _queued_behind_a_call_in_flight(ob, transport)
        waiter = asyncio.ensure_future(ob.wait(rid, 3600))
        await asyncio.sleep(0)  # the wait has started
        assert surface.withdraw("C1", ref(rid))
        assert (await asyncio.wait_for(waiter, WAIT_S)).state == "superseded"  # the channel is still held
        edit = ob.update("C1", ref(rid), msg("too late"))
        after = ob.post("C1", msg("next"))
        transport.release("C1")
        await sent(ob, after)
        assert (await ob.wait(edit, WAIT_S)).state == "failed"  # an edit of it fails at once, never waits
    assert [c.args["text"] for c in transport.calls_for("post")] == ["blocker", "next"]
    assert not transport.calls_for("update")


async def test_a_post_sent_straight_to_slack_or_a_refusing_database_leaves_the_edit_as_before(store, transport,
                                                                                              monkeypatch):
    """The database refused the placeholder's row, so it went straight to Slack (a negative id, already on its
    way): it is never changed, and its edit goes after it. The database refusing the change itself: the
    placeholder stays queued as it was and is edited after it is sent."""
    add = store.outbox.add

    def refused(**fields: Any) -> int:
        raise OperationalError("INSERT", {}, Exception("database or disk is full"))

    async with outbox_with(store, transport) as ob:
        surface = OutboxSurface(ob, wait_s=WAIT_S)
        monkeypatch.setattr(store.outbox, "add", refused)
        direct = ob.post("C1", msg("Working on status..."))
        assert direct < 0
        assert not surface.take_place("C1", ref(direct), msg("answer")) and not surface.withdraw("C1", ref(direct))
        monkeypatch.setattr(store.outbox, "add", add)  # the database is back for the edit
        await surface.update("C1", ref(direct), msg("answer"))
        assert await ob.flush(WAIT_S)
        rid = await _queued_behind_a_call_in_flight(ob, transport)

        def down(*args: Any, **kw: Any) -> None:
            raise OperationalError("UPDATE", {}, Exception("database is locked"))

        monkeypatch.setattr(store.outbox, "change_queued_post", down)
        assert not surface.take_place("C1", ref(rid), msg("answer 2"))
        await surface.update("C1", ref(rid), msg("answer 2"))
        transport.release("C1")
        assert await ob.flush(WAIT_S)
    first, _blocker, second = transport.posted("C1")
    assert (first["text"], second["text"]) == ("answer", "answer 2")  # each placeholder edited into its answer
    assert [len(m["edits"]) for m in (first, second)] == [1, 1]
    assert [c.args["text"] for c in transport.calls_for("post")] == ["Working on status...", "blocker",
                                                                     "Working on status..."]


@pytest.mark.parametrize("damage", ["blocks_json = '{not json'", "next_at = 'soon'", "attempts = 'many'",
                                    "blocks_json = '42'"])
async def test_a_damaged_row_never_stops_its_channel(transport, tmp_path, damage):
    """SQLite only: its columns take any type, so a row can be damaged this way (PostgreSQL refuses the write)."""
    import sqlite3

    store = Store(f"sqlite:///{tmp_path}/gpubot.db")
    first = store.outbox.add(channel="C1", kind="post", text="damaged", blocks_json='[{"type": "divider"}]')
    second = store.outbox.add(channel="C1", kind="post", text="after it")
    with sqlite3.connect(tmp_path / "gpubot.db") as db:
        db.execute(f"UPDATE outbox SET {damage} WHERE id = ?", (first,))
    async with outbox_with(store, transport) as ob:
        ob.start()
        await sent(ob, second)
        d = await ob.wait(first, WAIT_S)
    assert d.state == "sent", d  # the damaged row went too (its text alone when its blocks were damaged)
    assert [m["text"] for m in transport.posted("C1")] == ["damaged", "after it"]
    assert len(transport.calls_for("post", "C1")) == 2  # each once: no endless retries
