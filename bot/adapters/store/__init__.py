"""State that survives a restart: one database, one repository per table.

`Store(url)` opens the database (creating and migrating its tables) and exposes the repositories:
`launches` (launches and their incident threads), `events` (the audit trail), `observations` (readiness
check records), `confirmations` (typed kills waiting for a click), `outbox` (messages to Slack),
`deliveries` (Slack deliveries taken, acted on once) and `commands` (the commands being answered, written
ahead). Only services use it (bot.services); `url` is also the
APScheduler job store's URL.

Importing this package does not import SQLAlchemy: `DatabaseUnavailable` comes from the light `errors` module,
`default_url` is imported on first use (PEP 562 `__getattr__`) and `Store` imports the repositories when one is
built. So a command that only catches DatabaseUnavailable (`gpubot --version`, `diagnose`) starts fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bot.adapters.store.errors import DatabaseUnavailable
from bot.core.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    from sqlalchemy import MetaData

    from bot.adapters.store.db import default_url

__all__ = ["DatabaseUnavailable", "Store", "default_url", "tables"]


def __getattr__(name: str) -> Any:
    """`default_url`, from bot.adapters.store.db (which imports SQLAlchemy), on first use."""
    if name == "default_url":
        from bot.adapters.store.db import default_url

        return default_url
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tables() -> MetaData:
    """The declarative metadata with every repository's table (their modules imported)."""
    from bot.adapters.store import (  # noqa: F401
        commands,
        confirmations,
        deliveries,
        events,
        launches,
        lease,
        observations,
        outbox,
    )
    from bot.adapters.store.db import Base

    return Base.metadata


class Store:
    """The database of one bot and its repositories. Raises DatabaseUnavailable for a database that cannot be
    opened (see Database); the repositories raise it when a read or write is refused."""

    def __init__(self, url: str, clock: Clock = SYSTEM_CLOCK):
        from bot.adapters.store.commands import CommandRepository
        from bot.adapters.store.confirmations import ConfirmationRepository
        from bot.adapters.store.db import Database
        from bot.adapters.store.deliveries import DeliveryRepository
        from bot.adapters.store.events import EventRepository
        from bot.adapters.store.launches import LaunchRepository
        from bot.adapters.store.observations import ObservationRepository
        from bot.adapters.store.outbox import OutboxRepository

        self.db = Database(url)
        self.url = url
        self.clock = clock
        self.launches = LaunchRepository(self.db, clock)
        self.events = EventRepository(self.db, clock)
        self.observations = ObservationRepository(self.db, clock)
        self.confirmations = ConfirmationRepository(self.db, clock)
        self.outbox = OutboxRepository(self.db, clock)
        self.deliveries = DeliveryRepository(self.db, clock)
        self.commands = CommandRepository(self.db, clock)

    def close(self) -> None:
        """Dispose of the engine's connections."""
        self.db.close()
