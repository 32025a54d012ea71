"""Launches in their own transient systemd scope, and the fallback where there is none. This machine's PID 1
is not systemd, so the scope path runs against stand-ins for systemd-run/systemctl/loginctl
(tests/support/fakes/systemd.py) that record their calls and exec the command as the real systemd-run does;
the real-systemd test runs only on a host where systemd answers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bot.core.lifecycle import RenderedLaunch, launch_script, parse_launch_output, signal_script
from tests.support.builders import launch_config
from tests.support.fakes.ssh_server import LoopbackSSHServer
from tests.support.fakes.systemd import install_systemd_standins
from tests.support.procs import wait_until_sync

pytestmark = pytest.mark.timeout(120)

MANAGER = "system" if os.geteuid() == 0 else "user"


def rendered(tmp_path: Path, command: str, path: str | None = None, tag: str = "9-abcdef") -> RenderedLaunch:
    env = {"GPUBOT_LAUNCH": tag, **({"PATH": path} if path else {})}
    return RenderedLaunch(variant="v", host="h", command=command, log_path=str(tmp_path / "logs" / "s.log"),
                          port=None, gpus=[], env=env, workdir=None, params={})


def run_launch(r: RenderedLaunch, request) -> tuple:
    out = subprocess.run(["sh", "-s"], input=launch_script(r, systemd=True), capture_output=True, text=True,
                         timeout=30).stdout
    started = parse_launch_output(out)
    assert started is not None, out
    request.addfinalizer(lambda: _kill_group(started.pgid))
    return started, out


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def test_the_launch_runs_in_a_scope_when_the_manager_allows_it(tmp_path, request):
    sd = install_systemd_standins(tmp_path / "bin")
    started, out = run_launch(rendered(tmp_path, "sh -c 'echo started; exec sleep 60'", sd.path), request)
    assert (started.unit, started.manager) == ("gpubot-9-abcdef.scope", MANAGER), out
    wait_log_sync(tmp_path / "logs" / "s.log", "started")
    runs = [c for c in sd.calls() if c.startswith("systemd-run")]
    assert runs[0].endswith("--scope --quiet --collect true")  # a trial scope first
    assert "--scope --quiet --collect --unit=gpubot-9-abcdef -- sh -c exec 3>&2" in runs[1], runs
    # systemd-run execs the wrapper: the wrapper's PID is still the process group and session leader
    assert os.getpgid(started.pid) == started.pgid == os.getsid(started.pid)


def test_a_refused_scope_falls_back_to_a_plain_session(tmp_path, request):
    sd = install_systemd_standins(tmp_path / "bin")
    sd.refuse_scopes()
    started, out = run_launch(rendered(tmp_path, "sh -c 'echo started; exec sleep 60'", sd.path), request)
    assert started.unit is None and "UNIT=" not in out
    wait_log_sync(tmp_path / "logs" / "s.log", "started")
    assert [c for c in sd.calls() if c.startswith("systemd-run")] == [
        "systemd-run --scope --quiet --collect true" if MANAGER == "system" else
        "systemd-run --user --scope --quiet --collect true"]


def test_no_manager_means_no_systemd_run_at_all(tmp_path, request):
    sd = install_systemd_standins(tmp_path / "bin")
    sd.stop_manager()
    started, _ = run_launch(rendered(tmp_path, "sh -c 'echo started; exec sleep 60'", sd.path), request)
    assert started.unit is None
    assert not [c for c in sd.calls() if c.startswith("systemd-run")]
    wait_log_sync(tmp_path / "logs" / "s.log", "started")


def test_this_machine_without_systemd_launches_as_before(tmp_path, request):
    if subprocess.run(["sh", "-c", "systemctl show-environment"], capture_output=True).returncode == 0:
        pytest.skip("systemd answers here: see test_a_real_scope_holds_a_child_that_left_its_session")
    started, out = run_launch(rendered(tmp_path, "sh -c 'echo started; exec sleep 60'"), request)
    assert started.unit is None and started.pid != started.pgid, out
    wait_log_sync(tmp_path / "logs" / "s.log", "started")


def test_a_real_scope_holds_a_child_that_left_its_session(tmp_path, request):
    if os.geteuid() != 0 or subprocess.run(["sh", "-c", "systemctl show-environment"],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root on a host whose PID 1 is systemd (this machine's is not)")
    child = f"env -i setsid {sys.executable} -c 'import time; time.sleep(120)'"
    started, _ = run_launch(rendered(tmp_path, f"sh -c '{child} & echo started; exec sleep 60'"), request)
    assert started.unit == "gpubot-9-abcdef.scope"
    wait_log_sync(tmp_path / "logs" / "s.log", "started")
    members = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _in_unit(p, started.unit)]
    assert len(members) >= 3  # wrapper, server, the child with neither tag nor session
    subprocess.run(["sh", "-s"], input=signal_script([], None, "KILL", unit=started.unit, manager="system"),
                   text=True, timeout=15, check=True)
    wait_until_sync(lambda: not [p for p in members if p.exists() and _in_unit(p, started.unit)], 30,
                    what="every process of the scope gone")


def _in_unit(proc: Path, unit: str) -> bool:
    with contextlib.suppress(OSError):
        return f"/{unit}" in (proc / "cgroup").read_text()
    return False


def wait_log_sync(path: Path, text: str) -> None:
    wait_until_sync(lambda: path.exists() and text in path.read_text(errors="replace"), 30, what=f"{text!r} logged")


@pytest.fixture
def standins(tmp_path):
    """The systemd stand-ins under tmp_path/bin."""
    return install_systemd_standins(tmp_path / "bin")


@pytest.fixture
async def scoped_ssh(tmp_path, fake_gpu, standins):
    """A loopback SSH server whose commands find the stand-ins (then the fake nvidia-smi) first on PATH."""
    path = f"{standins.bin_dir}:{fake_gpu.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    async with LoopbackSSHServer(tmp_path / "ssh-scoped", env={"PATH": path}) as srv:
        yield srv


async def test_a_launch_in_a_scope_is_killed_through_its_unit(make_bot, scoped_ssh, fake_gpu, standins, tmp_path):
    bot = await make_bot(launch_config(scoped_ssh, fake_gpu, tmp_path))
    launched = await bot.chat.say("/launch base mode=ready")
    assert "Launched base#1" in launched.text, launched.text
    la = bot.launch(1)
    unit = f"gpubot-{la.tag}.scope"
    assert (la.unit, la.unit_manager) == (unit, MANAGER)
    assert f"systemd scope {unit}" in bot.chat.posts[0].text, bot.chat.posts[0].text
    killed = await bot.chat.say("/kill 1 --yes")
    assert "released" in killed.text, killed.text
    kills = [c for c in standins.calls() if " kill " in f" {c} "]
    assert kills and kills[0].endswith(f"kill --signal=SIGTERM -- {unit}"), standins.calls()
    assert bot.launch(1).unit == unit  # kept for the record after the end


async def test_a_host_with_systemd_off_never_asks_for_a_scope(make_bot, scoped_ssh, fake_gpu, standins, tmp_path):
    bot = await make_bot(launch_config(scoped_ssh, fake_gpu, tmp_path, host={"systemd": "off", "cgroup": "off"}))
    launched = await bot.chat.say("/launch base mode=ready")
    assert "Launched base#1" in launched.text, launched.text
    assert bot.launch(1).unit is None and standins.calls() == []
    killed = await bot.chat.say("/kill 1 --yes")
    assert "released" in killed.text and standins.calls() == [], killed.text


def test_a_scope_refused_for_the_server_after_the_trial_falls_back(tmp_path, request):
    sd = install_systemd_standins(tmp_path / "bin")
    # the trial scope starts; the named one is refused (a unit name taken, a policy)
    run = sd.bin_dir / "systemd-run"
    refuse_named = 'echo "systemd-run $*" >> "$d/calls"; case "$*" in *--unit=*) exit 1;; esac'
    run.write_text(run.read_text().replace('echo "systemd-run $*" >> "$d/calls"', refuse_named))
    started, out = run_launch(rendered(tmp_path, "sh -c 'echo started; exec sleep 60'", sd.path), request)
    assert started.unit is None and "UNIT=" not in out, out
    assert started.pid != started.pgid and os.getpgid(started.pid) == started.pgid  # the real server, no scope
    wait_log_sync(tmp_path / "logs" / "s.log", "started")


def test_a_wedged_systemd_costs_seconds_not_the_launch(tmp_path, request):
    sd = install_systemd_standins(tmp_path / "bin")
    ctl = sd.bin_dir / "systemctl"
    ctl.write_text(ctl.read_text().replace('echo "systemctl $*" >> "$d/calls"',
                                           'echo "systemctl $*" >> "$d/calls"; exec sleep 60'))
    started, _ = run_launch(rendered(tmp_path, "sh -c 'echo started; exec sleep 60'", sd.path), request)
    assert started.unit is None
    wait_log_sync(tmp_path / "logs" / "s.log", "started")


def test_the_exit_line_starts_its_own_line_after_a_cut_off_last_line(tmp_path, request):
    run_launch(rendered(tmp_path, "printf 'Loading 1/2'"), request)
    log = tmp_path / "logs" / "s.log"
    wait_log_sync(log, "exited with status")
    assert log.read_text().splitlines() == ["Loading 1/2", "[gpubot] the server process exited with status 0"]


def test_a_slow_scope_start_is_waited_for_never_started_twice(tmp_path, request):
    sd = install_systemd_standins(tmp_path / "bin")
    run = sd.bin_dir / "systemd-run"
    slow_named = 'echo "systemd-run $*" >> "$d/calls"; case "$*" in *--unit=*) sleep 12;; esac'
    run.write_text(run.read_text().replace('echo "systemd-run $*" >> "$d/calls"', slow_named))
    log = tmp_path / "logs" / "s.log"
    started, out = run_launch(rendered(tmp_path, "sh -c 'echo started $$; exec sleep 60'", sd.path), request)
    # the PID file stayed empty for the whole wait: the launch is reported with its group, and no second
    # copy was started without the scope
    assert started.pid == started.pgid and started.unit is not None, out
    wait_log_sync(log, "started")
    assert log.read_text().count("started") == 1
    assert len([c for c in sd.calls() if "--unit=" in c]) == 1
