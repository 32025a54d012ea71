"""Table `commands`: the write-ahead journal of the commands a bot is answering, and its repository.

A command's row and its audit row (table `events`, result `running`) are written in one transaction before its
work starts. When the work ends, its audit row gets the result and its journal row becomes `finished`, again in
one transaction, and only while its owner still holds it (compare and set on `state` and `owner`). Each outbox row
of its answer is inserted in the same transaction as the compare and set that makes the command `answered` by its
owner (`claim_answer`, called by bot.adapters.store.outbox): an answer is queued only by the bot that still holds
the command, so a bot taken for gone that wakes up queues nothing, and "was it answered?" is the row's state. A bot
that dies leaves `running` (or `finished`, not answered) rows; the leader takes them over (`take`, compare and set
to `recovered`) and answers them (bot.services.journal).

States: running -> finished -> answered, or running -> answered (the finish write was refused and is retried);
running | finished -> recovered (by another bot, once).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from sqlalchemy import Connection, Float, Integer, String, Text, delete, insert, select, update
from sqlalchemy.orm import Mapped, mapped_column

from bot.adapters.store.db import Base, Database
from bot.adapters.store.events import EventRow
from bot.core.clock import SYSTEM_CLOCK, Clock

#: The states of a journal row that nobody has settled yet.
UNSETTLED = ("running", "finished")
#: The longest owner (`host:pid:token`) stored.
OWNER_CHARS = 300


class TakenOver(Exception):
    """The command is no longer held by the bot that writes for it (another bot took it over): nothing of its
    answer may be queued."""


class CommandRow(Base):
    """Table `commands`. `owner`: the bot that runs it (`host:pid`); `text`: what was typed, redacted; `audit_id`:
    its row in `events`; `placeholder`: the `q:<row>` reference (or ts) of the progress message posted while it
    runs; `expects_answer`: 1 when its finished reply has a message. Times are epoch seconds."""

    __tablename__ = "commands"
    __table_args__: ClassVar[dict[str, Any]] = {"sqlite_autoincrement": True}  # ids never reused

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(OWNER_CHARS))
    state: Mapped[str] = mapped_column(String(16), default="running", index=True)
    user_id: Mapped[str] = mapped_column(String(64), default="")
    channel: Mapped[str] = mapped_column(String(64), default="")
    thread_ts: Mapped[str | None] = mapped_column(String(32), nullable=True)
    source: Mapped[str] = mapped_column(String(16), default="")
    text: Mapped[str] = mapped_column(Text, default="")
    audit_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    placeholder: Mapped[str | None] = mapped_column(String(32), nullable=True)
    expects_answer: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[float] = mapped_column(Float, default=time.time)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


@dataclass(frozen=True)
class JournalEntry:
    """One command of the journal, as stored (see CommandRow for the fields)."""

    id: int
    owner: str
    state: str
    user_id: str
    channel: str
    thread_ts: str | None
    source: str
    text: str
    audit_id: int | None
    placeholder: str | None
    expects_answer: bool
    started_at: float
    finished_at: float | None
    #: its audit row's result and detail (read by `unsettled`)
    result: str | None = None
    detail: str | None = None


def _entry(row: CommandRow, result: str | None = None, detail: str | None = None) -> JournalEntry:
    return JournalEntry(id=row.id, owner=row.owner, state=row.state, user_id=row.user_id, channel=row.channel,
                        thread_ts=row.thread_ts, source=row.source, text=row.text, audit_id=row.audit_id,
                        placeholder=row.placeholder, expects_answer=bool(row.expects_answer),
                        started_at=float(row.started_at), finished_at=row.finished_at, result=result,
                        detail=detail)


def claim_answer(c: Connection, command_id: int, owner: str) -> None:
    """Within the caller's transaction (an outbox row of the command's answer being written): make the command
    `answered` by `owner`, which must still hold it (running, finished or answered, and its own). Raises TakenOver,
    so that the caller's transaction is rolled back, when it does not."""
    done = c.execute(update(CommandRow).where(
        CommandRow.id == command_id, CommandRow.owner == owner,
        CommandRow.state.in_(("running", "finished", "answered"))).values(state="answered")).rowcount
    if done != 1:
        raise TakenOver(f"command {command_id} is no longer {owner}'s")


class CommandRepository:
    """The journal's reads and writes; it stores what it is given (redaction is the journal's job). Raises
    DatabaseUnavailable when the database refuses."""

    def __init__(self, db: Database, clock: Clock = SYSTEM_CLOCK):
        self._db = db
        self._clock = clock

    def begin(self, *, owner: str, user_id: str, channel: str, thread_ts: str | None, source: str, text: str,
              action: str, args: dict[str, Any]) -> tuple[int, int]:
        """Write a command ahead: its journal row (`running`) and its audit row (`action`, result `running`), in one
        transaction. Returns (command id, audit row id)."""
        now = self._clock.time()
        with self._db.writing() as c:
            audit_id = c.execute(insert(EventRow.__table__).values(
                at=now, user_id=user_id, action=action, args_json=json.dumps(args, sort_keys=True, default=str),
                result="running", detail=None, channel=channel)).inserted_primary_key[0]
            command_id = c.execute(insert(CommandRow.__table__).values(
                owner=owner, state="running", user_id=user_id, channel=channel, thread_ts=thread_ts, source=source,
                text=text, audit_id=audit_id, started_at=now, expects_answer=0)).inserted_primary_key[0]
        return int(command_id), int(audit_id)

    def finish(self, command_id: int, *, action: str, args: dict[str, Any], result: str, detail: str | None,
               launch_id: int | None, expects_answer: bool, owner: str) -> bool:
        """Record the command's end: its audit row's action, args, result, detail and launch, and its journal row
        `finished` (one already `answered`, when this write is a retry, stays so), in one transaction, only while
        `owner` still holds it (no other bot took it over). Returns False, writing nothing, when it was taken over
        (or is unknown)."""
        from sqlalchemy import case

        with self._db.writing() as c:
            done = c.execute(update(CommandRow).where(
                CommandRow.id == command_id, CommandRow.state.in_(("running", "answered")),
                CommandRow.owner == owner).values(
                state=case((CommandRow.state == "running", "finished"), else_=CommandRow.state),
                finished_at=self._clock.time(), expects_answer=int(expects_answer))).rowcount
            if done != 1:
                return False
            audit_id = c.execute(select(CommandRow.audit_id).where(CommandRow.id == command_id)).scalar()
            if audit_id is not None:
                c.execute(update(EventRow).where(EventRow.id == audit_id).values(
                    action=action, args_json=json.dumps(args, sort_keys=True, default=str), result=result,
                    detail=detail, launch_id=launch_id))
        return True

    def set_placeholder(self, command_id: int, ref: str) -> None:
        """Remember the progress message posted for the command (its `q:` reference or ts)."""
        with self._db.writing() as c:
            c.execute(update(CommandRow).where(CommandRow.id == command_id).values(placeholder=ref[:32]))

    def unsettled(self, *, not_owner: str, older_than: float | None = None) -> list[JournalEntry]:
        """The commands still `running` or `finished` of every bot but `not_owner` (started before `older_than`,
        epoch s, when given), oldest first, each with its audit row's result and detail."""
        with self._db.transaction() as s:
            q = (select(CommandRow, EventRow.result, EventRow.detail)
                 .outerjoin(EventRow, EventRow.id == CommandRow.audit_id)
                 .where(CommandRow.state.in_(UNSETTLED), CommandRow.owner != not_owner))
            if older_than is not None:
                q = q.where(CommandRow.started_at < older_than)
            return [_entry(row, result, detail) for row, result, detail in s.execute(q.order_by(CommandRow.id)).all()]

    def take(self, entry: JournalEntry, *, detail: str) -> bool:
        """Take `entry` over (compare and set from the state and owner read to `recovered`); a `running` one's audit
        row gets result `interrupted` with `detail`, in the same transaction. False when another bot (or its owner,
        awake again) changed it first."""
        with self._db.writing() as c:
            done = c.execute(update(CommandRow).where(CommandRow.id == entry.id, CommandRow.state == entry.state,
                                                      CommandRow.owner == entry.owner)
                             .values(state="recovered", finished_at=self._clock.time())).rowcount
            if done != 1:
                return False
            if entry.state == "running" and entry.audit_id is not None:
                c.execute(update(EventRow).where(EventRow.id == entry.audit_id, EventRow.result == "running")
                          .values(result="interrupted", detail=detail))
        return True

    def get(self, command_id: int) -> JournalEntry | None:
        """One command's row, or None."""
        with self._db.transaction() as s:
            row = s.get(CommandRow, command_id)
            return None if row is None else _entry(row)

    def purge(self, older_than: float) -> int:
        """Delete the settled rows started before `older_than` (epoch s); returns how many."""
        with self._db.writing() as c:
            return int(c.execute(delete(CommandRow).where(CommandRow.state.in_(("answered", "recovered")),
                                                          CommandRow.started_at < older_than)).rowcount or 0)
