"""bot.adapters.slurm.JobBoard: one `squeue` call per login node for every job watched there, shared by the checks
that ask within the age they accept, whatever the number of jobs; a failed call reaches every check that waited on
it and the next check asks again. The executor stands in for the login node's shell (what squeue prints)."""

from __future__ import annotations

import asyncio
import shlex

import pytest

from bot.adapters.remote import CommandResult
from bot.adapters.slurm import JobBoard, SlurmClient

pytestmark = pytest.mark.timeout(30)


class _Squeue:
    """A login node whose squeue lists `running` job ids as RUNNING; counts the calls, may fail or be held."""

    def __init__(self, running: set[str]) -> None:
        self.running = running
        self.calls: list[list[str]] = []
        self.fail = False
        self.gate: asyncio.Event | None = None
        self.name = "login"

    async def run(self, command: str, *, input: bytes | None = None, timeout_s: float | None = None) -> CommandResult:
        words = shlex.split(command)
        assert words[0] == "squeue", command  # no sacct while every job is listed
        ids = words[words.index("-j") + 1].split(",")
        self.calls.append(ids)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            return CommandResult(1, b"", b"squeue: error: Unable to contact slurm controller\n", 0.01)
        lines = [f"{j}|RUNNING|0|n1|1:00|UNLIMITED|0|None" for j in ids if j in self.running]
        return CommandResult(0, "\n".join(lines).encode(), b"", 0.01)


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def test_five_hundred_jobs_checked_within_an_interval_cost_one_squeue_call():
    ids = [str(100 + i) for i in range(500)]
    shell, clock = _Squeue(set(ids)), _Clock()
    board = JobBoard(SlurmClient(shell), lambda: ids, clock=clock)
    jobs = []
    for i, job_id in enumerate(ids):  # the checks, spread over a 30 s interval
        clock.t = 1000.0 + 30 * i / len(ids)
        jobs.append(await board.job(job_id, max_age_s=30))
    assert all(j is not None and j.state == "RUNNING" and j.job_id == k for j, k in zip(jobs, ids, strict=True))
    assert board.calls == 1 and len(shell.calls) == 1 and sorted(shell.calls[0], key=int) == ids
    clock.t += 31  # the next interval: one more call
    assert (await board.job("250", max_age_s=30)).state == "RUNNING"
    assert board.calls == 2


async def test_checks_that_ask_while_a_call_is_under_way_wait_on_that_call():
    ids = [str(i) for i in range(1, 41)]
    shell, clock = _Squeue(set(ids)), _Clock()
    shell.gate = asyncio.Event()
    board = JobBoard(SlurmClient(shell), lambda: ids, clock=clock)
    waiting = [asyncio.ensure_future(board.job(j, max_age_s=10)) for j in ids]
    await asyncio.sleep(0)
    shell.gate.set()
    jobs = await asyncio.gather(*waiting)
    assert [j.job_id for j in jobs] == ids and len(shell.calls) == 1


async def test_a_job_not_watched_at_the_last_call_and_a_fresh_read_ask_again():
    shell, clock = _Squeue({"1", "2", "3"}), _Clock()
    watched = ["1", "2"]
    board = JobBoard(SlurmClient(shell), lambda: list(watched), clock=clock)
    assert (await board.job("1", max_age_s=60)) is not None and board.calls == 1
    assert (await board.job("3", max_age_s=60)).job_id == "3"  # a job launched since: asked for, with the others
    assert board.calls == 2 and sorted(shell.calls[-1]) == ["1", "2", "3"]
    clock.t += 1
    await board.job("2", max_age_s=0)  # a kill or an end waits for Slurm's word now, never a cached one
    assert board.calls == 3


async def test_a_failed_call_reaches_every_waiting_check_and_the_next_check_asks_again():
    from bot.core.slurm import SlurmError
    shell, clock = _Squeue({"1", "2"}), _Clock()
    shell.fail, shell.gate = True, asyncio.Event()
    board = JobBoard(SlurmClient(shell), lambda: ["1", "2"], clock=clock)
    waiting = [asyncio.ensure_future(board.job(j, max_age_s=60)) for j in ("1", "2")]
    await asyncio.sleep(0)
    shell.gate.set()
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(r, SlurmError) and "Unable to contact slurm controller" in str(r) for r in results), results
    assert len(shell.calls) == 1
    shell.fail = False
    assert (await board.job("1", max_age_s=60)).state == "RUNNING" and len(shell.calls) == 2


async def test_a_check_that_asks_as_a_call_ends_gets_an_answer_never_a_spinning_loop():
    """A check that asks between the end of a call and its bookkeeping, for an answer newer than that call (a
    clock that moves on each reading): it gets its own call, and the event loop goes on."""
    ticks = iter(range(1000))

    class _Held:
        def __init__(self) -> None:
            self.answer: asyncio.Future | None = None
            self.calls = 0

        async def jobs(self, ids):
            self.calls += 1
            self.answer = asyncio.get_running_loop().create_future()
            return await self.answer

        async def forgotten(self, job_id):
            return None

    client = _Held()
    board = JobBoard(client, lambda: ["7"], clock=lambda: float(next(ticks)))
    first = asyncio.ensure_future(board.job("7", 0))
    while client.answer is None:
        await asyncio.sleep(0)
    client.answer.set_result({})
    late = asyncio.ensure_future(board.job("7", 0))
    assert await asyncio.wait_for(first, 10) is None
    while not late.done():  # each new call of the late check answered in turn
        if client.answer is not None and not client.answer.done():
            client.answer.set_result({})
        await asyncio.sleep(0)
    assert late.result() is None and client.calls >= 2
