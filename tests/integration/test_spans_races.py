"""Races of /kill and of Slurm with launches across nodes, with stand-ins for sbatch/squeue/scancel on PATH (Slurm's
side is tested for real in test_slurm_launch.py) and two local hosts: a kill while sbatch runs cancels the job it
returns; a kill while a multi-host launch's ranks start leaves no rank; a rank whose start failed half way is
stopped; a job Slurm still runs is never ended by a look at one node."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from bot.config import Config
from bot.core.models import LaunchState
from bot.demo.fakegpu import install_fake_gpu
from bot.services.runners.hosts import MultiHostRunner
from tests.support.builders import FAST_WATCH, OPERATOR
from tests.support.procs import free_port, wait_until

pytestmark = pytest.mark.timeout(120)

SBATCH = """#!/bin/sh
D={d}
cat > $D/script
sleep $(cat $D/delay 2>/dev/null || echo 0)
echo 4242 >> $D/submitted
echo 4242
"""
SQUEUE = """#!/bin/sh
D={d}
echo >> $D/shown
sleep $(cat $D/squeue_delay 2>/dev/null || echo 0)
if [ -e $D/cancelled ]; then st=CANCELLED; status=15; else st=RUNNING; status=0; fi
echo "4242|$st|$status|elsewhere1|0:05|UNLIMITED|0|None"
"""
SCANCEL = """#!/bin/sh
if [ -e {d}/scancel_fails ]; then
  echo "scancel: error: Unable to contact slurm controller (connect failure)" >&2; exit 1
fi
touch {d}/cancelled
"""


def _fake_slurm(d: Path) -> Path:
    b = d / "bin"
    b.mkdir(parents=True)
    for name, text in (("sbatch", SBATCH), ("squeue", SQUEUE), ("scancel", SCANCEL)):
        (b / name).write_text(text.format(d=d))
        (b / name).chmod(0o755)
    return b


@pytest.fixture
async def sl_bot(make_bot, tmp_path, monkeypatch):
    b = _fake_slurm(tmp_path)
    monkeypatch.setenv("PATH", f"{b}:{os.environ['PATH']}")
    logs = tmp_path / "logs"
    logs.mkdir()
    gpu = install_fake_gpu(tmp_path / "fakegpu", gpu_count=2)
    node = {"local": True, "nvidia_smi": str(gpu.bin_dir / "nvidia-smi"), "use_nvml": False,
            "log_dirs": [str(logs)], "systemd": "off", "cgroup": "off"}
    cfg = Config.model_validate({
        "hosts": {"login": {"local": True, "runner": "slurm", "log_dirs": [str(logs)]},
                  "a": node, "b": dict(node)},
        "variants": {
            "s": {"host": "login", "command": "sleep 300", "nodes": 1, "gpus_per_node": 1, "port": free_port()},
            "m": {"hosts": ["a", "b"], "command": "sleep 300", "gpus": [0], "port": free_port()},
        },
        "state_dir": str(tmp_path / "state"),
        "permissions": {"operators": [OPERATOR]},
        "lifecycle": {"kill_grace_s": 2, "release_timeout_s": 5},
    })
    bot = await make_bot(cfg, watch=True, watch_policy=FAST_WATCH)
    bot.dir = tmp_path
    return bot


async def test_kill_while_sbatch_in_flight_leaves_no_job(sl_bot):
    bot = sl_bot
    (bot.dir / "delay").write_text("3")
    t = asyncio.ensure_future(bot.chat.say("/launch s"))
    await wait_until(lambda: (bot.dir / "script").exists(), what="sbatch reading the script")
    await bot.chat.say("/kill 1 --yes")
    said = await t
    assert "Slurm job 4242 cancelled" in said.text, said.text
    assert (bot.dir / "cancelled").exists()
    la = bot.launch(1)
    assert not la.live and la.job_id == "4242"


def _tagged(tag: str) -> list[tuple[int, str]]:
    out = []
    for e in Path("/proc").iterdir():
        if e.name.isdigit():
            try:
                env = (e / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            for x in env:
                if x == f"GPUBOT_LAUNCH={tag}".encode() or x.startswith(f"GPUBOT_LAUNCH={tag}-r".encode()):
                    out.append((int(e.name), x.decode()))
    return out


async def test_kill_while_multi_host_ranks_start_stops_every_rank(sl_bot, monkeypatch):
    bot = sl_bot
    orig = MultiHostRunner._start_rank

    async def slow(self, r, host):  # an SSH round trip to a far host
        res = await orig(self, r, host)
        await asyncio.sleep(2)
        return res
    monkeypatch.setattr(MultiHostRunner, "_start_rank", slow)
    t = asyncio.ensure_future(bot.chat.say("/launch m"))
    row = await wait_until(lambda: bot.runtime.launches.get(1), what="the launch recorded")
    await wait_until(lambda: _tagged(row.tag), what="rank 1 started")
    await bot.chat.say("/kill 1 --yes")
    said = await t
    assert "killed while its ranks were starting" in said.text, said.text
    await wait_until(lambda: not _tagged(row.tag), timeout=20, what="no rank left")
    assert not bot.launch(1).live


async def test_rank1_fails_rank0_not_started_and_nothing_left(sl_bot, monkeypatch):
    bot = sl_bot
    orig = MultiHostRunner._start_rank

    async def failing(self, r, host):  # rank 1's script ran (its process started) but the SSH session timed out
        await orig(self, r, host)
        return "timed out after 30 s"
    monkeypatch.setattr(MultiHostRunner, "_start_rank", failing)
    said = await bot.chat.say("/launch m")
    assert "rank 1 on b could not start" in said.text, said.text
    la = bot.launch(1)
    assert la.state == LaunchState.FAILED
    await wait_until(lambda: not _tagged(la.tag), timeout=20, what="rank 1 stopped")


async def test_a_kill_while_the_submitted_job_is_read_back_cancels_it_or_stays_followed(sl_bot):
    """The job's id is recorded as soon as sbatch returns: a `/kill` while the start still reads the job back
    (`squeue`, slow here) scancels it; when scancel fails, the launch stays live and followed with its job, and the
    kill says it failed (never "nothing was left to kill" with the job running unseen)."""
    bot = sl_bot
    (bot.dir / "squeue_delay").write_text("3")
    (bot.dir / "scancel_fails").write_text("")
    t = asyncio.ensure_future(bot.chat.say("/launch s"))
    await wait_until(lambda: (bot.dir / "shown").exists(), what="the start reading the job back")
    assert bot.launch(1).job_id == "4242"
    killed = await bot.chat.say("/kill 1 --yes")
    said = await t
    (bot.dir / "squeue_delay").write_text("0")
    la = bot.launch(1)
    assert "scancel" in killed.text and "no process was left" not in killed.text, killed.text
    assert la.live and la.job_id == "4242", (la.state, la.state_detail, said.text)
    assert bot.runtime.watcher.scheduler.is_watched(1)
    kills = [e.result for e in bot.store.events.list() if e.action == "kill"]
    assert kills and kills[-1] not in ("cancelled", "released", "killed"), kills
    (bot.dir / "scancel_fails").unlink()
    again = await bot.chat.say("/kill 1 --yes")
    assert (bot.dir / "cancelled").exists() and not bot.launch(1).live, again.text


async def test_rank0_failing_to_start_is_recorded_failed_then_the_started_ranks_are_stopped(sl_bot, monkeypatch):
    bot = sl_bot
    from bot.services.runners import hosts as hosts_runner

    real = hosts_runner.run_launch_script
    states: list[LaunchState] = []

    async def rank0_fails(config, hosts, host, r):
        if host == "a":  # rank 0's host; rank 1 on b has started by now
            return None, "planted: the launch script could not run"
        return await real(config, hosts, host, r)

    stop = MultiHostRunner._stop_ranks

    async def stopping(self, la, ranks):
        states.append(bot.launch(la.id).state)  # what the thread shows while the ranks are stopped
        return await stop(self, la, ranks)

    monkeypatch.setattr(hosts_runner, "run_launch_script", rank0_fails)
    monkeypatch.setattr(MultiHostRunner, "_stop_ranks", stopping)
    said = await bot.chat.say("/launch m")
    assert "planted" in said.text, said.text
    la = bot.launch(1)
    assert la.state == LaunchState.FAILED and states == [LaunchState.FAILED], (la.state, states)
    await wait_until(lambda: not _tagged(la.tag), timeout=20, what="rank 1 stopped")


async def test_job_running_but_step_not_started_yet_is_not_ended(sl_bot):
    """Slurm says RUNNING on node a (a host of the config), but srun has not started rank 0 yet (a prolog, a
    container image being pulled): the launch must not end while Slurm still runs the job."""
    bot = sl_bot
    (bot.dir / "bin" / "squeue").write_text(SQUEUE.format(d=bot.dir).replace("|elsewhere1|", "|a|"))
    said = await bot.chat.say("/launch s")
    assert "Submitted s#1" in said.text, said.text
    await wait_until(lambda: bot.launch(1).nodes == ["a"], what="the job's node recorded")
    shown = len((bot.dir / "shown").read_text().splitlines())
    await wait_until(lambda: len((bot.dir / "shown").read_text().splitlines()) >= shown + 6, timeout=60,
                     what="several checks of the job")
    la = bot.launch(1)
    assert la.live and la.alert_state is None, (la.state, la.alert_state, la.state_detail)
    assert not (bot.dir / "cancelled").exists()
