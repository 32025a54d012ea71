"""Race-free log reads: a process flips a symlink inside `log_dirs` between a file inside and one outside
them as fast as it can, while a viewer probes that path over the loopback SSH server. The probe opens the
path once and reads only the open file, so it shows the inside file or refuses; it never shows the outside
one."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bot.core.models import Snapshot
from bot.core.probe import ProbeRequest
from tests.support.builders import launch_config
from tests.support.procs import wait_until_sync

pytestmark = pytest.mark.timeout(240)

PROBES = 200
FLIPPER = """
import os, sys
link, inside, outside = sys.argv[1:4]
tmp = link + ".tmp"
n = 0
while True:
    target = inside if n % 2 else outside
    try:
        os.symlink(target, tmp)
        os.replace(tmp, link)  # atomic: the link always exists, pointing one way or the other
    except FileExistsError:
        os.unlink(tmp)
    n += 1
    if n == 1:
        open(link + ".started", "w").close()
"""


@pytest.fixture
def flipped(tmp_path):
    """(link, inside text, outside text) with a flipper process running; stopped at teardown."""
    logs = tmp_path / "logs"
    outside_dir = tmp_path / "outside"
    logs.mkdir()
    outside_dir.mkdir()
    inside = logs / "inside.log"
    inside.write_text("INSIDE line\n" * 5)
    outside = outside_dir / "shadow"
    outside.write_text("root:SECRET-OUTSIDE:19000:0:99999:7:::\n" * 5)
    link = logs / "x.log"
    proc = subprocess.Popen([sys.executable, "-c", FLIPPER, str(link), str(inside), str(outside)],
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until_sync(lambda: Path(str(link) + ".started").exists(), 30, what="the flipper running")
        yield link
    finally:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


async def test_a_flipping_symlink_never_lets_a_probe_read_outside_the_log_dirs(make_bot, ssh_server, fake_gpu,
                                                                               tmp_path, flipped):
    cfg = launch_config(ssh_server, fake_gpu, tmp_path, host={"log_dirs": [str(tmp_path / "logs")]})
    bot = await make_bot(cfg)
    req = ProbeRequest(log_path=str(flipped), gpu=False, tail_lines=5, health_path=None)
    results: list = []
    for start in range(0, PROBES, 8):
        results += await asyncio.gather(*(bot.runtime.hosts.probe("gpu-host-1", req)
                                          for _ in range(min(8, PROBES - start))))
    snaps = [r for r in results if isinstance(r, Snapshot)]
    assert len(snaps) == PROBES, [r for r in results if not isinstance(r, Snapshot)][:3]
    shown = [line for s in snaps for line in (s.log.tail if s.log else [])]
    errors = [s.log.error for s in snaps if s.log and s.log.error]
    assert not [line for line in shown if "SECRET" in line]  # 0 outside reads
    inside_reads = sum(1 for s in snaps if s.log and any("INSIDE" in x for x in s.log.tail))
    refused = sum(1 for e in errors if "outside the allowed log directories" in e)
    print(f"[race] {PROBES} probes: {inside_reads} read the inside file, {refused} refused as outside, "
          f"0 outside reads")
    assert inside_reads > 0 and refused > 0  # the flipper really raced both ways
    # and the answer in the chat says so, without the outside file
    answer = await bot.chat.say(f"/probe gpu-host-1 log={flipped}")
    assert "SECRET" not in answer.text and "SECRET" not in str(answer.post.current.blocks if answer.post else "")


async def test_a_fifo_a_device_or_a_directory_is_refused_without_blocking(make_bot, ssh_server, fake_gpu, tmp_path):
    import os

    logs = tmp_path / "logs"
    logs.mkdir()
    fifo = logs / "pipe.log"
    os.mkfifo(fifo)  # no writer: opening it for reading would block
    (logs / "dir.log").mkdir()
    (logs / "dev.log").symlink_to("/dev/zero")
    cfg = launch_config(ssh_server, fake_gpu, tmp_path, host={"log_dirs": [str(logs)]})
    bot = await make_bot(cfg)
    for name, why in (("pipe.log", "not a regular file"), ("dir.log", "is a directory"),
                      ("dev.log", "not a regular file")):
        snap = await bot.runtime.hosts.probe("gpu-host-1", ProbeRequest(log_path=str(logs / name), gpu=False,
                                                                        health_path=None))
        assert isinstance(snap, Snapshot) and snap.log is not None, snap
        assert why in (snap.log.error or ""), (name, snap.log.error)


FLIP_TARGETS = """
import os, sys, time
victim, outside_dir, real_dir, dir_link, *names = sys.argv[1:]
n = 0
while True:
    for name in names:  # each launch's log name: absent, or a symlink to the victim
        try:
            if n % 2:
                os.symlink(victim, name)
            else:
                os.unlink(name)
        except OSError:
            pass
    tmp = dir_link + ".tmp"  # the log directory: the real one, or a symlink to a directory outside
    try:
        os.symlink(outside_dir if n % 2 else real_dir, tmp)
        os.replace(tmp, dir_link)
    except OSError:
        pass
    n += 1
    if n == 1:
        open(dir_link + ".started", "w").close()
"""


def test_launches_racing_a_symlink_flipper_write_nothing_outside_the_log_dirs(tmp_path, request):
    from bot.core.lifecycle import RenderedLaunch, launch_script, parse_launch_output

    logs, outside = tmp_path / "logs", tmp_path / "outside"
    real = logs / "real"
    real.mkdir(parents=True)
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("keep me\n")
    before = victim.stat()
    dir_link = logs / "sub"  # flips between logs/real and outside/
    names = [str(logs / f"base-{i}.log") for i in range(25)]  # the file names, as if predicted
    proc = subprocess.Popen([sys.executable, "-c", FLIP_TARGETS, str(victim), str(outside), str(real),
                             str(dir_link), *names], stdin=subprocess.DEVNULL, start_new_session=True)
    request.addfinalizer(proc.kill)
    wait_until_sync(lambda: Path(str(dir_link) + ".started").exists(), 30, what="the flipper running")
    paths = names + [str(dir_link / f"base-{i}.log") for i in range(25)]
    outcomes = {"created": 0, "refused": 0}
    for i, path in enumerate(paths):
        r = RenderedLaunch(variant="base", host="h", command="true", log_path=path, port=None, gpus=[],
                           env={"GPUBOT_LAUNCH": f"{i}-abcdef123456"}, workdir=None, params={},
                           log_dirs=[str(logs)])
        res = subprocess.run(["sh", "-s"], input=launch_script(r), capture_output=True, text=True, timeout=30)
        started = parse_launch_output(res.stdout)
        if started is None:
            assert res.returncode == 3 and "refusing" in res.stdout, res.stdout + res.stderr
            outcomes["refused"] += 1
        else:
            outcomes["created"] += 1
    proc.kill()
    proc.wait(timeout=10)
    print(f"[race] {len(paths)} launches: {outcomes['created']} created their log, {outcomes['refused']} refused, "
          f"files written outside: {sorted(p.name for p in outside.iterdir() if p.name != 'victim')}")
    assert victim.read_text() == "keep me\n" and victim.stat().st_mtime_ns == before.st_mtime_ns
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]  # 0 files written outside log_dirs
    assert outcomes["created"] > 0


@pytest.mark.parametrize("shape", ["a symlinked subdirectory", "a symlink to a device", "a symlink to a fifo"])
def test_a_launch_creates_nothing_through_a_symlink_out_of_the_log_dirs(tmp_path, shape):
    """`mkdir -p` would follow a symlink inside log_dirs and create directories outside; a symlink named like
    the log would be opened by noclobber when it points at a device or FIFO. Both are refused first."""
    from bot.core.lifecycle import RenderedLaunch, launch_script, parse_launch_output

    logs, outside = tmp_path / "logs", tmp_path / "outside"
    logs.mkdir()
    outside.mkdir()
    if shape == "a symlinked subdirectory":
        (logs / "link").symlink_to(outside)
        path = logs / "link" / "made" / "by" / "bot" / "x.log"
    elif shape == "a symlink to a device":
        path = logs / "x.log"
        path.symlink_to("/dev/null")
    else:
        os.mkfifo(outside / "pipe")
        path = logs / "x.log"
        path.symlink_to(outside / "pipe")
    r = RenderedLaunch(variant="base", host="h", command="echo started", log_path=str(path), port=None, gpus=[],
                       env={"GPUBOT_LAUNCH": "1-abcdef123456"}, workdir=None, params={}, log_dirs=[str(logs)])
    res = subprocess.run(["sh", "-s"], input=launch_script(r), capture_output=True, text=True, timeout=30)
    assert parse_launch_output(res.stdout) is None and res.returncode == 3, res.stdout + res.stderr
    assert "refusing" in res.stdout
    assert sorted(p.name for p in outside.iterdir()) == ([] if shape != "a symlink to a fifo" else ["pipe"])
