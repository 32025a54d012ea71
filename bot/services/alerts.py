"""Alerts in a launch's incident thread: the verdict with its evidence, the timeline chart attached, and
the root message edited to show the verdict."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from bot.adapters.cpu import CpuPool
from bot.core.clock import SYSTEM_CLOCK, Clock
from bot.core.diagnose import Verdict
from bot.core.models import Launch
from bot.core.observe import phase_times
from bot.core.records import CheckRecord
from bot.present.chart import draw_timeline, timeline_inputs
from bot.present.render import Message, Renderer
from bot.present.views import alert_view
from bot.services.history import CheckHistory
from bot.services.surface import Surface
from bot.services.threads import IncidentThreads

if TYPE_CHECKING:
    from bot.adapters.metrics import Metrics  # only the type: prometheus_client is imported by the wiring

log = logging.getLogger(__name__)


class AlertPoster:
    """Posts one alert per verdict change (the watcher decides when); its chart is drawn by `cpu` (off the event
    loop)."""

    def __init__(self, surface: Surface, renderer: Renderer, threads: IncidentThreads, history: CheckHistory,
                 cpu: CpuPool, clock: Clock = SYSTEM_CLOCK, metrics: Metrics | None = None):
        self._clock = clock
        self._metrics = metrics
        self._surface = surface
        self._render = renderer
        self._threads = threads
        self._history = history
        self._cpu = cpu

    async def post(self, la: Launch, verdict: Verdict, record: CheckRecord, *, recovered: bool = False,
                   files: list[tuple[str, bytes]] | None = None) -> bool:
        """Compose the alert (`compose`) and queue it (`send`). Returns True when it was posted or queued; False
        without a channel or when refused."""
        msg = await self.compose(la, verdict, record, recovered=recovered, files=files)
        return await self.send(la, verdict, msg) if msg is not None else False

    async def compose(self, la: Launch, verdict: Verdict, record: CheckRecord, *, recovered: bool = False,
                      files: list[tuple[str, bytes]] | None = None) -> Message | None:
        """The alert for `verdict` in `la`'s thread: short (headline, key evidence, buttons, next steps), with the
        full evidence (when longer) and the timeline PNG attached (a chart failure never costs the alert).
        `recovered`: the one message after a problem while serving. `files`: more attachments (name, bytes), e.g.
        the ranks' stack dump. The slow part of an alert (the records read, the chart drawn), done before the
        watcher records the alert so that recording and queueing follow each other with nothing in between. None
        without a channel."""
        if not la.channel:
            return None
        # the records' times are the host's clock, created_at the bot's: the time since the launch is the
        # bot's, the phases are the host's, with the launch's start moved onto the host's clock
        bot_now = self._clock.time()
        host_now = record.t
        try:
            records = await self._history.all(la.id)
        except Exception:  # the database refused: the alert goes without the phases and the chart
            log.exception("the records of %s could not be read for its alert", la.name)
            records = self._history.kept(la.id)
        view = alert_view(la, verdict, elapsed_s=max(0.0, bot_now - la.created_at),
                          phases=phase_times(records, la.created_at + (host_now - bot_now), host_now),
                          recovered=recovered)
        msg = self._render.render("alert", **view)
        if view["more_evidence"]:
            msg.files.append((f"{la.variant}-{la.id}-evidence.txt",
                              self._render.text("alert_evidence", **view).encode("utf-8", "replace")))
        msg.files.extend(files or [])
        try:
            png = await self._cpu.run(draw_timeline, timeline_inputs(la, records, self._render.redactor))
            msg.files.append((f"{la.variant}-{la.id}-timeline.png", png))
        except Exception:
            log.exception("timeline chart of %s failed", la.name)
        return msg

    async def send(self, la: Launch, verdict: Verdict, msg: Message) -> bool:
        """Queue a composed alert in `la`'s thread and show the verdict on the root message. Returns True when it
        was posted or queued; False when refused."""
        if not la.channel:
            return False
        ts = await self._surface.post(la.channel, msg, thread_ts=la.thread_ts)
        await self._threads.show(la, verdict)
        if ts is not None and self._metrics is not None:
            self._metrics.count_alert(verdict.verdict)
        return ts is not None
