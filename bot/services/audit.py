"""The audit trail's one writer: every command (`command:<name>` rows, written by the dispatcher) and every
action on a host (`launch`, `kill`, `kill_pid`, `relaunch`, `snooze`, `stack_dump` rows, written by the
services) goes through `Audit.record`, redacted, into the `events` table."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from bot.adapters.store.events import EventRepository
from bot.core.models import Event
from bot.core.redact import Redactor

if TYPE_CHECKING:
    from bot.adapters.metrics import Metrics

log = logging.getLogger(__name__)

#: Seconds between the retries of an audit row the database refused (about 31 s in all: a lock held 15 s is
#: outlasted).
RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0, 16.0)


class Audit:
    """Writes and reads the audit trail. `redactor` masks secrets in args and details before they are
    stored; writing never fails the caller (a database fault is logged). With `metrics`, every command's row
    (`command:<name>`) is counted there by name and result."""

    def __init__(self, events: EventRepository, redactor: Redactor, metrics: Metrics | None = None):
        self._events = events
        self._metrics = metrics
        self._redactor = redactor
        self._retries: set[asyncio.Task] = set()

    def record(self, *, user_id: str, action: str, args: dict[str, Any] | None = None, result: str = "ok",
               detail: str | None = None, launch_id: int | None = None, host: str | None = None,
               channel: str | None = None) -> Event | None:
        """Append one row (Slack user ID, action, args, result, detail, where) and return it; None when the
        database refused it. Never raises: a refused row is logged with all it says (redacted), and written
        again later, RETRY_DELAYS_S apart, while an event loop runs (a lock held past the busy timeout, a disk
        that fills up then frees); one that never goes in is logged as lost."""
        if self._metrics is not None and action.startswith("command:"):
            # an unknown command's name is what the user typed: one label for all of them (no label per typo,
            # and nothing typed, such as a pasted token, in the metrics)
            name = "unknown" if result == "unknown" else action.removeprefix("command:")
            self._metrics.count_command(name, result)
        row = dict(user_id=user_id, action=action, args=self._redactor.deep(args or {}), result=result,
                   detail=self._redactor(detail) if detail else detail, launch_id=launch_id, host=host,
                   channel=channel)
        try:
            return self._events.add(**row)
        except Exception as e:
            log.error("audit: could not record %s/%s of %s (%s); will retry: %s", action, result, user_id, e,
                      json.dumps(row, default=str))
        try:
            task = asyncio.get_running_loop().create_task(self._retry(row))
        except RuntimeError:
            log.error("audit: row lost (no event loop to retry): %s", json.dumps(row, default=str))
            return None
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)
        return None

    async def _retry(self, row: dict[str, Any]) -> None:
        last: Exception | None = None
        for delay in RETRY_DELAYS_S:
            await asyncio.sleep(delay)
            try:
                self._events.add(**row)
                log.warning("audit: recorded %s/%s of %s after a retry", row["action"], row["result"], row["user_id"])
                return
            except Exception as e:
                last = e
        log.error("audit: row lost after %d retries (%s): %s", len(RETRY_DELAYS_S), last,
                  json.dumps(row, default=str))

    def events(self, *, launch_id: int | None = None, action: str | None = None, limit: int = 1000) -> list[Event]:
        """Rows in time order, optionally of one launch and/or one action. Raises sqlalchemy errors."""
        return self._events.list(launch_id=launch_id, action=action, limit=limit)
