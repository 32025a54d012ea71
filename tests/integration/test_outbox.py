"""The outbox against a local fake of Slack's servers, with the real slack_sdk AsyncWebClient: database
first, one sender, >= 1 s per channel, 429 Retry-After, 5xx backoff, restarts that send nothing twice."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import time

import aiohttp
import pytest
from aiohttp import web
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_slack_response import AsyncSlackResponse
from sqlalchemy.exc import OperationalError

from bot.adapters.store import OutboxRow, Store
from bot.present.render import Message
from bot.services.outbox import Outbox, _Permanent, _Retry, classify, ref, ref_id
from bot.slack.surface import OutboxSurface, make_client
from tests.support.fakes.slack_server import FakeSlack

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def fake():
    async with FakeSlack() as f:
        yield f


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path}/gpubot.db")
    yield s
    s.close()


@contextlib.asynccontextmanager
async def outbox_on(store: Store, fake: FakeSlack, **kw):
    """An Outbox with a retry-less real client pointed at `fake`; stopped (not flushed) on exit."""
    session = aiohttp.ClientSession()
    kw.setdefault("min_interval_s", 1.0)
    kw.setdefault("backoff_base_s", 0.2)
    kw.setdefault("backoff_max_s", 2.0)
    ob = Outbox(store, make_client("xoxb-test", fake.api_url, retries=False, session=session), **kw)
    try:
        yield ob
    finally:
        await ob.stop()
        await session.close()


def msg(text: str, files: list[tuple[str, bytes]] | None = None) -> Message:
    return Message(text=text, blocks=[{"type": "section", "text": {"type": "mrkdwn", "text": text}}],
                   files=files or [])


def posts(fake: FakeSlack, channel: str | None = None) -> list[dict]:
    return [c for c in fake.calls_for("chat.postMessage") if channel is None or c["params"]["channel"] == channel]


async def test_sends_in_order_per_channel_at_least_the_interval_apart(fake, store):
    async with outbox_on(store, fake, min_interval_s=1.0) as ob:
        for i in range(3):
            ob.post("C1", msg(f"c1-{i}"))
            ob.post("C2", msg(f"c2-{i}"))
        assert ob.pending() == 6  # in the database before anything is sent
        assert await ob.flush(20)
    for ch in ("C1", "C2"):
        sent = posts(fake, ch)
        assert [c["params"]["text"] for c in sent] == [f"{ch.lower()}-{i}" for i in range(3)]
        gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(sent)]
        assert all(g >= 0.95 for g in gaps), gaps
    # the two channels are served side by side, not one after the other
    first_c2 = posts(fake, "C2")[0]["time"]
    assert first_c2 - posts(fake, "C1")[0]["time"] < 0.9


async def test_429_waits_for_retry_after_then_sends_once(fake, store):
    fake.fail("chat.postMessage", status=429, retry_after=2, times=1)
    async with outbox_on(store, fake, min_interval_s=0.0) as ob:
        rid = ob.post("C1", msg("hello"))
        d = await ob.wait(rid, 10)
    assert d.state == "sent" and d.ts == posts(fake)[0]["response"]["ts"]
    (failed,) = fake.failed_calls
    assert posts(fake)[0]["time"] - failed["time"] >= 1.9  # Retry-After honoured
    assert len(posts(fake)) == 1 and d.attempts == 2


async def test_permanent_error_fails_that_message_and_the_next_goes(fake, store):
    fake.set_error("chat.postMessage", "channel_not_found", times=1)
    async with outbox_on(store, fake, min_interval_s=0.0) as ob:
        surface = OutboxSurface(ob)
        assert await surface.post("C1", msg("lost")) is None
        assert surface.last_error == "channel_not_found"
        ts = await surface.post("C1", msg("next"))
    assert ts == posts(fake)[-1]["response"]["ts"]
    assert [(c["params"]["text"], c["response"]["ok"]) for c in posts(fake)] == [("lost", False), ("next", True)]


async def test_thread_replies_queued_before_their_root_is_sent_land_in_its_thread(fake, store):
    la = store.create_launch(host="h", variant="base", params={}, command="x", log_path=None, port=None, gpus=[0],
                             created_by="U1", channel="C1")
    fake.fail(None, status=503, for_seconds=2.0)
    async with outbox_on(store, fake, min_interval_s=0.1,
                         on_posted=lambda old, new: store.replace_thread_ts(old, new)) as ob:
        surface = OutboxSurface(ob, wait_s=0.3)
        root = await surface.post("C1", msg("root"))
        assert ref_id(root) is not None  # Slack is down: a reference stands in for the ts
        store.update_launch(la.id, thread_ts=root)
        await surface.post("C1", msg("reply 1", files=[("out.txt", b"full output")]), thread_ts=root, wait_s=0)
        await surface.update("C1", root, msg("root, edited"))
        await surface.post("C1", msg("reply 2"), thread_ts=root, wait_s=0)
        assert await ob.flush(30)
    root_ts = posts(fake)[0]["response"]["ts"]
    assert [c["params"].get("thread_ts") for c in posts(fake)] == [None, root_ts, root_ts]
    assert fake.calls_for("files.completeUploadExternal")[0]["params"]["thread_ts"] == root_ts
    assert fake.message_state(root_ts)["text"] == "root, edited"
    assert store.get_launch(la.id).thread_ts == root_ts  # the launch now points at the real thread
    assert store.launch_for_thread("C1", root_ts).id == la.id


async def test_a_newer_edit_supersedes_a_queued_one(fake, store):
    async with outbox_on(store, fake, min_interval_s=0.5) as ob:
        root = ob.post("C1", msg("root"))
        for i in range(5):
            ob.update("C1", ref(root), msg(f"edit {i}"))
        assert await ob.flush(15)
    updates = fake.calls_for("chat.update")
    assert len(updates) == 1 and updates[0]["params"]["text"] == "edit 4"


async def test_restart_after_a_crash_mid_send_does_not_post_twice(fake, store):
    async with outbox_on(store, fake, min_interval_s=0.0) as ob:
        rid = ob.post("C1", msg("once"))
        d = await ob.wait(rid, 10)
        assert d.state == "sent"
        # a crash between Slack's answer and the database write leaves the row "sending"
        with store._tx() as s:
            row = s.get(OutboxRow, rid)
            row.state, row.result_ts = "sending", None
        thread_rid = ob.post("C1", msg("in thread"), thread_ts=d.ts)
        await ob.wait(thread_rid, 10)
        with store._tx() as s:
            s.get(OutboxRow, thread_rid).state = "sending"
    async with outbox_on(store, fake, min_interval_s=0.0) as ob2:
        ob2.start()
        assert await ob2.flush(10)
        again = ob2.delivery(rid)
        assert again.state == "sent" and again.ts == d.ts  # found by its metadata key, not posted again
    assert [c["params"]["text"] for c in posts(fake)] == ["once", "in thread"]
    assert fake.calls_for("conversations.history") and fake.calls_for("conversations.replies")


@pytest.mark.timeout(180)
async def test_slack_down_for_60_s_with_a_restart_delivers_everything_once_in_order(fake, store):
    """Acceptance: 5xx to everything for 60 s, then recovery: every queued message is delivered exactly
    once, in order within each thread; a restart during the outage sends nothing twice."""
    outage_s = 60.0
    fake.fail(None, status=503, for_seconds=outage_s)
    threads = {("C1", "1700000000.000100"): [], ("C1", "1700000000.000200"): [], ("C2", "1700000000.000300"): []}
    expected: dict[tuple[str, str | None], list[str]] = {k: [] for k in threads}
    expected[("C2", None)] = []
    for (ch, th) in threads:  # the threads exist in Slack already (posted before the outage)
        fake.messages.append({"channel": ch, "ts": th, "thread_ts": None, "text": "root", "blocks": None,
                              "params": {}, "user": "UBOT", "bot_id": "BBOT"})

    async def produce(ob: Outbox, round_: int) -> None:
        for i in range(3):
            for (ch, th) in list(expected):
                text = f"{ch}/{th}/r{round_}/m{i}"
                ob.post(ch, msg(text), thread_ts=th)
                expected[(ch, th)].append(text)
            await asyncio.sleep(0.5)

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    async with outbox_on(store, fake, min_interval_s=1.0, backoff_base_s=1.0, backoff_max_s=8.0) as ob:
        await produce(ob, 0)
        await asyncio.sleep(5)
        assert not posts(fake) and ob.pending() == 12
    # restarted mid-outage: a new process, the same database
    async with outbox_on(store, fake, min_interval_s=1.0, backoff_base_s=1.0, backoff_max_s=8.0) as ob2:
        ob2.start()
        await produce(ob2, 1)
        while loop.time() - t0 < outage_s - 1:
            await asyncio.sleep(1)
            assert not posts(fake)  # nothing got through while Slack was down
        assert await ob2.flush(60)
    assert len(fake.failed_calls) > 10  # the outbox kept trying, backing off
    sent = posts(fake)
    assert len(sent) == sum(len(v) for v in expected.values()) == 24
    assert len({c["params"]["text"] for c in sent}) == 24  # each exactly once
    for (ch, th), texts in expected.items():
        got = [c["params"]["text"] for c in sent if c["params"]["channel"] == ch and c["params"].get("thread_ts") == th]
        assert got == texts, (ch, th)


def _api_error(status: int, data, headers=None) -> SlackApiError:
    resp = AsyncSlackResponse(client=None, http_verb="POST", api_url="x", req_args={}, data=data,
                              headers=headers or {}, status_code=status)
    return SlackApiError("x", resp)


def test_classify_sorts_slack_failures():
    r = classify(_api_error(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "7"}))
    assert isinstance(r, _Retry) and r.delay_s == 7.0 and not r.ambiguous
    r = classify(_api_error(503, "503 down"))
    assert isinstance(r, _Retry) and r.delay_s is None and r.ambiguous and r.error == "HTTP 503"
    assert isinstance(classify(_api_error(200, {"ok": False, "error": "internal_error"})), _Retry)
    p = classify(_api_error(200, {"ok": False, "error": "not_in_channel"}))
    assert isinstance(p, _Permanent) and str(p) == "not_in_channel"
    assert isinstance(classify(TimeoutError()), _Retry)
    assert isinstance(classify(aiohttp.ClientConnectionError("reset")), _Retry)
    assert isinstance(classify(ValueError("bug")), _Permanent)
    assert ref_id(ref(12)) == 12 and ref_id("1700000000.000100") is None and ref_id(None) is None


# -- found by an adversarial review: Slack storing a post and answering 503, a locked database ---------
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
    """503 after Slack stored the post -> retry does a lookup -> lookup answered 429 -> the 'ambiguous'
    marker is overwritten by 'ratelimited' -> next attempt posts without a lookup: duplicate."""
    store_then_503(fake)
    fake.fail("conversations.history", status=429, retry_after=0, times=1)
    async with outbox_on(store, fake, min_interval_s=0.0, backoff_base_s=0.1) as ob:
        rid = ob.post("C1", msg("hello"))
        d = await ob.wait(rid, 10)
        assert d.state == "sent"
        await asyncio.sleep(0.5)
    texts = [m["text"] for m in fake.messages if m["channel"] == "C1"]
    assert texts.count("hello") == 1, f"posted {texts.count('hello')} times: {texts}"


async def test_a_locked_database_when_claiming_a_row_loses_nothing(fake, store):
    """One 'database is locked' at the start of _send (before anything is sent) marks the row failed."""
    orig = store._tx
    armed = [True]

    def tx():
        caller = inspect.stack()[1].function
        if armed[0] and caller == "_send":
            armed[0] = False
            raise OperationalError("BEGIN", {}, Exception("database is locked"))
        return orig()
    store._tx = tx
    async with outbox_on(store, fake, min_interval_s=0.0) as ob:
        rid = ob.post("C1", msg("important"))
        d = await ob.wait(rid, 3)
    assert not armed[0], "injection did not fire"
    assert d.state == "sent", f"row {d}; posts={[m['text'] for m in fake.messages]}"


async def test_a_database_error_in_the_loop_does_not_stop_the_sender(fake, store):
    """One DB error in _dispatch_due ends the sender task; queued rows wait for the next enqueue."""
    fake.fail("chat.postMessage", status=429, retry_after=1, times=1)
    orig = store._tx
    armed = [False]

    def tx():
        caller = inspect.stack()[1].function
        if armed[0] and caller == "_dispatch_due":
            armed[0] = False
            raise OperationalError("SELECT", {}, Exception("database is locked"))
        return orig()
    store._tx = tx
    async with outbox_on(store, fake, min_interval_s=0.0) as ob:
        rid = ob.post("C1", msg("one"))
        await fake.wait_for_call("chat.postMessage", timeout=5, include_failed=True)
        armed[0] = True
        d = await ob.wait(rid, 6)
        alive = ob._task is not None and not ob._task.done()
    assert d.state == "sent", f"row still {d.state} after 6 s (Retry-After was 1 s); sender alive={alive}"


async def test_done_rows_are_purged_while_running(fake, store, monkeypatch):
    monkeypatch.setattr("bot.services.outbox.PURGE_EVERY_S", 0.2)
    async with outbox_on(store, fake, min_interval_s=0.0, retention_s=0.5) as ob:
        for i in range(3):
            ob.post("C1", msg(f"m{i}"))
        assert await ob.flush(10)
        await asyncio.sleep(1.5)
        ob.post("C1", msg("later"))
        assert await ob.flush(10)
        with store._tx() as s:
            n = s.query(OutboxRow).count()
    assert n <= 1, f"{n} rows kept although retention is 0.5 s (purged only at start)"


async def test_retry_after_is_capped(fake, store):
    """A Retry-After of 1e9 s (proxy, bug) parks the channel's head row ~forever: no cap."""
    fake.fail("chat.postMessage", status=429, retry_after=10**9, times=1)
    async with outbox_on(store, fake, min_interval_s=0.0) as ob:
        rid = ob.post("C1", msg("one"))
        await asyncio.sleep(0.5)
        ob.post("C1", msg("two"))
        await asyncio.sleep(1.0)
        with store._tx() as s:
            r = s.get(OutboxRow, rid)
            nxt = r.next_at - time.time()
    assert nxt < 3600, f"head row parked for {nxt:.0f} s; channel blocked"


async def test_wait_on_a_superseded_update_returns_at_once(fake, store):
    async with outbox_on(store, fake, min_interval_s=5.0) as ob:
        rid = ob.post("C1", msg("root"))
        d = await ob.wait(rid, 5)
        ob.post("C1", msg("blocker"))  # makes the channel busy for 5 s
        u1 = ob.update("C1", d.ts, msg("v1"))
        t0 = time.monotonic()
        w = asyncio.ensure_future(ob.wait(u1, 3))
        await asyncio.sleep(0.1)
        ob.update("C1", d.ts, msg("v2"))
        d1 = await w
        took = time.monotonic() - t0
    assert took < 1.0, f"wait() on a superseded update returned after {took:.1f} s (state {d1.state})"


async def test_a_database_error_after_a_post_keeps_it_sent_and_its_thread(fake, store):
    """chat.postMessage succeeds, the 'sent' write hits a transient DB error: the row becomes 'failed',
    on_posted never runs, and the replies queued for its thread are posted at channel level."""
    orig = store._tx
    armed = [True]
    hooked = []

    def tx():
        caller = inspect.stack()[1].function
        if armed[0] and caller == "_finish":
            armed[0] = False
            raise OperationalError("UPDATE", {}, Exception("database is locked"))
        return orig()
    store._tx = tx
    async with outbox_on(store, fake, min_interval_s=0.0, on_posted=lambda a, b: hooked.append((a, b))) as ob:
        root = ob.post("C1", msg("root"))
        reply = ob.post("C1", msg("reply"), thread_ts=f"q:{root}")
        await ob.wait(reply, 5)
        d = ob.delivery(root)
    roots = [m for m in fake.messages if m["text"] == "root"]
    replies = [m for m in fake.messages if m["text"] == "reply"]
    assert not armed[0], "injection did not fire"
    assert d.state == "sent" and replies and replies[0]["thread_ts"] == roots[0]["ts"]
    assert hooked[0] == (f"q:{root}", roots[0]["ts"])  # the launch thread hook ran for the root


async def test_blocks_slack_refuses_are_replaced_by_the_text(fake, store):
    fake.set_error("chat.postMessage", "invalid_blocks", times=1)
    async with outbox_on(store, fake, min_interval_s=0.0) as ob:
        d = await ob.wait(ob.post("C1", msg("still readable")), 10)
    assert d.state == "sent"
    first, second = posts(fake)
    assert first["params"].get("blocks") and not second["params"].get("blocks")
    assert second["params"]["text"] == "still readable"


async def test_an_edit_whose_blocks_are_refused_clears_the_old_blocks(fake, store):
    async with outbox_on(store, fake, min_interval_s=0.0) as ob:
        d = await ob.wait(ob.post("C1", msg("with buttons")), 10)
        fake.set_error("chat.update", "invalid_blocks", times=1)
        await ob.wait(ob.update("C1", d.ts, msg("decided")), 10)
    first, second = fake.calls_for("chat.update")
    assert first["params"]["blocks"] and second["params"]["blocks"] == []  # no stale [Kill] [Cancel] left
    assert second["params"]["text"] == "decided"
