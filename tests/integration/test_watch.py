"""Readiness checks over the loopback SSH server: fake servers that become ready, hang, crash or run out of
memory; persisted jobs; one alert per change of state."""

from __future__ import annotations

import asyncio
import time

import pytest

from bot.config import WatchPolicy
from bot.core.grammar import parse_slash
from bot.services.watch import Watcher
from handlers import dispatch
from tests.conftest import free_port
from tests.integration.test_lifecycle import _with_variant
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
        alert_wall = time.time()
        took = time.monotonic() - t0
        await asyncio.sleep(1.5)  # more checks run: nothing is posted twice
        posted = [a for a in alerts(stack) if f": {verdict}" in a.splitlines()[0]]
        assert len(posted) == 1, alerts(stack)
        assert quote in posted[0], posted[0]
        assert la.thread_ts and stack.surface.posts[-1][1] in (la.thread_ts, None)
        if verdict == "silent_hang":
            # time to alert, measured from the last write of the log (the moment the launch went silent):
            # at most the silence threshold + one check interval, plus one probe round trip
            import os

            silent_for = alert_wall - os.path.getmtime(la.log_path)
            print(f"time to alert: {silent_for:.2f} s (threshold {FAST.silence_after_s} s + interval "
                  f"{FAST.interval_s} s)")
            # the alert came from the FIRST check past the threshold: every earlier check saw less silence
            recs = [r for r in stack.store.observations(1) if "error" not in r]
            first = next(i for i, r in enumerate(recs) if r.get("verdict") == "silent_hang")
            silences = [r["t"] - r["last_progress_t"] for r in recs[: first + 1]]
            assert all(x <= FAST.silence_after_s for x in silences[:-1]), silences
            assert silences[-1] > FAST.silence_after_s
            # wall clock: threshold + one interval, plus generous room for probe latency on a loaded machine
            assert silent_for <= FAST.silence_after_s + FAST.interval_s + 5.0, silent_for
            assert took < 30
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


async def test_heartbeat_only_is_a_silent_hang(stack):
    w = await start_watcher(stack)
    try:
        await dispatch(parse_slash("/launch", "base mode=heartbeat workers=1"), stack.ctx())
        la = await wait_alert(stack, 1, {"silent_hang"}, timeout=25)
        assert "Waiting for 1 local, 0 remote core engine" in open(la.log_path).read()
        (posted,) = [a for a in alerts(stack) if ": silent_hang" in a.splitlines()[0]]
        assert "heartbeat" in posted.lower()
    finally:
        await w.stop()


async def test_slow_loading_with_an_advancing_progress_bar_never_alerts_hang(stack):
    w = await start_watcher(stack)
    try:
        # 6 s of weight loading (a progress line every 0.5 s): three times the 2 s silence threshold
        cmd = stack.cfg.variants["base"].command + " --load-steps 12"
        _with_variant(stack, "slow", command=cmd, port=free_port())
        await dispatch(parse_slash("/launch", "slow mode=ready workers=1 load_s=6"), stack.ctx())
        la = await wait_alert(stack, 1, {"ready"}, timeout=30)
        assert not [a for a in alerts(stack) if "silent_hang" in a.splitlines()[0]]
        (ready,) = [a for a in alerts(stack) if ": ready" in a.splitlines()[0]]
        assert "Phases:" in ready and "weight_loading" in ready
        assert la.alert_state == "ready"
    finally:
        await w.stop()


async def test_port_already_bound_is_port_in_use(stack):
    import socket

    w = await start_watcher(stack)
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", stack.cfg.variants["base"].port))  # bound, not listening: passes the pre-check
    try:
        await dispatch(parse_slash("/launch", "base mode=ready workers=1"), stack.ctx())
        await wait_alert(stack, 1, {"port_in_use"}, timeout=25)
        (posted,) = [a for a in alerts(stack) if ": port_in_use" in a.splitlines()[0]]
        assert "Address already in use" in posted
    finally:
        squatter.close()
        await w.stop()


async def test_case_00_replayed_live_gets_silent_hang_naming_all_four_signals(stack, fake_gpu):
    """8 TP workers load 76015 MiB each, log `Load weight end`, then go silent (the motivating report)."""
    from bot.demo.fakegpu import install_fake_gpu

    install_fake_gpu(fake_gpu.state_dir.parent, gpu_count=8)
    cmd = stack.cfg.variants["base"].command.replace("--gpus 0,1", "--gpus 0,1,2,3,4,5,6,7") + " --mem-mib 76015"
    _with_variant(stack, "tp8", command=cmd, gpus=list(range(8)), port=free_port())
    w = await start_watcher(stack)
    try:
        await dispatch(parse_slash("/launch", "tp8 mode=hang workers=8"), stack.ctx())
        await wait_alert(stack, 1, {"silent_hang"}, timeout=40)
        (posted,) = [a for a in alerts(stack) if ": silent_hang" in a.splitlines()[0]]
        assert "Load weight end" in posted                       # log silence after the last progress line
        assert "no log progress" in posted
        assert "76015 MiB" in posted and "0 % util" in posted   # GPU memory held, 0 % utilization
        assert "state `S" in posted and "% CPU" in posted        # process state and CPU
        assert "not listening" in posted and "refused" in posted  # port closed, health refused
        assert posted.count("GPU ") >= 8
    finally:
        await w.stop()


async def test_stack_dump_of_a_hung_launch_in_its_thread(stack):
    import shutil
    import sys
    from pathlib import Path

    if shutil.which("py-spy", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("py-spy is not installed in this environment (pip install py-spy)")
    data = stack.cfg.model_dump()
    data["hosts"]["gpu-host-1"]["py_spy"] = str(Path(sys.executable).parent / "py-spy")
    from bot.config import Config

    cfg = Config.model_validate(data)
    stack.cfg = stack.launches.config = stack.hosts.config = cfg
    await dispatch(parse_slash("/launch", "base mode=hang workers=2"), stack.ctx())
    la = stack.store.get_launch(1)
    await asyncio.sleep(1.5)
    from bot.core.grammar import parse_message

    ctx = stack.ctx(thread_ts=la.thread_ts, source="prefix")
    ctx.config = cfg
    msg = await dispatch(parse_message("!stack", bot_user_id=None), ctx)
    if "Permission" in msg.text or "ptrace" in msg.text:
        pytest.skip("py-spy cannot attach here (ptrace restricted)")
    assert msg.ok, msg.text
    assert "3 of 3 processes dumped" in msg.text
    assert "worker (bot/demo/fake_server.py" in msg.text  # the TP ranks, stuck in their hang loop
    (name, data_bytes), = msg.files
    assert name.startswith("stackdump-") and b"fake_server.py" in data_bytes
    assert stack.store.events(action="stack_dump")[-1].result == "ok"


async def test_alert_carries_a_timeline_chart_and_chart_command_works(stack):
    from bot.core.grammar import parse_message

    w = await start_watcher(stack)
    try:
        await dispatch(parse_slash("/launch", "base mode=hang workers=2"), stack.ctx())
        la = await wait_alert(stack, 1, {"silent_hang"}, timeout=25)
        msg = await dispatch(parse_message("!chart", bot_user_id=None),
                             stack.ctx(thread_ts=la.thread_ts, source="prefix"))
        (name, png), = msg.files
        assert name == "base-1-timeline.png" and png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
        assert "checks" in msg.text
    finally:
        await w.stop()


async def test_scheduled_digest_posts_gpu_status_to_its_channel(stack):
    data = stack.cfg.model_dump()
    data["watch"] = {"digest_cron": "*/5 * * * *", "digest_channel": "C0DIGEST"}
    from bot.config import Config

    cfg = Config.model_validate(data)
    stack.cfg = stack.launches.config = stack.hosts.config = cfg
    w = Watcher(stack.launches, stack.surface, db_url=stack.store.url, policy=FAST)
    await w.start()
    try:
        job = w.scheduler.get_job("digest")
        assert job is not None and "cron" in str(job.trigger)
        await dispatch(parse_slash("/launch", "base mode=hang workers=1"), stack.ctx())
        assert await w.digest()
        channel, thread, text = stack.surface.posts[-1]
        assert channel == "C0DIGEST" and thread is None and text.startswith("GPU status: 1 host")
        assert "[base#1]" in text
    finally:
        await w.stop()


def test_bad_digest_cron_is_a_config_error():
    from bot.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as e:
        parse_config({"watch": {"digest_cron": "every morning"}})
    assert any(err.startswith("watch.digest_cron: not a crontab expression") for err in e.value.errors)


async def test_launch_killed_from_outside_gets_exited_and_a_deliberate_kill_gets_no_alert(stack):
    import os
    import signal

    from tests.integration.test_lifecycle import pids_of_launch

    w = await start_watcher(stack)
    try:
        await dispatch(parse_slash("/launch", "base mode=hang workers=1 load_s=30"), stack.ctx())
        la = stack.store.get_launch(1)
        await asyncio.sleep(1.5)
        for pid in pids_of_launch(la):  # the OOM killer, or someone else's kill -9
            os.kill(pid, signal.SIGKILL)
        la = await wait_alert(stack, 1, {"exited"}, timeout=20)
        assert la.state == "exited"
        (posted,) = [a for a in alerts(stack) if ": exited" in a.splitlines()[0]]
        assert "no process of the launch is alive" in posted

        helper = stack.cfg.variants["base"]
        assert helper.port
        await dispatch(parse_slash("/launch", "base mode=hang workers=1 load_s=30"), stack.ctx())
        await asyncio.sleep(1.5)
        before = len(alerts(stack))
        await dispatch(parse_slash("/kill", "2 --yes"), stack.ctx())
        await asyncio.sleep(2.0)
        assert len(alerts(stack)) == before, alerts(stack)[before:]
        assert stack.store.get_launch(2).state == "killed"
    finally:
        await w.stop()


async def test_snoozed_change_is_posted_after_the_snooze(stack):
    from bot.core.grammar import parse_message

    w = await start_watcher(stack)
    try:
        await dispatch(parse_slash("/launch", "base mode=hang workers=1"), stack.ctx())
        la = stack.store.get_launch(1)
        msg = await dispatch(parse_message("!snooze 1", bot_user_id=None),
                             stack.ctx(thread_ts=la.thread_ts, source="prefix"))
        assert "snoozed" in msg.text
        await asyncio.sleep(4.0)  # the hang happens during the snooze: not posted
        assert not [a for a in alerts(stack) if ": silent_hang" in a.splitlines()[0]]
        stack.store.update_launch(1, snoozed_until=0.0)  # the snooze ends
        await wait_alert(stack, 1, {"silent_hang"}, timeout=10)
        assert len([a for a in alerts(stack) if ": silent_hang" in a.splitlines()[0]]) == 1
    finally:
        await w.stop()
