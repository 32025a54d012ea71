"""The audit trail's one writer: every command (`command:<name>` rows, written by the dispatcher) and every
action on a host (`launch`, `kill`, `kill_pid`, `relaunch`, `snooze`, `stack_dump` rows, written by the
services) goes through `Audit.record`, redacted, into the `events` table. A command from Slack is written ahead:
`begin_command` records it (table `commands`) with its audit row (result `running`) before its work starts, and
`finish_command` gives that row its result, so a bot that dies mid-command leaves a row that the leader completes
(bot.services.journal) rather than none."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bot.adapters.store.commands import CommandRepository
from bot.adapters.store.events import EventRepository
from bot.core.models import Event
from bot.core.redact import Redactor

if TYPE_CHECKING:
    from bot.adapters.metrics import Metrics

log = logging.getLogger(__name__)

#: Seconds between the retries of an audit row the database refused (about 31 s in all: a lock held 15 s is
#: outlasted).
RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0, 16.0)
#: Seconds commands are not written ahead after the database refused one (they run, and are audited at the end).
JOURNAL_PAUSE_S = 10.0


class Audit:
    """Writes and reads the audit trail. `redactor` masks secrets in args and details before they are
    stored; writing never fails the caller (a database fault is logged). With `metrics`, every command's row
    (`command:<name>`) is counted there by name and result."""

    def __init__(self, events: EventRepository, redactor: Redactor, metrics: Metrics | None = None, *,
                 commands: CommandRepository | None = None, owner: str = ""):
        self._events = events
        self._commands = commands
        self._journal_down_until = 0.0  # monotonic s: commands are not written ahead until then (it refused)
        #: this bot (`host:pid`): the owner of the commands it writes ahead
        self.owner = owner
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
        self._keep(lambda: self._events.add(**row), row)
        return None

    async def begin_command(self, *, user_id: str, channel: str, thread_ts: str | None, source: str, word: str,
                            text: str) -> int | None:
        """Write a command ahead of its work (table `commands`, with its audit row `command:<word>`, result
        `running`; `text` redacted). Returns its id, or None without a journal or when the database refused
        (logged: the command then runs and is audited as before, at its end)."""
        if self._commands is None or time.monotonic() < self._journal_down_until:
            return None
        text = self._redactor(text)[:500]
        try:
            command_id, _ = await asyncio.to_thread(
                self._commands.begin, owner=self.owner, user_id=user_id, channel=channel, thread_ts=thread_ts,
                source=source, text=text, action=f"command:{word[:40]}", args={"text": text, "source": source})
        except Exception as e:
            # the next commands do not wait on a database that refuses, one after the other
            self._journal_down_until = time.monotonic() + JOURNAL_PAUSE_S
            log.warning("audit: cannot write the command %r of %s ahead (it runs all the same; the next ones are "
                        "not written ahead for %.0f s): %s", word[:40], user_id, JOURNAL_PAUSE_S, e)
            return None
        return command_id

    def finish_command(self, command_id: int, *, user_id: str, action: str, args: dict[str, Any], result: str,
                       detail: str | None, launch_id: int | None, channel: str | None, expects_answer: bool) -> bool:
        """Give the command written ahead (`begin_command`) its result: its audit row completed and its journal row
        `finished`, in one transaction. Returns False when another bot took the command over meanwhile (this bot
        was taken for gone): its answer must not be sent. A database that refuses: the row is recorded as `record`
        does (logged, retried) and True is returned."""
        assert self._commands is not None
        args = self._redactor.deep(args)
        detail = self._redactor(detail) if detail else detail
        row = dict(user_id=user_id, action=action, args=args, result=result, detail=detail, launch_id=launch_id,
                   channel=channel, command=command_id)

        def write() -> bool:
            assert self._commands is not None
            return self._commands.finish(command_id, action=action, args=args, result=result, detail=detail,
                                         launch_id=launch_id, expects_answer=expects_answer, owner=self.owner)

        try:
            held = write()
        except Exception as e:
            log.error("audit: cannot finish command %s (%s); will retry: %s", command_id, result, e)
            self._keep(write, row)
            held = True
        if held and self._metrics is not None:
            self._metrics.count_command("unknown" if result == "unknown" else action.removeprefix("command:"), result)
        return held

    def _keep(self, write: Callable[[], object], row: dict[str, Any]) -> None:
        """Call `write` (which records `row`) again later, RETRY_DELAYS_S apart, while an event loop runs; else
        `row` is logged as lost."""
        try:
            task = asyncio.get_running_loop().create_task(self._retry(write, row))
        except RuntimeError:
            log.error("audit: row lost (no event loop to retry): %s", json.dumps(row, default=str))
            return
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    async def _retry(self, write: Callable[[], object], row: dict[str, Any]) -> None:
        last: Exception | None = None
        for delay in RETRY_DELAYS_S:
            await asyncio.sleep(delay)
            try:
                write()
                log.warning("audit: recorded %s/%s of %s after a retry", row["action"], row["result"], row["user_id"])
                return
            except Exception as e:
                last = e
        log.error("audit: row lost after %d retries (%s): %s", len(RETRY_DELAYS_S), last,
                  json.dumps(row, default=str))

    def events(self, *, launch_id: int | None = None, action: str | None = None, limit: int = 1000) -> list[Event]:
        """Rows in time order, optionally of one launch and/or one action. Raises sqlalchemy errors."""
        return self._events.list(launch_id=launch_id, action=action, limit=limit)
