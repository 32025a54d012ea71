"""The whole-life watch, as chat transcripts over the loopback SSH server: a ready fake server that is then
killed, wedged (a rank stopped with SIGSTOP), unhealthy (503) or out of memory; a bot restart that finds it
dead; two launches on one host; buttons of a replaced launch; kills that miss nothing."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from bot.core.models import LaunchState
from bot.core.transitions import LaunchEvent
from bot.present.actions import SNOOZE_BUTTON_MIN
from tests.support.alerts import alerts, full_text, is_alert, wait_alert, wait_checks
from tests.support.builders import FAST_WATCH, launch_config, launch_row
from tests.support.procs import free_port, pids_of_launch, wait_log, wait_until

pytestmark = pytest.mark.timeout(240)

#: Readiness as in the other watch tests; once ready a liveness check every 0.5 s, an alert after 2 failed
#: health checks, and 1 s of log silence for a serving hang.
SERVING_WATCH = FAST_WATCH.model_copy(update={"serving_interval_s": 0.5, "health_failures": 2,
                                              "phase_grace_s": {**FAST_WATCH.phase_grace_s, "serving": 1.0}})


@pytest.fixture
def control(tmp_path) -> Path:
    """The fake server's switch directory (health-503, oom)."""
    d = tmp_path / "control"
    d.mkdir()
    return d


@pytest.fixture
def serving_config(ssh_server, fake_gpu, tmp_path, control):
    """`base` is the fake server with the control switches; `solo0`/`solo1` one rank each on GPU 0 / GPU 1;
    `envless` base with a child that clears its environment and starts its own session."""
    cfg = launch_config(ssh_server, fake_gpu, tmp_path)
    cmd = cfg.variants["base"].command + f" --control {control}"
    return launch_config(ssh_server, fake_gpu, tmp_path, command=cmd, variants={
        "solo0": {"extends": "base", "command": cmd.replace("--gpus 0,1", "--gpus 0"), "gpus": [0],
                  "port": free_port()},
        "solo1": {"extends": "base", "command": cmd.replace("--gpus 0,1", "--gpus 1"), "gpus": [1],
                  "port": free_port()},
        "envless": {"extends": "base", "command": cmd + " --cleared-env-child"},
        "gen": {"extends": "base", "generate": {"preset": "openai", "model": "fake", "timeout_s": 1, "grace_s": 1,
                                                "failures": 2}},
        "gensg": {"extends": "base", "generate": {"preset": "sglang", "timeout_s": 1, "grace_s": 1}},
    })


@pytest.fixture
async def serving(make_bot, serving_config):
    """A watching bot with SERVING_WATCH whose `base` launch (2 ranks) is ready."""
    return await ready_bot(make_bot, serving_config, "base")


async def ready_bot(make_bot, config, variant: str):
    """A watching bot with SERVING_WATCH on `config` whose launch 1 of `variant` (mode=ready) is ready."""
    bot = await make_bot(config, watch=True, watch_policy=SERVING_WATCH)
    launched = await bot.chat.say(f"/launch {variant} mode=ready")
    assert f"Launched {variant}#1" in launched.text, launched.text
    await wait_alert(bot, 1, {"ready"})
    await wait_until(lambda: bot.launch(1).ready_at is not None, what=f"{variant}#1 recorded as ready")
    return bot


def root_text(bot) -> str:
    """The launch's root message as it reads now."""
    return bot.chat.posts[0].text


async def test_ready_then_the_server_killed_gets_one_died_alert_and_the_root_says_failed(serving):
    la = serving.launch(1)
    assert serving.runtime.watcher.scheduler.is_watched(1)  # the watch goes on after ready
    killed_at = time.time()
    os.kill(la.pid, signal.SIGKILL)  # the server process itself; its TP ranks stay as leftovers
    # the launcher is gone and its workers run on, re-parented to init: leftovers that hold GPU memory, with how
    # the launcher ended said too (issue 44)
    la = await wait_alert(serving, 1, {"orphans_hold_gpu"}, timeout=30)
    # within 2 liveness intervals: the first or second check after the kill found it dead
    after = [r for r in serving.store.observations.list(1) if r.t >= killed_at and r.ok]
    assert [r.verdict for r in after].index("orphans_hold_gpu") < 2, after
    (posted,) = alerts(serving, "orphans_hold_gpu")
    assert "the launcher was killed by signal 9 (SIGKILL)" in posted.text, posted.text
    assert la.state == LaunchState.FAILED and not serving.runtime.watcher.scheduler.is_watched(1)
    assert root_text(serving).startswith("base#1 on gpu-host-1: failed (orphans_hold_gpu in shutdown)"), \
        root_text(serving)
    # the leftover ranks are named, and /kill still stops them
    assert "leftover process" in full_text(posted) and "`/kill 1` stops them" in full_text(posted)
    killed = await serving.chat.say("/kill 1 --yes")
    assert "released" in killed.text, killed.text
    # the root keeps how it ended, and says the leftovers were stopped
    await wait_until(lambda: "its leftovers were stopped" in root_text(serving), what="the root updated")
    assert root_text(serving).startswith("base#1 on gpu-host-1: failed (Leftover workers of an ended launch"), \
        root_text(serving)
    assert serving.launch(1).state == LaunchState.FAILED
    assert pids_of_launch(la) == []


async def test_a_stopped_rank_makes_health_time_out_a_serving_hang(serving):
    la = serving.launch(1)
    rank = next(p for p in pids_of_launch(la) if "--worker-rank 1" in Path(f"/proc/{p}/cmdline").read_bytes()
                .replace(b"\0", b" ").decode())
    os.kill(rank, signal.SIGSTOP)
    try:
        la = await wait_alert(serving, 1, {"silent_hang"}, timeout=60)
        (posted,) = alerts(serving, "silent_hang")
        assert posted.text.startswith("base#1 on gpu-host-1: silent_hang in serving"), posted.text
        assert "health endpoint times out" in posted.text and "timeout" in posted.text
        assert la.state == LaunchState.RUNNING  # alive: a hang is not an end
        assert "silent_hang in serving" in root_text(serving)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank, signal.SIGCONT)


async def test_health_503_alerts_once_and_recovery_posts_one_message(serving, control):
    (control / "health-503").touch()
    await wait_alert(serving, 1, {"unhealthy"}, timeout=30)
    await wait_checks(serving, 1, 3)
    assert len(alerts(serving, "unhealthy")) == 1  # still failing: nothing posted twice
    assert "(now: HTTP 503)" in alerts(serving, "unhealthy")[0].text
    (control / "health-503").unlink()
    await wait_alert(serving, 1, {"ready"}, timeout=30)
    await wait_checks(serving, 1, 3)
    recovered = [p for p in serving.chat.posts if is_alert(p) and "recovered, serving again" in p.text]
    assert len(recovered) == 1, [p.text for p in serving.chat.posts]
    assert serving.launch(1).state == LaunchState.RUNNING


async def test_oom_after_ready_fails_the_launch_and_the_root_says_so(serving, control):
    (control / "oom").touch()
    await wait_alert(serving, 1, {"oom"}, timeout=30)
    # the alert comes as soon as the OOM is logged; the launch fails when its server exits
    await wait_until(lambda: serving.launch(1).state == LaunchState.FAILED, what="base#1 failed")
    assert root_text(serving).startswith("base#1 on gpu-host-1: failed (oom in serving)"), root_text(serving)
    (posted,) = alerts(serving, "oom")
    assert "CUDA out of memory" in posted.text


async def test_a_gpu_lost_while_serving_alerts_once_with_the_driver_s_words(serving, fake_gpu):
    fake_gpu.set_mode("exit:15")  # nvidia-smi now answers as on a host whose GPU fell off the bus
    la = await wait_alert(serving, 1, {"gpu_lost"}, timeout=30)
    (posted,) = alerts(serving, "gpu_lost")
    assert posted.text.splitlines()[0].startswith("base#1 on gpu-host-1: gpu_lost in serving"), posted.text
    assert "GPU is lost" in posted.text and "dmesg | grep -i xid" in posted.text
    assert la.live  # the server process still runs: the verdict says why it cannot serve, nothing is killed
    await wait_checks(serving, 1, 3)
    assert len(alerts(serving, "gpu_lost")) == 1 and len(alerts(serving)) == 2  # ready, then gpu_lost


async def test_a_restarted_bot_finds_the_ready_server_dead_with_its_signal(make_bot, serving_config):
    first = await make_bot(serving_config, watch=True, watch_policy=SERVING_WATCH)
    await first.chat.say("/launch base mode=ready workers=1")
    await wait_until(lambda: first.launch(1).ready_at is not None, what="base#1 ready")
    la = first.launch(1)
    await first.runtime.close()  # the bot goes away; the server keeps serving
    os.kill(la.pid, signal.SIGKILL)
    await wait_log(la.log_path, "exited with status 137")
    second = await make_bot(serving_config, watch=True, watch_policy=SERVING_WATCH, surface=first.surface)
    # its worker outlives it (a leftover holding GPU memory): the end is said with the signal, never `loading`
    la = await wait_alert(second, 1, {"orphans_hold_gpu", "unknown", "crashed"}, timeout=30)
    assert la.state == LaunchState.FAILED and la.alert_state in ("orphans_hold_gpu", "unknown"), la.alert_state
    (posted,) = alerts(second, la.alert_state)
    assert "killed by signal 9" in posted.text and "loading" not in posted.text.splitlines()[0]
    assert all(r.verdict != "loading" for r in second.store.observations.list(1))


async def test_two_launches_on_one_host_each_alert_quotes_only_its_own_processes(make_bot, serving_config):
    bot = await make_bot(serving_config, watch=True, watch_policy=SERVING_WATCH)
    for variant in ("solo0", "solo1"):
        launched = await bot.chat.say(f"/launch {variant} mode=hang workers=1 load_s=30")
        assert "Launched " in launched.text, launched.text
    a, b = bot.launch(1), bot.launch(2)
    await wait_until(lambda: len(pids_of_launch(a)) == 3 and len(pids_of_launch(b)) == 3, what="both launches")
    await wait_checks(bot, 1, 1)
    others = set(pids_of_launch(b))
    for pid in pids_of_launch(a):
        os.kill(pid, signal.SIGKILL)
    await wait_alert(bot, 1, {"unknown", "exited"}, timeout=30)  # its wrapper killed too: no status
    (posted,) = [p for p in alerts(bot, "unknown") if p.text.startswith("solo0#1")]
    evidence = posted.text + "".join(data.decode() for name, data in posted.files if name.endswith(".txt"))
    assert "--gpus 1" not in evidence and "solo1" not in evidence, evidence
    assert not any(f"pid {pid}" in evidence or f"`{pid} " in evidence for pid in others), (others, evidence)
    assert bot.launch(2).state == LaunchState.RUNNING and bot.launch(2).alert_state not in ("exited", "unknown")


async def test_an_old_relaunch_button_is_refused_naming_the_live_launch(serving, control):
    (control / "health-503").touch()
    await wait_alert(serving, 1, {"unhealthy"}, timeout=30)
    (old_alert,) = alerts(serving, "unhealthy")  # base#1's alert, with its buttons
    (control / "health-503").unlink()
    relaunched = await serving.chat.say("/relaunch 1")
    assert "base#2" in relaunched.text, relaunched.text
    await wait_until(lambda: serving.launch(2).state == LaunchState.RUNNING, what="base#2 running")
    live = set(pids_of_launch(serving.launch(2)))
    answer = await serving.chat.click("Relaunch", on=old_alert)
    assert "base#1 has ended" in answer.text and "base#2 is live" in answer.text, answer.text
    assert serving.launch(2).state == LaunchState.RUNNING and set(pids_of_launch(serving.launch(2))) == live
    assert serving.events("command:relaunch")[-1].result == "stale"
    # none of the old alert's other buttons acts on base#2 either
    for label in ("Kill", f"Snooze {SNOOZE_BUTTON_MIN} min", "Stack dump", "Probe"):
        other = await serving.chat.click(label, on=old_alert)
        assert "base#1 has ended" in other.text, (label, other.text)
    assert serving.launch(2).state == LaunchState.RUNNING and serving.launch(2).snoozed_until is None


async def test_a_crash_between_start_and_pid_record_is_killed_after_a_restart(make_bot, serving_config):
    first = await make_bot(serving_config)
    launches = first.runtime.launches
    transition = launches.transition

    def crash(la, event, *a, **k):  # the `started` event records the PID: the bot dies before it is written
        if event == LaunchEvent.STARTED:
            raise RuntimeError("the bot died right after starting the process")
        return transition(la, event, *a, **k)

    launches.transition = crash  # type: ignore[method-assign]
    await first.chat.say("/launch base mode=hang")
    la = first.launch(1)
    assert la.pid is None and la.state == LaunchState.STARTING
    await wait_until(lambda: len(pids_of_launch(la)) >= 4, what="the unrecorded launch's processes")
    await first.runtime.close()
    second = await make_bot(serving_config, surface=first.surface)
    killed = await second.chat.say("/kill 1 --yes")
    assert "released" in killed.text and "no process was left" not in killed.text, killed.text
    assert pids_of_launch(la) == []
    status = await second.chat.say("/gpu status")
    assert "no process holds GPU memory" in status.text, status.text


async def test_a_child_with_a_cleared_environment_in_its_own_session_is_killed(make_bot, serving_config):
    bot = await make_bot(serving_config, watch=True, watch_policy=SERVING_WATCH)
    await bot.chat.say("/launch envless mode=hang workers=1")
    la = bot.launch(1)
    await wait_log(la.log_path, "with a cleared environment")
    child = int(re.search(r"helper process (\d+) started with a cleared environment",
                          Path(la.log_path).read_text()).group(1))
    try:
        assert child not in pids_of_launch(la)  # no tag: only what the checks saw finds it
        await wait_until(lambda: child in bot.launch(1).seen_pids, what="a check remembered the child")
        killed = await bot.chat.say("/kill 1 --yes")
        assert "released" in killed.text, killed.text
        await wait_until(lambda: not Path(f"/proc/{child}").exists()
                         or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2], what="the child gone")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


async def test_the_watch_survives_a_locked_database_and_alerts_while_it_refuses_writes(serving, caplog):
    """A write lock held past the busy timeout makes the scheduler's job store fail (APScheduler 3 would stop
    waking up): the checks go on once it is gone. While the database refuses every write, a crash still gets its
    alert, once, and the launch's end is recorded when the database is back."""
    import sqlite3

    caplog.set_level("INFO")
    db = serving.runtime.store.db

    def refused(text: str) -> int:
        return sum(text in r.getMessage() for r in caplog.records)

    await wait_checks(serving, 1, 2)
    holder = sqlite3.connect(db.path, timeout=0, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        await wait_until(lambda: refused("cannot record") or refused("job store failed"),
                         what="a check refused by the locked database")
    finally:
        holder.rollback()
    await wait_checks(serving, 1, 3)  # the scheduler still wakes up

    holder.execute("BEGIN IMMEDIATE")
    try:
        for pid in pids_of_launch(serving.launch(1)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        ended = lambda: alerts(serving, "crashed") + alerts(serving, "exited") + alerts(serving, "unknown") \
            + alerts(serving, "orphans_hold_gpu")  # noqa: E731
        await wait_until(ended, 90, what="the crash alert while writes are refused")
        assert holder.in_transaction and refused("posting the verdict anyway")
        seen = refused("check of base#1: cannot record")
        await wait_until(lambda: refused("check of base#1: cannot record") >= seen + 2, 90,
                         what="more checks refused by the database")
        assert len(ended()) == 1  # posted once, not at every refused check
    finally:
        holder.rollback()
        holder.close()
    await wait_until(lambda: not serving.launch(1).live, 90, what="the end recorded")
    assert len(ended()) == 1


async def test_a_fine_serving_launch_gets_cheap_checks_and_trouble_gets_a_full_look(serving, control):
    """While it serves fine, a check reads only the launch's own processes and what its log got since the last
    check (no host-wide process table, no 200-line tail); the check that sees trouble looks at everything."""
    requests = []
    real = serving.runtime.hosts.probe

    async def spy(host, req):
        requests.append(req)
        return await real(host, req)

    serving.runtime.hosts.probe = spy
    await wait_checks(serving, 1, 5)
    cheap = [r for r in requests if r.ps_pids is not None]
    assert len(cheap) >= len(requests) // 2 > 0, [(r.ps_pids, r.log_since) for r in requests]
    la = serving.launch(1)
    assert all(la.pid in r.ps_pids and r.log_since and r.log_cursor is not None for r in cheap)
    before = len(requests)
    (control / "oom").touch()
    await wait_alert(serving, 1, {"oom"}, timeout=30)
    after = requests[before:]
    assert any(r.ps_pids is None for r in after), "the alert came from a full look"
    (alert,) = alerts(serving, "oom")
    assert "CUDA out of memory" in alert.text


@pytest.fixture
async def generating(make_bot, serving_config):
    """A watching bot with SERVING_WATCH whose `gen` launch (the fake server, with an OpenAI-style generation
    check: 1 s timeout, every check once the log is 1 s silent, an alert after 2 failures) is ready."""
    return await ready_bot(make_bot, serving_config, "gen")


def generation_states(bot) -> list[str | None]:
    """The generation check state of each recorded check of launch 1 since it was ready, oldest first."""
    ready = bot.launch(1).ready_at or 0
    return [r.generate for r in bot.store.observations.list(1) if r.ok and r.t >= ready]


async def test_health_200_while_generation_hangs_is_a_serving_hang_that_says_so(generating, control):
    await wait_until(lambda: "ok" in generation_states(generating), what="a generation check that answered")
    (control / "generate-hang").touch()
    try:
        la = await wait_alert(generating, 1, {"silent_hang"}, timeout=60)
        (posted,) = alerts(generating, "silent_hang")
        assert posted.text.startswith("gen#1 on gpu-host-1: silent_hang in serving"), posted.text
        assert "the health endpoint answers, but generation times out" in posted.text, posted.text
        assert "the generation check failed" in full_text(posted) and "(now: timed out)" in full_text(posted)
        assert la.state == LaunchState.RUNNING  # alive: a hang is not an end
        states = generation_states(generating)
        assert states[-2:] == ["timeout", "timeout"], states  # the two failures in a row that made it
        health = [r.health for r in generating.store.observations.list(1) if r.ok and r.generate == "timeout"]
        assert set(health) == {"ok"}, health  # /health answered all along
    finally:
        (control / "generate-hang").unlink(missing_ok=True)
    # generation answers again: recovered
    await wait_until(lambda: any(is_alert(p) and "recovered, serving again" in p.text for p in generating.chat.posts),
                     60, what="the recovery message")
    assert generating.launch(1).alert_state == "ready"


async def test_a_server_whose_generation_answers_stays_ready_and_checks_it_every_time_the_log_is_silent(
        generating, control):
    await wait_checks(generating, 1, 5)
    states = generation_states(generating)
    assert states.count("ok") >= 4 and not {s for s in states if s not in (None, "ok")}, states
    assert [p.text.split("\n", 1)[0] for p in generating.chat.posts if is_alert(p)] == \
        [p.text.split("\n", 1)[0] for p in alerts(generating, "ready")], "nothing but the ready alert"
    assert generating.launch(1).alert_state == "ready"


async def test_generation_failing_with_http_500_while_health_answers_is_unhealthy(generating, control):
    (control / "generate-500").touch()
    await wait_alert(generating, 1, {"unhealthy"}, timeout=60)
    (posted,) = alerts(generating, "unhealthy")
    assert "The generation check failed 2 checks in a row (now: HTTP 500)" in posted.text, posted.text


async def test_the_sglang_generation_check_hangs_too_and_the_bundle_records_it(make_bot, serving_config, control):
    bot = await ready_bot(make_bot, serving_config, "gensg")
    (control / "generate-hang").touch()
    try:
        await wait_alert(bot, 1, {"silent_hang"}, timeout=60)
        # the server's own line about each failed /health_generate is the probe's echo, not progress: still a hang
        await wait_until(lambda: "Health check failed" in Path(bot.launch(1).log_path).read_text(), 30,
                         what="SGLang's health-check failure line")
        await wait_checks(bot, 1, 3)
        assert bot.launch(1).alert_state == "silent_hang"
        assert not any(is_alert(p) and "recovered" in p.text for p in bot.chat.posts)
        bundle = await bot.runtime.services.bundles.collect(launch=bot.launch(1), user="U0OPERATOR")
        observed = json.loads(bundle.files["observed.json"])
        assert observed["generate"] == "timeout" and observed["health"] == "ok", observed
        assert "/health_generate" in bundle.files["curl.txt"].decode(), bundle.files["curl.txt"]
    finally:
        (control / "generate-hang").unlink(missing_ok=True)


async def test_the_generation_check_is_capped_under_the_command_timeout_and_dropped_when_unsendable(
        make_bot, serving_config, caplog, monkeypatch):
    data = serving_config.model_dump()
    data["hosts"]["gpu-host-1"]["command_timeout_s"] = 5
    data["variants"]["slow"] = {"extends": "base", "generate": {"preset": "openai", "timeout_s": 60}}
    cfg = type(serving_config).model_validate(data)
    from bot.config import GenerateCheck, config_warnings

    assert any(w.startswith("variants.slow.generate.timeout_s: 60 s is cut to 3 s") for w in config_warnings(cfg))
    bot = await make_bot(cfg)
    launches = bot.runtime.launches
    slow = launch_row(host="gpu-host-1", variant="slow", port=8000)
    req = launches.launch_probe_request(slow, generate=True)
    assert (req.generate_path, req.generate_timeout_s) == ("/v1/completions", 3.0)
    assert launches.launch_probe_request(slow).generate_path is None  # only when asked
    # a check the probe cannot send (the config refuses such values; a request built around it) is left out alone
    monkeypatch.setattr(GenerateCheck, "request", lambda self: ("/x y", None))
    launches.probes._probe_parts.clear()  # worked out again, as by a fresh bot
    with caplog.at_level("WARNING"):
        req = launches.launch_probe_request(slow, generate=True)
    assert req.generate_path is None and req.port == 8000 and req.health_path == "/health"  # the rest stays
    assert "generation check left out" in caplog.text


async def test_no_generation_check_before_ready_or_once_the_launch_is_not_running(make_bot, serving_config):
    bot = await make_bot(serving_config, watch=True, watch_policy=SERVING_WATCH)
    watcher = bot.runtime.watcher
    starting = launch_row(host="gpu-host-1", variant="gen", port=8000, ready_at=None)
    assert not watcher._generation_due(starting, [])
    ready = launch_row(host="gpu-host-1", variant="gen", port=8000, ready_at=900.0)
    assert watcher._generation_due(ready, [])
    for state in (LaunchState.KILL_FAILED, LaunchState.STOPPING):
        assert not watcher._generation_due(launch_row(host="gpu-host-1", variant="gen", port=8000, ready_at=900.0,
                                                      state=state), [])
    assert not watcher._generation_due(launch_row(host="gpu-host-1", variant="base", port=8000, ready_at=900.0), [])
