"""Table `observations`: one compact record per readiness check of a launch, and its repository."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import Float, ForeignKey, Integer, Text, insert, select
from sqlalchemy.orm import Mapped, mapped_column

from bot.adapters.store.db import Base, Database
from bot.core.clock import SYSTEM_CLOCK, Clock


class ObservationRow(Base):
    """Table `observations` (the record as JSON; `at` epoch seconds)."""

    __tablename__ = "observations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    launch_id: Mapped[int] = mapped_column(Integer, ForeignKey("launches.id"), index=True)
    at: Mapped[float] = mapped_column(Float, default=time.time)
    data_json: Mapped[str] = mapped_column(Text, default="{}")


class ObservationRepository:
    """Check records per launch (JSON-serialisable dicts, see bot.core.observe). Raises sqlalchemy errors
    for a broken database."""

    def __init__(self, db: Database, clock: Clock = SYSTEM_CLOCK):
        self._db = db
        self._clock = clock

    def add(self, launch_id: int, data: dict[str, Any]) -> None:
        """Append one check's record for a launch."""
        self.add_many([(launch_id, data)])

    def add_many(self, records: list[tuple[int, dict[str, Any]]]) -> None:
        """Append (launch id, record) pairs in one transaction (one INSERT statement run for all of them)."""
        if not records:
            return
        now = self._clock.time()
        rows = [{"launch_id": lid, "at": now, "data_json": json.dumps(data, default=str)} for lid, data in records]
        with self._db.writing() as c:  # Core: no ORM unit of work for plain inserts
            c.execute(insert(ObservationRow.__table__), rows)

    def list(self, launch_id: int, limit: int = 10_000) -> list[dict[str, Any]]:
        """The launch's records, oldest first (at most the newest `limit`)."""
        with self._db.transaction() as s:
            rows = list(s.scalars(select(ObservationRow).where(ObservationRow.launch_id == launch_id)
                                  .order_by(ObservationRow.id.desc()).limit(limit)))
        return [json.loads(r.data_json) for r in reversed(rows)]

    def last(self, launch_id: int) -> dict[str, Any] | None:
        """The newest record of the launch that is not an error (among its last 20), or None."""
        for rec in reversed(self.list(launch_id, limit=20)):
            if "error" not in rec:
                return rec
        return None
