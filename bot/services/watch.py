"""Follow every launch until it is ready: scheduled checks, observations, verdicts, alerts.

Each check probes the launch (processes, log, GPUs, port, health) in one round trip, turns the snapshot
into an Observation and a compact record (bot.core.observe), stores the record, and judges it with the pure
`diagnose()`. Only a change of verdict is posted to the launch's thread, once: the verdict is written to
the launch before the alert is sent, so a restart never repeats it. The scheduling (persisted APScheduler
jobs) is bot.adapters.scheduler.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from bot.adapters.scheduler import Scheduler
from bot.adapters.store import Store
from bot.config import Config, WatchPolicy
from bot.core.diagnose import Verdict
from bot.core.models import HostFailure, Launch, LaunchState
from bot.core.observe import FINAL_VERDICTS, is_news, judge, observation_from_snapshot
from bot.present.chart import launch_timeline_png
from bot.present.render import Renderer
from bot.present.views import status_view
from bot.services.alerts import AlertPoster
from bot.services.launches import LaunchService
from bot.services.surface import Surface
from bot.services.threads import IncidentThreads

log = logging.getLogger(__name__)


@dataclass
class CheckResult:
    """What one check saw: the verdict, whether it was news (posted), and the launch afterwards."""

    verdict: Verdict | None
    alerted: bool
    launch: Launch | None
    error: str | None = None


class Watcher:
    """Schedules and runs readiness checks, and the `/gpu status` digest. `policy` overrides the config's
    `watch:` (a variant's own `watch:` still wins)."""

    def __init__(self, config: Config, launches: LaunchService, store: Store, alerts: AlertPoster,
                 threads: IncidentThreads, surface: Surface, renderer: Renderer, scheduler: Scheduler, *,
                 policy: WatchPolicy | None = None):
        self.config = config
        self.launches = launches
        self._launch_rows = store.launches
        self._observations = store.observations
        self._alerts = alerts
        self._threads = threads
        self._surface = surface
        self._render = renderer
        self.scheduler = scheduler
        self.policy = policy or config.watch
        self._locks: dict[int, asyncio.Lock] = {}

    async def start(self) -> None:
        """Start the scheduler (inside the running loop), follow every live launch (also the ones an earlier
        run watched: their jobs come back from the database), and schedule the digest when
        `watch.digest_cron` and `watch.digest_channel` are set."""
        self.scheduler.start(self)
        digest = self.config.watch
        self.scheduler.set_digest(digest.digest_cron if digest.digest_cron and digest.digest_channel else None)
        if self.watch not in self.launches.started_hooks:
            self.launches.started_hooks.append(self.watch)
        if self.early_exit not in self.launches.early_exit_hooks:
            self.launches.early_exit_hooks.append(self.early_exit)
        for la in self._launch_rows.live():
            if not self.scheduler.is_watched(la.id):
                self.watch(la)

    async def stop(self) -> None:
        """Stop the scheduler without running pending jobs; the jobs stay in the database."""
        self.scheduler.shutdown(self)

    def policy_for(self, la: Launch) -> WatchPolicy:
        """The watch policy of `la`: its variant's own `watch:` when set, else this watcher's."""
        if la.variant in self.config.variants:
            v = self.config.resolved_variant(la.variant)
            if v.watch is not None:
                return v.watch
        return self.policy

    def watch(self, la: Launch) -> None:
        """Check `la` every `interval_s` seconds of its policy, the first time one interval from now."""
        self.scheduler.watch(la.id, self.policy_for(la).interval_s)

    def unwatch(self, launch_id: int) -> None:
        """Stop checking launch `launch_id`."""
        self.scheduler.unwatch(launch_id)

    async def early_exit(self, la: Launch) -> None:
        """A launch gone at its first look (LaunchService hook): check it now, so a crash or an OOM gets its
        verdict and alert instead of a bare `exited`."""
        await self.check(la.id)

    async def digest(self) -> bool:
        """Post `/gpu status` of every configured host (holders labelled by launch) to the digest channel.
        Returns True when it was posted."""
        channel = self.config.watch.digest_channel
        if not channel:
            return False
        try:
            results, owners = await self.launches.status(self.config.host_names())
            msg = self._render.render("status", **status_view(results, owners))
            return await self._surface.post(channel, msg) is not None
        except Exception:
            log.exception("the digest failed")
            return False

    def timeline(self, la: Launch) -> tuple[bytes, int]:
        """The launch's timeline chart (PNG bytes) and how many checks it shows."""
        records = self._observations.list(la.id)
        return launch_timeline_png(la, records), len(records)

    async def check(self, launch_id: int) -> CheckResult:
        """Probe, record, diagnose; post the verdict when it changed. One check of a launch at a time (the
        scheduled one and an early-exit one never race). Never raises."""
        lock = self._locks.setdefault(launch_id, asyncio.Lock())
        async with lock:
            try:
                return await self._check(launch_id)
            except Exception as e:  # a bug in one check must not kill the job or the loop
                log.exception("check of launch %s failed", launch_id)
                return CheckResult(None, False, self._launch_rows.get(launch_id), error=type(e).__name__)

    async def _check(self, launch_id: int) -> CheckResult:
        la = self._launch_rows.get(launch_id)
        if la is None or not la.live:
            self.unwatch(launch_id)
            return CheckResult(None, False, la)
        snap = await self.launches.probe_launch(la, tail_lines=200)
        if isinstance(snap, HostFailure):
            self._observations.add(la.id, {"t": time.time(), "error": snap.reason})
            return CheckResult(None, False, la, error=snap.reason)
        prev = self._observations.last(la.id)
        obs, record = observation_from_snapshot(snap, la, prev)
        policy = self.policy_for(la)
        verdict = judge(obs, prev, grace_s=policy.phase_grace_s, silence_after_s=policy.silence_after_s)
        record["verdict"], record["phase"] = verdict.verdict, verdict.phase
        self._observations.add(la.id, record)
        current = self._launch_rows.get(la.id)
        if current is None or not current.live:  # killed while this check ran: a deliberate stop is no news
            self.unwatch(la.id)
            return CheckResult(verdict, False, current)
        if current.snoozed_until and time.time() < current.snoozed_until:
            return CheckResult(verdict, False, current)  # nothing recorded: the change is posted after the snooze
        news = is_news(verdict.verdict, current.alert_state)
        fields: dict[str, object] = {}
        if verdict.verdict != current.alert_state:
            fields["alert_state"] = verdict.verdict
        if news:
            fields["state_detail"] = verdict.summary[:300]
        if verdict.verdict in FINAL_VERDICTS and verdict.verdict != "ready":
            # the verdict ends the launch (leftovers still hold GPUs: /gpu status shows them, /kill stops them)
            fields["state"] = LaunchState.EXITED if verdict.verdict == "exited" else LaunchState.FAILED
        if fields:
            # record first: a crash or restart after this line never posts the same alert twice
            la = self._launch_rows.update(la.id, **fields)
        alerted = False
        if news:
            alerted = await self._alerts.post(la, verdict, record)  # the root shows the verdict too
        elif "state" in fields:
            await self._threads.show(la, verdict)
        if verdict.verdict in FINAL_VERDICTS:
            self.unwatch(la.id)
        return CheckResult(verdict, alerted, la)
