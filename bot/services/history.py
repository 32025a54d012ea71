"""The check records of watched launches (bot.core.records.CheckRecord): the newest ones kept in memory for the
watcher's judgement, every one written to the database in batches, off the event loop.

A check reads the last HISTORY_CHECKS records of its launch (health streaks, the previous record) and appends one:
read from the database each time, that was most of a check's cost. Here the newest records of each launch live in
memory (loaded once from the database, in a worker thread, on the launch's first check after a start) and new
records are queued and written in one transaction per batch by a worker thread: at most FLUSH_S seconds after they
were added, at once when someone needs every record (a chart, an alert: `all`), and at `close`. A batch the
database refuses is kept and tried again with the next one (the records stay in memory meanwhile); a record is
never lost while the bot runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from bot.adapters.store.observations import ObservationRepository
from bot.core.records import CheckRecord

log = logging.getLogger(__name__)

#: How many of a launch's newest records a check reads (health streaks, the previous verdict).
HISTORY_CHECKS = 60
#: Seconds a new record may wait before its batch is written.
FLUSH_S = 0.5
#: Records queued at most; beyond this the oldest queued ones are written first at once.
MAX_PENDING = 20_000


class CheckHistory:
    """Records per launch: `recent` (memory), `add` (memory now, database soon), `all` (database, after a flush),
    `flush`, `close`. One per bot (bot.wiring). Not thread-safe: use it from the event loop."""

    def __init__(self, rows: ObservationRepository, *, keep: int = HISTORY_CHECKS, flush_s: float = FLUSH_S):
        self._rows = rows
        self._keep = keep
        self._flush_s = flush_s
        self._recent: dict[int, deque[CheckRecord]] = {}
        self._pending: list[tuple[int, CheckRecord]] = []
        self._flusher: asyncio.Task | None = None
        self._write_lock = asyncio.Lock()

    async def recent(self, launch_id: int, limit: int | None = None) -> list[CheckRecord]:
        """The launch's newest records (at most `limit`, default all kept), oldest first. The first call for a
        launch reads them from the database in a worker thread; raises what the database raises then."""
        kept = self._recent.get(launch_id)
        if kept is None:
            loaded = await asyncio.to_thread(self._rows.list, launch_id, self._keep)
            kept = self._recent.setdefault(launch_id, deque(loaded, maxlen=self._keep))
        records = list(kept)
        return records if limit is None else records[-limit:]

    def kept(self, launch_id: int) -> list[CheckRecord]:
        """The launch's records in memory now, oldest first (none before its first `recent`); never reads the
        database."""
        return list(self._recent.get(launch_id, ()))

    def add(self, launch_id: int, record: CheckRecord) -> None:
        """Append a record: in memory at once (a `recent` of a launch never read before reads the database
        first, so nothing is lost), in the database within FLUSH_S seconds."""
        kept = self._recent.get(launch_id)
        if kept is not None:
            kept.append(record)
        self._pending.append((launch_id, record))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush_later())

    async def all(self, launch_id: int, limit: int = 10_000) -> list[CheckRecord]:
        """Every record of the launch from the database (at most the newest `limit`), oldest first, after the
        queued ones were written. Raises what the database raises."""
        await self.flush()
        return await asyncio.to_thread(self._rows.list, launch_id, limit)

    async def flush(self) -> None:
        """Write the queued records now (one transaction, in a worker thread). A refused batch stays queued and is
        logged; never raises."""
        async with self._write_lock:
            batch, self._pending = self._pending, []
            if not batch:
                return
            try:
                await asyncio.to_thread(self._rows.add_many, batch)
            except Exception as e:  # DatabaseUnavailable, or the driver's own error: keep them for the next batch
                log.error("cannot record %d check record(s) yet: %s", len(batch), e)
                self._pending = (batch + self._pending)[-MAX_PENDING:]

    async def _flush_later(self) -> None:
        await asyncio.sleep(self._flush_s)
        await self.flush()

    async def close(self) -> None:
        """Write what is queued (bounded by the database's own timeouts)."""
        if self._flusher is not None and not self._flusher.done():
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        await self.flush()

    def forget(self, launch_id: int) -> None:
        """Drop the launch's records from memory (it is no longer watched); the database keeps them."""
        self._recent.pop(launch_id, None)
