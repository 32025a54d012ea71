"""Follow every launch until it is ready: persisted APScheduler checks, observations, verdicts, alerts.

One APScheduler job per live launch lives in the same database as the launches (SQLAlchemyJobStore, table
`apscheduler_jobs`): a module-level job function `check_launch(launch_id)` that takes only the launch id,
deterministic job ids `watch:<id>` with `replace_existing`, a large `misfire_grace_time`, `coalesce`,
`max_instances=1`, UTC. After a restart the jobs come back from the database.

Each check probes the launch (processes, log, GPUs, port, health) in one round trip, turns the snapshot
into a `bot.core.diagnose.Observation`, stores a compact observation row, and runs the pure `diagnose()` over
the history. Only a change of verdict is posted to the launch's thread, once: the verdict is written to
the launch row before the alert is sent, so a restart never repeats it.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Any

from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger

from bot.adapters.store import Launch
from bot.config import WatchPolicy
from bot.core.diagnose import Observation, Verdict, diagnose, scan_log
from bot.core.models import HostFailure, Snapshot
from bot.present.render import Message, render
from bot.services.launches import LaunchService
from bot.services.surface import Surface

log = logging.getLogger(__name__)

#: Verdicts that end the watch (the launch is no longer starting).
FINAL_VERDICTS = frozenset({"ready", "crashed", "oom", "host_oom", "nccl_error", "cuda_error", "port_in_use",
                            "gpu_lost", "exited"})
#: Verdicts that are news for the thread (a change into `loading` is only posted when leaving a problem).
QUIET_VERDICTS = frozenset({"loading", "unknown"})

_WATCHER: Watcher | None = None


async def post_digest() -> None:
    """The persisted digest job: `/gpu status` of every host, posted to `watch.digest_channel`."""
    watcher = _WATCHER
    if watcher is not None:
        await watcher.digest()


async def check_launch(launch_id: int) -> None:
    """The persisted APScheduler job: one readiness check of launch `launch_id` (only the id is pickled)."""
    watcher = _WATCHER
    if watcher is None:
        log.warning("check of launch %s skipped: no watcher is running", launch_id)
        return
    await watcher.check(launch_id)


@dataclass
class CheckResult:
    """What one check saw: the verdict, whether it was news (posted), and the launch afterwards."""

    verdict: Verdict | None
    alerted: bool
    launch: Launch | None
    error: str | None = None


class Watcher:
    """Schedules and runs readiness checks. `surface` posts alerts (Slack or console); `now` is injectable
    for tests (epoch seconds)."""

    def __init__(self, launches: LaunchService, surface: Surface | None, *, db_url: str,
                 policy: WatchPolicy | None = None):
        self.launches = launches
        self.store = launches.store
        self.surface = surface
        self.policy = policy or launches.config.watch
        self.scheduler = AsyncIOScheduler(
            jobstores={"default": SQLAlchemyJobStore(url=db_url, tablename="apscheduler_jobs")},
            job_defaults={"misfire_grace_time": 3600, "coalesce": True, "max_instances": 1},
            timezone=dt.UTC,
        )

    async def start(self) -> None:
        """Start the scheduler (inside the running loop), make sure every live launch is watched, and
        schedule the `/gpu status` digest when `watch.digest_cron` and `watch.digest_channel` are set."""
        global _WATCHER
        _WATCHER = self
        self.scheduler.start()
        policy = self.launches.config.watch
        if policy.digest_cron and policy.digest_channel:
            self.scheduler.add_job(post_digest, CronTrigger.from_crontab(policy.digest_cron, timezone=dt.UTC),
                                   id="digest", replace_existing=True)
        elif self.scheduler.get_job("digest") is not None:
            self.scheduler.remove_job("digest")
        if self.watch not in self.launches.started_listeners:
            self.launches.started_listeners.append(self.watch)
        for la in self.store.live_launches():
            if self.scheduler.get_job(f"watch:{la.id}") is None:
                self.watch(la)

    async def stop(self) -> None:
        """Stop the scheduler without running pending jobs; the jobs stay in the database."""
        global _WATCHER
        self.scheduler.shutdown(wait=False)
        if _WATCHER is self:
            _WATCHER = None

    def _policy(self, la: Launch) -> WatchPolicy:
        if la.variant in self.launches.config.variants:
            v = self.launches.config.resolved_variant(la.variant)
            if v.watch is not None:
                return v.watch
        return self.policy

    def watch(self, la: Launch) -> None:
        """Add (or replace) the launch's job: every `interval_s`, first run one interval from now."""
        interval = self._policy(la).interval_s
        self.scheduler.add_job(check_launch, "interval", seconds=interval, args=[la.id], id=f"watch:{la.id}",
                               replace_existing=True,
                               next_run_time=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=interval))

    async def digest(self) -> bool:
        """Post `/gpu status` of every configured host (holders labelled by launch) to the digest channel.
        Returns True when it was posted."""
        from bot.present.views import status_view

        channel = self.launches.config.watch.digest_channel
        if self.surface is None or not channel:
            return False
        hosts = self.launches.config.host_names()
        results = await self.launches.hosts.status(hosts)
        owners = {r.host: {h.pid: h.owner for h in self.launches.holders(r)} for r in results
                  if not isinstance(r, HostFailure)}
        return await self.surface.post(channel, render("status", **status_view(results, owners))) is not None

    def unwatch(self, launch_id: int) -> None:
        """Remove the launch's job (no error when there is none)."""
        job = self.scheduler.get_job(f"watch:{launch_id}")
        if job is not None:
            job.remove()

    async def check(self, launch_id: int) -> CheckResult:
        """Probe, record, diagnose; post the verdict when it changed. Never raises."""
        try:
            return await self._check(launch_id)
        except Exception as e:  # a bug in one check must not kill the job or the loop
            log.exception("check of launch %s failed", launch_id)
            return CheckResult(None, False, self.store.get_launch(launch_id), error=type(e).__name__)

    async def _check(self, launch_id: int) -> CheckResult:
        la = self.store.get_launch(launch_id)
        if la is None or not la.live:
            self.unwatch(launch_id)
            return CheckResult(None, False, la)
        snap = await self.launches.probe_launch(la, tail_lines=200)
        if isinstance(snap, HostFailure):
            self.store.add_observation(la.id, {"t": time.time(), "error": snap.reason})
            return CheckResult(None, False, la, error=snap.reason)
        prev = self.store.last_observation(la.id)
        obs, record = observation_from_snapshot(snap, la, prev)
        policy = self._policy(la)
        verdict = diagnose(obs, grace_s=policy.phase_grace_s or None, silence_after_s=policy.silence_after_s)
        if verdict.verdict == "unknown" and obs.process_alive is False and (prev or {}).get("alive"):
            # it ran, now nothing of it is left and the log says nothing: it exited (killed from outside,
            # host OOM killer, ...): that is news and ends the watch
            verdict = Verdict("exited", verdict.phase,
                              ["no process of the launch is alive any more, and the log gives no reason",
                               *verdict.evidence],
                              ["Check the kernel log on the host: `dmesg | tail` (OOM killer?)",
                               "Look at who stopped it: the thread's history and the events table",
                               *verdict.next_steps],
                              "The launch's processes are gone without an error in the log.")
        record["verdict"], record["phase"] = verdict.verdict, verdict.phase
        self.store.add_observation(la.id, record)
        current = self.store.get_launch(la.id)
        if current is None or not current.live:  # killed while this check ran: a deliberate stop is no news
            self.unwatch(la.id)
            return CheckResult(verdict, False, current)
        alerted = False
        if current.snoozed_until and time.time() < current.snoozed_until:
            return CheckResult(verdict, False, current)  # nothing recorded: the change is posted after the snooze
        if verdict.verdict != la.alert_state and not (verdict.verdict in QUIET_VERDICTS and la.alert_state in
                                                      (None, "", *QUIET_VERDICTS)):
            # record first: a crash or restart after this line never posts the same alert twice
            la = self.store.update_launch(la.id, alert_state=verdict.verdict, state_detail=verdict.summary[:300])
            alerted = await self._post_alert(la, verdict, record)
        elif verdict.verdict != la.alert_state:
            la = self.store.update_launch(la.id, alert_state=verdict.verdict)
        if verdict.verdict in FINAL_VERDICTS:
            self.unwatch(la.id)
            now_la = self.store.get_launch(la.id)
            if verdict.verdict != "ready" and not snap.tagged_pids and now_la is not None and now_la.live:
                la = self.store.update_launch(la.id, state="exited" if verdict.verdict == "exited" else "failed")
        return CheckResult(verdict, alerted, la)

    async def _post_alert(self, la: Launch, verdict: Verdict, record: dict[str, Any]) -> bool:
        if self.surface is None or not la.channel:
            return False
        elapsed = record.get("t", time.time()) - la.created_at
        phases = phase_times(self.store.observations(la.id), la.created_at, record.get("t", time.time()))
        msg: Message = render("alert", name=la.name, host=la.host, verdict=verdict.verdict, phase=verdict.phase,
                              summary=verdict.summary, evidence=verdict.evidence[:30],
                              next_steps=verdict.next_steps[:6], who_mention=_mention(la.created_by),
                              elapsed_s=elapsed, phases=phases if verdict.verdict == "ready" else [],
                              launch_id=la.id, buttons=verdict.verdict != "ready")
        try:
            msg.files.append((f"{la.variant}-{la.id}-timeline.png", chart_png(la, self.store.observations(la.id))))
        except Exception:  # a chart must never cost the alert
            log.exception("timeline chart of %s failed", la.name)
        ts = await self.surface.post(la.channel, msg, thread_ts=la.thread_ts)
        if la.thread_ts:
            await self.surface.update(la.channel, la.thread_ts,
                                      render("launch_root", **_root_view(la, verdict)))
        return ts is not None


def chart_png(la: Launch, records: list[dict[str, Any]]) -> bytes:
    """The launch's timeline (bot.present.chart): per-GPU memory and utilization and log lines over its life, with
    phase starts and verdict changes marked. Returns PNG bytes."""
    from bot.present.chart import ChartPoint, timeline_png

    points, phases, verdicts = [], [], []
    seen_phases: set[str] = set()
    last_verdict = None
    for rec in records:
        t = rec.get("t")
        if not isinstance(t, (int, float)) or "error" in rec:
            continue
        rel = max(0.0, t - la.created_at)
        points.append(ChartPoint(
            t_s=rel,
            gpu_mem_mib={int(k): v for k, v in (rec.get("gpu_mem_mib") or {}).items()},
            gpu_util_pct={int(k): v for k, v in (rec.get("gpu_util_pct") or {}).items()},
            log_lines=rec.get("log_lines"),
        ))
        ph = rec.get("phase")
        if ph and ph not in seen_phases:
            seen_phases.add(ph)
            phases.append((rel, ph))
        if rec.get("verdict") and rec.get("verdict") != last_verdict:
            last_verdict = rec["verdict"]
            verdicts.append((rel, last_verdict))
    return timeline_png(points, title=f"{la.name} on {la.host}", phases=phases, verdicts=verdicts)


def phase_times(records: list[dict[str, Any]], started_at: float, now: float) -> list[tuple[str, float]]:
    """(phase, seconds spent in it) in the order the checks first saw each phase (pure). A phase lasts from
    the first check that saw it to the first check that saw the next one (the last one until `now`)."""
    firsts: list[tuple[str, float]] = []
    for rec in records:
        ph, t = rec.get("phase"), rec.get("t")
        if ph and isinstance(t, (int, float)) and all(ph != p for p, _ in firsts):
            firsts.append((ph, float(t)))
    out = []
    for i, (ph, t) in enumerate(firsts):
        end = firsts[i + 1][1] if i + 1 < len(firsts) else now
        out.append((ph, max(0.0, end - max(t, started_at))))
    return out


def _mention(user_id: str) -> str:
    import re

    return f"<@{user_id}>" if re.fullmatch(r"[UW][A-Z0-9]{2,}", user_id or "") else ""


def _root_view(la: Launch, verdict: Verdict) -> dict[str, Any]:
    from bot.present.views import launch_view

    view = launch_view(la)
    view["state_detail"] = f"{verdict.verdict}" + (f" in {verdict.phase}" if verdict.phase else "")
    return view


def observation_from_snapshot(snap: Snapshot, la: Launch, prev: dict[str, Any] | None
                              ) -> tuple[Observation, dict[str, Any]]:
    """Turn one probe of a launch into a diagnose() Observation plus the compact record stored for history
    and charts (pure). Log silence is measured from the last line that is not a heartbeat: it resets when
    the newest meaningful line changes. Times are the remote clock, in seconds."""
    now = snap.clock if snap.clock is not None else time.time()
    lines = list(snap.log.tail) if snap.log and snap.log.tail else []
    scan = scan_log(lines)
    marker = lines[scan.meaningful[-1]] if scan.meaningful else None
    prev = prev or {}
    last_progress = prev.get("last_progress_t")
    if marker is not None and marker != prev.get("marker"):
        # new progress: when the newest line IS that progress line, the log's mtime is when it was written
        newest_is_marker = bool(scan.meaningful) and scan.meaningful[-1] == len(scan.lines) - 1
        mtime = snap.log.mtime if snap.log else None
        last_progress = mtime if newest_is_marker and mtime is not None and mtime <= now else now
    if last_progress is None:
        last_progress = snap.log.mtime if snap.log and snap.log.mtime is not None else now
    size = snap.log.size_bytes if snap.log else None
    procs = [p for p in snap.table if p.pid in set(snap.tagged_pids)] or snap.processes
    # only the launch's own GPUs count: other launches on other GPUs of the host are not orphans
    mine = set(la.gpus)
    gpus = [g for g in snap.gpu.gpus if not mine or g.index in mine] if snap.gpu.ok else None
    gpu_procs = [p for p in snap.gpu.processes if not mine or p.gpu_index in mine] if snap.gpu.ok else None
    log_error = snap.log.error if snap.log else None
    obs = Observation(
        log_lines=lines,
        log_silent_s=None if log_error else max(0.0, now - last_progress),
        notes=[f"the log could not be read: {log_error}"] if log_error else [],
        log_growing=(size is not None and prev.get("log_bytes") is not None and size > prev["log_bytes"]),
        elapsed_s=max(0.0, now - la.created_at),
        process_alive=bool(snap.tagged_pids),
        processes=procs,
        launch_pids=set(snap.tagged_pids),
        gpus=gpus,
        gpu_processes=gpu_procs,
        gpu_error_lines=[snap.gpu.error] if not snap.gpu.ok and snap.gpu.error else None,
        gpu_mem_rising=_rising(gpus, prev),
        cpu_time_growing=_cpu_growing(procs, prev),
        port=la.port,
        port_open=snap.port_listening,
        health=snap.health.status if snap.health else None,
    )
    record = {
        "t": now,
        "marker": marker,
        "last_progress_t": last_progress,
        "log_bytes": size,
        "log_lines": snap.log.lines if snap.log else None,
        "gpu_mem_mib": {str(g.index): g.memory_used_mib for g in gpus or []},
        "gpu_util_pct": {str(g.index): g.utilization_gpu_pct for g in gpus or []},
        "gpu_power_w": {str(g.index): g.power_draw_w for g in gpus or []},
        "cpu_s": {str(p.pid): p.cpu_time_s for p in procs},
        "alive": bool(snap.tagged_pids),
        "port_open": snap.port_listening,
        "health": snap.health.status if snap.health else None,
    }
    return obs, record


def _cpu_growing(procs: list, prev: dict[str, Any]) -> bool | None:
    before = prev.get("cpu_s") or {}
    grew = [p.cpu_time_s > before[str(p.pid)] for p in procs
            if p.cpu_time_s is not None and before.get(str(p.pid)) is not None]
    return any(grew) if grew else None


def _rising(gpus: list | None, prev: dict[str, Any]) -> bool | None:
    before = prev.get("gpu_mem_mib")
    if not gpus or not before:
        return None
    now = sum(g.memory_used_mib or 0.0 for g in gpus)
    return now > sum(v or 0.0 for v in before.values()) + 64.0
