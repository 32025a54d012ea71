"""APScheduler wiring: persisted readiness checks and the digest, in the bot's own database.

One job per watched launch lives in the same database as the launches (SQLAlchemyJobStore, table
`apscheduler_jobs`): the module-level job function `check_launch(launch_id)` takes only the launch id,
job ids are deterministic (`watch:<id>`, replaced when re-added), `misfire_grace_time` is large, with
`coalesce` and `max_instances=1`, in UTC. After a restart the jobs come back from the database; a check
that came due during the downtime runs once.

Persisted jobs can only name a module-level function and plain arguments, so the object that handles them
(`JobTarget`, the watcher) is not stored with them: each `Scheduler` runs its jobs through an executor of its own
(`_TargetExecutor`) that hands its target to the job function (its `target` argument). Several bots in one process
each run their own jobs; one bot process per database (two schedulers on one job store would run each check
twice).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import pickle
import threading
import time
from typing import Any, Protocol

from apscheduler.executors.asyncio import AsyncIOExecutor
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger

from bot.config import Config

log = logging.getLogger(__name__)

#: Seconds a check may be late (the bot was down) and still run once.
MISFIRE_GRACE_S = 3600
DIGEST_JOB = "digest"


class JobTarget(Protocol):
    """What the persisted jobs call: one readiness check of a launch, and the digest."""

    async def check(self, launch_id: int) -> Any:
        """Run one check of launch `launch_id`; must not raise."""
        ...

    async def digest(self) -> Any:
        """Post the scheduled `/gpu status` digest; must not raise."""
        ...


async def check_launch(launch_id: int, *, target: JobTarget | None = None) -> None:
    """The persisted job: one readiness check of launch `launch_id` (only the id is pickled; `target` is given by
    the scheduler's executor when the job runs)."""
    if target is None:
        log.warning("check of launch %s skipped: no scheduler is running", launch_id)
        return
    await target.check(launch_id)


async def post_digest(*, target: JobTarget | None = None) -> None:
    """The persisted digest job: `/gpu status` of every host, posted to `watch.digest_channel` (`target` as for
    `check_launch`)."""
    if target is not None:
        await target.digest()


class _Bound:
    """A job as its executor runs it: every attribute of `job`, with `func` given `target` (keyword)."""

    __slots__ = ("_job", "func")

    def __init__(self, job: Any, target: JobTarget | None):
        self._job = job
        self.func = functools.partial(job.func, target=target)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._job, name)

    def __str__(self) -> str:
        return str(self._job)


class _TargetExecutor(AsyncIOExecutor):
    """APScheduler's asyncio executor, running each job with this scheduler's `target` (set by `Scheduler.start`)
    as the job function's `target` argument."""

    def __init__(self) -> None:
        super().__init__()
        self.target: JobTarget | None = None

    def _do_submit_job(self, job: Any, run_times: list[dt.datetime]) -> None:
        super()._do_submit_job(_Bound(job, self.target), run_times)


#: The id of every launch's check job starts with this.
WATCH_JOB_PREFIX = "watch:"


def watch_job_id(launch_id: int) -> str:
    """The job id of launch `launch_id`'s checks: `watch:<id>`."""
    return f"{WATCH_JOB_PREFIX}{launch_id}"


def crontab_problem(expr: str) -> str | None:
    """Why `expr` is not a crontab expression (minute hour day month weekday), or None when it is one
    (APScheduler's `CronTrigger.from_crontab` decides)."""
    try:
        CronTrigger.from_crontab(expr)
    except ValueError as e:
        return f"not a crontab expression (minute hour day month weekday): {e}"
    return None


def config_problems(config: Config) -> list[str]:
    """`location: message` for each scheduling setting of `config` that APScheduler refuses (watch and
    variant `digest_cron`). Empty when all are fine."""
    out = []
    policies = [("watch", config.watch)] + [(f"variants.{n}.watch", v.watch) for n, v in config.variants.items()
                                            if v.watch is not None]
    for where, policy in policies:
        if policy.digest_cron is not None and (problem := crontab_problem(policy.digest_cron)):
            out.append(f"{where}.digest_cron: {problem}")
    return out


#: Seconds until the scheduler looks at its jobs again after the job store failed (a locked or full database).
JOBSTORE_RETRY_S = 2.0


class _ResilientScheduler(AsyncIOScheduler):
    """AsyncIOScheduler whose wake-up survives a job store error. APScheduler 3 catches a failure to READ the
    due jobs, but not one to write a job's next run time (`update_job`): that error escapes the event loop's
    timer callback and no timer is set again, so every check stops for good. Here it is logged and the
    scheduler looks again after JOBSTORE_RETRY_S (the job, not updated, is still due then)."""

    def _process_jobs(self) -> float | None:
        try:
            return super()._process_jobs()
        except Exception:
            log.exception("scheduler: the job store failed; looking again in %.0f s", JOBSTORE_RETRY_S)
            return JOBSTORE_RETRY_S


#: Seconds a job's new next run time (written after every run) may wait in memory before it is written.
FLUSH_S = 5.0


def _write_behind_store(url: str) -> Any:
    """An APScheduler SQLAlchemyJobStore (table `apscheduler_jobs` of the database at `url`) that keeps its jobs in
    memory too (`_WriteBehindJobStore`). Built here, not at import: SQLAlchemy is only needed by a running
    scheduler, not to check a crontab (check-config)."""
    from apscheduler.jobstores.base import JobLookupError
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from apscheduler.util import datetime_to_utc_timestamp

    class _WriteBehindJobStore(SQLAlchemyJobStore):
        """The persisted job store, with what the scheduler asks at every wake-up answered from memory.

        Plain SQLAlchemyJobStore reads the due jobs (unpickling each), the next run time, and writes the job
        back after every run: about 4 ms of a check's 5 with 500 watched launches. Here the jobs are read from
        the table once (`start`) and kept in memory; adding and removing a job (watching a launch, or not) is
        written at once, as before, so a restart always finds what is watched; a job's new next run time after a
        run is kept in memory and written with the others in one transaction, by a worker thread, at most
        FLUSH_S seconds later (a crash loses at most that: the job then runs once more after the restart, as a
        job that came due while the bot was down does). A refused write is logged and tried again."""

        def start(self, scheduler: Any, alias: str) -> None:
            super().start(scheduler, alias)
            self._mem = {job.id: job for job in super().get_all_jobs()}
            self._dirty: set[str] = set()
            self._flushed_at = time.monotonic()
            self._writer: threading.Thread | None = None
            self._guard = threading.Lock()

        def lookup_job(self, job_id: str) -> Any:
            return self._mem.get(job_id)

        def get_due_jobs(self, now: dt.datetime) -> list[Any]:
            self._maybe_flush()
            due = [j for j in self._mem.values() if j.next_run_time is not None and j.next_run_time <= now]
            return sorted(due, key=lambda j: j.next_run_time)

        def get_next_run_time(self) -> dt.datetime | None:
            times = [j.next_run_time for j in self._mem.values() if j.next_run_time is not None]
            return min(times, default=None)

        def get_all_jobs(self) -> list[Any]:
            jobs = sorted(self._mem.values(), key=lambda j: (j.next_run_time is None, j.next_run_time or 0))
            return jobs

        def add_job(self, job: Any) -> None:
            super().add_job(job)
            self._mem[job.id] = job

        def update_job(self, job: Any) -> None:
            if job.id not in self._mem:
                raise JobLookupError(job.id)
            self._mem[job.id] = job
            with self._guard:
                self._dirty.add(job.id)

        def remove_job(self, job_id: str) -> None:
            super().remove_job(job_id)
            self._mem.pop(job_id, None)
            with self._guard:
                self._dirty.discard(job_id)

        def remove_all_jobs(self) -> None:
            super().remove_all_jobs()
            self._mem.clear()
            with self._guard:
                self._dirty.clear()

        def _maybe_flush(self) -> None:
            """Hand the changed jobs to a writer thread when FLUSH_S passed since the last time (and none is
            writing)."""
            if time.monotonic() - self._flushed_at < FLUSH_S or (self._writer and self._writer.is_alive()):
                return
            self._flushed_at = time.monotonic()
            batch = self._changed()
            if batch:
                self._writer = threading.Thread(target=self._write, args=(batch,), name="gpubot-jobstore-writer",
                                                daemon=True)
                self._writer.start()

        def _changed(self) -> list[dict[str, Any]]:
            """The changed jobs' rows (pickled here, on the scheduler's thread: the jobs are its objects)."""
            with self._guard:
                ids, self._dirty = self._dirty, set()
            rows = []
            for job_id in ids:
                job = self._mem.get(job_id)
                if job is not None:
                    rows.append({"job_id": job_id, "next_run_time": datetime_to_utc_timestamp(job.next_run_time),
                                 "job_state": pickle.dumps(job.__getstate__(), self.pickle_protocol)})
            return rows

        def _write(self, rows: list[dict[str, Any]]) -> None:
            from sqlalchemy import bindparam

            stmt = (self.jobs_t.update().where(self.jobs_t.c.id == bindparam("job_id"))
                    .values(next_run_time=bindparam("next_run_time"), job_state=bindparam("job_state")))
            try:
                with self.engine.begin() as connection:
                    connection.execute(stmt, rows)
            except Exception as e:  # the database refused (locked, full): keep them for the next flush
                log.error("scheduler: cannot write %d job(s)' next run times yet: %s", len(rows), e)
                with self._guard:
                    self._dirty |= {r["job_id"] for r in rows}

        def flush(self) -> None:
            """Write every changed job now (waits for a writer already at work)."""
            if self._writer is not None:
                self._writer.join(10)
            batch = self._changed()
            if batch:
                self._write(batch)

        def shutdown(self) -> None:
            self.flush()
            super().shutdown()

    return _WriteBehindJobStore(url=url, tablename="apscheduler_jobs")


#: Seconds between two log lines that count the checks skipped meanwhile.
SKIPPED_LOG_EVERY_S = 60.0


class _SchedulerLog:
    """APScheduler's own logger (`apscheduler.scheduler`), but a check skipped because the launch's previous check is
    still running (a slow or unreachable host) is counted (`skipped`) and said once per SKIPPED_LOG_EVERY_S in one
    line, not in one WARNING per skipped run: hundreds a minute on a fleet whose hosts answer slowly, each costing
    the event loop a formatted record."""

    def __init__(self) -> None:
        self._log = logging.getLogger("apscheduler.scheduler")
        self.skipped = 0
        self._unsaid = 0
        self._said_at = time.monotonic()

    def warning(self, msg: str, *args: Any, **kwargs: Any) -> None:
        if "maximum number of running instances" not in msg:
            self._log.warning(msg, *args, **kwargs)
            return
        self.skipped += 1
        self._unsaid += 1
        now = time.monotonic()
        if now - self._said_at >= SKIPPED_LOG_EVERY_S:
            log.warning("%d check(s) skipped in the last %.0f s: their launch's previous check was still running "
                        "(hosts slow to answer?)", self._unsaid, now - self._said_at)
            self._unsaid, self._said_at = 0, now

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


class Scheduler:
    """An AsyncIOScheduler on the database at `db_url` (any SQLAlchemy URL), in UTC, that survives job store
    errors (`_ResilientScheduler`), with its jobs kept in memory and their run times written behind
    (`_write_behind_store`)."""

    def __init__(self, db_url: str, *, misfire_grace_s: float = MISFIRE_GRACE_S):
        self._executor = _TargetExecutor()
        self._log = _SchedulerLog()
        self._aps = _ResilientScheduler(
            jobstores={"default": _write_behind_store(db_url)},
            executors={"default": self._executor},
            job_defaults={"misfire_grace_time": int(misfire_grace_s), "coalesce": True, "max_instances": 1},
            timezone=dt.UTC,
            logger=self._log,
        )

    @property
    def skipped_checks(self) -> int:
        """How many due checks were skipped since the start because the launch's previous check was still running."""
        return self._log.skipped

    def start(self, target: JobTarget) -> None:
        """Start scheduling (inside the running event loop); persisted jobs call `target` from now on."""
        self._executor.target = target
        self._aps.start()

    def shutdown(self, target: JobTarget | None = None) -> None:
        """Stop without running pending jobs (they stay in the database); forget `target` (when it is the one
        started with, or None)."""
        if self._aps.running:
            self._aps.shutdown(wait=False)
        if target is None or self._executor.target is target:
            self._executor.target = None

    def watch(self, launch_id: int, interval_s: float, first_in_s: float | None = None) -> None:
        """Add (or replace) the checks of launch `launch_id`: every `interval_s` seconds, the first one
        `first_in_s` seconds from now (default: one interval)."""
        first = interval_s if first_in_s is None else max(0.0, first_in_s)
        self._aps.add_job(check_launch, "interval", seconds=interval_s, args=[launch_id],
                          id=watch_job_id(launch_id), replace_existing=True,
                          next_run_time=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=first))

    def unwatch(self, launch_id: int) -> None:
        """Remove the checks of launch `launch_id` (nothing happens when there are none)."""
        job = self._aps.get_job(watch_job_id(launch_id))
        if job is not None:
            job.remove()

    def is_watched(self, launch_id: int) -> bool:
        """True while launch `launch_id` has a check job."""
        return self._aps.get_job(watch_job_id(launch_id)) is not None

    def watched_count(self) -> int:
        """How many launches have check jobs running here (0 while the scheduler is stopped: a follower's)."""
        if not self._aps.running:
            return 0
        return sum(1 for job in self._aps.get_jobs() if job.id.startswith(WATCH_JOB_PREFIX))

    def set_digest(self, cron: str | None) -> None:
        """Schedule the digest on crontab `cron` (UTC), or remove it when None. Raises ValueError for a bad
        expression (check it with `crontab_problem` first)."""
        if cron:
            self._aps.add_job(post_digest, CronTrigger.from_crontab(cron, timezone=dt.UTC), id=DIGEST_JOB,
                              replace_existing=True)
        elif self._aps.get_job(DIGEST_JOB) is not None:
            self._aps.remove_job(DIGEST_JOB)

    def job(self, job_id: str) -> Any:
        """The APScheduler job with this id, or None (for status and tests)."""
        return self._aps.get_job(job_id)
