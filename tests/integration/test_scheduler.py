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
