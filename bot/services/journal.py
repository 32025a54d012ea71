"""The answers to the commands of a bot that is gone.

Every command from Slack is written ahead (bot.services.audit.Audit.begin_command: table `commands` with its audit
row, result `running`) before its work starts, and the rows of its answer carry its id in the outbox. A bot that
dies (SIGKILL, a lost host) or is taken for gone (frozen past its lease: the new leader ended its sessions) leaves
such a command `running`, or `finished` with no answer queued. The leader (`CommandJournal.recover`, at takeover and
every few seconds) takes each one over once (compare and set in the database: a bot that wakes up finds its command
taken and sends nothing) and answers it where it was asked, in its progress message when one was posted:

* `running`: the work was cut off. Its audit row becomes `interrupted`; the answer says what was asked, by whom,
  that the bot running it stopped, and what it had recorded (the launches the user started since: the leader
  follows them, and settles one left `starting` at takeover), and to check before repeating it.
* `finished` without an answer: the work was done and audited, but the bot stopped before its answer was queued:
  the answer gives the result the audit row holds.
* `finished` with its answer queued (or none expected): settled without a word.

A bot is gone when its life lock is free (bot.adapters.locks.DecisionLocks.alive); commands younger than
RECOVER_GRACE_S are left alone (a bot whose session was ended takes its life lock again within a second).
Limits: a leader that dies between taking a command over and queueing its answer leaves it unanswered (one
database write apart); the work a dead bot did on a host is not redone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from bot.adapters.store.commands import CommandRepository, JournalEntry
from bot.adapters.store.launches import LaunchRepository
from bot.core.clock import SYSTEM_CLOCK, Clock
from bot.core.commands import slash
from bot.present.render import Message, Renderer, fmt_duration
from bot.services.outbox import answering
from bot.services.surface import Surface

log = logging.getLogger(__name__)

#: Seconds a command of another bot must have run before it can be taken over.
RECOVER_GRACE_S = 3.0
#: Launches looked at for what a cut-off command had recorded.
RECENT_LAUNCHES = 50
#: Settled commands (answered, recovered) are deleted this many seconds after they began (their audit rows stay).
KEEP_S = 86400.0
#: Seconds between two purges of settled commands.
PURGE_EVERY_S = 3600.0


class CommandJournal:
    """Takes over and answers the commands of the bots that are gone (see the module's docstring). `alive(owner)`
    tells whether the bot `owner` (`host:pid`) still runs; `owner` is this bot."""

    def __init__(self, rows: CommandRepository, launches: LaunchRepository, surface: Surface, renderer: Renderer,
                 alive: Callable[[str], Awaitable[bool]], *, owner: str, clock: Clock = SYSTEM_CLOCK,
                 grace_s: float = RECOVER_GRACE_S):
        self._rows = rows
        self._launches = launches
        self._surface = surface
        self._renderer = renderer
        self._alive = alive
        self.owner = owner
        self._clock = clock
        self.grace_s = grace_s
        self._purged_at: float | None = None

    async def recover(self) -> int:
        """Take over and answer every command a gone bot left unsettled. Returns how many were answered. Raises
        what the database raises (the caller tries again later)."""
        now = self._clock.time()
        if self._purged_at is None or now - self._purged_at >= PURGE_EVERY_S:
            self._purged_at = now
            await asyncio.to_thread(self._rows.purge, now - KEEP_S)
        entries = await asyncio.to_thread(self._rows.unsettled, not_owner=self.owner, older_than=now - self.grace_s)
        gone: dict[str, bool] = {}
        answered = 0
        for entry in entries:
            if entry.owner not in gone:
                gone[entry.owner] = not await self._alive(entry.owner)
            if not gone[entry.owner]:
                continue
            quiet = entry.state == "finished" and (entry.answered or not entry.expects_answer)
            detail = f"the bot running it ({entry.owner}) stopped; {self.owner} took it over"
            if not await asyncio.to_thread(self._rows.take, entry, detail=detail):
                continue  # another bot, or its owner awake again, settled it first
            if quiet:
                continue
            message = await asyncio.to_thread(self._answer, entry, now)
            with answering(entry.id):
                if entry.placeholder:
                    await self._surface.update(entry.channel, entry.placeholder, message)
                else:
                    await self._surface.post(entry.channel, message, thread_ts=entry.thread_ts)
            log.warning("answered command %s (%r of %s), left %s by %s", entry.id, entry.text[:60], entry.user_id,
                        entry.state, entry.owner)
            answered += 1
        return answered

    def _answer(self, entry: JournalEntry, now: float) -> Message:
        """The answer to `entry` (the database read: what it recorded)."""
        asked = f"`{entry.text[:200]}` (asked by <@{entry.user_id}>)"
        if entry.state == "finished":
            result = entry.result or "done"
            said = f": {entry.detail[:300]}" if entry.detail else ""
            return self._renderer.error(
                "Answer lost", f"{asked} finished ({result}{said}), but the bot that ran it ({entry.owner}) stopped "
                               "before its answer was sent.", f"Check with `{slash('status')}`.")
        made = [la for la in self._launches.recent(RECENT_LAUNCHES)
                if la.created_by == entry.user_id and la.created_at >= entry.started_at - 1.0
                and la.channel in (entry.channel, None)]
        if made:
            recorded = "It had recorded " + ", ".join(f"{la.name} ({la.state.value})" for la in reversed(made)) \
                + ": this bot follows it in its thread."
        else:
            recorded = "It had recorded no launch."
        return self._renderer.error(
            "Not finished", f"{asked} was cut off: it began {fmt_duration(max(0.0, now - entry.started_at))} ago "
                            f"and the bot running it ({entry.owner}) stopped; {self.owner} took over. " + recorded,
            f"Check with `{slash('status')}` before repeating it.")
