"""A multi-host variant over SSH (no scheduler), as chat transcripts against two loopback SSH hosts, each with its
own fake GPUs: `/launch` starts one process tree per host (rank 0 on the first, rank 1 on the second, with the
template's `node_rank`, `nnodes` and `master_addr`) as one launch with one thread that becomes ready; a rank that
hangs on the second host is named with its host in the alert; `/kill` stops both hosts' ranks."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bot.config import Config
from bot.core.models import LaunchState
from bot.demo.fakegpu import install_fake_gpu
from tests.support.alerts import alerts, full_text, wait_alert
from tests.support.builders import FAST_WATCH, OPERATOR, ssh_host
from tests.support.bundles import bundle_files
from tests.support.fakes.ssh_server import LoopbackSSHServer
from tests.support.procs import FAKE_SERVER, free_port, wait_until

pytestmark = pytest.mark.timeout(180)

COMMAND = ("{{ python }} {{ server }} --workers 1 --gpus 0 --port {{ port }} --mode ready --load-s {{ load_s }}"
           " --gpu-state {{ state }}/{{ host }}/state --nnodes {{ nnodes }} --node-rank {{ node_rank }}"
           " --dist-init-addr {{ master_addr }}:{{ master_port }} --hang-node {{ hang_node }}")
HOSTS = ("gpu-a", "gpu-b")


@pytest.fixture
async def two_hosts(tmp_path):
    """Two real SSH servers on loopback, hosts gpu-a and gpu-b, each with its own replayed GPU."""
    async with LoopbackSSHServer(tmp_path / "ssh-a", env=_path(tmp_path, "gpu-a")) as a, \
            LoopbackSSHServer(tmp_path / "ssh-b", env=_path(tmp_path, "gpu-b")) as b:
        yield {"gpu-a": a, "gpu-b": b}


def _path(tmp_path: Path, host: str) -> dict[str, str]:
    gpu = install_fake_gpu(tmp_path / "gpus" / host, gpu_count=1)
    return {"PATH": f"{gpu.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


@pytest.fixture
async def duo_bot(make_bot, two_hosts, tmp_path):
    return await _duo_bot(make_bot, two_hosts, tmp_path, FAST_WATCH)


async def _duo_bot(make_bot, two_hosts, tmp_path, policy):
    """A bot watching (by `policy`) variants `duo` and `duo_slow` on hosts gpu-a and gpu-b."""
    logs = tmp_path / "logs"
    logs.mkdir()
    py_spy = Path(sys.executable).parent / "py-spy"  # a dev dependency; without it the alert says so
    hosts = {name: ssh_host(srv, log_dirs=[str(logs)], py_spy=str(py_spy)).model_dump()
             for name, srv in two_hosts.items()}
    cfg = Config.model_validate({
        "hosts": hosts,
        "variants": {"duo": {
            "hosts": list(HOSTS), "command": COMMAND, "port": free_port(), "master_port": free_port(), "gpus": [0],
            "params": {"python": {"type": "path", "default": sys.executable},
                       "server": {"type": "path", "default": FAKE_SERVER},
                       "load_s": {"type": "float", "default": 0.3},
                       "state": {"type": "path", "default": str(tmp_path / "gpus")},
                       "hang_node": {"type": "int", "default": -1}}},
            # rank 0 loads for longer than the grace of weight loading would allow elsewhere: its log goes silent
            # well after the hung rank's
            "duo_slow": {"extends": "duo", "watch": {"phase_grace_s": {"weight_loading": 5}}}},
        "state_dir": str(tmp_path / "state"),
        "permissions": {"operators": [OPERATOR]},
        "lifecycle": {"kill_grace_s": 3, "release_timeout_s": 10},
    })
    return await make_bot(cfg, watch=True, watch_policy=policy)


def _ranks_running(tag: str) -> list[int]:
    """Pids of processes whose environment carries launch tag `tag` or one of its rank tags."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(e == f"GPUBOT_LAUNCH={tag}".encode() or e.startswith(f"GPUBOT_LAUNCH={tag}-r".encode()) for e in env):
            out.append(int(entry.name))
    return out


async def test_two_hosts_one_launch_ready_relaunched_in_its_thread_then_kill_stops_both(duo_bot):
    bot = duo_bot
    said = await bot.chat.say("/launch duo")
    assert "Launched duo#1 on gpu-a, gpu-b" in said.text, said.text
    la = await wait_alert(bot, 1, {"ready"}, timeout=90)
    assert la.host == "gpu-a" and la.nodes == list(HOSTS) and la.job_id is None
    rank1_log = Path(la.log_path.replace(".log", "-rank1.log")) if la.log_path.endswith(".log") else None
    assert rank1_log is not None and "Node 1 joined node 0" in rank1_log.read_text()
    assert "All 2 nodes joined" in Path(la.log_path).read_text()
    # one thread: every post of the launch is in it
    (ready,) = alerts(bot, "ready")
    assert ready.thread_ts == la.thread_ts
    assert len({p.thread_ts for p in bot.chat.posts if p.thread_ts}) == 1
    # /gpu status names both hosts' ranks as the one launch
    status = await bot.chat.say("/gpu status")
    assert "duo#1" in status.text
    assert len(_ranks_running(la.tag)) >= 2
    # `!relaunch` in the thread: both hosts' ranks of #1 stopped, #2 started on both, in the same thread
    said = await bot.chat.say("!relaunch", thread=la.thread_ts)
    assert "Launched duo#2 on gpu-a, gpu-b" in said.text, said.text
    new = await wait_alert(bot, 2, {"ready"}, timeout=90)
    assert new.relaunch_of == 1 and new.thread_ts == la.thread_ts and new.nodes == list(HOSTS)
    assert bot.launch(1).state == LaunchState.KILLED and not _ranks_running(la.tag)
    killed = await bot.chat.say("/kill 2 --yes")
    assert bot.launch(2).state == LaunchState.KILLED, killed.text
    await wait_until(lambda: not _ranks_running(new.tag), what="no process of either rank left")


async def test_a_rank_hung_on_the_second_host_is_named_with_its_host(duo_bot):
    bot = duo_bot
    await bot.chat.say("/launch duo_slow hang_node=1 load_s=2.5")
    la = await wait_alert(bot, 1, {"silent_hang"}, timeout=120)
    (hang,) = alerts(bot, "silent_hang")
    text = full_text(hang)
    assert "rank 1 on node gpu-b" in text, text
    assert "rank 0 on gpu-a" in text and "rank 1 on gpu-b" in text, text
    assert hang.thread_ts == la.thread_ts
    # the watcher's stack dump took every rank, each on its host: the cross-rank summary spans both
    if "ptrace" not in text and "not installed" not in text:
        stacks = next(line for line in text.splitlines() if "stacks (py-spy" in line)
        assert "gpu-a:" in stacks and "gpu-b:" in stacks, stacks
    # `!bundle`: rank 0's files at the top, rank 1's in node-gpu-b/, diagnosed offline across both
    answer = await bot.chat.say("!bundle", thread=la.thread_ts)
    assert answer.audit == "ok", answer.text
    assert "diagnosed offline: silent_hang" in answer.text, answer.text
    ((_name, data),) = answer.post.files
    files = bundle_files(data)
    assert {"server.log", "ps.txt", "node-gpu-b/server.log", "node-gpu-b/ps.txt", "ranks.txt"} <= set(files), files
    assert files["ranks.txt"] == b"0 gpu-a\n1 gpu-b\n"
    await bot.chat.say("/kill 1 --yes")
    assert bot.launch(1).state == LaunchState.KILLED
    await wait_until(lambda: not _ranks_running(la.tag), what="no process of either rank left")


async def test_the_second_host_unreachable_is_told_and_back_and_a_relaunch_then_leaves_no_ready_launch(
        make_bot, two_hosts, tmp_path, monkeypatch):
    """gpu-b's sshd goes away while duo#1 serves: the thread names gpu-b (rank 1) unreachable within three checks,
    and no alert is posted; `!relaunch` with gpu-b down stops rank 0, cannot stop rank 1, starts nothing and leaves
    duo#1 `kill_failed` (never `running`/`ready` with a dead rank) and still followed, also when a check ran while
    it was `stopping`; gpu-b back: told once; `/kill` then stops rank 1."""
    bot = await _duo_bot(make_bot, two_hosts, tmp_path, FAST_WATCH.model_copy(update={"serving_interval_s": 1}))
    await bot.chat.say("/launch duo")
    la = await wait_alert(bot, 1, {"ready"}, timeout=90)
    checks_before = len(bot.store.observations.list(1))
    await two_hosts["gpu-b"].stop()
    down = await bot.chat.wait_post(lambda p: "gpu-b (rank 1 of duo#1) cannot be reached" in p.text, 90,
                                    what="the unreachable notice")
    assert down.thread_ts == la.thread_ts
    assert len(bot.store.observations.list(1)) - checks_before <= 3, "told after more than three checks"
    assert [p.text.split("\n")[0] for p in alerts(bot)] == [alerts(bot, "ready")[0].text.split("\n")[0]]
    spans, watcher = bot.runtime.launches.runner(la), bot.runtime.watcher
    kill = spans.stop

    async def kill_with_a_check_meanwhile(la, out):
        assert bot.launch(1).state == LaunchState.STOPPING
        await watcher.check(1)  # a check while duo#1 is being stopped: quiet, and the kill's end decides
        assert watcher.scheduler.is_watched(1)
        return await kill(la, out)

    monkeypatch.setattr(spans, "stop", kill_with_a_check_meanwhile)
    said = await bot.chat.say("!relaunch", thread=la.thread_ts)
    monkeypatch.setattr(spans, "stop", kill)
    assert "duo#2" not in said.text or "Launched duo#2" not in said.text, said.text
    first = bot.launch(1)
    assert first.state == LaunchState.KILL_FAILED, (first.state, first.state_detail)
    assert watcher.scheduler.is_watched(1), "what the kill left is not followed"
    assert "gpu-b" in (first.state_detail or ""), first.state_detail
    every = bot.store.launches.recent(50)
    assert not any(x.state == LaunchState.RUNNING and x.alert_state == "ready" for x in every), \
        [(x.name, x.state) for x in every]
    await two_hosts["gpu-b"].start()
    back = await bot.chat.wait_post(lambda p: "gpu-b (rank 1 of duo#1) is reachable again" in p.text, 90,
                                    what=lambda: f"the back notice ({bot.launch(1).state}, "
                                                 f"{[p.text[:80] for p in bot.chat.posts[-4:]]})")
    assert back.thread_ts == la.thread_ts
    killed = await bot.chat.say("/kill 1 --yes")
    assert bot.launch(1).state == LaunchState.KILLED, killed.text
    await wait_until(lambda: not _ranks_running(la.tag), what="no process of either rank left")
    assert len([p for p in bot.chat.posts if "cannot be reached" in p.text]) == 1
