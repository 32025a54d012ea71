"""Hostile remote state, probed for real on this machine through the LocalExecutor."""

from __future__ import annotations

import os

import pytest

from bot.config import Config, HostConfig
from bot.core.models import Snapshot
from bot.core.probe import ProbeRequest
from bot.services.hosts import HostService

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def local(fake_gpu):
    cfg = Config(hosts={"me": HostConfig(local=True, use_nvml=False, nvidia_smi=str(fake_gpu.nvidia_smi),
                                         command_timeout_s=20, log_dirs=["/tmp", "/dev", "/proc"])})
    svc = HostService(cfg)
    yield svc
    await svc.close()


async def test_fifo_log_does_not_block_the_probe(local, tmp_path):
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    snap = await local.probe("me", ProbeRequest(log_path=str(fifo)))
    assert isinstance(snap, Snapshot)
    assert snap.log is not None and snap.log.error == "not a regular file"
    # A read blocked on the FIFO would hold the script until command_timeout_s kills it: the probe would be
    # cut short (HostService adds an error saying so).
    assert not [e for e in snap.errors if "cut short" in e], snap.errors
    assert snap.all_process_count > 1 and snap.gpu.ok


async def test_device_files_are_refused(local):
    snap = await local.probe("me", ProbeRequest(log_path="/dev/zero"))
    assert isinstance(snap, Snapshot) and snap.log is not None and snap.log.error == "not a regular file"


async def test_unreadable_proc_file_does_not_break_the_probe(local):
    snap = await local.probe("me", ProbeRequest(log_path="/proc/self/mem"))
    assert isinstance(snap, Snapshot) and snap.log is not None and snap.all_process_count > 1


async def test_non_utf8_huge_single_line_log_and_fake_markers(local, tmp_path):
    log = tmp_path / "bin.log"
    with open(log, "wb") as f:
        f.write(b"\xff\xfe\x00garbage \x1b[31mred\x1b[0m\n")
        f.write(b"@@0123456789abcdef BEGIN ps\nfake\n@@0123456789abcdef END ps rc=0\n")
        f.write(b"x" * (5 * 1024 * 1024) + b"\n")
        f.write("last line \u2603\n".encode())
    snap = await local.probe("me", ProbeRequest(log_path=str(log), tail_lines=5))
    assert isinstance(snap, Snapshot) and snap.log is not None and snap.log.exists
    assert snap.log.lines == 6 and snap.log.size_bytes == log.stat().st_size
    assert snap.log.tail[-1] == "last line \u2603"
    assert all(len(line) <= 400 for line in snap.log.tail)
    assert snap.all_process_count > 1  # the fake markers did not confuse the section splitter


async def test_unreadable_and_missing_logs(local, tmp_path):
    missing = await local.probe("me", ProbeRequest(log_path=str(tmp_path / "nope.log")))
    assert missing.log.error == "no such file"
    d = await local.probe("me", ProbeRequest(log_path=str(tmp_path)))
    assert d.log.error == "is a directory"
