"""The outbox: every message to Slack is written to the database first, then sent by one sender.

Why: Slack rate-limits posting (about one message per second per channel), answers 429/5xx at times
and is sometimes down for minutes; the bot restarts. The outbox makes delivery survive all of that:

* `post` / `update` / `upload` only write a row (table `outbox`, see `bot.adapters.store.OutboxRow`) and wake
  the sender; they never wait on Slack.
* One sender task sends rows strictly in id order within each channel (so in order within each
  thread), at least `min_interval_s` apart per channel, one call in flight per channel.
* 429: the row waits the `Retry-After` seconds Slack gave. 5xx, connection errors and timeouts: the
  row waits with exponential backoff (`backoff_base_s` doubling up to `backoff_max_s`). Other Slack
  errors (`channel_not_found`, `not_in_channel`, `invalid_blocks`, ...) are permanent: the row is marked
  failed with the error and the next row goes.
* Exactly once: a row is marked `sending` before the call and `sent` (with the ts) after it. Every post
  carries message metadata `{"event_type": "gpubot_outbox", "event_payload": {"key": <row key>}}`;
  before a post is retried after an answer that may have come after Slack stored it (5xx, timeout,
  dropped connection) or after a restart that found it `sending`, the sender looks for that key in
  the channel or thread (conversations.history / conversations.replies with include_all_metadata) and
  only posts when it is not there.
* A message that starts a thread is referenced before it is sent as `q:<row id>` (`ref`); rows whose
  `thread_ts` or update target is such a reference are sent with the real ts once it is known, and
  `on_posted(ref, ts)` lets the store replace the reference (a launch's incident thread).
* `chat.update` is throttled: a newer update of a message supersedes one still queued.

Limits: an upload interrupted by a crash between Slack's last upload call and the database write is
sent again (files carry no metadata to look up). Rows are kept `retention_s` after they are sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy import delete, func, select, update

from bot.adapters.store import OutboxRow, Store
from bot.present.render import Message, mrkdwn_escape

log = logging.getLogger(__name__)

#: Prefix of a reference to a not-yet-sent outbox post: `q:<row id>`.
REF_PREFIX = "q:"
#: Message metadata event type that marks gpubot's posts (looked up to avoid posting twice).
METADATA_EVENT = "gpubot_outbox"
#: Slack API error codes that are worth retrying (the rest are permanent for that message).
RETRYABLE_ERRORS = frozenset({"ratelimited", "internal_error", "fatal_error", "service_unavailable",
                              "request_timeout"})
#: Slack errors about the blocks themselves: the message goes again as text alone.
BLOCK_ERRORS = frozenset({"invalid_blocks", "invalid_blocks_format", "msg_blocks_too_long"})
#: Seconds between retries while the database is unavailable.
DB_RETRY_S = 1.0
#: Tries (over about RECORD_TRIES**2 / 10 seconds) to record a row's result before giving up.
RECORD_TRIES = 8
#: Longest Retry-After honoured (seconds); Slack's are far shorter, a larger one is a bug or an attack.
MAX_RETRY_AFTER_S = 300.0
#: Seconds between purges of rows done longer than `retention_s` ago.
PURGE_EVERY_S = 3600.0
#: The metadata lookup starts this many seconds before the row was written (clock differences).
LOOKUP_SKEW_S = 300.0
#: Errors of the metadata lookup that mean "cannot look": the post goes out without the check.
_LOOKUP_UNAVAILABLE = frozenset({"missing_scope", "not_allowed_token_type", "not_in_channel", "channel_not_found",
                                 "thread_not_found", "no_permission", "method_not_supported_for_channel_type"})


def ref(row_id: int) -> str:
    """The stand-in ts of outbox post `row_id` until it is sent: `q:<row_id>`."""
    return f"{REF_PREFIX}{row_id}"


def ref_id(ts: str | None) -> int | None:
    """The outbox row id of a `q:<id>` reference; None for a real Slack ts (or None)."""
    if ts and ts.startswith(REF_PREFIX) and ts[len(REF_PREFIX):].isascii() and ts[len(REF_PREFIX):].isdigit():
        return int(ts[len(REF_PREFIX):])
    return None


@dataclass
class Delivery:
    """Where an outbox row stands: `state` pending / sending / sent / failed / superseded, the Slack `ts`
    once a post is sent, the last `error` (a Slack error code or `HTTP 503`), and `attempts` made."""

    id: int
    state: str
    ts: str | None = None
    error: str | None = None
    attempts: int = 0

    @property
    def done(self) -> bool:
        """True when the row will not be sent again (sent, failed or superseded)."""
        return self.state in ("sent", "failed", "superseded")


class _Retry(Exception):
    """A send failed in a way worth retrying: after `delay_s`, checking for a stored copy if `ambiguous`."""

    def __init__(self, error: str, delay_s: float | None, ambiguous: bool):
        super().__init__(error)
        self.error, self.delay_s, self.ambiguous = error, delay_s, ambiguous


class _Permanent(Exception):
    """A send failed for good (the error code says why)."""


def classify(e: BaseException) -> _Retry | _Permanent:
    """Sort a failed Slack call: 429 -> retry after Retry-After (not ambiguous); 5xx, retryable API
    errors, timeouts and connection errors -> retry with backoff (ambiguous: Slack may have stored the
    message); any other API error -> permanent."""
    if isinstance(e, SlackApiError) and e.response is not None:
        status = getattr(e.response, "status_code", 0) or 0
        data = getattr(e.response, "data", None)
        code = data.get("error") if isinstance(data, dict) else None
        if status == 429 or code == "ratelimited":
            headers = getattr(e.response, "headers", None) or {}
            raw = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
            try:
                delay = max(0.0, float(raw if not isinstance(raw, list) else raw[0]))
            except (TypeError, ValueError):
                delay = None
            return _Retry(code or "HTTP 429", delay, ambiguous=False)
        if status >= 500:
            return _Retry(f"HTTP {status}", None, ambiguous=True)
        if code in RETRYABLE_ERRORS:
            return _Retry(str(code), None, ambiguous=True)
        return _Permanent(str(code or f"HTTP {status}"))
    if isinstance(e, (asyncio.TimeoutError, OSError, ConnectionError)) or type(e).__module__.startswith("aiohttp"):
        return _Retry(f"{type(e).__name__}", None, ambiguous=True)
    return _Permanent(f"{type(e).__name__}: {e}"[:200])


class Outbox:
    """The persisted queue and its sender (see the module docstring).

    `client` should have no retry handlers of its own (the outbox retries; `make_client(retries=False)`).
    `on_posted(ref, ts)` is called after a post is sent. Database errors propagate from the enqueue
    methods (a broken database is not hidden); Slack errors never do.
    """

    def __init__(self, store: Store, client: AsyncWebClient, *, min_interval_s: float = 1.0,
                 backoff_base_s: float = 1.0, backoff_max_s: float = 30.0, give_up_after_s: float = 24 * 3600,
                 retention_s: float = 7 * 24 * 3600, on_posted: Callable[[str, str], Any] | None = None):
        self.store = store
        self.client = client
        self.min_interval_s = min_interval_s
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.give_up_after_s = give_up_after_s
        self.retention_s = retention_s
        self.on_posted = on_posted
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._stopped = False
        self._busy: set[str] = set()
        self._last_sent: dict[str, float] = {}
        self._inflight: set[asyncio.Task] = set()
        self._done_waiters: dict[int, list[asyncio.Future]] = {}

    # -- enqueue ------------------------------------------------------------------------------------
    def _add(self, **fields: Any) -> int:
        with self.store._tx() as s:
            row = OutboxRow(key=secrets.token_hex(12), created_at=time.time(), next_at=0.0, **fields)
            s.add(row)
            s.flush()
            row_id = int(row.id)
        self._kick()
        return row_id

    def post(self, channel: str, message: Message, *, thread_ts: str | None = None) -> int:
        """Queue `message` for chat.postMessage in `channel` (in `thread_ts`, a ts or a `q:` reference);
        its files are queued as uploads into the same thread (the message's own thread when it starts
        one). Returns the row id (`ref(id)` stands for its ts until it is sent)."""
        row_id = self._add(channel=channel, kind="post", thread_ts=thread_ts, text=message.text,
                           blocks_json=json.dumps(message.blocks) if message.blocks is not None else None)
        for name, data in message.files:
            self.upload(channel, name, data, thread_ts=thread_ts or ref(row_id))
        return row_id

    def update(self, channel: str, ts: str, message: Message) -> int:
        """Queue chat.update of message `ts` (a ts or `q:` reference); an older queued update of the same
        message is superseded. Files of `message` go as uploads into the message's thread. Returns the id."""
        with self.store._tx() as s:
            old = s.scalars(select(OutboxRow.id).where(OutboxRow.channel == channel, OutboxRow.kind == "update",
                                                       OutboxRow.target_ts == ts, OutboxRow.state == "pending")).all()
            if old:
                s.execute(update(OutboxRow).where(OutboxRow.id.in_(old)).values(state="superseded"))
        for old_id in old:
            self._wake_waiters(old_id)
        row_id = self._add(channel=channel, kind="update", target_ts=ts, text=message.text,
                           blocks_json=json.dumps(message.blocks) if message.blocks is not None else None)
        for name, data in message.files:
            self.upload(channel, name, data, thread_ts=ts)
        return row_id

    def upload(self, channel: str, filename: str, content: bytes, *, thread_ts: str | None = None,
               title: str | None = None) -> int:
        """Queue files_upload_v2 of `content` (bytes) as `filename` into `thread_ts`. Returns the row id."""
        return self._add(channel=channel, kind="upload", thread_ts=thread_ts, filename=filename, content=content,
                         text=title or filename)

    # -- queries ------------------------------------------------------------------------------------
    def delivery(self, row_id: int) -> Delivery | None:
        """The current Delivery of row `row_id`, or None when there is no such row."""
        with self.store._tx() as s:
            row = s.get(OutboxRow, row_id)
            if row is None:
                return None
            return Delivery(row.id, row.state, row.result_ts, row.error, row.attempts)

    def resolve(self, ts: str | None) -> str | None:
        """A real Slack ts for `ts`: itself when it is one, the sent ts for a `q:` reference, or None
        while that post is unsent (or failed)."""
        rid = ref_id(ts)
        if rid is None:
            return ts
        d = self.delivery(rid)
        return d.ts if d is not None and d.state == "sent" else None

    def pending(self, channel: str | None = None) -> int:
        """How many rows are still to send (pending or sending), in `channel` or everywhere."""
        with self.store._tx() as s:
            q = select(func.count()).select_from(OutboxRow).where(OutboxRow.state.in_(("pending", "sending")))
            if channel is not None:
                q = q.where(OutboxRow.channel == channel)
            return int(s.scalar(q) or 0)

    async def wait(self, row_id: int, timeout_s: float) -> Delivery:
        """Wait up to `timeout_s` seconds for row `row_id` to be sent (or to fail). Returns its Delivery
        (state `pending`/`sending` when the time ran out). Raises KeyError for an unknown row."""
        d = self.delivery(row_id)
        if d is None:
            raise KeyError(row_id)
        if d.done or timeout_s <= 0:
            return d
        fut = asyncio.get_running_loop().create_future()
        self._done_waiters.setdefault(row_id, []).append(fut)
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        finally:
            waiters = self._done_waiters.get(row_id, [])
            if fut in waiters:
                waiters.remove(fut)
        return self.delivery(row_id) or d

    async def flush(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` seconds until nothing is left to send. Returns True when empty."""
        deadline = time.monotonic() + timeout_s
        while self.pending():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    # -- the sender ---------------------------------------------------------------------------------
    def _kick(self) -> None:
        self._wake.set()
        if self._stopped:  # shutting down: the row waits in the database for the next start
            return
        with contextlib.suppress(RuntimeError):  # no running loop: start() will pick the rows up
            self.start()

    def start(self) -> None:
        """Start the sender task on the running loop (idempotent). Rows left `sending` by a crash are
        checked first. Raises RuntimeError outside an event loop."""
        if self._task is not None and not self._task.done():
            return
        self._stopping = self._stopped = False
        self._task = asyncio.get_running_loop().create_task(self._run(), name="gpubot-outbox")

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the sender: the call in flight may finish within `timeout_s`; unsent rows stay queued in
        the database for the next start."""
        self._stopping = self._stopped = True
        self._wake.set()
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=timeout_s)
        for t in list(self._inflight):
            t.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._task = None

    async def _run(self) -> None:
        next_purge = 0.0
        while not self._stopping:
            self._wake.clear()
            try:
                if time.monotonic() >= next_purge:
                    self._recover(first=next_purge == 0.0)
                    next_purge = time.monotonic() + PURGE_EVERY_S
                delay = self._dispatch_due()
            except asyncio.CancelledError:
                raise
            except Exception:  # the database is unavailable for now: keep the rows, try again soon
                log.exception("outbox: cannot read the queue; retrying in %.0f s", DB_RETRY_S)
                delay = DB_RETRY_S
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=min(delay, 5.0))

    def _recover(self, *, first: bool) -> None:
        """At start, rows found `sending` were interrupted by a crash: they are sent again, after a lookup
        for posts. Every PURGE_EVERY_S: rows done longer than `retention_s` ago are deleted."""
        now = time.time()
        with self.store._tx() as s:
            if first:
                s.execute(update(OutboxRow).where(OutboxRow.state == "sending")
                          .values(state="pending", error="interrupted", next_at=0.0, needs_lookup=1))
            s.execute(delete(OutboxRow).where(OutboxRow.state.in_(("sent", "superseded", "failed")),
                                              OutboxRow.created_at < now - self.retention_s))

    def _dispatch_due(self) -> float:
        """Start a send for each channel whose head row is due. Returns seconds until the next due row."""
        now = time.time()
        with self.store._tx() as s:
            rows = s.execute(select(OutboxRow.id, OutboxRow.channel, OutboxRow.next_at)
                             .where(OutboxRow.state == "pending").order_by(OutboxRow.id)).all()
            heads: dict[str, Any] = {}
            for row in rows:
                heads.setdefault(row.channel, row)
            next_delay = 60.0
            start: list[tuple[int, str]] = []
            for channel, row in heads.items():
                if channel in self._busy:
                    continue
                due = max(row.next_at or 0.0, self._last_sent.get(channel, 0.0) + self.min_interval_s)
                if due > now:
                    next_delay = min(next_delay, due - now)
                    continue
                start.append((row.id, channel))
        for row_id, channel in start:
            self._busy.add(channel)
            task = asyncio.get_running_loop().create_task(self._send(row_id, channel))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
        return max(0.01, next_delay)

    def _finish(self, row_id: int, **values: Any) -> None:
        """Write `values` to row `row_id` and wake whoever waits for it once it is done. Raises the
        database's error (callers use `_record`, which retries)."""
        with self.store._tx() as s:
            s.execute(update(OutboxRow).where(OutboxRow.id == row_id).values(**values))
        if values.get("state") in ("sent", "failed", "superseded"):
            self._wake_waiters(row_id)

    def _wake_waiters(self, row_id: int) -> None:
        for fut in self._done_waiters.pop(row_id, []):
            if not fut.done():
                fut.set_result(None)

    async def _record(self, row_id: int, **values: Any) -> bool:
        """`_finish` with retries over a few seconds (a locked database). Returns False if it never
        succeeded: the row then stays `sending` and is looked up and resent (posts) after a restart."""
        for attempt in range(RECORD_TRIES):
            try:
                self._finish(row_id, **values)
                return True
            except Exception as e:
                if attempt == RECORD_TRIES - 1:
                    log.error("outbox: cannot record row %s as %s: %s", row_id, values.get("state"), e)
                    return False
                await asyncio.sleep(0.2 * (attempt + 1))
        return False

    async def _send(self, row_id: int, channel: str) -> None:
        try:
            try:
                with self.store._tx() as s:
                    row = s.get(OutboxRow, row_id)
                    if row is None or row.state != "pending":
                        return
                    row.state = "sending"
                    row.attempts = (row.attempts or 0) + 1
                    snapshot = {c.name: getattr(row, c.name) for c in OutboxRow.__table__.columns}
            except Exception:  # database unavailable: the row stays pending, the channel waits a little
                log.exception("outbox: cannot claim row %s; retrying in %.0f s", row_id, DB_RETRY_S)
                self._last_sent[channel] = time.time() + DB_RETRY_S
                return
            try:
                values = await self._deliver(snapshot)
            except _Retry as r:
                await self._record(row_id, **self._retry_values(snapshot, r))
            except _Permanent as p:
                log.warning("outbox: %s to %s failed for good: %s", snapshot["kind"], channel, p)
                await self._record(row_id, state="failed", error=str(p)[:500])
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    self._finish(row_id, state="pending", error="interrupted", needs_lookup=1)
                raise
            except Exception as e:  # the database failed mid-send: send again later, looking first
                log.exception("outbox: row %s: %s; retrying in %.0f s", row_id, type(e).__name__, DB_RETRY_S)
                await self._record(row_id, state="pending", error=f"{type(e).__name__}"[:500], needs_lookup=1,
                                   next_at=time.time() + DB_RETRY_S)
            else:
                await self._record(row_id, state="sent", sent_at=time.time(), error=None, needs_lookup=0, **values)
                if snapshot["kind"] == "post" and self.on_posted is not None:
                    try:
                        self.on_posted(ref(row_id), values["result_ts"])
                    except Exception:
                        log.exception("outbox: on_posted hook failed for row %s", row_id)
        finally:
            self._busy.discard(channel)
            self._last_sent[channel] = max(self._last_sent.get(channel, 0.0), time.time())
            self._wake.set()

    def _retry_values(self, row: dict[str, Any], r: _Retry) -> dict[str, Any]:
        """The row's new values after a retryable failure: pending again after the delay (Retry-After,
        capped at MAX_RETRY_AFTER_S, or backoff), or failed once `give_up_after_s` has passed."""
        now = time.time()
        needs_lookup = 1 if (r.ambiguous or row.get("needs_lookup")) else 0
        if r.delay_s is not None:
            delay = min(r.delay_s, MAX_RETRY_AFTER_S)
        else:
            delay = min(self.backoff_max_s, self.backoff_base_s * 2 ** max(0, row["attempts"] - 1))
        if now + delay - (row["created_at"] or now) > self.give_up_after_s:
            log.error("outbox: giving up on %s to %s after %d attempts: %s", row["kind"], row["channel"],
                      row["attempts"], r.error)
            return {"state": "failed", "error": f"gave up: {r.error}"[:500]}
        log.info("outbox: %s to %s: %s; retry in %.1f s", row["kind"], row["channel"], r.error, delay)
        return {"state": "pending", "error": r.error[:500], "next_at": now + delay, "needs_lookup": needs_lookup}

    # -- one Slack call per row ---------------------------------------------------------------------
    def _target(self, ts: str | None) -> tuple[str | None, bool]:
        """(real ts or None, ok): ok is False when `ts` is a reference to a post that failed."""
        rid = ref_id(ts)
        if rid is None:
            return ts, True
        d = self.delivery(rid)
        if d is not None and d.state == "sent":
            return d.ts, True
        if d is None or d.state == "failed":
            return None, False
        raise _Retry(f"waiting for message {rid}", 0.2, ambiguous=False)

    async def _deliver(self, row: dict[str, Any]) -> dict[str, Any]:
        """Make the Slack call(s) for `row`. Returns the values to record (`result_ts`, ...). Raises _Retry
        or _Permanent for Slack's failures; a database error propagates as it is."""
        kind = row["kind"]
        blocks = json.loads(row["blocks_json"]) if row["blocks_json"] else None
        text = mrkdwn_escape(row["text"] or "")[:40_000] or " "
        if kind == "post":
            thread_ts, ok = self._target(row["thread_ts"])
            if not ok:
                log.warning("outbox: the thread of row %s was never posted; posting at channel level", row["id"])
            if row.get("needs_lookup"):
                found = await self._find_posted(row, thread_ts)
                if found:
                    return {"result_ts": found}
            resp = await self._text_if_blocks_refused(blocks, lambda b: self.client.chat_postMessage(
                channel=row["channel"], text=text, blocks=b, thread_ts=thread_ts, unfurl_links=False,
                unfurl_media=False, metadata={"event_type": METADATA_EVENT, "event_payload": {"key": row["key"]}}))
            return {"result_ts": str(resp.get("ts"))}
        if kind == "update":
            target, ok = self._target(row["target_ts"])
            if not ok or target is None:
                raise _Permanent("the message to edit was never posted")
            await self._text_if_blocks_refused(blocks, lambda b: self.client.chat_update(
                channel=row["channel"], ts=target, text=text, blocks=b if b is not None else []))  # [] clears old
            return {"result_ts": target}
        if kind == "upload":
            thread_ts, _ok = self._target(row["thread_ts"])
            await self._slack(self.client.files_upload_v2(
                channel=row["channel"], thread_ts=thread_ts, filename=row["filename"] or "file",
                content=row["content"] or b"", title=row["text"] or row["filename"]))
            return {"content": None}
        raise _Permanent(f"unknown outbox row kind {kind!r}")

    async def _text_if_blocks_refused(self, blocks: list | None, make_call: Callable[[list | None], Any]) -> Any:
        """Send with `blocks`; if Slack refuses the blocks themselves (`invalid_blocks`, ...), send the
        text alone rather than lose the message."""
        try:
            return await self._slack(make_call(blocks))
        except _Permanent as p:
            if blocks is None or str(p) not in BLOCK_ERRORS:
                raise
            log.warning("outbox: Slack refused the blocks (%s); sending the text alone", p)
            return await self._slack(make_call(None))

    @staticmethod
    async def _slack(call: Any) -> Any:
        """Await one Slack Web API call; its failures become _Retry or _Permanent (see `classify`)."""
        try:
            return await call
        except asyncio.CancelledError:
            raise
        except Exception as e:
            raise classify(e) from e

    async def _find_posted(self, row: dict[str, Any], thread_ts: str | None) -> str | None:
        """The ts of a message already posted for `row` (found by its metadata key), or None. A lookup
        Slack refuses for good (missing scope, ...) returns None; a transient failure raises _Retry."""
        # from a while before the row was written (the bot's and Slack's clocks may differ), newest 1000
        args = {"channel": row["channel"], "oldest": f"{max(0.0, (row['created_at'] or 0) - LOOKUP_SKEW_S):.6f}",
                "include_all_metadata": True, "limit": 1000}
        try:
            if thread_ts:
                resp = await self.client.conversations_replies(ts=thread_ts, **args)
            else:
                resp = await self.client.conversations_history(**args)
        except Exception as e:
            c = classify(e)
            if isinstance(c, _Permanent):
                if str(c) not in _LOOKUP_UNAVAILABLE:
                    log.warning("outbox: cannot look for an earlier copy of row %s (%s); posting", row["id"], c)
                return None
            raise c from e
        for m in resp.get("messages") or []:
            meta = m.get("metadata") or {}
            if meta.get("event_type") == METADATA_EVENT and (meta.get("event_payload") or {}).get("key") == row["key"]:
                return str(m.get("ts"))
        return None
