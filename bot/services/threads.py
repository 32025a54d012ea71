"""Incident threads: the root message of each launch, posted once and edited in place.

Every launch opens one thread: a root message in its channel (variant, host, params, who, state, PID,
port, GPUs, log). Everything about the launch goes into the thread under it. When the state changes the
root is edited (`chat.update`), unless a newer launch (a relaunch) now owns the thread.
"""

from __future__ import annotations

import json
import logging

from bot.adapters.store.launches import LaunchRepository
from bot.core.diagnose import Verdict
from bot.core.models import Launch
from bot.present.render import Message, Renderer
from bot.present.views import launch_view
from bot.services.surface import Surface

log = logging.getLogger(__name__)


class IncidentThreads:
    """Posts and edits launches' root messages through `surface`."""

    def __init__(self, launches: LaunchRepository, surface: Surface, renderer: Renderer):
        self._launches = launches
        self._surface = surface
        self._render = renderer
        # what each root message shows now, (channel, ts) -> (text, blocks as JSON): an edit that would change
        # nothing is not sent (a check that records a field the root does not show)
        self._shown: dict[tuple[str, str], tuple[str, str]] = {}

    async def open(self, la: Launch) -> Launch:
        """Post `la`'s root message in its channel and record the thread (a ts, or a `q:` reference while
        queued). Returns the launch as stored; unchanged when it has no channel or the post failed (logged)."""
        if not la.channel:
            return la
        try:
            msg = self._render.render("launch_root", **launch_view(la))
            ts = await self._surface.post(la.channel, msg)
        except Exception:
            log.exception("posting the root message of %s failed", la.name)
            return la
        if ts:
            self._remember(la.channel, ts, msg)
        return self._launches.update(la.id, thread_ts=ts) if ts else la

    async def show(self, la: Launch, verdict: Verdict | None = None) -> bool:
        """Edit the root message to show `la` as it is now (with `verdict` and its phase when given). Returns
        False when there is nothing to edit, or the thread now belongs to a newer launch (whose state the root
        shows). Failures are logged, never raised."""
        if not la.channel or not la.thread_ts:
            return False
        newest = self._launches.for_thread(la.channel, la.thread_ts)
        if newest is not None and newest.id != la.id:
            return False
        try:
            msg = self._render.render("launch_root", **launch_view(la, verdict))
            if self._shown.get((la.channel, la.thread_ts)) == _content(msg):
                return True  # it already shows exactly this
            updated = await self._surface.update(la.channel, la.thread_ts, msg)
        except Exception:
            log.exception("updating the root message of %s failed", la.name)
            return False
        if updated:
            self._remember(la.channel, la.thread_ts, msg)
        return updated

    async def post(self, la: Launch, template: str, /, **context: object) -> bool:
        """Post template `template` rendered with `context` in `la`'s thread (nothing without a channel). Returns
        whether it was posted; never raises (a failure is logged)."""
        if not la.channel:
            return False
        try:
            msg = self._render.render(template, **context)
            return await self._surface.post(la.channel, msg, thread_ts=la.thread_ts) is not None
        except Exception:
            log.exception("posting %s in the thread of %s failed", template, la.name)
            return False

    def _remember(self, channel: str, ts: str, msg: Message) -> None:
        """Keep what the root message (channel, ts) shows (the SHOWN_KEPT newest roots)."""
        key = (channel, ts)
        self._shown.pop(key, None)
        self._shown[key] = _content(msg)
        while len(self._shown) > SHOWN_KEPT:
            self._shown.pop(next(iter(self._shown)))


#: Root messages whose content is remembered (to skip edits that change nothing).
SHOWN_KEPT = 1024


def _content(msg: Message) -> tuple[str, str]:
    return msg.text, json.dumps(msg.blocks, sort_keys=True)
