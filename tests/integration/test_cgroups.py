"""A launch in a cgroup v2 directory of its own (no systemd here): a grandchild that leaves its session and clears its
environment (`setsid env -i python ...`) while holding GPU memory is still the launch's, and `/kill` stops it through
`cgroup.kill`. Where the launch has no cgroup (`cgroup: off`, or no writable cgroup v2), the same escape survives the
kill, and the answer says that not all memory was released and names the holder with `/kill pid=N host=H`.

The cgroup tests need root and a writable cgroup v2 mount (this machine kind has one beside the v1 controllers);
elsewhere they skip."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest

from bot.core.lifecycle import CGROUP_PARENT
from bot.core.models import LaunchState
from tests.support.builders import FAST_WATCH, launch_config
from tests.support.procs import free_port, wait_until

pytestmark = pytest.mark.timeout(180)

ESCAPEE_MIB = 6656


def cgroup2_mount() -> Path | None:
    """The cgroup v2 mount point, if any (the first `cgroup2` line of /proc/mounts)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and parts[2] == "cgroup2":
                return Path(parts[1])
    return None


def cgroups_usable() -> bool:
    """Root on a host whose cgroup v2 mount takes a new directory."""
    mount = cgroup2_mount()
    if os.geteuid() != 0 or mount is None:
        return False
    probe = mount / CGROUP_PARENT / f"gpubot-test-{os.getpid()}.launch"
    try:
        probe.mkdir(parents=True)
        probe.rmdir()
        return True
    except OSError:
        return False


needs_cgroups = pytest.mark.skipif(not cgroups_usable(), reason="needs root and a writable cgroup v2 mount")


def escapee_config(ssh_server, fake_gpu, tmp_path, *, cgroup: str):
    """Variant `escapee`: a server that starts a grandchild with `setsid env -i python` (through a shell that exits
    at once: it has no parent of the launch) which registers 6.5 GiB on
    fake GPU 0 (tests.support: the fake nvidia-smi lists it while it lives) and sleeps, then sleeps itself."""
    holders = fake_gpu.holders_dir
    grandchild = (f"import os,time; open('{holders}/%d' % os.getpid(), 'w').write('0 {ESCAPEE_MIB}'); "
                  "time.sleep(600)")
    # double fork: the shell in between exits, so the grandchild is nobody's descendant either
    code = ("import shlex,subprocess,sys,time; "
            "subprocess.run(['sh', '-c', 'setsid env -i %s -c %s &' % "
            f"(sys.executable, shlex.quote({grandchild!r}))]); "
            "print('server up', flush=True); time.sleep(600)")
    return launch_config(ssh_server, fake_gpu, tmp_path, host={"systemd": "off", "cgroup": cgroup},
                         lifecycle={"release_timeout_s": 4}, variants={"escapee": {
                             "host": "gpu-host-1", "command": "{{ python }} -c {{ code }}", "port": free_port(),
                             "gpus": [0], "params": {"python": {"type": "path", "default": sys.executable},
                                                     "code": {"type": "str", "default": code}}}})


def holder_pids(fake_gpu) -> list[int]:
    """The PIDs registered as fake GPU holders that still run."""
    out = []
    for f in fake_gpu.holders_dir.iterdir():
        if f.name.isdigit() and Path(f"/proc/{f.name}").exists():
            out.append(int(f.name))
    return out


@pytest.fixture
def escapees(fake_gpu):
    """Kills every fake GPU holder left at the end (the escapee has neither tag nor session of the launch)."""
    yield
    for pid in holder_pids(fake_gpu):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@needs_cgroups
async def test_a_grandchild_that_escaped_session_and_environment_is_killed_with_its_cgroup(
        make_bot, ssh_server, fake_gpu, tmp_path, escapees):
    bot = await make_bot(escapee_config(ssh_server, fake_gpu, tmp_path, cgroup="auto"))
    launched = await bot.chat.say("/launch escapee")
    assert "Launched escapee#1" in launched.text, launched.text
    la = bot.launch(1)
    assert (la.unit, la.unit_manager) == (f"gpubot-{la.tag}.launch", "cgroup")
    assert f"cgroup {CGROUP_PARENT}/{la.unit}" in bot.chat.posts[0].text, bot.chat.posts[0].text
    await wait_until(lambda: holder_pids(fake_gpu), what="the escaped grandchild holding GPU memory")
    escapee = holder_pids(fake_gpu)[0]
    assert os.getsid(escapee) != la.sid and b"GPUBOT_LAUNCH" not in Path(f"/proc/{escapee}/environ").read_bytes()
    # the probe counts it as the launch's (its cgroup says so), not as a stranger
    status = await bot.chat.say("/gpu status")
    assert "escapee#1" in status.text and "[foreign" not in status.text, status.text
    killed = await bot.chat.say("/kill 1 --yes")
    assert "Killed escapee#1" in killed.text and "released" in killed.text, killed.text
    assert not Path(f"/proc/{escapee}").exists() or Path(f"/proc/{escapee}/stat").read_text().split()[2] == "Z"
    assert bot.launch(1).state == LaunchState.KILLED
    mount = cgroup2_mount()
    assert mount is not None and not (mount / CGROUP_PARENT / la.unit).exists()  # removed once empty


@needs_cgroups
async def test_a_launch_that_ends_by_itself_removes_its_cgroup(make_bot, ssh_server, fake_gpu, tmp_path):
    cfg = launch_config(ssh_server, fake_gpu, tmp_path, host={"systemd": "off"}, variants={"brief": {
        "host": "gpu-host-1", "command": "{{ python }} -c {{ code }}", "port": free_port(), "gpus": [1],
        "params": {"python": {"type": "path", "default": sys.executable},
                   "code": {"type": "str", "default": "import time; time.sleep(2)"}}}})
    bot = await make_bot(cfg)
    launched = await bot.chat.say("/launch brief")
    assert "Launched brief#1" in launched.text, launched.text
    la = bot.launch(1)
    mount = cgroup2_mount()
    assert la.unit_manager == "cgroup" and mount is not None
    path = mount / CGROUP_PARENT / la.unit
    assert path.is_dir()
    await wait_until(lambda: not path.exists(), timeout=60, what="the cgroup removed after the server exited")
    assert (Path(la.log_path + ".exit")).read_text().strip() == "0"


async def test_without_a_cgroup_an_escaped_holder_is_named_and_memory_is_not_called_released(
        make_bot, ssh_server, fake_gpu, tmp_path, escapees):
    bot = await make_bot(escapee_config(ssh_server, fake_gpu, tmp_path, cgroup="off"))
    launched = await bot.chat.say("/launch escapee")
    assert "Launched escapee#1" in launched.text, launched.text
    assert bot.launch(1).unit is None
    await wait_until(lambda: holder_pids(fake_gpu), what="the escaped grandchild holding GPU memory")
    escapee = holder_pids(fake_gpu)[0]
    killed = await bot.chat.say("/kill 1 --yes")
    assert "not all GPU memory was released" in killed.text, killed.text
    assert f"pid {escapee}" in killed.text and f"/kill pid={escapee} host=gpu-host-1" in killed.text, killed.text
    assert "Killed escapee#1" not in killed.text
    la = bot.launch(1)
    assert la.state == LaunchState.KILL_FAILED and "not all memory released" in (la.state_detail or "")
    assert Path(f"/proc/{escapee}").exists()  # it did escape: the answer told the truth
    # a second /kill finds none of the launch's own processes, but the holder is still there: not "killed"
    again = await bot.chat.say("/kill 1 --yes")
    assert "Killed escapee#1" not in again.text and "no process was left" not in again.text, again.text
    assert f"/kill pid={escapee} host=gpu-host-1" in again.text, again.text
    assert bot.launch(1).state == LaunchState.KILL_FAILED


async def test_a_failed_kill_whose_holder_ends_later_becomes_killed_without_an_alert(
        make_bot, ssh_server, fake_gpu, tmp_path, escapees):
    """The kill left an escaped holder (kill_failed); once it ends (`/kill pid=N`, or by itself) the readiness
    check finds the launch's processes gone and its GPU free: the bot stopped it, so it is `killed`, with no
    "exited ... check who stopped it" alert."""
    config = escapee_config(ssh_server, fake_gpu, tmp_path, cgroup="off")
    bot = await make_bot(config)
    launched = await bot.chat.say("/launch escapee")
    assert "Launched escapee#1" in launched.text, launched.text
    await wait_until(lambda: holder_pids(fake_gpu), what="the escaped grandchild holding GPU memory")
    escapee = holder_pids(fake_gpu)[0]
    await bot.chat.say("/kill 1 --yes")
    assert bot.launch(1).state == LaunchState.KILL_FAILED
    os.kill(escapee, signal.SIGKILL)
    await bot.runtime.close()
    restarted = await make_bot(config, watch=True, watch_policy=FAST_WATCH)  # watches every live launch again
    await wait_until(lambda: restarted.launch(1).state == LaunchState.KILLED, timeout=120, what="the launch killed")
    assert "what it left has ended since" in (restarted.launch(1).state_detail or "")
    assert not [p for p in restarted.chat.posts if "exited" in p.text or "crashed" in p.text], \
        [p.text for p in restarted.chat.posts]


@needs_cgroups
async def test_a_new_launch_removes_empty_cgroups_left_by_earlier_ones(make_bot, ssh_server, fake_gpu, tmp_path,
                                                                       escapees):
    import time

    mount = cgroup2_mount()
    assert mount is not None
    parent = mount / CGROUP_PARENT
    parent.mkdir(exist_ok=True)
    stale = parent / f"gpubot-{os.getpid()}-stale.launch"  # a launch whose wrapper was killed too
    fresh = parent / f"gpubot-{os.getpid()}-fresh.launch"  # one being made beside this launch
    for d in (stale, fresh):
        d.mkdir()
    os.utime(stale, (time.time() - 300, time.time() - 300))
    try:
        bot = await make_bot(escapee_config(ssh_server, fake_gpu, tmp_path, cgroup="auto"))
        launched = await bot.chat.say("/launch escapee")
        assert "Launched escapee#1" in launched.text, launched.text
        assert not stale.exists() and fresh.exists()
        assert (parent / bot.launch(1).unit).exists()  # its own, made after the sweep
        await bot.chat.say("/kill 1 --yes")
    finally:
        for d in (stale, fresh):
            with contextlib.suppress(OSError):
                d.rmdir()
