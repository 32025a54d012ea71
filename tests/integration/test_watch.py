"""Readiness checks over the loopback SSH server: fake servers that become ready, hang, crash or run out of
memory; persisted jobs; one alert per change of state."""

from __future__ import annotations

import asyncio
import time

import pytest

from bot.commands import parse_slash
from bot.config import WatchPolicy
from bot.watch import Watcher
from handlers import dispatch
from tests.integration.test_lifecycle import stack as _lifecycle_stack

stack = _lifecycle_stack  # the lifecycle tests' `stack` fixture: SSH host, store, LaunchService, surface

pytestmark = pytest.mark.timeout(90)

FAST = WatchPolicy(interval_s=0.5, silence_after_s=2.0,
                   phase_grace_s={p: 2.0 for p in ("comm_init", "weight_loading", "kv_cache_alloc",
                                                   "cuda_graph_capture", "warmup")})


async def start_watcher(stack) -> Watcher:
    w = Watcher(stack.launches, stack.surface, db_url=stack.store.url, policy=FAST)
    await w.start()
    return w


async def wait_alert(stack, launch_id, verdicts, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        la = stack.store.get_launch(launch_id)
        if la.alert_state in verdicts:
            return la
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {verdicts} for launch {launch_id}: state {stack.store.get_launch(launch_id)}")


def alerts(stack):
    return [t for _c, th, t in stack.surface.posts if th is not None and " on gpu-host-1: " in t.splitlines()[0]
            and ("(after" in t)]


@pytest.mark.parametrize(("mode", "verdict", "quote"), [
    ("hang", "silent_hang", "Load weight end"),
    ("ready", "ready", "fired up and ready to roll"),
    ("crash", "crashed", "RuntimeError: fake scheduler failed during init"),
    ("oom", "oom", "CUDA out of memory"),
])
async def test_each_outcome_gets_one_alert_with_evidence(stack, mode, verdict, quote):
    w = await start_watcher(stack)
    try:
        t0 = time.monotonic()
        msg = await dispatch(parse_slash("/launch", f"base mode={mode} workers=2"), stack.ctx())
        assert "Launched base#1" in msg.text or "exited right after" in msg.text, msg.text
        la = await wait_alert(stack, 1, {verdict}, timeout=25)
        took = time.monotonic() - t0
        await asyncio.sleep(1.5)  # more checks run: nothing is posted twice
        posted = [a for a in alerts(stack) if f": {verdict}" in a.splitlines()[0]]
        assert len(posted) == 1, alerts(stack)
        assert quote in posted[0], posted[0]
        assert la.thread_ts and stack.surface.posts[-1][1] in (la.thread_ts, None)
        if verdict == "silent_hang":
            # time to alert <= silence threshold + one interval (+ launch start-up and probe time)
            assert took <= FAST.silence_after_s + FAST.interval_s + 6.0, took
            assert "0%" in posted[0] or "0 %" in posted[0]
    finally:
        await w.stop()


async def test_watch_job_is_persisted_and_resumed_after_restart(stack):
    w = await start_watcher(stack)
    await dispatch(parse_slash("/launch", "base mode=hang workers=1"), stack.ctx())
    assert w.scheduler.get_job("watch:1") is not None
    await w.stop()  # the bot goes away; the job stays in the database
    w2 = Watcher(stack.launches, stack.surface, db_url=stack.store.url, policy=FAST)
    await w2.start()
    try:
        assert w2.scheduler.get_job("watch:1") is not None
        await wait_alert(stack, 1, {"silent_hang"}, timeout=25)
        assert len([a for a in alerts(stack) if ": silent_hang" in a.splitlines()[0]]) == 1
    finally:
        await w2.stop()
