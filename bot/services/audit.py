"""The audit trail's one writer: every command (`command:<name>` rows, written by the dispatcher) and every
action on a host (`launch`, `kill`, `kill_pid`, `relaunch`, `snooze`, `stack_dump` rows, written by the
services) goes through `Audit.record`, redacted, into the `events` table."""

from __future__ import annotations

import logging
from typing import Any

from bot.adapters.store.events import EventRepository
from bot.core.models import Event
from bot.core.redact import Redactor

log = logging.getLogger(__name__)


class Audit:
    """Writes and reads the audit trail. `redactor` masks secrets in args and details before they are
    stored; writing never fails the caller (a database fault is logged)."""

    def __init__(self, events: EventRepository, redactor: Redactor):
        self._events = events
        self._redactor = redactor

    def record(self, *, user_id: str, action: str, args: dict[str, Any] | None = None, result: str = "ok",
               detail: str | None = None, launch_id: int | None = None, host: str | None = None,
               channel: str | None = None) -> Event | None:
        """Append one row (Slack user ID, action, args, result, detail, where) and return it; None when the
        database refused it (logged with the action, never raised)."""
        try:
            return self._events.add(user_id=user_id, action=action, args=self._redactor.deep(args or {}),
                                    result=result, detail=self._redactor(detail) if detail else detail,
                                    launch_id=launch_id, host=host, channel=channel)
        except Exception:
            log.exception("could not record the audit event %s/%s of %s", action, result, user_id)
            return None

    def events(self, *, launch_id: int | None = None, action: str | None = None, limit: int = 1000) -> list[Event]:
        """Rows in time order, optionally of one launch and/or one action. Raises sqlalchemy errors."""
        return self._events.list(launch_id=launch_id, action=action, limit=limit)
