"""A log's line count never costs a full reread, and never shows a wrong exact number: each probe counts at most
LOG_COUNT_BYTES on from where the last one stopped (the same file, grown), says "at least N" until the count
reached the end, starts again from 0 when the file was replaced or truncated; a check can read just what was
written after its cursor. Real files, real shell, this machine as the host."""

from __future__ import annotations

import dataclasses
import os

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
