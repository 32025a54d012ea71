"""Typed kills ask first: what would be killed, with [Kill] [Cancel]; the first operator's click decides.

A confirmation is a one-shot record (table `confirmations`) valid for `ttl_s` seconds. `confirm` and
`cancel` claim it atomically, so two clicks never act twice: the loser is told who decided (or that it
expired). A confirmed kill runs through the LaunchService like any other kill.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.adapters.store.confirmations import ConfirmationRepository
from bot.core.lifecycle import KillOutcome, KillPreview
from bot.core.models import Confirmation, ConfirmationState, Launch, LaunchState
from bot.present.views import user_mention
from bot.services.launches import LaunchService

#: Seconds a typed kill's [Kill] button stays valid.
CONFIRM_TTL_S = 3600.0


@dataclass
class KillRequest:
    """A typed kill, previewed: what it would stop, and the pending confirmation (None when there is nothing
    to confirm: a pid that holds no GPU, or a host that could not be read for a pid kill)."""

    preview: KillPreview
    confirmation: Confirmation | None


@dataclass
class Decision:
    """The outcome of a click on a confirmation: the confirmation (None when unknown), whether this click
    decided it (`won`), and `why` it did not (already confirmed/cancelled by someone, or expired)."""

    confirmation: Confirmation | None
    won: bool
    why: str | None = None

    def what(self) -> str:
        """`launch 7` or `pid 123 on gpu-host-1`: what the confirmation is about."""
        c = self.confirmation
        if c is None:
            return "?"
        return f"pid {c.pid} on {c.host}" if c.pid is not None else f"launch {c.launch_id}"


@dataclass
class ConfirmedKill:
    """A confirmed kill that ran: its decision, the outcome, and the launch afterwards (None for a pid)."""

    decision: Decision
    outcome: KillOutcome
    launch: Launch | None


#: Who decided a confirmation the bot closed itself (its kill was not needed any more): no Slack user.
CLOSED_BY_BOT = "gpubot"


class ConfirmationService:
    """Asks and decides typed kill confirmations."""

    def __init__(self, confirmations: ConfirmationRepository, launches: LaunchService, *,
                 ttl_s: float = CONFIRM_TTL_S):
        self._rows = confirmations
        self._launches = launches
        self.ttl_s = ttl_s

    async def ask_kill(self, la: Launch, *, user: str) -> KillRequest:
        """Preview a kill of `la` and record a pending confirmation when it has processes (or its host could
        not be read: the kill may still be tried)."""
        pv = await self._launches.kill_preview(la)
        if not (pv.processes or pv.error):
            return KillRequest(pv, None)
        return KillRequest(pv, self._rows.add(asked_by=user, host=la.host, launch_id=la.id))

    async def ask_kill_pid(self, host: str, pid: int, *, user: str) -> KillRequest:
        """Preview a kill of one foreign GPU-holding process and record a pending confirmation carrying its
        command line (so a reused pid is refused later). None confirmation when there is nothing to confirm."""
        pv = await self._launches.kill_pid_preview(host, pid)
        if pv.refusal or pv.error or not pv.processes:
            return KillRequest(pv, None)
        return KillRequest(pv, self._rows.add(asked_by=user, host=host, pid=pid, command=pv.processes[0].args))

    def _decide(self, conf_id: int, state: ConfirmationState, user: str) -> Decision:
        conf, won = self._rows.claim(conf_id, state=state, user_id=user, max_age_s=self.ttl_s)
        if conf is None or won:
            return Decision(conf, won)
        if conf.state != ConfirmationState.PENDING and conf.decided_by == CLOSED_BY_BOT:
            why = "not needed: it was closed when its launch had already ended and nothing of it ran"
        elif conf.state != ConfirmationState.PENDING:
            why = f"already {conf.state} by {user_mention(conf.decided_by or '')}"
        else:
            why = f"expired (older than {self.ttl_s / 60:.0f} min); type the kill again"
        return Decision(conf, False, why)

    async def _ended_with_nothing_left(self, conf_id: int) -> Launch | None:
        """The launch of pending confirmation `conf_id` when it has ended (not live, no kill stopping it) AND a
        fresh look finds none of its processes: a kill done meanwhile left nothing to confirm. An ended launch
        whose leftovers still run (a crash that left its ranks holding GPUs) is not: its kill goes on. None
        otherwise."""
        pending = self._rows.get(conf_id)
        if pending is None or pending.state != ConfirmationState.PENDING or pending.launch_id is None:
            return None
        la = self._launches.get(pending.launch_id)
        if la is None or la.live or la.state == LaunchState.STOPPING:
            return None
        pv = await self._launches.kill_preview(la)
        return la if not pv.processes and not pv.error else None

    def cancel(self, conf_id: int, *, user: str) -> Decision:
        """Decide confirmation `conf_id` as cancelled if it is still pending (nothing is stopped)."""
        return self._decide(conf_id, ConfirmationState.CANCELLED, user)

    async def confirm(self, conf_id: int, *, user: str, channel: str | None = None) -> Decision | ConfirmedKill:
        """Decide confirmation `conf_id` as confirmed and run its kill. Returns the Decision alone when this
        click did not decide it (unknown, already decided, expired), else the ConfirmedKill."""
        ended = await self._ended_with_nothing_left(conf_id)
        if ended is not None:  # killed meanwhile (`--yes`, another confirmation): nothing left to stop
            d = self._decide(conf_id, ConfirmationState.CANCELLED, CLOSED_BY_BOT)
            if d.won:
                return Decision(d.confirmation, False, f"not needed: {ended.name} already ended "
                                                       f"({ended.state.value}) and nothing of it runs")
            return d
        d = self._decide(conf_id, ConfirmationState.CONFIRMED, user)
        if not d.won or d.confirmation is None:
            return d
        c = d.confirmation
        if c.pid is not None:
            out = await self._launches.kill_pid(c.host, c.pid, user=user, channel=channel, expect_command=c.command)
            return ConfirmedKill(d, out, None)
        la = self._launches.get(c.launch_id) if c.launch_id is not None else None
        if la is None:
            return ConfirmedKill(d, KillOutcome(target=d.what(), error="the launch is no longer known"), None)
        out = await self._launches.kill(la, user=user, channel=channel)
        return ConfirmedKill(d, out, self._launches.get(la.id))
