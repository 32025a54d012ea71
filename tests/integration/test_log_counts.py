"""A log's line count never costs a full reread, and never shows a wrong exact number: each probe counts at most
LOG_COUNT_BYTES on from where the last one stopped (the same file, grown), says "at least N" until the count
reached the end, starts again from 0 when the file was replaced or truncated; a check can read just what was
written after its cursor. Real files, real shell, this machine as the host."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest

from bot.config import Config, HostConfig
from bot.core import probe as probe_module
from bot.core.models import Snapshot
from bot.core.probe import ProbeRequest
from bot.services.hosts import HostService

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def svc(tmp_path, fake_gpu):
    cfg = Config(hosts={"me": HostConfig(local=True, use_nvml=False, nvidia_smi=str(fake_gpu.nvidia_smi),
                                         log_dirs=[str(tmp_path)])})
    return HostService(cfg)


def write_lines(path, start: int, n: int, mode: str = "a") -> None:
    with open(path, mode) as f:
        f.writelines(f"[2025-12-03 10:00:00 TP0] line {i} of the server log, padded to a realistic width\n"
                     for i in range(start, start + n))


async def log_of(svc: HostService, req: ProbeRequest):
    snap = await svc.probe("me", req)
    assert isinstance(snap, Snapshot) and snap.log is not None and snap.log.exists, snap
    return snap.log


async def test_a_grown_log_is_counted_from_where_the_last_probe_stopped(svc, tmp_path, monkeypatch):
    log = tmp_path / "server.log"
    write_lines(log, 0, 1000)
    req = ProbeRequest(log_path=str(log), gpu=False, processes=False)
    first = await log_of(svc, req)
    assert (first.lines, first.lines_exact) == (1000, True)
    assert first.cursor is not None and first.cursor.offset == log.stat().st_size
    write_lines(log, 1000, 37)
    # a budget smaller than the whole file: an exact total can only come from counting on from the cursor
    monkeypatch.setattr(probe_module, "LOG_COUNT_BYTES", 8192)
    second = await log_of(svc, req)
    assert (second.lines, second.lines_exact) == (1037, True)
    assert second.cursor.offset == log.stat().st_size


async def test_a_log_larger_than_the_budget_says_at_least_and_converges_exactly(svc, tmp_path, monkeypatch):
    monkeypatch.setattr(probe_module, "LOG_COUNT_BYTES", 16384)
    log = tmp_path / "big.log"
    write_lines(log, 0, 2000)  # about 160 KiB: ten budgets
    req = ProbeRequest(log_path=str(log), gpu=False, processes=False)
    seen = []
    for _ in range(30):
        info = await log_of(svc, req)
        seen.append((info.lines, info.lines_exact))
        assert info.lines is not None and info.lines <= 2000, "a count is never more than the truth"
        if info.lines_exact:
            break
    assert seen[0][1] is False and 0 < seen[0][0] < 2000, "the first probe says 'at least', never a wrong exact"
    assert seen[-1] == (2000, True), seen
    assert [n for n, _ in seen] == sorted(n for n, _ in seen), "the count only grows while it catches up"


@pytest.mark.parametrize("how", ["replaced", "truncated"])
async def test_a_replaced_or_truncated_log_is_counted_again_from_its_start(svc, tmp_path, how):
    log = tmp_path / "rot.log"
    write_lines(log, 0, 500)
    req = ProbeRequest(log_path=str(log), gpu=False, processes=False)
    assert (await log_of(svc, req)).lines == 500
    if how == "replaced":  # logrotate's create: a new file under the same name
        os.rename(log, tmp_path / "rot.log.1")
        write_lines(log, 0, 7, mode="w")
    else:  # copytruncate: the same file, emptied, written again
        with open(log, "r+") as f:
            f.truncate(0)
        write_lines(log, 0, 7)
    info = await log_of(svc, req)
    assert (info.lines, info.lines_exact) == (7, True)


async def test_a_check_reads_only_what_was_written_after_its_cursor(svc, tmp_path):
    log = tmp_path / "since.log"
    write_lines(log, 0, 300)
    req = ProbeRequest(log_path=str(log), gpu=False, processes=False, tail_lines=20)
    cursor = (await log_of(svc, req)).cursor
    write_lines(log, 300, 3)
    info = await log_of(svc, dataclasses.replace(req, log_cursor=cursor, log_since=True))
    assert info.since == cursor.offset
    assert [line.split("] ")[1].split(" of")[0] for line in info.tail] == ["line 300", "line 301", "line 302"]
    assert (info.lines, info.lines_exact) == (303, True)
    # nothing new: an empty window, not the last lines again
    again = await log_of(svc, dataclasses.replace(req, log_cursor=info.cursor, log_since=True))
    assert again.since == info.cursor.offset and again.tail == []
    # a cursor of another file (the log was replaced): the last lines, as without one
    os.rename(log, tmp_path / "since.log.1")
    write_lines(log, 0, 5, mode="w")
    fresh = await log_of(svc, dataclasses.replace(req, log_cursor=info.cursor, log_since=True))
    assert fresh.since is None and len(fresh.tail) == 5 and fresh.lines == 5


@pytest.fixture
def plain_tools(tmp_path) -> str:
    """A PATH whose `stat` refuses `%.9Y` and whose `dd` refuses `iflag=` (as older or smaller coreutils, e.g.
    BusyBox builds, do): the probe falls back to one `stat` per field and to `tail | head`. Returns that PATH."""
    bin_dir = tmp_path / "plain-bin"
    bin_dir.mkdir()
    for name, refuse in (("stat", "*%.9Y*"), ("dd", "*iflag=*")):
        real = next(p for d in os.environ.get("PATH", "/usr/bin:/bin").split(":")
                    if os.access(p := os.path.join(d, name), os.X_OK))
        (bin_dir / name).write_text(f'#!/bin/sh\nfor a in "$@"; do case "$a" in {refuse}) '
                                    f'echo "{name}: invalid argument" >&2; exit 1;; esac; done\nexec {real} "$@"\n')
        (bin_dir / name).chmod(0o755)
    return f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"


@pytest.mark.parametrize("tools", ["gnu", "plain"])
async def test_counts_and_windows_are_the_same_with_plain_stat_and_dd(tmp_path, fake_gpu, plain_tools, tools,
                                                                      monkeypatch):
    env = {"PATH": plain_tools} if tools == "plain" else {}
    svc = HostService(Config(hosts={"me": HostConfig(local=True, use_nvml=False, env=env, log_dirs=[str(tmp_path)],
                                                     nvidia_smi=str(fake_gpu.nvidia_smi))}))
    monkeypatch.setattr(probe_module, "LOG_COUNT_BYTES", 16384)
    log = tmp_path / "server.log"
    write_lines(log, 0, 1000)  # about 80 KiB: five budgets
    req = ProbeRequest(log_path=str(log), gpu=False, processes=False, tail_lines=5)
    seen = []
    for _ in range(12):
        info = await log_of(svc, req)
        seen.append((info.lines, info.lines_exact))
        if info.lines_exact:
            break
    assert seen[0][1] is False and seen[-1] == (1000, True), seen
    assert info.size_bytes == log.stat().st_size and info.mtime == pytest.approx(log.stat().st_mtime, abs=1.0)
    assert info.cursor.inode == log.stat().st_ino and info.cursor.offset == log.stat().st_size
    write_lines(log, 1000, 2)
    grown = await log_of(svc, dataclasses.replace(req, log_cursor=info.cursor, log_since=True))
    assert (grown.lines, grown.lines_exact) == (1002, True)
    assert [line.split("] ")[1].split(" of")[0] for line in grown.tail] == ["line 1000", "line 1001"]


async def test_an_environment_value_with_line_breaks_never_forges_another_process_tag(svc, tmp_path):
    """A process whose GPUBOT_LAUNCH value carries a newline (or a CR) followed by what looks like another
    process's tag line claims nothing for that other process: only its own (malformed) value is seen."""
    import subprocess

    me = os.getpid()
    forged = {f"mine\n/proc/{me}/environ:GPUBOT_LAUNCH=base-7", f"mine\r/proc/{me}/environ:GPUBOT_LAUNCH=base-8"}
    procs = [subprocess.Popen(["sleep", "60"], env={"GPUBOT_LAUNCH": v, "PATH": os.environ["PATH"]})
             for v in sorted(forged)]
    try:
        snap = await svc.probe("me", ProbeRequest(gpu=False, select_tag="base-7"))
        assert isinstance(snap, Snapshot), snap
        assert snap.launch_tags.get(me) is None, snap.launch_tags
        assert not {t for t in snap.launch_tags.values() if t in ("base-7", "base-8")}, snap.launch_tags
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.parametrize(("name", "value"), [("DB_PASSWORD=", "Zq8mN2pL9xWv"), ("--api-key ", "Zq8mN2pL9xWv"),
                                             ("Authorization: Bearer ", "Zq8mN2pL9xWvKq81")])
async def test_a_window_from_a_cursor_inside_a_line_never_shows_a_secret_value_without_its_name(svc, tmp_path,
                                                                                              name, value):
    """A writer flushed a secret's NAME before one check and its VALUE after it: the check's window starts inside
    that line, and shows it whole, redacted (the name is read back from before the cursor)."""
    log = tmp_path / "buffered.log"
    write_lines(log, 0, 10)
    with open(log, "a") as f:
        f.write(f"connecting with {name}")
    req = ProbeRequest(log_path=str(log), gpu=False, processes=False, tail_lines=20)
    cursor = (await log_of(svc, req)).cursor
    with open(log, "a") as f:
        f.write(f"{value} to db\nnext line\n")
    info = await log_of(svc, dataclasses.replace(req, log_cursor=cursor, log_since=True))
    assert info.since == cursor.offset
    assert not any(value in line for line in info.tail), info.tail
    assert len(info.tail) == 2 and info.tail[0].startswith("connecting with") and info.tail[1] == "next line"


async def test_a_window_from_a_cursor_sees_a_secret_name_on_the_line_above(svc, tmp_path, monkeypatch):
    """`password:` at the end of what one check read, the value on the next line: the window is redacted with the
    line above it as context. A cursor further in than the context reach shows its line as cut."""
    log = tmp_path / "yaml.log"
    write_lines(log, 0, 5)
    with open(log, "a") as f:
        f.write("  password:\n")
    req = ProbeRequest(log_path=str(log), gpu=False, processes=False, tail_lines=20)
    cursor = (await log_of(svc, req)).cursor
    with open(log, "a") as f:
        f.write("    Zq8mN2pL9xWv\nok\n")
    info = await log_of(svc, dataclasses.replace(req, log_cursor=cursor, log_since=True))
    assert not any("Zq8mN2pL9xWv" in line for line in info.tail), info.tail
    assert info.tail[-1] == "ok" and len(info.tail) == 2
    # one line longer than the context read back: its start (where a name may be) is not shown
    monkeypatch.setattr(probe_module, "LOG_SINCE_CONTEXT_BYTES", 16)
    with open(log, "a") as f:
        f.write("x" * 40 + " DB_PASSWORD=")
    cursor = (await log_of(svc, req)).cursor
    with open(log, "a") as f:
        f.write("Zq8mN2pL9xWv\n")
    cut = await log_of(svc, dataclasses.replace(req, log_cursor=cursor, log_since=True))
    assert len(cut.tail) == 1 and "Zq8mN2pL9xWv" not in cut.tail[0] and "cut by the read window" in cut.tail[0]


@pytest.mark.parametrize("how", ["copytruncate", "copied over", "plain tools"])
async def test_a_log_truncated_and_written_past_the_cursor_is_counted_again(tmp_path, fake_gpu, plain_tools, how):
    """The same inode, at least as long as where the last count stopped, but not the same bytes there (logrotate's
    copytruncate then a busy writer; `cp` over the log): counted again from the start, exactly. Also where `dd`
    and `stat` are plain (the fallbacks)."""
    env = {"PATH": plain_tools} if how == "plain tools" else {}
    svc = HostService(Config(hosts={"me": HostConfig(local=True, use_nvml=False, env=env, log_dirs=[str(tmp_path)],
                                                     nvidia_smi=str(fake_gpu.nvidia_smi))}))
    log = tmp_path / "busy.log"
    log.write_text("".join(f"{i}\n" for i in range(1, 11)))
    req = ProbeRequest(log_path=str(log), gpu=False, processes=False, tail_lines=5)
    first = await log_of(svc, req)
    assert (first.lines, first.lines_exact) == (10, True) and first.cursor.mark.endswith(b"10\n")
    inode = log.stat().st_ino
    if how == "copied over":
        src = tmp_path / "other"
        src.write_text("y\n" * 5000)
        shutil.copyfile(src, log)
    else:
        with open(log, "r+") as f:
            f.truncate(0)
        write_lines(log, 0, 30)
    assert log.stat().st_ino == inode and log.stat().st_size > first.cursor.offset
    again = await log_of(svc, req)
    truth = log.read_bytes().count(b"\n")
    assert (again.lines, again.lines_exact) == (truth, True)
    # a check's window from the old cursor: not "what was written after it" (it was not), but the last lines
    window = await log_of(svc, dataclasses.replace(req, log_cursor=first.cursor, log_since=True))
    assert window.since is None and window.lines == truth and len(window.tail) == 5
    # and the same file simply grown is still counted on from the cursor
    with open(log, "a") as f:
        f.write("one more\n")
    grown = await log_of(svc, dataclasses.replace(req, log_cursor=again.cursor))
    assert (grown.lines, grown.lines_exact) == (truth + 1, True)


def test_an_older_bots_cursor_without_a_mark_is_read_and_a_bad_one_refused():
    from bot.core.models import LogCursor

    assert LogCursor.from_list([1, 2, 30, 4]) == LogCursor(1, 2, 30, 4, b"")
    c = LogCursor(1, 2, 30, 4, b"ab\n")
    assert LogCursor.from_list(c.as_list()) == c
    for bad in ([1, 2, 30, 4, "zz"], [1, 2, 30, 4, "abc"], [1, 2, 30, 4, 5], [1, 2, 30, 4, "00" * 65], [1, 2, -1, 4]):
        assert LogCursor.from_list(bad) is None, bad


async def test_a_log_read_that_hangs_loses_only_the_log(tmp_path, fake_gpu):
    """The log part never finishes (here a `stat` that hangs, as an open of a FIFO swapped in after the checks
    would): when the budget runs out, every other section still comes back, and the log says why it is missing."""
    bin_dir = tmp_path / "hang-bin"
    bin_dir.mkdir()
    (bin_dir / "stat").write_text("#!/bin/sh\nexec sleep 1000\n")
    (bin_dir / "stat").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    svc = HostService(Config(hosts={"me": HostConfig(local=True, use_nvml=False, env=env, command_timeout_s=4,
                                                     log_dirs=[str(tmp_path)], nvidia_smi=str(fake_gpu.nvidia_smi))}))
    log = tmp_path / "server.log"
    write_lines(log, 0, 3)
    snap = await svc.probe("me", ProbeRequest(log_path=str(log)))
    assert isinstance(snap, Snapshot), snap
    assert snap.table and snap.gpu.ok, (len(snap.table), snap.gpu)
    assert snap.log is not None and "could not be read in time" in (snap.log.error or ""), snap.log
    assert any("cut short" in e for e in snap.errors), snap.errors


async def test_a_rewritten_log_whose_lines_end_alike_is_still_counted_again(svc, tmp_path):
    """Every line ends in the same constant text (fixed padding, a status suffix): a log truncated and written
    past the old offset with other lines still differs in the mark's bytes, which reach into the line before."""
    log = tmp_path / "padded.log"
    log.write_text(("a" * 63 + " realistic width\n") * 100)
    req = ProbeRequest(log_path=str(log), gpu=False, processes=False)
    assert (await log_of(svc, req)).lines == 100
    with open(log, "r+") as f:
        f.truncate(0)
    with open(log, "a") as f:
        f.write(("b" * 143 + " realistic width\n") * 60)
    again = await log_of(svc, req)
    assert (again.lines, again.lines_exact) == (60, True)
