"""Table `outbox`: every message to Slack, written before it is sent, and its repository.

The sending rules (order, pacing, retries, exactly once) are the outbox service's (bot.services.outbox);
this module only stores rows and moves them between states in single transactions.
"""

from __future__ import annotations

import math
import secrets
import time
from typing import Any

from sqlalchemy import Float, Integer, LargeBinary, String, Text, delete, func, select, update
from sqlalchemy.orm import Mapped, mapped_column

from bot.adapters.store.commands import claim_answer
from bot.adapters.store.db import Base, Database
from bot.core.clock import SYSTEM_CLOCK, Clock
from bot.core.records import OutboxItem

#: Row states: pending -> sending -> sent, or failed (a permanent error) or superseded (an edit replaced
#: by a newer edit of the same message, or a queued post withdrawn before it was sent).
DONE_STATES = ("sent", "failed", "superseded")


class OutboxRow(Base):
    """Table `outbox`. `kind` is post / update / upload. `thread_ts` and `target_ts` hold a Slack ts, or
    `q:<id>`: the ts of outbox row <id> once that row is sent. `key` is the unique metadata key a post
    carries (looked up before a retry). Times are epoch seconds."""

    __tablename__ = "outbox"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    channel: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    thread_ts: Mapped[str | None] = mapped_column(String(32), nullable=True)
    target_ts: Mapped[str | None] = mapped_column(String(32), nullable=True)
    text: Mapped[str] = mapped_column(Text, default="")
    blocks_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    filename: Mapped[str | None] = mapped_column(String(255), nullable=True)
    content: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    key: Mapped[str] = mapped_column(String(40), default="")
    state: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_at: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    sent_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    result_ts: Mapped[str | None] = mapped_column(String(32), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: 1 while an earlier attempt may have reached Slack (5xx, timeout, crash): look before posting again.
    needs_lookup: Mapped[int] = mapped_column(Integer, default=0)
    user_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    #: the command (table `commands`) whose answer this row carries, or None
    command_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)


def _number(value: Any, default: float = 0.0) -> float:
    """A numeric column's value as a finite float; `default` for what a damaged row holds instead (text, NaN)."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return default
    return f if math.isfinite(f) else default


def _count(value: Any) -> int:
    """An integer column's value (attempts, needs_lookup); 0 for what a damaged row holds instead."""
    return int(_number(value)) if not isinstance(value, bool) else int(value)


_NUMBERS = frozenset({"next_at", "created_at"})
_COUNTS = frozenset({"attempts", "needs_lookup"})


def _snapshot(row: OutboxRow) -> OutboxItem:
    """The row as an OutboxItem; a damaged value (text where a number belongs: SQLite stores what it is given)
    reads as 0, so one odd row cannot stop the queue."""
    values = {c.name: getattr(row, c.name) for c in OutboxRow.__table__.columns}
    for name in _NUMBERS:
        values[name] = _number(values[name])
    for name in _COUNTS:
        values[name] = _count(values[name])
    if values["sent_at"] is not None:
        values["sent_at"] = _number(values["sent_at"])
    return OutboxItem(**values)


class OutboxRepository:
    """Outbox rows. Every method is one transaction; rows come back as bot.core.records.OutboxItem.
    Raises sqlalchemy errors for a broken or locked database (the outbox service retries)."""

    def __init__(self, db: Database, clock: Clock = SYSTEM_CLOCK):
        self._db = db
        self._clock = clock

    def add(self, *, answer_of: tuple[int, str] | None = None, **fields: Any) -> int:
        """Insert a pending row with a fresh 24-hex `key`; returns its id. `answer_of` (command id, owner): the row
        is part of that command's answer, written only while `owner` holds the command (made `answered` in the
        same transaction; bot.adapters.store.commands.claim_answer raises TakenOver otherwise)."""
        with self._db.transaction() as s:
            if answer_of is not None:
                claim_answer(s.connection(), *answer_of)
                fields["command_id"] = answer_of[0]
            row = OutboxRow(key=secrets.token_hex(12), created_at=self._clock.time(), next_at=0.0, **fields)
            s.add(row)
            s.flush()
            return int(row.id)

    def supersede_updates(self, channel: str, target_ts: str) -> list[int]:
        """Mark every pending edit of message `target_ts` in `channel` superseded; returns their ids."""
        with self._db.transaction() as s:
            old = list(s.scalars(select(OutboxRow.id).where(
                OutboxRow.channel == channel, OutboxRow.kind == "update", OutboxRow.target_ts == target_ts,
                OutboxRow.state == "pending")).all())
            if old:
                s.execute(update(OutboxRow).where(OutboxRow.id.in_(old)).values(state="superseded"))
            return old

    def change_queued_post(self, row_id: int, channel: str, *, answer_of: tuple[int, str] | None = None,
                           **values: Any) -> OutboxItem | None:
        """Write `values` (column -> value) to post `row_id` of `channel` only while it is still just queued: pending,
        and no earlier attempt of it may have reached Slack (`needs_lookup` 0). One conditional UPDATE, so a row the
        sender has claimed (`sending`), sent, failed or superseded is left as it is. Returns the row's columns after
        the change, or None when it was not changed. `answer_of`: as for `add`."""
        with self._db.transaction() as s:
            if answer_of is not None:
                claim_answer(s.connection(), *answer_of)
                values["command_id"] = answer_of[0]
            res = s.execute(update(OutboxRow).where(
                OutboxRow.id == row_id, OutboxRow.channel == channel, OutboxRow.kind == "post",
                OutboxRow.state == "pending", OutboxRow.needs_lookup == 0).values(**values))
            if (res.rowcount or 0) != 1:
                return None
            row = s.get(OutboxRow, row_id)
            return None if row is None else _snapshot(row)

    def get(self, row_id: int) -> OutboxItem | None:
        """The row's columns, or None."""
        with self._db.transaction() as s:
            row = s.get(OutboxRow, row_id)
            return None if row is None else _snapshot(row)

    def pending_count(self, channel: str | None = None) -> int:
        """How many rows are still to send (pending or sending), in `channel` or everywhere."""
        with self._db.transaction() as s:
            q = select(func.count()).select_from(OutboxRow).where(OutboxRow.state.in_(("pending", "sending")))
            if channel is not None:
                q = q.where(OutboxRow.channel == channel)
            return int(s.scalar(q) or 0)

    def backlog(self) -> tuple[int, float | None]:
        """(rows still to send, the oldest one's created_at in epoch seconds or None when there is none)."""
        with self._db.transaction() as s:
            n, oldest = s.execute(select(func.count(), func.min(OutboxRow.created_at))
                                  .where(OutboxRow.state.in_(("pending", "sending")))).one()
            return int(n or 0), (None if oldest is None else float(oldest))

    def pending(self) -> list[tuple[int, str, float]]:
        """(id, channel, next_at epoch s) of every pending row, in id order."""
        with self._db.transaction() as s:
            rows = s.execute(select(OutboxRow.id, OutboxRow.channel, OutboxRow.next_at)
                             .where(OutboxRow.state == "pending").order_by(OutboxRow.id)).all()
            return [(int(r.id), str(r.channel), _number(r.next_at)) for r in rows]

    def requeue_interrupted(self, claimed_before: float | None = None) -> int:
        """Rows left `sending` by a crash become pending again, to be looked up before a resend; with
        `claimed_before` (epoch s) only those claimed before then (a row another bot may still be sending stays).
        Returns how many."""
        with self._db.transaction() as s:
            q = update(OutboxRow).where(OutboxRow.state == "sending")
            if claimed_before is not None:
                q = q.where(OutboxRow.next_at < claimed_before)
            res = s.execute(q.values(state="pending", error="interrupted", next_at=0.0, needs_lookup=1))
            return int(res.rowcount or 0)

    def purge(self, older_than: float) -> int:
        """Delete rows that are done and were created before `older_than` (epoch s). Returns how many."""
        with self._db.transaction() as s:
            res = s.execute(delete(OutboxRow).where(OutboxRow.state.in_(DONE_STATES),
                                                    OutboxRow.created_at < older_than))
            return int(res.rowcount or 0)

    def claim(self, row_id: int) -> OutboxItem | None:
        """Move a pending row to `sending` (one more attempt; `next_at` becomes the claim's time) and return its
        columns; None when it is gone or no longer pending. One conditional update: of two senders (bots on one
        database) only one claims it."""
        with self._db.transaction() as s:
            res = s.execute(update(OutboxRow).where(OutboxRow.id == row_id, OutboxRow.state == "pending")
                            .values(state="sending", next_at=self._clock.time()))
            if (res.rowcount or 0) != 1:
                return None
            row = s.get(OutboxRow, row_id)
            if row is None:
                return None
            row.attempts = _count(row.attempts) + 1
            return _snapshot(row)

    def last_sent_at(self, since: float, now: float) -> dict[str, float]:
        """Channel -> when its last row was sent (epoch s), over rows sent after `since`. A channel with a row still
        `sending` (another bot's call, or one its crash cut off) counts as sent at `now`: that call may have
        reached Slack a moment ago, so the channel's pacing starts from the latest it could have."""
        with self._db.transaction() as s:
            rows = s.execute(select(OutboxRow.channel, func.max(OutboxRow.sent_at))
                             .where(OutboxRow.sent_at > since).group_by(OutboxRow.channel)).all()
            out = {str(c): _number(t) for c, t in rows if t is not None}
            for (channel,) in s.execute(select(OutboxRow.channel).where(OutboxRow.state == "sending").distinct()):
                out[str(channel)] = max(out.get(str(channel), 0.0), now)
            return out

    def set(self, row_id: int, *, only_if: str | None = None, **values: Any) -> bool:
        """Write `values` (column -> value) to row `row_id` (with `only_if`, only while its state is that one).
        Returns whether the row was written."""
        with self._db.transaction() as s:
            q = update(OutboxRow).where(OutboxRow.id == row_id)
            if only_if is not None:
                q = q.where(OutboxRow.state == only_if)
            return bool(s.execute(q.values(**values)).rowcount)
