"""The answers to the commands of a bot that is gone.

Every command from Slack is written ahead (bot.services.audit.Audit.begin_command: table `commands` with its audit
row, result `running`) before its work starts, and the rows of its answer are queued only while its bot holds it
(bot.adapters.store.commands). A bot that dies (SIGKILL, a lost host) or is taken for gone (frozen past its lease:
the new leader ended its sessions) leaves such a command `running`, or `finished` with no answer queued. The leader
(`CommandJournal.recover`, at takeover and every second or so) takes each one over once (compare and set in the
database: a bot that wakes up finds its command taken and queues nothing) and answers it where it was asked, in its
progress message when one was posted:

* `running`: the work was cut off. Its audit row becomes `interrupted`; the answer says what was asked, by whom,
  that the bot running it stopped, and what it had recorded (the launches the user started since: the leader
  follows them, and settles one left `starting` at takeover), and to check before repeating it.
* `finished` without an answer: the work was done and audited, but the bot stopped before its answer was queued:
  the answer gives the result the audit row holds.
* `finished` with no message to send, or one for its user alone (denied, invalid: a public "lost" would be
  noise), or begun more than STALE_S ago (its answer may have gone straight to Slack while the database refused
  its row): settled without a word.

A bot is gone when its life lock is free (bot.adapters.locks.DecisionLocks.alive) at two looks `confirm_s` apart
(a live bot whose session a database restart ended takes its lock again within a second); commands younger than
`grace_s` are left alone. Limits: a bot killed between Slack's ack and the command's journal row (a few
milliseconds) leaves nothing to answer; a leader that dies between taking a command over and queueing its answer
leaves it unanswered (one database write apart); the work a dead bot did on a host is not redone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from bot.adapters.store.commands import CommandRepository, JournalEntry
from bot.adapters.store.launches import LaunchRepository
from bot.core.clock import SYSTEM_CLOCK, Clock
from bot.core.commands import slash
from bot.present.render import Message, Renderer, fmt_duration
from bot.services.surface import OutboxSurface, Surface

log = logging.getLogger(__name__)

#: Seconds a command of another bot must have run before it can be taken over.
RECOVER_GRACE_S = 3.0
#: Seconds a bot must stay gone (its life lock free) before its commands are taken over, on a shared database.
CONFIRM_GONE_S = 3.0
#: A command begun longer ago than this is settled without a word (its answer may have gone straight to Slack).
STALE_S = 3600.0
#: Results whose answer only its user sees: never told publicly as lost.
PRIVATE_RESULTS = frozenset({"denied", "invalid", "unknown", "ignored"})
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
                 grace_s: float = RECOVER_GRACE_S, confirm_s: float = CONFIRM_GONE_S):
        self._rows = rows
        self._launches = launches
        self._surface = surface
        self._renderer = renderer
        self._alive = alive
        self.owner = owner
        self._clock = clock
        self.grace_s = grace_s
        self.confirm_s = confirm_s
        self._purged_at: float | None = None
        self._gone_since: dict[str, float] = {}  # owner -> monotonic s when its life lock was first seen free

    async def recover(self) -> int:
        """Take over and answer every command a gone bot left unsettled. Returns how many were answered. Raises
        what the database raises (the caller tries again later)."""
        now = self._clock.time()
        if self._purged_at is None or now - self._purged_at >= PURGE_EVERY_S:
            self._purged_at = now
            await asyncio.to_thread(self._rows.purge, now - KEEP_S)
        entries = await asyncio.to_thread(self._rows.unsettled, not_owner=self.owner, older_than=now - self.grace_s)
        gone = {owner: await self._gone(owner) for owner in dict.fromkeys(e.owner for e in entries)}
        for owner in [o for o in self._gone_since if o not in gone]:
            del self._gone_since[owner]  # nothing of it left to answer
        answered = 0
        for entry in entries:
            if not gone[entry.owner]:
                continue
            quiet = now - entry.started_at > STALE_S or (entry.state == "finished" and (
                not entry.expects_answer or entry.result in PRIVATE_RESULTS))
            detail = f"the bot running it ({entry.owner}) stopped; {self.owner} took it over"
            if not await asyncio.to_thread(self._rows.take, entry, detail=detail):
                continue  # another bot, or its owner awake again, settled it first
            if quiet:
                continue
            message = await asyncio.to_thread(self._answer, entry, now)
            if entry.placeholder:
                await self._surface.update(entry.channel, entry.placeholder, message)
            elif isinstance(self._surface, OutboxSurface):
                await self._surface.post(entry.channel, message, thread_ts=entry.thread_ts, wait_s=0)
            else:
                await self._surface.post(entry.channel, message, thread_ts=entry.thread_ts)
            log.warning("answered command %s (%r of %s), left %s by %s", entry.id, entry.text[:60], entry.user_id,
                        entry.state, entry.owner)
            answered += 1
        return answered

    async def _gone(self, owner: str) -> bool:
        """True when bot `owner` has been gone (its life lock free) for `confirm_s` seconds: seen free at a look that
        long after the first look that found it free."""
        if await self._alive(owner):
            self._gone_since.pop(owner, None)
            return False
        first = self._gone_since.setdefault(owner, time.monotonic())
        return time.monotonic() - first >= self.confirm_s

    def _answer(self, entry: JournalEntry, now: float) -> Message:
        """The answer to `entry` (the database read: what it recorded), saying who asked it."""
        return self._said(entry, now).asked_by(entry.user_id, entry.text)

    def _said(self, entry: JournalEntry, now: float) -> Message:
        asked = f"`{entry.text[:200]}`"
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
