"""The scheduler adapter (bot.adapters.scheduler): persisted jobs reach the target of the scheduler that runs
them (no module-level registry), so two bots in one process each run only their own checks, and a job written by
one run is run by the next with that run's target."""

from __future__ import annotations

import datetime as dt

import pytest

from bot.adapters.scheduler import Scheduler
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(60)


class Target:
    def __init__(self) -> None:
        self.checked: list[int] = []
        self.digests = 0

    async def check(self, launch_id: int) -> None:
        self.checked.append(launch_id)

    async def digest(self) -> None:
        self.digests += 1


async def test_two_schedulers_in_one_process_each_call_their_own_target(tmp_path):
    a, b = Target(), Target()
    sa, sb = Scheduler(f"sqlite:///{tmp_path / 'a.db'}"), Scheduler(f"sqlite:///{tmp_path / 'b.db'}")
    sa.start(a)
    sb.start(b)
    try:
        sa.watch(1, 3600, first_in_s=0)
        sb.watch(2, 3600, first_in_s=0)
        await wait_until(lambda: a.checked and b.checked, what="both schedulers to run their job")
        assert a.checked == [1] and b.checked == [2]
    finally:
        sa.shutdown(a)
        sb.shutdown(b)


async def test_a_persisted_job_runs_after_a_restart_with_the_new_runs_target(tmp_path):
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    first, second = Target(), Target()
    s1 = Scheduler(url)
    s1.start(first)
    s1.watch(7, 3600, first_in_s=3600)
    s1.set_digest("0 9 * * *")
    s1.shutdown(first)
    s2 = Scheduler(url)
    s2.start(second)
    try:
        assert s2.is_watched(7) and s2.job("digest") is not None
        now = dt.datetime.now(dt.UTC)  # due now (within the misfire grace), not at their written times
        s2.job("watch:7").modify(next_run_time=now)
        s2.job("digest").modify(next_run_time=now)
        await wait_until(lambda: second.checked and second.digests, what="the persisted jobs to run")
        assert second.checked == [7] and second.digests == 1 and not first.checked
    finally:
        s2.shutdown(second)


class Slow(Target):
    """A target whose checks take until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        import asyncio

        self.release = asyncio.Event()

    async def check(self, launch_id: int) -> None:
        self.checked.append(launch_id)
        await self.release.wait()


async def test_checks_skipped_while_the_previous_one_runs_are_counted_not_logged_one_by_one(tmp_path, caplog,
                                                                                         monkeypatch):
    import bot.adapters.scheduler as scheduler

    monkeypatch.setattr(scheduler, "SKIPPED_LOG_EVERY_S", 0.0)  # the count is said at the next skip
    slow = Slow()
    s = Scheduler(f"sqlite:///{tmp_path / 's.db'}")
    s.start(slow)
    try:
        with caplog.at_level("WARNING"):
            s.watch(1, 0.2, first_in_s=0)
            await wait_until(lambda: s.skipped_checks >= 3, 30, what="three skipped checks")
        slow.release.set()
        assert slow.checked == [1]  # one check ran: the others were due while it still ran
        said = [r.getMessage() for r in caplog.records if r.name == "bot.adapters.scheduler"]
        assert said and all("skipped in the last" in m and "still running" in m for m in said), said
        assert not [r for r in caplog.records if "maximum number of running instances" in r.getMessage()]
    finally:
        s.shutdown(slow)
