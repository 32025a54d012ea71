"""Launch -> kill -> relaunch of a multi-process fake server over a real SSH server on loopback, with the
fake nvidia-smi reporting each live TP worker's "GPU memory"."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from importlib import resources

import pytest

from bot.adapters.store import Store
from bot.config import Config
from bot.core.grammar import parse_message, parse_slash
from bot.core.models import Snapshot
from bot.core.probe import ProbeRequest
from bot.services.hosts import HostService
from bot.services.launches import LaunchService
from handlers import dispatch
from handlers.base import CommandContext
from tests.conftest import free_port, ssh_host

pytestmark = pytest.mark.timeout(90)


class RecordingSurface:
    """A Surface that keeps what would be posted (the Slack one is tested end to end elsewhere)."""

    def __init__(self):
        self.posts: list[tuple[str, str | None, str]] = []
        self.updates: list[tuple[str, str, str]] = []
        self.n = 0

    async def post(self, channel, message, *, thread_ts=None):
        self.n += 1
        self.posts.append((channel, thread_ts, message.text))
        return f"1700000000.{self.n:06d}"

    async def update(self, channel, ts, message):
        self.updates.append((channel, ts, message.text))
        return True

    async def upload(self, channel, filename, content, *, thread_ts=None, title=None):
        return True


def make_config(ssh_server, fake_gpu, tmp_path, **variant_extra) -> Config:
    server = str(resources.files("bot.demo") / "fake_server.py")
    base = {
        "host": "gpu-host-1",
        "command": "{{ python }} {{ server }} --workers {{ workers }} --gpus 0,1 --port {{ port }} --mode {{ mode }}"
                   " --load-s {{ load_s }} --gpu-state {{ state }}",
        "params": {
            "python": {"type": "path", "default": sys.executable},
            "server": {"type": "path", "default": server},
            "workers": {"type": "int", "default": 2, "min": 1, "max": 8},
            "mode": {"type": "str", "default": "hang",
                     "choices": ["ready", "hang", "crash", "oom", "exit", "heartbeat"]},
            "load_s": {"type": "float", "default": 0.2},
            "state": {"type": "path", "default": str(fake_gpu.state_dir)},
            "model": {"type": "str", "default": "fake", "regex": "[A-Za-z0-9_./-]+"},
        },
        "port": free_port(),
        "gpus": [0, 1],
        "log": str(tmp_path / "logs" / "{{ variant }}-{{ launch_id }}.log"),
    }
    base.update(variant_extra)
    fake_gpu_2 = fake_gpu  # the fake has one GPU row by default; use 2 rows for TP=2
    from bot.demo.fakegpu import install_fake_gpu

    install_fake_gpu(fake_gpu_2.state_dir.parent, gpu_count=2)
    return Config.model_validate({
        "hosts": {"gpu-host-1": ssh_host(ssh_server).model_dump()},
        "variants": {"base": base, "helper": {"extends": "base", "command": base["command"] + " --own-pgid-child"}},
        "state_dir": str(tmp_path / "state"),
        "permissions": {"operators": ["U0OPERATOR", "U0OTHER"], "viewers": ["U0VIEWER"]},
    })


@pytest.fixture
def stack(ssh_server, fake_gpu, tmp_path):
    cfg = make_config(ssh_server, fake_gpu, tmp_path)
    hosts = HostService(cfg)
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    launches = LaunchService(cfg, hosts, store, kill_grace_s=3, release_timeout_s=10, poll_s=0.2, start_check_s=0.8)
    surface = RecordingSurface()
    started: list[int] = []

    def ctx(user="U0OPERATOR", channel="C1", thread_ts=None, source="slash"):
        return CommandContext(user_id=user, channel_id=channel, config=cfg, hosts=hosts, thread_ts=thread_ts,
                              source=source, surface=surface, launches=launches)

    yield type("S", (), {"cfg": cfg, "hosts": hosts, "store": store, "launches": launches, "surface": surface,
                         "ctx": staticmethod(ctx), "started": started, "tmp": tmp_path})
    for la in store.recent_launches(100):  # kill by PID whatever a failed test left behind
        for pid in pids_of_launch(la):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    store.close()


def pids_of_launch(la) -> list[int]:
    """Every live process on this machine carrying the launch's unique GPUBOT_LAUNCH tag."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{d}/stat") as f:
                stat = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[0] == "Z":
            continue
        if la.tag and f"GPUBOT_LAUNCH={la.tag}".encode() in env:
            out.append(int(d))
    return out


async def wait_log(path, text, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{text!r} not in {path}")


async def test_launch_kill_relaunch_leaves_nothing_and_releases_gpu(stack):
    msg = await dispatch(parse_slash("/launch", "helper mode=hang"), stack.ctx())
    assert msg.text.startswith("Launched helper#1"), msg.text
    la = stack.store.get_launch(1)
    assert la.pid and la.pid == la.pgid == la.sid and la.state == "running"
    assert la.thread_ts == "1700000000.000001" and stack.surface.posts[0][1] is None  # root message at channel level
    await wait_log(la.log_path, "Load weight end", 15)
    await asyncio.sleep(0.3)
    # the own-session helper child escaped the process group and session, but carries the launch tag
    pids = pids_of_launch(la)
    assert len(pids) >= 4, pids  # launcher, 2 TP workers, the setsid helper
    snap = await stack.hosts.probe("gpu-host-1", ProbeRequest())
    assert isinstance(snap, Snapshot) and sum(g.memory_used_mib for g in snap.gpu.gpus) == 2 * 8610

    # kill, typed in the launch's thread without naming it
    kmsg = await dispatch(parse_message("!kill --yes", bot_user_id=None),
                          stack.ctx(thread_ts=la.thread_ts, source="prefix"))
    assert "Killed helper#1" in kmsg.text and "released" in kmsg.text, kmsg.text
    assert "16.8 GiB before, 0.0 GiB after" in kmsg.text
    await asyncio.sleep(0.2)
    assert pids_of_launch(la) == []
    assert stack.store.get_launch(1).state == "killed"
    assert any("killed" in u[2] for u in stack.surface.updates), "root message updated in place"

    # relaunch with a changed param, in the same thread
    rmsg = await dispatch(parse_message("!relaunch workers=1", bot_user_id=None),
                          stack.ctx(thread_ts=la.thread_ts, source="prefix"))
    assert "Launched helper#2" in rmsg.text, rmsg.text
    new = stack.store.get_launch(2)
    assert new.thread_ts == la.thread_ts and new.relaunch_of == 1 and new.params["workers"] == 1
    await wait_log(new.log_path, "Load weight end", 15)
    k2 = await stack.launches.kill(new, user="U0OPERATOR")
    assert k2.released and not k2.remaining and pids_of_launch(new) == []

    # the audit trail: who, when, args, result for every action
    events = stack.store.events()
    actions = [(e.action, e.result) for e in events]
    assert ("launch", "started") in actions and ("kill", "released") in actions and ("relaunch", "started") in actions
    assert all(e.user_id == "U0OPERATOR" and e.at > 0 for e in events)
    assert any(e.args.get("params") == {"mode": "hang"} for e in events if e.action == "launch")


async def test_parent_sigkilled_alone_leaves_orphans_shown_in_status(stack):
    await dispatch(parse_slash("/launch", "base mode=hang"), stack.ctx())
    la = stack.store.get_launch(1)
    await wait_log(la.log_path, "Load weight end", 15)
    await asyncio.sleep(0.3)
    os.kill(la.pid, signal.SIGKILL)  # the launcher only: its TP workers are re-parented and keep the memory
    await asyncio.sleep(0.5)
    status = await dispatch(parse_slash("/gpu", "status"), stack.ctx())
    assert status.text.count("[orphan of base#1]") == 2, status.text
    # /kill still finds and stops them (same session), and the memory comes back
    out = await stack.launches.kill(stack.store.get_launch(1), user="U0OTHER")
    assert out.released and len(out.signalled) >= 2
    status2 = await dispatch(parse_slash("/gpu", "status"), stack.ctx())
    assert "orphan" not in status2.text and "no process holds GPU memory" in status2.text


async def test_second_launch_refused_when_gpus_or_port_are_held(stack, start_fake_server):
    # a foreign server (not launched by the bot) holds the GPUs
    foreign = start_fake_server(mode="hang", workers=2, load_s=0.1, gpus="0,1")
    await asyncio.to_thread(foreign.wait_log, "Load weight end")
    await asyncio.sleep(0.3)
    msg = await dispatch(parse_slash("/launch", "base"), stack.ctx())
    assert "refused" in msg.text and "GPU 0 already uses 8.4 GiB" in msg.text, msg.text
    assert "(foreign)" in msg.text and "/kill pid=" in msg.text
    assert stack.store.recent_launches() == []  # nothing recorded, nothing started
    refused = stack.store.events(action="launch")
    assert refused and refused[-1].result == "refused"
    # free the GPUs with /kill pid=N, then the port is the problem
    for pid in {int(x) for x in __import__("re").findall(r"/kill pid=(\d+)", msg.text)}:
        ask = await dispatch(parse_slash("/kill", f"pid={pid}"), stack.ctx())  # without --yes: asks first
        assert f"Kill pid {pid} on gpu-host-1? single process, 1 process, GPUs" in ask.text, ask.text
        assert "8.4 GiB" in ask.text and f"/kill pid={pid} host=gpu-host-1 --yes" in ask.text
        button = next(b for b in ask.blocks if b["type"] == "actions")["elements"][0]
        assert button["action_id"] == "gpubot_killpid_confirm"
        conf, won = stack.store.claim_confirmation(int(button["value"]), state="confirmed", user_id="U0OPERATOR",
                                                   max_age_s=60)
        assert won and (conf.host, conf.pid) == ("gpu-host-1", pid) and "fake_server.py" in conf.command
        assert not stack.store.claim_confirmation(conf.id, state="cancelled", user_id="U0OTHER", max_age_s=60)[1]
        os.kill(pid, 0)  # still alive: asking killed nothing
        # a pid that now runs another command than the one confirmed is not killed (pid reuse)
        other = await dispatch(parse_slash("/kill", f"pid={pid} --yes expect_command=something-else"), stack.ctx())
        assert "now runs another command" in other.text
        os.kill(pid, 0)
        k = await dispatch(parse_slash("/kill", f"pid={pid} --yes"), stack.ctx())
        assert "Killed pid" in k.text
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", stack.cfg.variants["base"].port))
        s.listen(1)
        msg2 = await dispatch(parse_slash("/launch", "base"), stack.ctx())
    assert f"port {stack.cfg.variants['base'].port} is already listening" in msg2.text, msg2.text


async def test_live_launch_of_same_variant_blocks_a_second_one(stack):
    await dispatch(parse_slash("/launch", "base mode=hang workers=1"), stack.ctx())
    second = await dispatch(parse_slash("/launch", "base mode=hang workers=1"), stack.ctx())
    assert "base#1 of base is still live" in second.text and "`/kill 1`" in second.text


INJECTIONS = [
    "model=/x;touch {m}", "model=$(touch {m})", "model=`touch {m}`", "model='a\ntouch {m}'",
    "mode='hang; touch {m}'", "workers='1; touch {m}'", "load_s='0.1 --own-pgid-child'",
    "model=--own-pgid-child", "state='/tmp/$(touch {m})'", "python=/bin/sh server=-c",
    "evil=1", "host='gpu-host-1;touch {m}'",
]


@pytest.mark.parametrize("inj", INJECTIONS)
async def test_param_injection_is_rejected_or_quoted(stack, inj):
    marker = stack.tmp / "pwned"
    msg = await dispatch(parse_slash("/launch", "base " + inj.format(m=marker)), stack.ctx())
    await asyncio.sleep(0.5)
    assert not marker.exists()
    for la in stack.store.recent_launches():
        # when a value was accepted it reached the command only shell-quoted
        assert "touch" not in la.command or "'" in la.command
    assert any(w in msg.text for w in ("Cannot launch", "Bad arguments", "Launched", "refused")), msg.text


async def test_launch_survives_a_bot_restart(stack):
    await dispatch(parse_slash("/launch", "base mode=hang"), stack.ctx())
    la = stack.store.get_launch(1)
    await wait_log(la.log_path, "Load weight end", 15)
    # "restart": new store, new services over the same database file, new SSH connection
    await stack.hosts.close()
    stack.store.close()
    hosts2 = HostService(stack.cfg)
    store2 = Store(stack.store.url)
    launches2 = LaunchService(stack.cfg, hosts2, store2, kill_grace_s=3, release_timeout_s=10, poll_s=0.2)
    ctx2 = CommandContext(user_id="U0OPERATOR", channel_id="C1", config=stack.cfg, hosts=hosts2,
                          thread_ts=la.thread_ts, source="prefix", surface=stack.surface, launches=launches2)
    try:
        again = store2.get_launch(1)
        assert (again.pid, again.thread_ts, again.state) == (la.pid, la.thread_ts, "running")
        probe = await dispatch(parse_message("!probe", bot_user_id=None), ctx2)
        assert "Probe of gpu-host-1" in probe.text and "base#1" in probe.text
        assert "Load weight end" in probe.text and str(la.pid) in probe.text
        logs = await dispatch(parse_message("!logs 3", bot_user_id=None), ctx2)
        assert "Last 3 lines" in logs.text
        killed = await dispatch(parse_slash("/kill", "1 --yes"), CommandContext(
            user_id="U0OPERATOR", channel_id="C1", config=stack.cfg, hosts=hosts2, source="slash",
            surface=stack.surface, launches=launches2))
        assert "Killed base#1" in killed.text and "released" in killed.text
        assert pids_of_launch(la) == []
    finally:
        await hosts2.close()
        store2.close()


async def test_every_command_and_every_denial_is_audited(stack):
    viewer = stack.ctx(user="U0VIEWER")
    denied = await dispatch(parse_slash("/launch", "base"), viewer)
    assert "Permission denied" in denied.text and "operator" in denied.text
    await dispatch(parse_slash("/gpu", "status"), viewer)
    events = stack.store.events()
    got = [(e.user_id, e.action, e.result) for e in events]
    assert ("U0VIEWER", "command:launch", "denied") in got
    assert ("U0VIEWER", "command:status", "ok") in got
    assert stack.store.recent_launches() == []
    assert all(e.at > 0 and e.args.get("text") is not None for e in events)


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
        old = store.get_launch(1)
        assert old is not None and old.state == "running" and old.tag == ""
        new = store.create_launch(host="h", variant="base", params={}, command="", log_path=None, port=None,
                                  gpus=[], created_by="U1")
        assert new.tag.startswith(f"{new.id}-") and len(new.tag) > 4
    finally:
        store.close()


async def test_kill_never_touches_another_bots_launch_with_the_same_id(stack, tmp_path):
    """Two bots (two databases) each have a launch #1: killing one must leave the other alone."""
    await dispatch(parse_slash("/launch", "base mode=hang workers=1"), stack.ctx())
    mine = stack.store.get_launch(1)
    await wait_log(mine.log_path, "Load weight end")
    other_store = Store(f"sqlite:///{tmp_path / 'other.db'}")
    try:
        ghost = other_store.create_launch(host="gpu-host-1", variant="base", params={}, command="", log_path=None,
                                          port=None, gpus=[0, 1], created_by="U0OTHER")
        ghost = other_store.update_launch(ghost.id, pid=999999, pgid=999999, sid=999999, state="running")
        assert ghost.id == mine.id and ghost.tag != mine.tag
        other = LaunchService(stack.cfg, stack.hosts, other_store, kill_grace_s=2, release_timeout_s=3, poll_s=0.2)
        out = await other.kill(ghost, user="U0OTHER")
        assert out.nothing_to_kill and not out.signalled
    finally:
        other_store.close()
    assert pids_of_launch(mine), "the first bot's server must still run"


async def test_kill_pid_only_stops_gpu_holders(stack, tmp_path):
    import subprocess

    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        msg = await dispatch(parse_slash("/kill", f"pid={bystander.pid} --yes"), stack.ctx())
        assert "holds no GPU memory" in msg.text and bystander.poll() is None
        refused = stack.store.events(action="command:kill")
        assert refused[-1].result == "refused"
    finally:
        bystander.kill()
        bystander.wait()


async def test_two_racing_launches_of_one_variant_start_only_one(stack):
    a, b = await asyncio.gather(dispatch(parse_slash("/launch", "base mode=hang workers=1"), stack.ctx()),
                                dispatch(parse_slash("/launch", "base mode=hang workers=1"), stack.ctx()))
    texts = sorted([a.text, b.text])
    assert sum(t.startswith("Launched") for t in texts) == 1, texts
    assert any("still live" in t for t in texts), texts
    assert len([la for la in stack.store.recent_launches() if la.state == "running"]) == 1


async def test_other_variant_cannot_take_gpus_of_a_loading_launch(stack):
    first = await dispatch(parse_slash("/launch", "base mode=hang workers=1 load_s=5"), stack.ctx())
    assert first.text.startswith("Launched base#1")
    # helper is another variant on the same GPUs; base#1 holds no memory yet (still "loading")
    second = await dispatch(parse_slash("/launch", "helper mode=hang workers=1"), stack.ctx())
    assert "GPU(s) 0,1 belong to base#1" in second.text and f"port {stack.cfg.variants['base'].port}" in second.text


async def test_kill_while_starting_cancels_instead_of_losing_the_server(stack):
    slow = asyncio.Event()

    class SlowSurface(RecordingSurface):
        async def post(self, channel, message, *, thread_ts=None):
            if thread_ts is None:
                await slow.wait()  # the root message is slow to post: the launch stays `starting`
            return await super().post(channel, message, thread_ts=thread_ts)

    ctx = stack.ctx()
    ctx.surface = SlowSurface()
    task = asyncio.create_task(dispatch(parse_slash("/launch", "base mode=hang workers=1"), ctx))
    for _ in range(100):
        if stack.store.recent_launches():
            break
        await asyncio.sleep(0.05)
    la = stack.store.recent_launches()[0]
    assert la.state == "starting"
    killed = await dispatch(parse_slash("/kill", str(la.id)), stack.ctx())
    slow.set()
    launched = await task
    await asyncio.sleep(1.0)
    assert "no process was left" in killed.text
    assert "cancelled while it was starting" in launched.text, launched.text
    assert stack.store.get_launch(la.id).state == "killed"
    assert pids_of_launch(stack.store.get_launch(la.id)) == []


async def test_commands_in_a_thread_that_is_not_a_launch_thread_never_guess(stack):
    await dispatch(parse_slash("/launch", "base mode=hang workers=1"), stack.ctx())
    la = stack.store.get_launch(1)
    k = await dispatch(parse_message("!kill --yes", bot_user_id=None),
                       stack.ctx(channel="C_OTHER", thread_ts="1600000000.000001", source="prefix"))
    assert "this thread belongs to no launch" in k.text
    k2 = await dispatch(parse_slash("/kill", "--yes"), stack.ctx())
    assert "name the launch" in k2.text
    assert stack.store.get_launch(1).state == "running" and pids_of_launch(la)


async def test_bang_launch_inside_another_launch_thread_opens_its_own_thread(stack):
    await dispatch(parse_slash("/launch", "base mode=hang workers=1"), stack.ctx())
    a = stack.store.get_launch(1)
    msg = await dispatch(parse_message("!launch helper mode=hang workers=1 load_s=0.1", bot_user_id=None),
                         stack.ctx(thread_ts=a.thread_ts, source="prefix"))
    assert "refused" in msg.text  # helper shares GPUs with base: but it must not hijack base's thread either
    await dispatch(parse_slash("/kill", "1 --yes"), stack.ctx())
    msg = await dispatch(parse_message("!launch helper mode=hang workers=1", bot_user_id=None),
                         stack.ctx(thread_ts=a.thread_ts, source="prefix"))
    b = stack.store.get_launch(2)
    assert msg.text.startswith("Launched helper#2") and b.thread_ts and b.thread_ts != a.thread_ts
    assert stack.store.launch_for_thread("C1", a.thread_ts).id == 1


async def test_launch_refused_when_gpus_cannot_be_checked(stack, fake_gpu):
    fake_gpu.set_mode("exit:9")
    msg = await dispatch(parse_slash("/launch", "base"), stack.ctx())
    assert "cannot verify that GPUs 0,1 are free" in msg.text and "driver is not loaded" in msg.text


def test_unsafe_command_templates_are_config_errors():
    from bot.config import ConfigError, parse_config

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


async def test_variant_prefix_must_match_and_secrets_never_reach_the_store(stack):
    await dispatch(parse_slash("/launch", "base mode=hang workers=1 model=sk-abcdefghijklmnopqrstuvwx"),
                   stack.ctx())
    wrong = await dispatch(parse_slash("/kill", "helper#1 --yes"), stack.ctx())
    assert "no launch 'helper#1'" in wrong.text and stack.store.get_launch(1).state == "running"
    la = stack.store.get_launch(1)
    assert "sk-abcdefghijklmnopqrstuvwx" not in la.command
    for e in stack.store.events():
        assert "sk-abcdefghijklmnopqrstuvwx" not in f"{e.args} {e.detail}"
    assert oct(os.stat(stack.store.url[len("sqlite:///"):]).st_mode & 0o777) == "0o600"


def _with_variant(stack, name, **fields):
    data = stack.cfg.model_dump()
    base = data["variants"]["base"]
    data["variants"][name] = {**{k: v for k, v in base.items() if v is not None}, **fields}
    cfg = Config.model_validate(data)
    stack.cfg = cfg
    stack.launches.config = cfg
    stack.hosts.config = cfg
    return cfg


async def test_secret_named_params_never_reach_the_database(stack):
    params = dict(stack.cfg.variants["base"].params)
    params["api_key"] = {"type": "str", "default": "none"}
    cmd = stack.cfg.variants["base"].command + " --served-model-name {{ api_key }}"
    _with_variant(stack, "keyed", params=params, command=cmd, log=None, port=free_port(), gpus=[0, 1])
    secret = "opaque-looking-secret-1234"
    msg = await dispatch(parse_slash("/launch", f"keyed mode=hang workers=1 api_key={secret}"), stack.ctx())
    assert msg.text.startswith("Launched keyed#1"), msg.text
    la = stack.store.get_launch(1)
    assert secret not in la.command and secret not in str(la.params)
    for e in stack.store.events():
        assert secret not in f"{e.args} {e.detail}"
    assert all(secret not in t for _c, _t, t in stack.surface.posts)


async def test_a_variant_without_gpus_conflicts_with_every_gpu_launch(stack):
    _with_variant(stack, "allgpu", gpus=None, port=free_port())
    first = await dispatch(parse_slash("/launch", "base mode=hang workers=1 load_s=5"), stack.ctx())
    assert first.text.startswith("Launched base#1")
    second = await dispatch(parse_slash("/launch", "allgpu mode=hang workers=1"), stack.ctx())
    assert "GPU(s) all belong to base#1" in second.text


async def test_worker_that_cleared_its_environment_is_still_killed(stack):
    # the launcher exits after starting a worker with `env -i` (no tag) that stays in the session
    server = stack.cfg.variants["base"].params["server"].default
    cmd = ("{{ python }} -c " + "{{ code }}")
    code = ("import os,subprocess,sys,time;subprocess.Popen(['env','-i',sys.executable,'-c',"
            "'import time\\nwhile True: time.sleep(1)']);time.sleep(1)")
    _with_variant(stack, "escapee", command=cmd, params={"python": {"type": "path", "default": sys.executable},
                                                          "code": {"type": "str", "default": code}},
                  port=free_port(), gpus=[0, 1])
    assert server
    msg = await dispatch(parse_slash("/launch", "escapee"), stack.ctx())
    la = stack.store.get_launch(1)
    assert "Launched escapee#1" in msg.text or "exited" in msg.text, msg.text
    await asyncio.sleep(1.5)  # the tagged launcher is gone; only the untagged worker is left in its session
    snap = await stack.hosts.probe("gpu-host-1", ProbeRequest(sid=la.sid))
    left = [p for p in snap.table if p.sid == la.sid]
    assert left, "the untagged worker should be alive before the kill"
    out = await stack.launches.kill(stack.store.get_launch(1), user="U0OPERATOR")
    assert not out.nothing_to_kill and not out.remaining
    snap2 = await stack.hosts.probe("gpu-host-1", ProbeRequest(sid=la.sid))
    assert [p for p in snap2.table if p.sid == la.sid and p.state != "Z"] == []


def test_log_templates_need_host_log_dirs_and_symlinked_logs_are_refused(stack, tmp_path):
    from bot.core.lifecycle import LaunchError, launch_script, render_launch

    data = stack.cfg.model_dump()
    data["hosts"]["gpu-host-1"]["log_dirs"] = []
    cfg = Config.model_validate(data)
    with pytest.raises(LaunchError, match="has no log_dirs"):
        render_launch(cfg, "base", {}, launch_id=7, tag="7-abc")
    r = render_launch(stack.cfg, "base", {}, launch_id=7, tag="7-abc")
    target = tmp_path / "victim"
    target.write_text("keep me")
    os.makedirs(os.path.dirname(r.log_path), exist_ok=True)
    os.symlink(target, r.log_path)
    import subprocess

    res = subprocess.run(["sh", "-s"], input=launch_script(r), capture_output=True, text=True, timeout=20)
    assert res.returncode == 3 and "symbolic link" in res.stdout
    assert target.read_text() == "keep me"


async def test_variant_name_with_several_live_launches_is_ambiguous(stack):
    await dispatch(parse_slash("/launch", "base mode=hang workers=1"), stack.ctx())
    second = stack.store.create_launch(host="gpu-host-1", variant="base", params={}, command="", log_path=None,
                                       port=None, gpus=[], created_by="U0OPERATOR")
    stack.store.update_launch(second.id, state="running")
    msg = await dispatch(parse_slash("/kill", "base --yes"), stack.ctx())
    assert "has 2 live launches" in msg.text


async def test_killing_an_ended_launch_again_asks_nothing_and_keeps_how_it_ended(stack):
    msg = await dispatch(parse_slash("/launch", "base mode=hang"), stack.ctx())
    assert msg.text.startswith("Launched base#1"), msg.text
    la = stack.store.get_launch(1)
    await wait_log(la.log_path, "Load weight end", 15)
    killed = await dispatch(parse_slash("/kill", "1 --yes"), stack.ctx())
    assert "released" in killed.text
    ended = stack.store.get_launch(1)
    again = await dispatch(parse_slash("/kill", "1"), stack.ctx())  # a typed kill of an ended launch
    assert again.text.startswith("Nothing to kill") and "killed" in again.text
    forced = await dispatch(parse_slash("/kill", "1 --yes"), stack.ctx())  # e.g. a stale [Kill] click
    assert "no process was left" in forced.text
    now = stack.store.get_launch(1)
    assert (now.state, now.state_detail) == (ended.state, ended.state_detail)
    assert [e.result for e in stack.store.events(action="kill")] == ["released", "nothing"]


async def test_a_launch_left_stopping_by_a_crash_can_be_killed_after_a_restart(stack):
    from bot.services.launches import build_launch_service

    msg = await dispatch(parse_slash("/launch", "base mode=hang"), stack.ctx())
    assert msg.text.startswith("Launched base#1"), msg.text
    la = stack.store.get_launch(1)
    await wait_log(la.log_path, "Load weight end", 15)
    stack.store.update_launch(1, state="stopping")  # the bot died between "stopping" and the result
    busy = await dispatch(parse_slash("/kill", "1 --yes"), stack.ctx())
    assert busy.text.startswith("Already stopping")
    relaunch = await dispatch(parse_slash("/relaunch", "1"), stack.ctx())
    assert "being stopped by another kill" in relaunch.text and len(stack.store.recent_launches()) == 1
    build_launch_service(stack.cfg, stack.hosts, stack.store)  # the next bot process starts
    assert stack.store.get_launch(1).state == "kill_failed"
    killed = await dispatch(parse_slash("/kill", "1 --yes"), stack.ctx())
    assert "released" in killed.text and pids_of_launch(la) == []
