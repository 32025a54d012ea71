"""The CPU worker (bot.adapters.cpu): the timeline chart is drawn in another process; an exception comes back as
it was raised; a worker that died is replaced; and the worker never outlives the bot, even a SIGKILLed one."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bot.adapters.cpu import CpuPool
from bot.present.chart import draw_timeline
from tests.support.procs import wait_until, wait_until_sync

pytestmark = pytest.mark.timeout(60)

EMPTY = {"points": [], "title": "base#1 on gpu-host-1", "phases": [], "verdicts": []}


@pytest.fixture
def pool():
    p = CpuPool()
    yield p
    p.close()


async def test_the_chart_is_drawn_in_another_process_and_errors_come_back(pool):
    png = await pool.run(draw_timeline, EMPTY)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    pid = pool.worker_pid
    assert pid is not None and pid != os.getpid()
    with pytest.raises(TypeError):
        await pool.run(draw_timeline, {"no such argument": 1})
    assert pool.worker_pid == pid, "an exception in a call does not cost the worker"


async def test_a_worker_that_died_is_replaced_and_the_call_still_answers(pool):
    await pool.run(draw_timeline, EMPTY)
    first = pool.worker_pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    await wait_until(lambda: pool.worker_pid is None, what="the worker to die")
    assert (await pool.run(draw_timeline, EMPTY)).startswith(b"\x89PNG")
    assert pool.worker_pid not in (None, first)


async def test_each_pool_has_its_own_worker_and_close_ends_it(pool):
    other = CpuPool()
    try:
        await pool.run(draw_timeline, EMPTY)
        await other.run(draw_timeline, EMPTY)
        mine, theirs = pool.worker_pid, other.worker_pid
        assert None not in (mine, theirs) and mine != theirs
        other.close()
        assert other.worker_pid is None
        await wait_until(lambda: not Path(f"/proc/{theirs}").exists() or _zombie(theirs), what="its worker to end")
        assert pool.worker_pid == mine, "closing one pool leaves the other's worker alone"
    finally:
        other.close()


async def test_an_inline_pool_runs_in_this_process_without_a_worker():
    pool = CpuPool(inline=True)
    pngs = await asyncio.gather(*(pool.run(draw_timeline, EMPTY) for _ in range(3)))
    assert all(p.startswith(b"\x89PNG") for p in pngs)
    assert pool.worker_pid is None and pool.calls == 3


def test_the_worker_ends_with_a_sigkilled_bot_and_holds_none_of_its_streams(tmp_path):
    # a bot process that draws a chart, says its worker's pid, then waits to be killed; its stdout is a pipe
    script = textwrap.dedent("""
        import asyncio, sys, time
        from bot.adapters.cpu import CpuPool
        from bot.present.chart import draw_timeline
        pool = CpuPool()
        asyncio.run(pool.run(draw_timeline, {"points": [], "title": "x", "phases": [], "verdicts": []}))
        print(pool.worker_pid, flush=True)
        time.sleep(600)
    """)
    bot = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           cwd=str(Path(__file__).resolve().parents[2]))
    try:
        worker = int(bot.stdout.readline())
        bot.kill()
        bot.wait()
        wait_until_sync(lambda: not Path(f"/proc/{worker}").exists() or _zombie(worker), 20,
                        what="the worker to exit after its bot was killed")
        # nothing holds the bot's pipes open: both reach EOF at once
        assert bot.stdout.read() == b"" and bot.stderr.read() is not None
    finally:
        bot.kill()
        bot.wait()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True
