"""Launch -> kill -> relaunch of a multi-process fake server over a real SSH server on loopback, with the
fake nvidia-smi reporting each live TP worker's "GPU memory": chat transcripts against a whole bot."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from bot.adapters.store import Store
from bot.config import Config, ConfigError, parse_config
from bot.core.models import LaunchState, Snapshot
from bot.core.probe import ProbeRequest
from bot.wiring import build_runtime
from tests.support.builders import OTHER_OPERATOR, VIEWER, launch_config
from tests.support.procs import free_port, pids_of_launch, wait_log, wait_until
from tests.support.surfaces import RecordingSurface

pytestmark = pytest.mark.timeout(240)

WORKER_MIB = 8610  # what each fake TP worker registers


async def gpu_mib(bot) -> float | None:
    """Total MiB the host's GPUs use now (None when unreadable)."""
    snap = await bot.runtime.hosts.probe("gpu-host-1", ProbeRequest(health_path=None))
    if not isinstance(snap, Snapshot) or not snap.gpu.ok:
        return None
    return sum(g.memory_used_mib or 0 for g in snap.gpu.gpus)


async def wait_loaded(bot, launch_id: int, workers: int = 2) -> None:
    """Wait until launch `launch_id` finished loading: its log says so and every worker holds its memory."""
    la = bot.launch(launch_id)
    await wait_log(la.log_path, "Load weight end")

    async def held() -> bool:
        return await gpu_mib(bot) == workers * WORKER_MIB

    await wait_until(held, what=f"{workers} workers holding GPU memory")


async def test_launch_kill_relaunch_leaves_nothing_and_releases_gpu(bot):
    chat = bot.chat
    launched = await chat.say("/launch helper mode=hang")
    assert launched.text.startswith("Launched helper#1"), launched.text
    la = bot.launch(1)
    # the server is the child of its wrapper shell, which leads the session and process group
    assert la.pid and la.pgid == la.sid and la.pid != la.pgid and la.state == LaunchState.RUNNING
    assert os.getpgid(la.pid) == la.pgid and os.getsid(la.pid) == la.sid
    root = chat.posts[0]
    assert la.thread_ts == root.ts and root.thread_ts is None and launched.thread == root.ts  # answered in its thread
    await wait_loaded(bot, 1)
    # the own-session helper child escaped the process group and session, but carries the launch tag
    await wait_until(lambda: len(pids_of_launch(la)) >= 5, what="wrapper, launcher, 2 TP workers, setsid helper")

    killed = await chat.say("!kill --yes", thread=la.thread_ts)  # typed in the launch's thread, unnamed
    assert "Killed helper#1" in killed.text and "released" in killed.text, killed.text
    assert "16.8 GiB before, 0.0 GiB after" in killed.text
    await wait_until(lambda: pids_of_launch(la) == [], what="no process of helper#1")
    assert bot.launch(1).state == LaunchState.KILLED
    assert "killed" in root.text, "the root message is edited in place"

    relaunched = await chat.say("!relaunch workers=1", thread=la.thread_ts)
    assert "Launched helper#2" in relaunched.text, relaunched.text
    new = bot.launch(2)
    assert new.thread_ts == la.thread_ts and new.relaunch_of == 1 and new.params["workers"] == 1
    await wait_loaded(bot, 2, workers=1)
    killed2 = await chat.say("!kill --yes", thread=la.thread_ts)  # the thread's newest launch now
    assert "Killed helper#2" in killed2.text and "released" in killed2.text
    assert pids_of_launch(new) == []

    # the audit trail: who, when, args, result for every action
    events = bot.events()
    actions = [(e.action, e.result) for e in events]
    assert ("launch", "started") in actions and ("kill", "released") in actions and ("relaunch", "started") in actions
    assert all(e.user_id == chat.user and e.at > 0 for e in events)
    assert any(e.args.get("params") == {"mode": "hang"} for e in events if e.action == "launch")


async def test_parent_sigkilled_alone_leaves_orphans_shown_in_status(bot):
    await bot.chat.say("/launch base mode=hang")
    la = bot.launch(1)
    await wait_loaded(bot, 1)
    os.kill(la.pid, signal.SIGKILL)  # the launcher only: its TP workers are re-parented and keep the memory

    async def orphans() -> str | None:
        status = await bot.chat.say("/gpu status")
        return status.text if status.text.count("[orphan of base#1 by U0OPERATOR]") == 2 else None

    await wait_until(orphans, what="both workers shown as orphans of base#1")
    # /kill still finds and stops them (same session), and the memory comes back
    killed = await bot.chat.say("/kill 1 --yes", user=OTHER_OPERATOR)
    assert "released" in killed.text and "2 processes signalled" in killed.text, killed.text
    status2 = await bot.chat.say("/gpu status")
    assert "orphan" not in status2.text and "no process holds GPU memory" in status2.text


async def test_second_launch_refused_when_gpus_or_port_are_held(bot, start_fake_server):
    foreign = start_fake_server(mode="hang", workers=2, load_s=0.1, gpus="0,1")  # not launched by the bot
    await asyncio.to_thread(foreign.wait_log, "Load weight end")
    async def held() -> bool:
        return await gpu_mib(bot) == 2 * WORKER_MIB

    await wait_until(held, what="the foreign workers' memory")
    refused = await bot.chat.say("/launch base")
    assert "refused" in refused.text and "GPU 0 already uses 8.4 GiB" in refused.text, refused.text
    assert "(foreign)" in refused.text and "/kill pid=" in refused.text
    assert bot.store.launches.recent() == []  # nothing recorded, nothing started
    assert bot.events(action="launch")[-1].result == "refused"
    # free the GPUs with /kill pid=N (asked first, then confirmed), then the port is the problem
    for pid in sorted({int(x) for x in re.findall(r"/kill pid=(\d+)", refused.text)}):
        ask = await bot.chat.say(f"/kill pid={pid}")
        assert f"Kill pid {pid} on gpu-host-1? single process, 1 process, GPUs" in ask.text, ask.text
        assert "8.4 GiB" in ask.text and f"/kill pid={pid} host=gpu-host-1 --yes" in ask.text
        assert [b["action_id"] for b in ask.buttons()] == ["gpubot_killpid_confirm", "gpubot_kill_cancel"]
        os.kill(pid, 0)  # still alive: asking killed nothing
        # a pid that now runs another command than the one confirmed is not killed (pid reuse)
        other = await bot.chat.say(f"/kill pid={pid} --yes expect_command=something-else")
        assert "now runs another command" in other.text
        os.kill(pid, 0)
        confirmed = await bot.chat.click("Kill", on=ask)
        assert f"Killed pid {pid}" in confirmed.text, confirmed.text
        assert "confirmed by" in ask.post.text  # the confirmation message says who decided
        late = await bot.chat.click("Cancel", on=ask, user=OTHER_OPERATOR)
        assert "already confirmed" in late.text and late.audit == "stale"
    with socket.socket() as s:
        s.bind(("127.0.0.1", bot.config.variants["base"].port))
        s.listen(1)
        refused2 = await bot.chat.say("/launch base")
    assert f"port {bot.config.variants['base'].port} is already listening" in refused2.text, refused2.text


async def test_live_launch_of_same_variant_blocks_a_second_one(bot):
    await bot.chat.say("/launch base mode=hang workers=1")
    second = await bot.chat.say("/launch base mode=hang workers=1")
    assert "base#1 of base is still live" in second.text and "`/kill 1`" in second.text


INJECTIONS = [
    "model=/x;touch {m}", "model=$(touch {m})", "model=`touch {m}`", "model='a\ntouch {m}'",
    "mode='hang; touch {m}'", "workers='1; touch {m}'", "load_s='0.1 --own-pgid-child'",
    "model=--own-pgid-child", "state='/tmp/$(touch {m})'", "python=/bin/sh server=-c",
    "evil=1", "host='gpu-host-1;touch {m}'",
]


@pytest.mark.parametrize("inj", INJECTIONS)
async def test_param_injection_is_rejected_or_quoted(bot, tmp_path, inj):
    marker = tmp_path / "pwned"
    answer = await bot.chat.say("/launch base " + inj.format(m=marker))
    assert any(w in answer.text for w in ("Cannot launch", "Bad arguments", "Launched", "refused",
                                          "exited right after it started")), answer.text
    for la in bot.store.launches.recent():
        await wait_log(la.log_path, "server_args")  # the launch ran (or the shell would have run the payload)
        # when a value was accepted it reached the command only shell-quoted
        assert "touch" not in la.command or "'" in la.command
    assert not marker.exists()


async def test_a_dashed_param_is_named_as_such(bot):
    answer = await bot.chat.say("/launch base --evil=1")
    assert "Bad arguments" in answer.text and "`--evil=1` is not a param" in answer.text, answer.text
    assert "name=value" in answer.text and not bot.store.launches.recent()
    answer = await bot.chat.say("/launch base other")
    assert "name exactly one variant" in answer.text, answer.text


async def test_launch_survives_a_bot_restart(make_bot, gpu_config):
    first = await make_bot(gpu_config)
    await first.chat.say("/launch base mode=hang")
    la = first.launch(1)
    await wait_log(la.log_path, "Load weight end")
    await first.runtime.close()  # "restart": a new bot over the same database file, new SSH connection
    second = await make_bot(gpu_config)
    again = second.launch(1)
    assert (again.pid, again.thread_ts, again.state) == (la.pid, la.thread_ts, LaunchState.RUNNING)
    probe = await second.chat.say("!probe", thread=la.thread_ts)
    assert "Probe of gpu-host-1" in probe.text and "base#1" in probe.text
    assert "Load weight end" in probe.text and str(la.pid) in probe.text
    logs = await second.chat.say("!logs 3", thread=la.thread_ts)
    assert "Last 3 lines" in logs.text
    killed = await second.chat.say("/kill 1 --yes")
    assert "Killed base#1" in killed.text and "released" in killed.text
    assert pids_of_launch(la) == []


async def test_every_command_and_every_denial_is_audited(bot):
    denied = await bot.chat.say("/launch base", user=VIEWER)
    assert "Permission denied" in denied.text and "operator" in denied.text
    await bot.chat.say("/gpu status", user=VIEWER)
    got = [(e.user_id, e.action, e.result) for e in bot.events()]
    assert (VIEWER, "command:launch", "denied") in got
    assert (VIEWER, "command:status", "ok") in got
    assert bot.store.launches.recent() == []
    assert all(e.at > 0 and e.args.get("text") is not None for e in bot.events())


def test_store_upgrades_a_database_made_by_an_older_version(tmp_path):
    import sqlite3

    db = tmp_path / "old.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE launches (id INTEGER PRIMARY KEY, host VARCHAR(64), variant VARCHAR(64), "
                "params_json TEXT, command TEXT, log_path TEXT, port INTEGER, gpus_json TEXT, pid INTEGER, "
                "pgid INTEGER, sid INTEGER, state VARCHAR(32), state_detail TEXT, created_by VARCHAR(64), "
                "created_at FLOAT, ended_at FLOAT, channel VARCHAR(64), thread_ts VARCHAR(32), relaunch_of INTEGER)")
    con.execute("INSERT INTO launches (id, host, variant, params_json, command, gpus_json, state, created_by, "
                "created_at) VALUES (1, 'h', 'base', '{}', 'x', '[]', 'running', 'U1', 1.0)")
    con.commit()
    con.close()
    store = Store(f"sqlite:///{db}")
    try:
        old = store.launches.get(1)
        assert old is not None and old.state == LaunchState.RUNNING and old.tag == ""
        new = store.launches.create(host="h", variant="base", params={}, command="", log_path=None, port=None,
                                    gpus=[], created_by="U1")
        assert new.tag.startswith(f"{new.id}-") and len(new.tag) > 4
    finally:
        store.close()


async def test_kill_never_touches_another_bots_launch_with_the_same_id(make_bot, gpu_config, tmp_path):
    """Two bots (two databases) each have a launch #1: killing one must leave the other alone."""
    bot = await make_bot(gpu_config)
    await bot.chat.say("/launch base mode=hang workers=1")
    mine = bot.launch(1)
    await wait_log(mine.log_path, "Load weight end")
    other = await make_bot(gpu_config, store=Store(f"sqlite:///{tmp_path / 'other.db'}"))
    ghost = other.store.launches.create(host="gpu-host-1", variant="base", params={}, command="", log_path=None,
                                        port=None, gpus=[0, 1], created_by=OTHER_OPERATOR)
    ghost = other.store.launches.update(ghost.id, pid=mine.pid, pgid=mine.pgid, sid=mine.sid,
                                        state=LaunchState.RUNNING)
    assert ghost.id == mine.id and ghost.tag != mine.tag
    answer = await other.chat.say("/kill 1 --yes")
    assert "no process was left" in answer.text, answer.text
    assert pids_of_launch(mine), "the first bot's server must still run"


async def test_kill_pid_only_stops_gpu_holders(bot):
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        answer = await bot.chat.say(f"/kill pid={bystander.pid} --yes")
        assert "holds no GPU memory" in answer.text and bystander.poll() is None
        assert answer.audit == "refused" and bot.events(action="command:kill")[-1].result == "refused"
    finally:
        bystander.kill()
        bystander.wait()


async def test_two_racing_launches_of_one_variant_start_only_one(bot):
    a, b = await asyncio.gather(bot.chat.say("/launch base mode=hang workers=1"),
                                bot.chat.say("/launch base mode=hang workers=1"))
    texts = sorted([a.text, b.text])
    assert sum(t.startswith("Launched") for t in texts) == 1, texts
    assert any("still live" in t for t in texts), texts
    assert len([la for la in bot.store.launches.recent() if la.state == LaunchState.RUNNING]) == 1


async def test_other_variant_cannot_take_gpus_of_a_loading_launch(bot):
    first = await bot.chat.say("/launch base mode=hang workers=1 load_s=5")
    assert first.text.startswith("Launched base#1")
    # helper is another variant on the same GPUs; base#1 holds no memory yet (still "loading")
    second = await bot.chat.say("/launch helper mode=hang workers=1")
    assert "GPUs 0,1 belong to base#1" in second.text and f"port {bot.config.variants['base'].port}" in second.text


async def test_kill_while_starting_cancels_instead_of_losing_the_server(bot):
    release = asyncio.Event()
    surface = bot.surface
    real_post = surface.post

    async def slow_root_post(channel, message, *, thread_ts=None):
        if thread_ts is None and "launched by" in message.text:
            await release.wait()  # the root message is slow to post: the launch stays `starting`
        return await real_post(channel, message, thread_ts=thread_ts)

    surface.post = slow_root_post  # type: ignore[method-assign]

    task = asyncio.create_task(bot.chat.say("/launch base mode=hang workers=1"))
    la = await wait_until(lambda: next(iter(bot.store.launches.recent()), None), what="the launch recorded")
    assert la.state == LaunchState.STARTING
    killed = await bot.chat.say(f"/kill {la.id}")
    release.set()
    launched = await task
    assert "no process was left" in killed.text
    assert "cancelled while it was starting" in launched.text, launched.text
    assert bot.launch(la.id).state == LaunchState.KILLED
    await wait_until(lambda: pids_of_launch(bot.launch(la.id)) == [], what="nothing of the cancelled launch")


async def test_commands_in_a_thread_that_is_not_a_launch_thread_never_guess(bot):
    await bot.chat.say("/launch base mode=hang workers=1")
    la = bot.launch(1)
    k = await bot.chat.say("!kill --yes", channel="C_OTHER", thread="1600000000.999999")
    assert "this thread belongs to no launch" in k.text
    k2 = await bot.chat.say("/kill --yes")
    assert "name the launch" in k2.text
    assert bot.launch(1).state == LaunchState.RUNNING and pids_of_launch(la)


async def test_bang_launch_inside_another_launch_thread_opens_its_own_thread(bot):
    await bot.chat.say("/launch base mode=hang workers=1")
    a = bot.launch(1)
    refused = await bot.chat.say("!launch helper mode=hang workers=1 load_s=0.1", thread=a.thread_ts)
    assert "refused" in refused.text  # helper shares GPUs with base: but it must not hijack base's thread either
    await bot.chat.say("/kill 1 --yes")
    launched = await bot.chat.say("!launch helper mode=hang workers=1", thread=a.thread_ts)
    b = bot.launch(2)
    assert launched.text.startswith("Launched helper#2") and b.thread_ts and b.thread_ts != a.thread_ts
    assert launched.thread == b.thread_ts
    assert bot.store.launches.for_thread("C1", a.thread_ts).id == 1


async def test_launch_refused_when_gpus_cannot_be_checked(bot, fake_gpu):
    fake_gpu.set_mode("exit:9")
    answer = await bot.chat.say("/launch base")
    assert "cannot verify that GPUs 0,1 are free" in answer.text and "driver is not loaded" in answer.text


def test_unsafe_command_templates_are_config_errors():
    base = {"hosts": {"h": {"local": True}}}
    for cmd, expect in [('sleep 30 "{{ note }}"', "quotes"), ("run {{ note|replace('x','') }}", "plain names"),
                        ("run {{ note[1:-1] }}", "plain names"), ("{% set y = note %}run {{ y }}", "only if"),
                        ("echo \\{{ note }}", "backslashes"), ("echo `{{ note }}`", "backticks"),
                        ("echo $( {{ note }} )", "$( )"), ("{# c #}echo {{ note }}", "comments"),
                        ("{%+ set note = note[1:-1] %}echo {{ note }}", "only if"),
                        ("echo '{% if false %}'{% endif %} {{ note }} '", "quotes")]:
        data = {**base, "variants": {"v": {"host": "h", "command": cmd, "params": {"note": "x"}}}}
        with pytest.raises(ConfigError) as e:
            parse_config(data)
        assert any(expect in err for err in e.value.errors), e.value.errors
    data = {**base, "variants": {"v": {"host": "h", "command": "run {{ port }}", "params": {"port": 1}}}}
    with pytest.raises(ConfigError) as e:
        parse_config(data)
    assert any("built-in template variable" in err for err in e.value.errors)


async def test_variant_prefix_must_match_and_secrets_never_reach_the_store(bot):
    await bot.chat.say("/launch base mode=hang workers=1 model=sk-abcdefghijklmnopqrstuvwx")
    wrong = await bot.chat.say("/kill helper#1 --yes")
    assert "no launch 'helper#1'" in wrong.text and bot.launch(1).state == LaunchState.RUNNING
    assert "sk-abcdefghijklmnopqrstuvwx" not in bot.launch(1).command
    for e in bot.events():
        assert "sk-abcdefghijklmnopqrstuvwx" not in f"{e.args} {e.detail}"
    db = bot.store.url[len("sqlite:///"):]
    for f in (db, f"{db}-wal", f"{db}-shm"):  # the write-ahead log holds what was written last: private too
        assert oct(os.stat(f).st_mode & 0o777) == "0o600", f


async def test_secret_named_params_never_reach_the_database(make_bot, ssh_server, fake_gpu, tmp_path):
    cmd = ("{{ python }} {{ server }} --workers 1 --gpus 0,1 --port {{ port }} --mode hang --load-s 0.1"
           " --gpu-state {{ state }} --served-model-name {{ api_key }}")
    cfg = launch_config(ssh_server, fake_gpu, tmp_path, variants={"keyed": {
        "extends": "base", "command": cmd, "params": {"api_key": {"type": "str", "default": "none"}},
        "port": free_port()}})
    bot = await make_bot(cfg)
    secret = "opaque-looking-secret-1234"
    launched = await bot.chat.say(f"/launch keyed api_key={secret}")
    assert launched.text.startswith("Launched keyed#1"), launched.text
    la = bot.launch(1)
    assert secret not in la.command and secret not in str(la.params)
    for e in bot.events():
        assert secret not in f"{e.args} {e.detail}"
    assert all(secret not in p.text for p in bot.chat.posts)


async def test_a_variant_without_gpus_conflicts_with_every_gpu_launch(make_bot, ssh_server, fake_gpu, tmp_path):
    cfg = launch_config(ssh_server, fake_gpu, tmp_path,
                        variants={"allgpu": {"extends": "base", "gpus": [], "port": free_port()}})
    bot = await make_bot(cfg)
    first = await bot.chat.say("/launch base mode=hang workers=1 load_s=5")
    assert first.text.startswith("Launched base#1")
    second = await bot.chat.say("/launch allgpu mode=hang workers=1")
    assert "GPUs all belong to base#1" in second.text, second.text


async def test_worker_that_cleared_its_environment_is_still_killed(make_bot, ssh_server, fake_gpu, tmp_path):
    # the launcher exits after starting a worker with `env -i` (no tag) that stays in the session
    code = ("import os,subprocess,sys,time;subprocess.Popen(['env','-i',sys.executable,'-c',"
            "'import time\\nwhile True: time.sleep(1)']);time.sleep(1)")
    cfg = launch_config(ssh_server, fake_gpu, tmp_path, variants={"escapee": {
        "host": "gpu-host-1", "command": "{{ python }} -c {{ code }}", "port": free_port(), "gpus": [0, 1],
        "params": {"python": {"type": "path", "default": sys.executable}, "code": {"type": "str", "default": code}}}})
    bot = await make_bot(cfg)
    launched = await bot.chat.say("/launch escapee")
    la = bot.launch(1)
    assert "Launched escapee#1" in launched.text or "exited" in launched.text, launched.text

    async def untagged_worker_alone() -> bool:  # the tagged launcher is gone; only its untagged worker is left
        snap = await bot.runtime.hosts.probe("gpu-host-1", ProbeRequest(sid=la.sid, health_path=None))
        left = [p for p in snap.table if p.sid == la.sid and p.state != "Z"]
        return bool(left) and la.pid not in {p.pid for p in left}

    await wait_until(untagged_worker_alone, what="the launcher gone, its env -i worker alive")
    killed = await bot.chat.say("/kill 1 --yes")
    assert "Killed escapee#1" in killed.text and "1 process signalled" in killed.text, killed.text
    snap2 = await bot.runtime.hosts.probe("gpu-host-1", ProbeRequest(sid=la.sid, health_path=None))
    assert [p for p in snap2.table if p.sid == la.sid and p.state != "Z"] == []


def test_log_templates_need_host_log_dirs_and_symlinked_logs_are_refused(gpu_config, tmp_path):
    from bot.config import render_launch
    from bot.core.lifecycle import LaunchError, launch_script

    data = gpu_config.model_dump()
    data["hosts"]["gpu-host-1"]["log_dirs"] = []
    with pytest.raises(LaunchError, match="has no log_dirs"):
        render_launch(Config.model_validate(data), "base", {}, launch_id=7, tag="7-abc")
    r = render_launch(gpu_config, "base", {}, launch_id=7, tag="7-abc")
    target = tmp_path / "victim"
    target.write_text("keep me")
    os.makedirs(os.path.dirname(r.log_path), exist_ok=True)
    os.symlink(target, r.log_path)
    res = subprocess.run(["sh", "-s"], input=launch_script(r), capture_output=True, text=True, timeout=20)
    assert res.returncode == 3 and "symbolic link" in res.stdout
    assert target.read_text() == "keep me"


async def test_variant_name_with_several_live_launches_is_ambiguous(bot):
    await bot.chat.say("/launch base mode=hang workers=1")
    second = bot.store.launches.create(host="gpu-host-1", variant="base", params={}, command="", log_path=None,
                                       port=None, gpus=[], created_by="U0OPERATOR")
    bot.store.launches.update(second.id, state=LaunchState.RUNNING)
    answer = await bot.chat.say("/kill base --yes")
    assert "has 2 live launches" in answer.text


async def test_killing_an_ended_launch_again_asks_nothing_and_keeps_how_it_ended(bot):
    launched = await bot.chat.say("/launch base mode=hang")
    assert launched.text.startswith("Launched base#1"), launched.text
    await wait_log(bot.launch(1).log_path, "Load weight end")
    killed = await bot.chat.say("/kill 1 --yes")
    assert "released" in killed.text
    ended = bot.launch(1)
    again = await bot.chat.say("/kill 1")  # a typed kill of an ended launch
    assert again.text.startswith("Nothing to kill") and "killed" in again.text
    forced = await bot.chat.say("/kill 1 --yes")  # e.g. a stale [Kill] click
    assert "no process was left" in forced.text
    now = bot.launch(1)
    assert (now.state, now.state_detail) == (ended.state, ended.state_detail)
    assert [e.result for e in bot.events(action="kill")] == ["released", "nothing"]


async def test_a_kill_interrupted_by_a_crash_is_finished_and_told_in_its_thread_after_a_restart(make_bot, gpu_config):
    bot = await make_bot(gpu_config)
    launched = await bot.chat.say("/launch base mode=hang")
    assert launched.text.startswith("Launched base#1"), launched.text
    la = bot.launch(1)
    await wait_log(la.log_path, "Load weight end")
    bot.store.launches.update(1, state=LaunchState.STOPPING)  # the bot died between "stopping" and the result
    busy = await bot.chat.say("/kill 1 --yes")
    assert busy.text.startswith("Already stopping")
    relaunch = await bot.chat.say("/relaunch 1")
    assert "being stopped by another kill" in relaunch.text and len(bot.store.launches.recent()) == 1
    await bot.runtime.close()
    restarted = await make_bot(gpu_config)  # the next bot process starts: it finishes the kill
    told = [p for p in restarted.chat.posts if "interrupted by a restart" in p.text]
    assert len(told) == 1 and told[0].thread_ts == la.thread_ts, [p.text for p in restarted.chat.posts]
    assert "The kill of base#1 was interrupted by a restart of the bot" in told[0].text
    assert "Killed base#1" in told[0].text and "released" in told[0].text, told[0].text
    assert restarted.launch(1).state == LaunchState.KILLED and pids_of_launch(la) == []
    assert [e.user_id for e in restarted.events(action="kill")][-1] == "gpubot"


async def test_a_kill_interrupted_twice_is_finished_by_the_next_start(make_bot, gpu_config):
    """The bot that found the interrupted kill stopped too before finishing it (a supervisor's SIGKILL during
    start-up): the launch was left kill_failed, and the start after that finishes the kill and tells the thread."""
    bot = await make_bot(gpu_config)
    launched = await bot.chat.say("/launch base mode=hang")
    assert launched.text.startswith("Launched base#1"), launched.text
    la = bot.launch(1)
    await wait_log(la.log_path, "Load weight end")
    bot.store.launches.update(1, state=LaunchState.STOPPING)
    await bot.runtime.close()
    # the second bot only gets as far as reading the state (what a start does before it finishes kills)
    second = build_runtime(gpu_config, surface=RecordingSurface())  # built (the state recovered), never started
    assert second.store.launches.get(1).state == LaunchState.KILL_FAILED
    await second.close()
    assert pids_of_launch(la), "nothing killed yet"
    third = await make_bot(gpu_config)
    told = [p for p in third.chat.posts if "interrupted by a restart" in p.text]
    assert len(told) == 1 and told[0].thread_ts == la.thread_ts, [p.text for p in third.chat.posts]
    assert third.launch(1).state == LaunchState.KILLED and pids_of_launch(la) == []


async def test_a_launch_left_starting_without_a_pid_by_a_restart_is_settled(make_bot, gpu_config):
    bot = await make_bot(gpu_config)
    launched = await bot.chat.say("/launch base mode=hang")
    assert launched.text.startswith("Launched base#1"), launched.text
    la = bot.launch(1)
    await wait_log(la.log_path, "Load weight end")
    # the bot died between recording each launch and reading its PID back: launch 1's processes run, launch 2
    # (recorded, never started) has none
    second = bot.store.launches.create(host="gpu-host-1", variant="helper", params={}, command="c", log_path=None,
                                       port=None, gpus=[], created_by="U0OPERATOR")
    assert second.id == 2 and second.state == LaunchState.STARTING
    bot.store.launches.update(1, state=LaunchState.STARTING, pid=None, pgid=None, sid=None)
    await bot.runtime.close()
    restarted = await make_bot(gpu_config)
    found = restarted.launch(1)
    assert found.state == LaunchState.RUNNING and (found.pid, found.pgid) == (la.pid, la.pgid), found
    assert restarted.launch(2).state == LaunchState.EXITED
    assert "none of its processes runs" in (restarted.launch(2).state_detail or "")
    refused = await restarted.chat.say("/launch base")
    assert "pid None" not in refused.text and f"pid {la.pid}" in refused.text, refused.text


async def test_a_variant_naming_a_gpu_the_host_does_not_have_is_refused_before_anything_starts(
        make_bot, ssh_server, fake_gpu, tmp_path):
    cfg = launch_config(ssh_server, fake_gpu, tmp_path, variants={"ghost": {"extends": "base", "gpus": [7],
                                                                            "port": free_port()}})
    bot = await make_bot(cfg)
    refused = await bot.chat.say("/launch ghost")
    assert "GPU 7 does not exist on gpu-host-1 (it has GPU 0,1)" in refused.text, refused.text
    assert "Launched" not in refused.text and bot.runtime.store.launches.live() == []
