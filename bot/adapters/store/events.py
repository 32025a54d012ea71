"""Table `events`: the audit trail and each launch's timeline, and its repository."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import Float, ForeignKey, Integer, String, Text, insert, select
from sqlalchemy.orm import Mapped, mapped_column

from bot.adapters.store.db import Base, Database
from bot.core.clock import SYSTEM_CLOCK, Clock
from bot.core.models import Event


class EventRow(Base):
    """Table `events`: who did what, with which args, and the result (times are epoch seconds)."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, default=time.time, index=True)
    user_id: Mapped[str] = mapped_column(String(64), default="")
    action: Mapped[str] = mapped_column(String(64))
    args_json: Mapped[str] = mapped_column(Text, default="{}")
    result: Mapped[str] = mapped_column(String(32), default="ok")
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    launch_id: Mapped[int | None] = mapped_column(Integer, ForeignKey("launches.id"), nullable=True, index=True)
    host: Mapped[str | None] = mapped_column(String(64), nullable=True)
    channel: Mapped[str | None] = mapped_column(String(64), nullable=True)


_INSERT = insert(EventRow.__table__)


def _event(row: EventRow) -> Event:
    return Event(id=row.id, at=row.at, user_id=row.user_id, action=row.action,
                 args=json.loads(row.args_json or "{}"), result=row.result, detail=row.detail,
                 launch_id=row.launch_id, host=row.host, channel=row.channel)


class EventRepository:
    """Appends and reads audit rows. It stores what it is given: redaction is the audit writer's job
    (bot.services.audit). Raises sqlalchemy errors for a broken database."""

    def __init__(self, db: Database, clock: Clock = SYSTEM_CLOCK):
        self._db = db
        self._clock = clock

    def add(self, *, user_id: str, action: str, args: dict[str, Any], result: str, detail: str | None,
            launch_id: int | None, host: str | None, channel: str | None) -> Event:
        """Append one row (args as JSON) and return it. One Core insert (every command writes one: an ORM
        session costs several times as much)."""
        args_json = json.dumps(args, sort_keys=True, default=str)
        values = dict(at=self._clock.time(), user_id=user_id, action=action, args_json=args_json, result=result,
                      detail=detail, launch_id=launch_id, host=host, channel=channel)
        with self._db.writing() as c:
            key = c.execute(_INSERT, values).inserted_primary_key
        return Event(id=key[0], at=values["at"], user_id=user_id, action=action, args=json.loads(args_json),
                     result=result, detail=detail, launch_id=launch_id, host=host, channel=channel)

    def list(self, *, launch_id: int | None = None, action: str | None = None, limit: int = 1000) -> list[Event]:
        """Rows in time order (the first `limit`), optionally of one launch and/or one action."""
        with self._db.transaction() as s:
            q = select(EventRow)
            if launch_id is not None:
                q = q.where(EventRow.launch_id == launch_id)
            if action is not None:
                q = q.where(EventRow.action == action)
            return [_event(r) for r in s.scalars(q.order_by(EventRow.id).limit(limit))]
