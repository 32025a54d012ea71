"""State that survives a restart: one database, one repository per table.

`Store(url)` opens the database (creating and migrating its tables) and exposes the repositories:
`launches` (launches and their incident threads), `events` (the audit trail), `observations` (readiness
check records), `confirmations` (typed kills waiting for a click) and `outbox` (messages to Slack). Only
services use it (bot.services); `url` is also the APScheduler job store's URL.
"""

from __future__ import annotations

from bot.adapters.store.confirmations import ConfirmationRepository
from bot.adapters.store.db import Database, DatabaseUnavailable, default_url
from bot.adapters.store.events import EventRepository
from bot.adapters.store.launches import LaunchRepository
from bot.adapters.store.observations import ObservationRepository
from bot.adapters.store.outbox import OutboxRepository

__all__ = ["DatabaseUnavailable", "Store", "default_url"]


class Store:
    """The database of one bot and its repositories. Raises DatabaseUnavailable for a database that cannot be
    opened (see Database); the repositories raise it when a read or write is refused."""

    def __init__(self, url: str):
        self.db = Database(url)
        self.url = url
        self.launches = LaunchRepository(self.db)
        self.events = EventRepository(self.db)
        self.observations = ObservationRepository(self.db)
        self.confirmations = ConfirmationRepository(self.db)
        self.outbox = OutboxRepository(self.db)

    def close(self) -> None:
        """Dispose of the engine's connections."""
        self.db.close()
