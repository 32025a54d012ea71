"""Table `confirmations`: typed kills waiting for their [Kill] / [Cancel] click, and its repository."""

from __future__ import annotations

import time

from sqlalchemy import Float, Integer, String, Text, update
from sqlalchemy.orm import Mapped, mapped_column

from bot.adapters.store.db import Base, Database
from bot.core.clock import SYSTEM_CLOCK, Clock
from bot.core.models import Confirmation, ConfirmationState


class ConfirmationRow(Base):
    """Table `confirmations`: `state` pending -> confirmed | cancelled, claimed once (so two clicks never act
    twice). For a pid kill, `command` is the process's command line when asked. Times are epoch seconds."""

    __tablename__ = "confirmations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    launch_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    host: Mapped[str] = mapped_column(String(64), default="")
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    command: Mapped[str | None] = mapped_column(Text, nullable=True)
    asked_by: Mapped[str] = mapped_column(String(64), default="")
    state: Mapped[str] = mapped_column(String(16), default=ConfirmationState.PENDING.value)
    decided_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    decided_at: Mapped[float | None] = mapped_column(Float, nullable=True)


def _confirmation(row: ConfirmationRow) -> Confirmation:
    return Confirmation(id=row.id, launch_id=row.launch_id, host=row.host, pid=row.pid, command=row.command,
                        asked_by=row.asked_by, state=ConfirmationState(row.state), decided_by=row.decided_by,
                        created_at=row.created_at)


class ConfirmationRepository:
    """One-shot kill confirmations. Raises sqlalchemy errors for a broken database."""

    def __init__(self, db: Database, clock: Clock = SYSTEM_CLOCK):
        self._db = db
        self._clock = clock

    def add(self, *, asked_by: str, host: str, launch_id: int | None = None, pid: int | None = None,
            command: str | None = None) -> Confirmation:
        """Record a pending confirmation and return it (its id is the [Kill] / [Cancel] buttons' value)."""
        with self._db.transaction() as s:
            row = ConfirmationRow(asked_by=asked_by, host=host, launch_id=launch_id, pid=pid, command=command,
                                  created_at=self._clock.time())
            s.add(row)
            s.flush()
            return _confirmation(row)

    def get(self, conf_id: int) -> Confirmation | None:
        """Confirmation `conf_id` as it is now, or None when unknown."""
        with self._db.transaction() as s:
            row = s.get(ConfirmationRow, conf_id)
            return None if row is None else _confirmation(row)

    def claim(self, conf_id: int, *, state: ConfirmationState, user_id: str,
              max_age_s: float) -> tuple[Confirmation | None, bool]:
        """Decide confirmation `conf_id` as `state` if it is still pending and younger than `max_age_s`
        seconds, atomically (compare-and-set). Returns (the confirmation as it is now, or None when unknown;
        whether this call decided it)."""
        with self._db.transaction() as s:
            res = s.execute(update(ConfirmationRow).where(
                ConfirmationRow.id == conf_id, ConfirmationRow.state == ConfirmationState.PENDING.value,
                ConfirmationRow.created_at >= self._clock.time() - max_age_s,
            ).values(state=ConfirmationState(state).value, decided_by=user_id, decided_at=self._clock.time()))
            row = s.get(ConfirmationRow, conf_id)
            return (None if row is None else _confirmation(row)), bool(res.rowcount)
