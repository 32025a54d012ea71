"""Table `observations`: one compact record per readiness check of a launch, and its repository."""

from __future__ import annotations

import json
import time

from sqlalchemy import Float, ForeignKey, Integer, Text, insert, select
from sqlalchemy.orm import Mapped, mapped_column

from bot.adapters.store.db import Base, Database
from bot.core.clock import SYSTEM_CLOCK, Clock
from bot.core.records import CheckRecord


class ObservationRow(Base):
    """Table `observations` (the record as JSON; `at` epoch seconds)."""

    __tablename__ = "observations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    launch_id: Mapped[int] = mapped_column(Integer, ForeignKey("launches.id"), index=True)
    at: Mapped[float] = mapped_column(Float, default=time.time)
    data_json: Mapped[str] = mapped_column(Text, default="{}")


class ObservationRepository:
    """Check records per launch (bot.core.records.CheckRecord, stored as its `as_json`). Raises sqlalchemy errors
    for a broken database."""

    def __init__(self, db: Database, clock: Clock = SYSTEM_CLOCK):
        self._db = db
        self._clock = clock

    def add(self, launch_id: int, record: CheckRecord) -> None:
        """Append one check's record for a launch."""
        self.add_many([(launch_id, record)])

    def add_many(self, records: list[tuple[int, CheckRecord]]) -> None:
        """Append (launch id, record) pairs in one transaction (one INSERT statement run for all of them)."""
        if not records:
            return
        now = self._clock.time()
        rows = [{"launch_id": lid, "at": now, "data_json": json.dumps(rec.as_json(), default=str)}
                for lid, rec in records]
        with self._db.writing() as c:  # Core: no ORM unit of work for plain inserts
            c.execute(insert(ObservationRow.__table__), rows)

    def list(self, launch_id: int, limit: int = 10_000) -> list[CheckRecord]:
        """The launch's records, oldest first (at most the newest `limit`; a stored one that does not read as a
        record, such as one without a time, is left out)."""
        with self._db.transaction() as s:
            rows = list(s.scalars(select(ObservationRow).where(ObservationRow.launch_id == launch_id)
                                  .order_by(ObservationRow.id.desc()).limit(limit)))
        out = []
        for r in reversed(rows):
            try:
                rec = CheckRecord.from_json(json.loads(r.data_json))
            except ValueError:  # not JSON
                rec = None
            if rec is not None:
                out.append(rec)
        return out

    def last(self, launch_id: int) -> CheckRecord | None:
        """The newest record of the launch that is not a failed check (among its last 20), or None."""
        for rec in reversed(self.list(launch_id, limit=20)):
            if rec.ok:
                return rec
        return None
