"""Table `deliveries`: the Slack deliveries (slash commands, messages, clicks) some bot of this database has
taken, so that a delivery Slack sends twice, to one bot or to two bots on one database, is acted on once."""

from __future__ import annotations

from sqlalchemy import Float, String, delete, insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from bot.adapters.store.db import Base, Database
from bot.core.clock import SYSTEM_CLOCK, Clock

#: Rows older than this many seconds are deleted (Slack retries a delivery within minutes).
KEEP_S = 3600.0
#: Every this many claims, the rows older than KEEP_S are deleted.
PRUNE_EVERY = 500


class DeliveryRow(Base):
    """Table `deliveries`: `key` a delivery's identity (e.g. `cmd:<trigger_id>`, `act:<message_ts>:<action_ts>`),
    `at` when it was first taken (epoch seconds)."""

    __tablename__ = "deliveries"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    at: Mapped[float] = mapped_column(Float, index=True)


class DeliveryRepository:
    """Claims of deliveries: the primary key decides, so of two bots that claim one key at once exactly one wins.
    Raises DatabaseUnavailable when the database refuses."""

    def __init__(self, db: Database, clock: Clock = SYSTEM_CLOCK):
        self._db = db
        self._clock = clock
        self._claims = 0

    def claim(self, key: str, ttl_s: float = KEEP_S) -> bool:
        """True when this call is the first to take `key` within `ttl_s` seconds (a claim older than that is
        replaced), False when a claim of it stands. Keys longer than the column are cut to it."""
        key = key[:200]
        now = self._clock.time()
        self._claims += 1
        try:
            with self._db.writing() as c:
                c.execute(delete(DeliveryRow.__table__).where(DeliveryRow.key == key, DeliveryRow.at < now - ttl_s))
                c.execute(insert(DeliveryRow.__table__).values(key=key, at=now))
        except IntegrityError:
            return False
        if self._claims % PRUNE_EVERY == 0:
            self.prune()
        return True

    def prune(self, keep_s: float = KEEP_S) -> int:
        """Delete the claims older than `keep_s` seconds; returns how many."""
        with self._db.writing() as c:
            return c.execute(delete(DeliveryRow.__table__).where(DeliveryRow.at < self._clock.time() - keep_s)).rowcount
