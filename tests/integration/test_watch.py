"""Readiness checks over the loopback SSH server, as chat transcripts: fake servers that become ready, hang,
crash or run out of memory; persisted jobs; one alert per change of state; buttons on the alert."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from bot.core.models import LaunchState
from bot.demo.fakegpu import install_fake_gpu
from tests.support.alerts import alerts, full_text, wait_alert, wait_checks
from tests.support.builders import FAST_WATCH, launch_config
from tests.support.clock import ManualClock
from tests.support.procs import free_port, pids_of_launch, wait_log, wait_until

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
async def watched(make_bot, gpu_config):
    """A bot whose readiness checks run every 0.5 s (silence after 2 s)."""
    return await make_bot(gpu_config, watch=True, watch_policy=FAST_WATCH)


async def hung_then_watched(make_bot, config, text: str, workers: int, **options):
    """A bot that launches `text` (a server that hangs after loading), waits until every rank has finished
    loading, and only then starts its checks: on a loaded machine starting the ranks alone can take longer
    than the 2 s silence threshold, which would be a (right) alert of the wrong hang. `options` go to the bot."""
    bot = await make_bot(config, watch_policy=FAST_WATCH, **options)
    launched = await bot.chat.say(text)
    assert "Launched " in launched.text, launched.text
    await wait_log(bot.launch(1).log_path, "Load weight end", count=workers)
    await bot.runtime.watcher.start()
    return bot


@pytest.mark.parametrize(("mode", "verdict", "quote"), [
    ("hang", "silent_hang", "Load weight end"),
    ("ready", "ready", "fired up and ready to roll"),
    ("crash", "crashed", "RuntimeError: fake scheduler failed during init"),
    ("oom", "oom", "CUDA out of memory"),
])
async def test_each_outcome_gets_one_alert_with_evidence(make_bot, gpu_config, mode, verdict, quote):
    if mode == "hang":
        bot = await hung_then_watched(make_bot, gpu_config, "/launch base mode=hang workers=2", 2)
    else:  # watched from the start: a crash right after the start gets its verdict too
        bot = await make_bot(gpu_config, watch=True, watch_policy=FAST_WATCH)
        launched = await bot.chat.say(f"/launch base mode={mode} workers=2")
        assert "Launched base#1" in launched.text or "exited right after" in launched.text, launched.text
    la = await wait_alert(bot, 1, {verdict})
    alert_wall = time.time()
    if verdict not in ("ready", "silent_hang"):
        # the alert may come while the crashing process still runs; once it is gone the launch has failed,
        # and the root says so
        await wait_until(lambda: bot.launch(1).state == LaunchState.FAILED, what="base#1 failed")
        await wait_until(lambda: "failed" in bot.chat.posts[0].text, what="the root updated")
        assert verdict in bot.chat.posts[0].text
    elif verdict == "silent_hang":
        await wait_checks(bot, 1)  # more checks of the still-hung launch: nothing is posted twice
    (posted,) = alerts(bot, verdict)
    assert quote in posted.text, posted.text
    assert posted.thread_ts == la.thread_ts
    # the root message is edited only when what it shows changes
    root = bot.chat.posts[0]
    shown = [(m.text, json.dumps(m.blocks, sort_keys=True)) for m in (root.message, *root.edits)]
    assert all(a != b for a, b in itertools.pairwise(shown)), [t for t, _ in shown]
    if verdict == "silent_hang":
        # the alert came from the FIRST check past the threshold: every earlier check saw less silence
        recs = [r for r in bot.store.observations.list(1) if r.ok]
        first = next(i for i, r in enumerate(recs) if r.verdict == "silent_hang")
        silences = [r.t - r.last_progress_t for r in recs[: first + 1]]
        assert all(x <= FAST_WATCH.silence_after_s for x in silences[:-1]), silences
        assert silences[-1] > FAST_WATCH.silence_after_s
        assert "0%" in posted.text or "0 %" in posted.text  # the GPU line is among the key evidence
        print(f"time to alert: {alert_wall - os.path.getmtime(la.log_path):.2f} s after the last log write "
              f"(threshold {FAST_WATCH.silence_after_s} s + interval {FAST_WATCH.interval_s} s)")


async def test_watch_job_is_persisted_and_resumed_after_restart(make_bot, gpu_config):
    # the first bot checks every 0.5 s but calls nothing a hang (a minute of silence): it only creates the job
    patient = FAST_WATCH.model_copy(update={"silence_after_s": 60.0, "phase_grace_s": {}})
    first = await make_bot(gpu_config, watch=True, watch_policy=patient)
    await first.chat.say("/launch base mode=hang workers=1")
    assert first.runtime.watcher.scheduler.is_watched(1)
    await first.runtime.close()  # the bot goes away; the job stays in the database
    await wait_log(first.launch(1).log_path, "Load weight end")
    second = await make_bot(gpu_config, watch=True, watch_policy=FAST_WATCH, surface=first.surface)
    assert second.runtime.watcher.scheduler.is_watched(1)
    await wait_alert(second, 1, {"silent_hang"})
    assert len(alerts(second, "silent_hang")) == 1


async def test_heartbeat_only_is_a_silent_hang(make_bot, gpu_config):
    watched = await hung_then_watched(make_bot, gpu_config, "/launch base mode=heartbeat workers=1", 1)
    la = await wait_alert(watched, 1, {"silent_hang"})
    assert "Waiting for 1 local, 0 remote core engine" in Path(la.log_path).read_text()
    (posted,) = alerts(watched, "silent_hang")
    assert "heartbeat" in posted.text.lower()


async def test_slow_loading_with_an_advancing_progress_bar_never_alerts_hang(make_bot, ssh_server, fake_gpu,
                                                                             tmp_path):
    # 6 s of weight loading (a progress line every 0.5 s): three times the 2 s silence threshold
    cfg = launch_config(ssh_server, fake_gpu, tmp_path)
    cmd = cfg.variants["base"].command + " --load-steps 12"
    cfg = launch_config(ssh_server, fake_gpu, tmp_path,
                        variants={"slow": {"extends": "base", "command": cmd, "port": free_port()}})
    bot = await make_bot(cfg, watch_policy=FAST_WATCH)
    await bot.chat.say("/launch slow mode=ready workers=1 load_s=6")
    # checked from the moment loading began (before it, a loaded machine may take longer than the 2 s
    # threshold just to start the rank: a hang of another kind than this test is about)
    await wait_log(bot.launch(1).log_path, "Load weight begin")
    await bot.runtime.watcher.start()
    la = await wait_alert(bot, 1, {"ready"})
    assert not alerts(bot, "silent_hang")
    (ready,) = alerts(bot, "ready")
    assert "Phases:" in ready.text and "weight_loading" in ready.text
    assert la.alert_state == "ready" and not ready.buttons()  # a ready launch needs no buttons


async def test_port_already_bound_is_said_with_the_workers_it_left_behind(watched):
    """The launcher dies of the bind error while its TP worker (re-parented to init) still holds its GPU: the verdict is
    the leftovers (orphans_hold_gpu), and the alert says what ended the launcher too."""
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", watched.config.variants["base"].port))  # bound, not listening: passes the check
    try:
        await watched.chat.say("/launch base mode=ready workers=1")
        await wait_alert(watched, 1, {"port_in_use", "orphans_hold_gpu"})
        (posted,) = alerts(watched, "port_in_use") or alerts(watched, "orphans_hold_gpu")
        assert "Address already in use" in full_text(posted)
    finally:
        squatter.close()


async def test_case_00_replayed_live_gets_silent_hang_naming_all_four_signals(make_bot, ssh_server, fake_gpu,
                                                                              tmp_path):
    """8 TP workers load 76015 MiB each, log `Load weight end`, then go silent (the motivating report)."""
    cfg = launch_config(ssh_server, fake_gpu, tmp_path)
    cmd = cfg.variants["base"].command.replace("--gpus 0,1", "--gpus 0,1,2,3,4,5,6,7") + " --mem-mib 76015"
    cfg = launch_config(ssh_server, fake_gpu, tmp_path, variants={"tp8": {
        "extends": "base", "command": cmd, "gpus": list(range(8)), "port": free_port()}})
    install_fake_gpu(fake_gpu.state_dir.parent, gpu_count=8)
    bot = await hung_then_watched(make_bot, cfg, "/launch tp8 mode=hang workers=8", 8)
    await wait_alert(bot, 1, {"silent_hang"})
    (posted,) = alerts(bot, "silent_hang")
    assert len(posted.text.splitlines()) < 20  # short: the key lines; the rest in the attached evidence file
    text = full_text(posted)
    assert "Load weight end" in text                       # log silence after the last progress line
    assert "no log progress" in text
    assert "74.2 GiB" in text and "0 % util" in text     # GPU memory held, 0 % utilization
    assert "state `S" in text and "% CPU" in text          # process state and CPU
    assert "not listening" in text and "refused" in text  # port closed, health refused
    assert text.count("GPU ") >= 8


async def test_stack_dump_of_a_hung_launch_in_its_thread(make_bot, ssh_server, fake_gpu, tmp_path):
    py_spy = Path(sys.executable).parent / "py-spy"
    if shutil.which("py-spy", path=str(py_spy.parent)) is None:
        pytest.skip("py-spy is not installed in this environment (pip install py-spy)")
    cfg = launch_config(ssh_server, fake_gpu, tmp_path, host={"py_spy": str(py_spy)})
    bot = await make_bot(cfg)
    await bot.chat.say("/launch base mode=hang workers=2")
    la = bot.launch(1)
    await wait_log(la.log_path, "Load weight end")
    await wait_until(lambda: len(pids_of_launch(la)) == 4, what="wrapper, launcher and 2 workers")
    answer = await bot.chat.say("!stack", thread=la.thread_ts)
    if "Permission" in answer.text or "ptrace" in answer.text:
        pytest.skip("py-spy cannot attach here (ptrace restricted)")
    assert answer.audit == "ok", answer.text
    assert "3 of 3 processes dumped" in answer.text
    assert "worker (bot/demo/fake_server.py" in answer.text  # the TP ranks, stuck in their hang loop
    (name, data), = answer.post.files
    assert name.startswith("stackdump-") and b"fake_server.py" in data
    assert bot.events(action="stack_dump")[-1].result == "ok"


async def test_stack_dumps_during_a_hang_change_no_verdict_and_post_no_alert(make_bot, ssh_server, fake_gpu,
                                                                              tmp_path):
    py_spy = Path(sys.executable).parent / "py-spy"
    if shutil.which("py-spy", path=str(py_spy.parent)) is None:
        pytest.skip("py-spy is not installed in this environment (pip install py-spy)")
    # the hung ranks poll, as a real rank's progress thread does: ps TIME ticks a second now and then
    cfg = launch_config(ssh_server, fake_gpu, tmp_path, host={"py_spy": str(py_spy)})
    cfg.variants["base"].command += " --poll-cpu 0.3"
    bot = await hung_then_watched(make_bot, cfg, "/launch base mode=hang workers=2", 2)
    la = await wait_alert(bot, 1, {"silent_hang"})
    first_dump = None
    for _ in range(3):  # the bot's own work on the hung ranks, with checks in between
        answer = await bot.chat.say("!stack", thread=la.thread_ts)
        if "Permission" in answer.text or "ptrace" in answer.text:
            pytest.skip("py-spy cannot attach here (ptrace restricted)")
        assert answer.audit == "ok", answer.text
        first_dump = first_dump or len(bot.store.observations.list(1))
        await wait_checks(bot, 1, 2)
    await wait_checks(bot, 1, 3)
    verdicts = [r.verdict for r in bot.store.observations.list(1)[first_dump:] if r.ok]
    assert verdicts and set(verdicts) == {"silent_hang"}, verdicts
    assert [p.text.splitlines()[0] for p in alerts(bot)] == [alerts(bot, "silent_hang")[0].text.splitlines()[0]]
    assert bot.launch(1).alert_state == "silent_hang"
    assert "silent_hang" in bot.chat.posts[0].text  # the root still says what it is


async def test_alert_carries_a_timeline_chart_and_chart_command_works(make_bot, gpu_config):
    watched = await hung_then_watched(make_bot, gpu_config, "/launch base mode=hang workers=2", 2)
    la = await wait_alert(watched, 1, {"silent_hang"})
    (alert,) = alerts(watched, "silent_hang")
    assert [n for n, _ in alert.files] == ["base-1-evidence.txt", "base-1-timeline.png"]
    answer = await watched.chat.say("!chart", thread=la.thread_ts)
    (name, png), = answer.post.files
    assert name == "base-1-timeline.png" and png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    assert "checks" in answer.text


async def test_scheduled_digest_posts_gpu_status_to_its_channel(make_bot, gpu_config):
    cfg = gpu_config.model_copy(update={"watch": gpu_config.watch.model_copy(
        update={"digest_cron": "*/5 * * * *", "digest_channel": "C0DIGEST"})})
    bot = await make_bot(cfg, watch=True, watch_policy=FAST_WATCH)
    job = bot.runtime.watcher.scheduler.job("digest")
    assert job is not None and "cron" in str(job.trigger)
    await bot.chat.say("/launch base mode=hang workers=1")
    assert await bot.runtime.watcher.digest()
    digest = bot.chat.posts[-1]
    assert digest.channel == "C0DIGEST" and digest.thread_ts is None and digest.text.startswith("GPU status: 1 host")
    assert "[base#1 by U0OPERATOR]" in digest.text


def test_bad_digest_cron_is_a_config_error():
    from bot.config import ConfigError, parse_config
    from bot.wiring import check_config

    with pytest.raises(ConfigError) as e:
        check_config(parse_config({"watch": {"digest_cron": "every morning"}}))
    assert any(err.startswith("watch.digest_cron: not a crontab expression") for err in e.value.errors)


async def test_launch_killed_from_outside_is_an_unknown_end_said_so_and_a_deliberate_kill_gets_no_alert(watched):
    await watched.chat.say("/launch base mode=hang workers=1 load_s=30")
    la = watched.launch(1)
    await wait_until(lambda: len(pids_of_launch(la)) == 3, what="wrapper, launcher and worker")
    await wait_checks(watched, 1, 1)  # a check has seen it alive
    for pid in pids_of_launch(la):  # the OOM killer, or someone else's kill -9: its wrapper too, so no status
        os.kill(pid, signal.SIGKILL)
    la = await wait_alert(watched, 1, {"unknown", "exited"})
    assert (la.alert_state, la.state) == ("unknown", LaunchState.FAILED)  # it ended; how, nothing here says
    (posted,) = alerts(watched, "unknown")
    assert "the process is gone and no exit status was recorded" in posted.text, posted.text
    assert "would decide: how it ended" in posted.text, posted.text

    await watched.chat.say("/launch base mode=hang workers=1 load_s=30")
    await wait_checks(watched, 2, 1)
    before = len(alerts(watched))
    await watched.chat.say("/kill 2 --yes")
    await wait_until(lambda: not watched.runtime.watcher.scheduler.is_watched(2), what="the watch of base#2 ended")
    assert len(alerts(watched)) == before, [p.text for p in alerts(watched)[before:]]
    assert watched.launch(2).state == LaunchState.KILLED


async def test_snoozed_change_is_posted_after_the_snooze(make_bot, gpu_config):
    clock = ManualClock()  # the bot's clock: the snooze ends when the test moves it, not after 15 real minutes
    watched = await hung_then_watched(make_bot, gpu_config, "/launch base mode=hang workers=1", 1, clock=clock)
    la = watched.launch(1)
    snoozed = await watched.chat.say("!snooze", thread=la.thread_ts)  # the thread's launch, 15 minutes
    assert "snoozed: for 15 min" in snoozed.text, snoozed.text
    assert watched.launch(1).snoozed_until == pytest.approx(clock.time() + 15 * 60)
    # the hang happens during the snooze: the checks see it, nothing is posted
    await wait_until(lambda: any(r.verdict == "silent_hang" for r in watched.store.observations.list(1)),
                     what="a check that saw the hang")
    clock.advance(14 * 60)  # still snoozed
    await wait_checks(watched, 1, 2)
    assert not alerts(watched, "silent_hang")
    clock.advance(61)  # the snooze ends
    await wait_alert(watched, 1, {"silent_hang"})
    assert len(alerts(watched, "silent_hang")) == 1
