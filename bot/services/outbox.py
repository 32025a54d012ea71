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
  carries its row's unique key (Slack: message metadata); before a post is retried after an answer that
  may have come after Slack stored it (5xx, timeout, dropped connection) or after a restart that found it
  `sending`, the sender asks the transport for a message with that key in the channel or thread and only
  posts when there is none.
* A message that starts a thread is referenced before it is sent as `q:<row id>` (`ref`); rows whose
  `thread_ts` or update target is such a reference are sent with the real ts once it is known, and
  `on_posted(ref, ts)` lets the store replace the reference (a launch's incident thread).
* `chat.update` is throttled: a newer update of a message supersedes one still queued.
* A post still only queued can be changed instead of followed by an edit or a deletion (`replace_queued_post`,
  `withdraw_queued_post`): a placeholder whose answer is ready before its turn goes as the answer, one call
  instead of two. Only a row that is pending and that no attempt may have reached Slack with is changed, in
  one conditional write, so the sender either sends the new text or had already claimed the row (the caller
  then edits or deletes it as usual). A message sent straight to Slack (below) is never changed.

The Slack calls are a `Transport` (bot.slack.transport.SlackTransport in production; a fake in tests): it
makes one call per row and sorts its failures into `DeliveryRetry` and `DeliveryFailed`. The rows are the
store's `OutboxRepository`.

A command's answer: rows queued inside `answering(command_id, owner)` carry the command's id (`command_id`) and
are written only while `owner` (this bot) still holds the command, which becomes `answered` in the same transaction
(bot.adapters.store.commands): a bot another bot took over (taken for gone while frozen) queues nothing of its
answer (TakenOver is raised, never turned into a direct send), so the command journal's answer
(bot.services.journal) is the only one.

Limits: an upload interrupted by a crash between Slack's last upload call and the database write is
sent again (files carry no metadata to look up). Rows are kept `retention_s` after they are sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from bot.adapters.store.commands import TakenOver
from bot.adapters.store.outbox import DONE_STATES, OutboxRepository
from bot.core.clock import SYSTEM_CLOCK, Clock
from bot.core.records import OutboxItem
from bot.present.render import Message, redact_blocks

log = logging.getLogger(__name__)

#: The command (table `commands`: its id and owner) whose answer is being queued in this task (see `answering`).
_ANSWERING: contextvars.ContextVar[tuple[int, str] | None] = contextvars.ContextVar("gpubot_answering",
                                                                                    default=None)


@contextlib.contextmanager
def answering(command_id: int | None, owner: str) -> Iterator[None]:
    """Within this block (in this task), every row the outbox queues or changes is part of command `command_id`'s
    answer, written only while `owner` holds it (TakenOver otherwise). `command_id` None: no command."""
    token = _ANSWERING.set((command_id, owner) if command_id is not None else None)
    try:
        yield
    finally:
        _ANSWERING.reset(token)


#: Prefix of a reference to a not-yet-sent outbox post: `q:<row id>`.
REF_PREFIX = "q:"
#: Seconds between retries while the database is unavailable.
DB_RETRY_S = 1.0
#: Tries of a message sent straight to Slack (its row could not be written) before it is given up.
DIRECT_TRIES = 6
#: Tries (over about RECORD_TRIES**2 / 10 seconds) to record a row's result before giving up.
RECORD_TRIES = 8
#: Longest Retry-After honoured (seconds); Slack's are far shorter, a larger one is a bug or an attack.
MAX_RETRY_AFTER_S = 300.0
#: Seconds between purges of rows done longer than `retention_s` ago.
PURGE_EVERY_S = 3600.0
#: On a shared database, a row another bot claimed this many seconds ago and still shows `sending` was abandoned
#: (its bot died or lost the database): it is sent again, after a lookup for posts. Longer than a Slack call may
#: take (the Web API client's 30 s timeout), so a row a live bot is still sending is never sent twice.
STALE_CLAIM_S = 35.0
#: Seconds between two looks for abandoned rows on a shared database.
STALE_CHECK_S = 5.0
#: The metadata lookup starts this many seconds before the row was written (clock differences).
LOOKUP_SKEW_S = 300.0
#: Seconds between looks for rows another bot queued (a shared database; only the leader sends) and between a
#: follower's looks at a row it waits for.
SHARED_POLL_S = 0.2


#: The first bytes of the binary attachments, never redacted as text: a PNG (a chart) and a gzip file (a bundle's
#: tar.gz, whose files were redacted before they were packed).
_BINARY_SIGNATURES = (b"\x89PNG\r\n\x1a\n", b"\x1f\x8b")


def ref(row_id: int) -> str:
    """The stand-in ts of outbox post `row_id` until it is sent: `q:<row_id>`."""
    return f"{REF_PREFIX}{row_id}"


def ref_id(ts: str | None) -> int | None:
    """The outbox row id of a `q:<id>` reference (negative: a message sent straight to Slack, see
    `Outbox.post`); None for a real Slack ts (or None)."""
    if not ts or not ts.startswith(REF_PREFIX):
        return None
    digits = ts[len(REF_PREFIX):]
    digits = digits[1:] if digits.startswith("-") else digits
    if digits.isascii() and digits.isdigit() and len(digits) <= 18:
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
        return self.state in DONE_STATES


class DeliveryRetry(Exception):
    """A transport call failed in a way worth retrying: after `delay_s` seconds (None: the outbox's backoff),
    looking first for a stored copy when `ambiguous` (the message may have been stored before the failure)."""

    def __init__(self, error: str, delay_s: float | None = None, *, ambiguous: bool = True):
        super().__init__(error)
        self.error, self.delay_s, self.ambiguous = error, delay_s, ambiguous


class DeliveryFailed(Exception):
    """A transport call failed for good; str() is the error code (e.g. `channel_not_found`).
    `blocks_refused` says the blocks themselves were refused: the text alone may still go."""

    def __init__(self, error: str, *, blocks_refused: bool = False):
        super().__init__(error)
        self.blocks_refused = blocks_refused


class Transport(Protocol):
    """One chat API call per outbox row. Failures raise DeliveryRetry or DeliveryFailed, nothing else."""

    async def post(self, *, channel: str, text: str, blocks: list | None, thread_ts: str | None,
                   key: str) -> str:
        """Post a message carrying `key` (looked up by `find_posted`); returns its ts."""
        ...

    async def update(self, *, channel: str, ts: str, text: str, blocks: list | None) -> None:
        """Replace message `ts` (blocks None: the old blocks are cleared)."""
        ...

    async def upload(self, *, channel: str, thread_ts: str | None, filename: str, content: bytes,
                     title: str) -> None:
        """Attach a file in the channel or thread."""
        ...

    async def find_posted(self, *, channel: str, thread_ts: str | None, key: str, oldest: float) -> str | None:
        """The ts of a message carrying `key` posted since `oldest` (epoch s), or None (also when the
        transport cannot look); raises DeliveryRetry when looking failed for now."""
        ...

    async def post_ephemeral(self, *, channel: str, user: str, text: str, blocks: list | None,
                             thread_ts: str | None) -> None:
        """Show a message to `user` alone in the channel or thread (it cannot be edited later)."""
        ...

    async def delete(self, *, channel: str, ts: str) -> None:
        """Delete the bot's message `ts`."""
        ...


class Outbox:
    """The persisted queue and its sender (see the module docstring).

    `transport` makes the calls (it must not retry on its own: the outbox retries). `on_posted(ref, ts)` is
    called after a post is sent. `redactor` (bot.core.redact.Redactor) is the last gate before Slack and the
    database: every text, every string in the blocks and every text attachment (not a PNG or gzip) is redacted once
    more when it is queued, so nothing reaches a channel or the `outbox` table unredacted, whichever code
    built the message.

    A row that cannot be written (disk full, a lock held past the busy timeout, a corrupted database) is not
    lost: the message goes straight to Slack (in order with the other direct ones of its channel, retried as
    Slack asks, DIRECT_TRIES times), the failure is logged, and its negative id works with `delivery`, `wait`
    and `ref` like a row's. Neither database nor transport errors propagate from the enqueue methods.
    """

    def __init__(self, rows: OutboxRepository, transport: Transport, *, min_interval_s: float = 1.0,
                 backoff_base_s: float = 1.0, backoff_max_s: float = 30.0, give_up_after_s: float = 24 * 3600,
                 retention_s: float = 7 * 24 * 3600, on_posted: Callable[[str, str], Any] | None = None,
                 redactor: Callable[[str], str] | None = None, clock: Clock = SYSTEM_CLOCK):
        self.rows = rows
        self._clock = clock  # the bot's one clock: the rows' times, pacing, retries, give-up and purge
        self._redact = redactor
        self.transport = transport
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
        # messages whose row could not be written, sent straight to Slack: negative ids, kept in memory
        self._direct: dict[int, Delivery] = {}
        self._direct_tail: dict[str, asyncio.Task] = {}
        self._direct_seq = 0
        #: True when other bots share the database (PostgreSQL): rows they queue are looked for every
        #: SHARED_POLL_S, the pacing starts from what was sent last, and `wait` reads the row's state
        self.shared = False

    # -- enqueue ------------------------------------------------------------------------------------
    def _add(self, **fields: Any) -> int:
        if self._redact is not None:
            fields = self._redacted(fields)
        try:
            row_id = self.rows.add(answer_of=_ANSWERING.get(), **fields)
        except TakenOver:
            raise
        except Exception as e:  # disk full, locked past the busy timeout, corrupted: the answer goes anyway
            return self._add_direct(fields, e)
        self._kick()
        return row_id

    def _add_direct(self, fields: dict[str, Any], error: Exception) -> int:
        """Send a message whose row could not be written straight to Slack, after the earlier direct ones of its
        channel (in order); returns its negative id (`delivery`, `wait` and `ref` work with it)."""
        # unique across runs too (a `q:` reference may be stored, e.g. as a launch's thread): -(ms * 1000 + n)
        self._direct_seq = (self._direct_seq + 1) % 1000
        row_id = -(int(time.time() * 1000) * 1000 + self._direct_seq)
        while row_id in self._direct:
            row_id -= 1
        channel = fields.get("channel") or ""
        log.error("outbox: cannot queue a %s to %s in the database (%s); sending it straight to Slack",
                  fields.get("kind"), channel, error)
        self._direct[row_id] = Delivery(row_id, "sending")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            log.error("outbox: no event loop to send the %s to %s: it is lost", fields.get("kind"), channel)
            self._direct[row_id] = Delivery(row_id, "failed", error=f"not queued: {error}"[:500])
            return row_id
        row = OutboxItem(id=row_id, key=secrets.token_hex(12), created_at=self._clock.time(), **fields)
        task = loop.create_task(self._send_direct(row, self._direct_tail.get(channel)))
        self._direct_tail[channel] = task
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return row_id

    async def _send_direct(self, row: OutboxItem, before: asyncio.Task | None) -> None:
        """One direct send (see `_add_direct`), paced like the queue (`min_interval_s` per channel): retries what
        Slack asks to retry, DIRECT_TRIES times at most."""
        if before is not None:
            try:
                await asyncio.shield(before)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():  # this send itself is cancelled (stop): so be it
                    raise
            except Exception as e:  # the one before failed: this one goes anyway
                log.debug("outbox: the direct send before row %s failed: %s", row.id, e)
        row_id, delivery, channel = row.id, self._direct[row.id], row.channel
        for attempt in range(1, DIRECT_TRIES + 1):
            delivery.attempts = attempt
            # paced like the queue: at least min_interval_s after the channel's last message
            await asyncio.sleep(max(0.0, self._last_sent.get(channel, 0.0) + self.min_interval_s - self._clock.time()))
            self._last_sent[channel] = self._clock.time()
            try:
                values = await self._deliver(row)
            except DeliveryRetry as r:
                delivery.error = r.error[:500]
                row.needs_lookup = 1 if r.ambiguous and row.kind == "post" else 0
                delay = r.delay_s if r.delay_s is not None else self.backoff_base_s * 2 ** (attempt - 1)
                await asyncio.sleep(min(max(0.0, delay), self.backoff_max_s))
                continue
            except DeliveryFailed as p:
                delivery.state, delivery.error = "failed", str(p)[:500]
                log.warning("outbox: the direct %s to %s failed for good: %s", row.kind, row.channel, p)
                break
            except Exception as e:  # a database read inside (a thread's ts): post at channel level next time
                delivery.error = type(e).__name__
                log.exception("outbox: direct %s to %s", row.kind, row.channel)
                row.thread_ts = None if ref_id(row.thread_ts) is not None else row.thread_ts
                continue
            delivery.state, delivery.ts, delivery.error = "sent", values.get("result_ts"), None
            if row.kind == "post" and self.on_posted is not None:
                with contextlib.suppress(Exception):
                    self.on_posted(ref(row_id), values["result_ts"])
            break
        else:
            delivery.state = "failed"
            log.error("outbox: gave up on the direct %s to %s: %s", row.kind, row.channel, delivery.error)
        self._wake_waiters(row_id)

    def _redacted(self, fields: dict[str, Any]) -> dict[str, Any]:
        """`fields` of a new row with its text, the strings of its blocks and a text file's content redacted."""
        assert self._redact is not None
        out = dict(fields)
        if out.get("text"):
            out["text"] = self._redact(out["text"])
        if out.get("blocks_json"):
            out["blocks_json"] = json.dumps(redact_blocks(json.loads(out["blocks_json"]), self._redact))
        content = out.get("content")
        if content and not content.startswith(_BINARY_SIGNATURES):
            out["content"] = self._redact(content.decode("utf-8", "replace")).encode("utf-8")
        return out

    def post(self, channel: str, message: Message, *, thread_ts: str | None = None) -> int:
        """Queue `message` for posting in `channel` (in `thread_ts`, a ts or a `q:` reference); its files are
        queued as uploads into the same thread (the message's own thread when it starts one). Returns the row
        id (`ref(id)` stands for its ts until it is sent)."""
        row_id = self._add(channel=channel, kind="post", thread_ts=thread_ts, text=message.text,
                           blocks_json=json.dumps(message.blocks) if message.blocks is not None else None)
        for name, data in message.files:
            self.upload(channel, name, data, thread_ts=thread_ts or ref(row_id))
        return row_id

    def ephemeral(self, channel: str, user: str, message: Message, *, thread_ts: str | None = None) -> int:
        """Queue `message` for `user` alone (chat.postEphemeral) in `channel` / `thread_ts`; its files are not
        sent (an ephemeral message has no thread of its own). Returns the row id."""
        return self._add(channel=channel, kind="ephemeral", thread_ts=thread_ts, text=message.text, user_id=user,
                         blocks_json=json.dumps(message.blocks) if message.blocks is not None else None)

    def delete(self, channel: str, ts: str) -> int:
        """Queue the deletion of the bot's message `ts` (a ts or `q:` reference). Returns the row id."""
        return self._add(channel=channel, kind="delete", target_ts=ts)

    def update(self, channel: str, ts: str, message: Message) -> int:
        """Queue an edit of message `ts` (a ts or `q:` reference); an older queued edit of the same message is
        superseded. Files of `message` go as uploads into the message's thread. Returns the row id."""
        try:
            superseded = self.rows.supersede_updates(channel, ts)
        except Exception as e:  # the database refuses: both edits go, the newer one last
            log.warning("outbox: cannot supersede the queued edits of %s: %s", ts, e)
            superseded = []
        for old_id in superseded:
            self._wake_waiters(old_id)
        row_id = self._add(channel=channel, kind="update", target_ts=ts, text=message.text,
                           blocks_json=json.dumps(message.blocks) if message.blocks is not None else None)
        for name, data in message.files:
            self.upload(channel, name, data, thread_ts=ts)
        return row_id

    def replace_queued_post(self, row_id: int, channel: str, message: Message) -> bool:
        """Put `message` in place of post `row_id` of `channel` while that post is still only queued (pending, and no
        attempt of it may have reached Slack): the row keeps its id and place in the queue, so `ref(row_id)` and
        thread_ts values pointing at it stay valid, and it is sent carrying `message` (redacted like any row).
        The files of `message` are queued as uploads into the post's thread (its own when it starts one).
        Returns False, changing nothing, when the row is claimed by the sender, done, was sent straight to Slack
        (a negative id), or the database refuses: edit the post instead."""
        fields: dict[str, Any] = {"text": message.text,
                                  "blocks_json": json.dumps(message.blocks) if message.blocks is not None else None}
        row = self._change_queued_post(row_id, channel, self._redacted(fields) if self._redact else fields)
        if row is None:
            return False
        for name, data in message.files:
            self.upload(channel, name, data, thread_ts=row.thread_ts or ref(row_id))
        return True

    def withdraw_queued_post(self, row_id: int, channel: str) -> bool:
        """Drop post `row_id` of `channel` while it is still only queued (see `replace_queued_post`): it is never
        sent, its state becomes `superseded`, and whoever waits for it is woken. Returns False, changing nothing,
        when that is too late or the database refuses: delete the post instead."""
        if self._change_queued_post(row_id, channel, {"state": "superseded"}) is None:
            return False
        self._wake_waiters(row_id)
        return True

    def _change_queued_post(self, row_id: int, channel: str, values: dict[str, Any]) -> OutboxItem | None:
        """`rows.change_queued_post` for a row of the database; None for a direct send or a refusing database."""
        if row_id < 0:  # sent straight to Slack: already on its way, there is no queued row to change
            return None
        try:
            return self.rows.change_queued_post(row_id, channel, answer_of=_ANSWERING.get(), **values)
        except TakenOver:
            raise
        except Exception as e:
            log.warning("outbox: cannot change queued post %s (%s); it goes as it is", row_id, e)
            return None

    def upload(self, channel: str, filename: str, content: bytes, *, thread_ts: str | None = None,
               title: str | None = None) -> int:
        """Queue an upload of `content` (bytes) as `filename` into `thread_ts`. Returns the row id."""
        return self._add(channel=channel, kind="upload", thread_ts=thread_ts, filename=filename, content=content,
                         text=title or filename)

    # -- queries ------------------------------------------------------------------------------------
    def delivery(self, row_id: int) -> Delivery | None:
        """The current Delivery of row `row_id`, or None when there is no such row."""
        if row_id < 0:
            return self._direct.get(row_id)
        row = self.rows.get(row_id)
        if row is None:
            return None
        return Delivery(row.id, row.state, row.result_ts, row.error, row.attempts or 0)

    def resolve(self, ts: str | None) -> str | None:
        """A real Slack ts for `ts`: itself when it is one, the sent ts for a `q:` reference, or None
        while that post is unsent (or failed)."""
        rid = ref_id(ts)
        if rid is None:
            return ts
        d = self.delivery(rid)
        return d.ts if d is not None and d.state == "sent" else None

    def pending(self, channel: str | None = None) -> int:
        """How many rows are still to send (pending or sending), in `channel` or everywhere; messages sent
        straight to Slack (their row could not be written) count while they are on their way."""
        direct = sum(1 for d in self._direct.values() if not d.done)
        try:
            return self.rows.pending_count(channel) + direct
        except Exception:  # the database cannot be read: only what is in memory is known
            return direct

    async def wait(self, row_id: int, timeout_s: float) -> Delivery:
        """Wait up to `timeout_s` seconds for row `row_id` to be sent (or to fail). Returns its Delivery
        (state `pending`/`sending` when the time ran out). Raises KeyError for an unknown row."""
        d = self.delivery(row_id)
        if d is None:
            raise KeyError(row_id)
        if d.done or timeout_s <= 0:
            return d
        if self.shared and not self.sending:  # another bot sends it: its state is in the database alone
            deadline = time.monotonic() + timeout_s
            while not d.done and time.monotonic() < deadline:
                await asyncio.sleep(SHARED_POLL_S)
                d = self.delivery(row_id) or d
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

    def hold(self) -> None:
        """Queue without sending until `start` (a follower: the leader of the shared database sends its rows)."""
        self._stopped = True

    @property
    def sending(self) -> bool:
        """True while this bot's sender runs."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the sender task on the running loop (idempotent). Rows left `sending` by a crash are
        checked first. Raises RuntimeError outside an event loop."""
        if self._task is not None and not self._task.done():
            return
        self._stopping = self._stopped = False
        if self.shared:  # the channels' pacing goes on from the last sends, whichever bot made them
            try:
                now = self._clock.time()
                for channel, at in self.rows.last_sent_at(now - 60.0, now).items():
                    self._last_sent[channel] = max(self._last_sent.get(channel, 0.0), at)
            except Exception as e:
                log.warning("outbox: cannot read the last sends (%s); pacing starts afresh", e)
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
        next_purge = next_stale = 0.0
        while not self._stopping:
            self._wake.clear()
            try:
                if time.monotonic() >= next_purge:
                    self._recover(first=next_purge == 0.0)
                    next_purge = time.monotonic() + PURGE_EVERY_S
                if self.shared and time.monotonic() >= next_stale:
                    self.rows.requeue_interrupted(claimed_before=self._clock.time() - STALE_CLAIM_S)
                    next_stale = time.monotonic() + STALE_CHECK_S
                delay = self._dispatch_due()
            except asyncio.CancelledError:
                raise
            except Exception:  # the database is unavailable for now: keep the rows, try again soon
                log.exception("outbox: cannot read the queue; retrying in %.0f s", DB_RETRY_S)
                delay = DB_RETRY_S
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=min(delay, SHARED_POLL_S if self.shared else 5.0))

    def _recover(self, *, first: bool) -> None:
        """At start, rows found `sending` were interrupted by a crash: they are sent again, after a lookup
        for posts (on a shared database only the abandoned ones: see STALE_CLAIM_S). Every PURGE_EVERY_S: rows done
        longer than `retention_s` ago are deleted."""
        if first and not self.shared:
            self.rows.requeue_interrupted()
        self.rows.purge(self._clock.time() - self.retention_s)

    def _dispatch_due(self) -> float:
        """Start a send for each channel whose head row is due. Returns seconds until the next due row."""
        now = self._clock.time()
        heads: dict[str, tuple[int, str, float]] = {}
        for row in self.rows.pending():
            heads.setdefault(row[1], row)
        next_delay = 60.0
        start: list[tuple[int, str]] = []
        for channel, (row_id, _channel, next_at) in heads.items():
            if channel in self._busy:
                continue
            due = max(next_at, self._last_sent.get(channel, 0.0) + self.min_interval_s)
            if due > now:
                next_delay = min(next_delay, due - now)
                continue
            start.append((row_id, channel))
        for row_id, channel in start:
            self._busy.add(channel)
            task = asyncio.get_running_loop().create_task(self._send(row_id, channel))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
        return max(0.01, next_delay)

    def _finish(self, row_id: int, **values: Any) -> None:
        """Write `values` to row `row_id` and wake whoever waits for it once it is done. Raises the
        database's error (callers use `_record`, which retries)."""
        # on a shared database the row may have been taken back as abandoned meanwhile: then its new sender writes
        if not self.rows.set(row_id, only_if="sending" if self.shared else None, **values):
            log.warning("outbox: row %s was taken over by another bot while this one sent it", row_id)
            return
        if values.get("state") in DONE_STATES:
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
        called = True  # the channel's pacing counts from now, unless no call was made at all
        try:
            try:
                snapshot = self.rows.claim(row_id)
                if snapshot is None:  # changed since it was picked (superseded, withdrawn): nothing was sent
                    called = False
                    return
            except Exception:  # database unavailable: the row stays pending, the channel waits a little
                log.exception("outbox: cannot claim row %s; retrying in %.0f s", row_id, DB_RETRY_S)
                self._last_sent[channel] = self._clock.time() + DB_RETRY_S
                return
            try:
                values = await self._deliver(snapshot)
            except DeliveryRetry as r:
                await self._record(row_id, **self._retry_values(snapshot, r))
            except DeliveryFailed as p:
                log.warning("outbox: %s to %s failed for good: %s", snapshot.kind, channel, p)
                await self._record(row_id, state="failed", error=str(p)[:500])
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    self._finish(row_id, state="pending", error="interrupted", needs_lookup=1)
                raise
            except Exception as e:  # the database failed mid-send: send again later, looking first
                log.exception("outbox: row %s: %s; retrying in %.0f s", row_id, type(e).__name__, DB_RETRY_S)
                await self._record(row_id, state="pending", error=f"{type(e).__name__}"[:500], needs_lookup=1,
                                   next_at=self._clock.time() + DB_RETRY_S)
            else:
                await self._record(row_id, state="sent", sent_at=self._clock.time(), error=None, needs_lookup=0,
                                   **values)
                if snapshot.kind == "post" and self.on_posted is not None:
                    try:
                        self.on_posted(ref(row_id), values["result_ts"])
                    except Exception:
                        log.exception("outbox: on_posted hook failed for row %s", row_id)
        finally:
            self._busy.discard(channel)
            if called:
                self._last_sent[channel] = max(self._last_sent.get(channel, 0.0), self._clock.time())
            self._wake.set()

    def _retry_values(self, row: OutboxItem, r: DeliveryRetry) -> dict[str, Any]:
        """The row's new values after a retryable failure: pending again after the delay (Retry-After,
        capped at MAX_RETRY_AFTER_S, or backoff), or failed once `give_up_after_s` has passed."""
        now = self._clock.time()
        needs_lookup = 1 if (r.ambiguous or row.needs_lookup) else 0
        if r.delay_s is not None:
            delay = min(max(0.0, r.delay_s), MAX_RETRY_AFTER_S)
        else:
            delay = min(self.backoff_max_s, self.backoff_base_s * 2 ** max(0, row.attempts - 1))
        if now + delay - (row.created_at or now) > self.give_up_after_s:
            log.error("outbox: giving up on %s to %s after %d attempts: %s", row.kind, row.channel,
                      row.attempts, r.error)
            return {"state": "failed", "error": f"gave up: {r.error}"[:500]}
        log.info("outbox: %s to %s: %s; retry in %.1f s", row.kind, row.channel, r.error, delay)
        return {"state": "pending", "error": r.error[:500], "next_at": now + delay, "needs_lookup": needs_lookup}

    # -- one transport call per row -----------------------------------------------------------------
    def _target(self, ts: str | None) -> tuple[str | None, bool]:
        """(real ts or None, ok): ok is False when `ts` is a reference to a post that failed or was withdrawn."""
        rid = ref_id(ts)
        if rid is None:
            return ts, True
        d = self.delivery(rid)
        if d is not None and d.state == "sent":
            return d.ts, True
        if d is None or d.done:  # failed, or a post withdrawn before it was sent
            return None, False
        raise DeliveryRetry(f"waiting for message {rid}", 0.2, ambiguous=False)

    async def _deliver(self, row: OutboxItem) -> dict[str, Any]:
        """Make the transport call(s) for `row`. Returns the values to record (`result_ts`, ...). Raises
        DeliveryRetry or DeliveryFailed for the transport's failures; a database error propagates."""
        kind = row.kind
        blocks = _blocks(row)
        text = row.text or ""
        if kind == "post":
            thread_ts, ok = self._target(row.thread_ts)
            if not ok:
                log.warning("outbox: the thread of row %s was never posted; posting at channel level", row.id)
            if row.needs_lookup:
                found = await self.transport.find_posted(
                    channel=row.channel, thread_ts=thread_ts, key=row.key,
                    oldest=max(0.0, (row.created_at or 0) - LOOKUP_SKEW_S))
                if found:
                    return {"result_ts": found}
            ts = await self._text_if_blocks_refused(blocks, lambda b: self.transport.post(
                channel=row.channel, text=text, blocks=b, thread_ts=thread_ts, key=row.key))
            return {"result_ts": str(ts)}
        if kind == "update":
            target, ok = self._target(row.target_ts)
            if not ok or target is None:
                raise DeliveryFailed("the message to edit was never posted")
            await self._text_if_blocks_refused(blocks, lambda b: self.transport.update(
                channel=row.channel, ts=target, text=text, blocks=b))
            return {"result_ts": target}
        if kind == "ephemeral":
            thread_ts, _ok = self._target(row.thread_ts)
            await self._text_if_blocks_refused(blocks, lambda b: self.transport.post_ephemeral(
                channel=row.channel, user=row.user_id or "", text=text, blocks=b, thread_ts=thread_ts))
            return {}
        if kind == "delete":
            target, ok = self._target(row.target_ts)
            if not ok or target is None:
                raise DeliveryFailed("the message to delete was never posted")
            await self.transport.delete(channel=row.channel, ts=target)
            return {"result_ts": target}
        if kind == "upload":
            thread_ts, _ok = self._target(row.thread_ts)
            await self.transport.upload(channel=row.channel, thread_ts=thread_ts,
                                        filename=row.filename or "file", content=row.content or b"",
                                        title=row.text or row.filename or "file")
            return {"content": None}
        raise DeliveryFailed(f"unknown outbox row kind {kind!r}")

    @staticmethod
    async def _text_if_blocks_refused(blocks: list | None, make_call: Callable[[list | None], Any]) -> Any:
        """Send with `blocks`; if the transport refuses the blocks themselves, send the text alone rather than
        lose the message."""
        try:
            return await make_call(blocks)
        except DeliveryFailed as p:
            if blocks is None or not p.blocks_refused:
                raise
            log.warning("outbox: the blocks were refused (%s); sending the text alone", p)
            return await make_call(None)


def _blocks(row: OutboxItem) -> list[Any] | None:
    """The row's Block Kit blocks, or None (the text alone is sent) when it has none or they are damaged (not a
    JSON list): one odd row never stops its channel."""
    if not row.blocks_json:
        return None
    try:
        blocks = json.loads(row.blocks_json)
    except (ValueError, TypeError, RecursionError):
        blocks = None
    if not isinstance(blocks, list):
        log.warning("outbox: row %s has damaged blocks; sending its text alone", row.id)
        return None
    return blocks
