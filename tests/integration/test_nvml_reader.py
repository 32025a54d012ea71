"""GPU readings through the NVML reader kept on a host's SSH connection (`nvml_python`): the same model as the two
nvidia-smi queries, on the real H200 captures; one reader per connection, started once, hidden from the process
table; nvidia-smi whenever the reader cannot answer (no pynvml or driver, a reader that died, a wedged driver, a
lost GPU), and a new reader after one died.

The host is a real SSH server on loopback; its GPUs are the replayed captures, read by the fake nvidia-smi and
by the fake pynvml (bot/demo/fake_pynvml) from the same state."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bot.config import Config
from bot.core.models import GpuSource, Snapshot
from bot.core.parse.nvidia_smi import parse_query_apps, parse_query_gpu
from bot.core.probe import ProbeRequest
from bot.demo.fakegpu import FIELDS
from bot.services.hosts import HostService
from tests.support.builders import ssh_host
from tests.support.paths import H200
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(90)


def replay_capture(fake_gpu, name: str) -> list[subprocess.Popen]:
    """Make the fake GPUs answer what the H200 capture `name` (busy, hung, orphans, freed) shows: its GPU row, and
    one live process per compute app holding the app's MiB (sleeps started here; the caller kills them)."""
    (gpu,) = parse_query_gpu((H200 / f"{name}.query-gpu.csv").read_text())
    row = dict.fromkeys(FIELDS)
    row.update({"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name, "memory.total": gpu.memory_total_mib,
                "utilization.gpu": gpu.utilization_gpu_pct, "utilization.memory": gpu.utilization_memory_pct,
                "temperature.gpu": gpu.temperature_c, "power.draw": gpu.power_draw_w, "power.limit": gpu.power_limit_w,
                "pstate": gpu.pstate, "clocks.sm": gpu.clocks_sm_mhz,
                "ecc.errors.uncorrected.volatile.total": gpu.ecc_uncorrected, "bus_id": "00000000:00:06.0"})
    apps = parse_query_apps((H200 / f"{name}.query-apps.csv").read_text())
    row["memory.used"] = (gpu.memory_used_mib or 0) - sum(a.used_memory_mib or 0 for a in apps)
    (fake_gpu.state_dir / "gpus.json").write_text(json.dumps([row]))
    procs = []
    for app in apps:
        p = subprocess.Popen(["sleep", "300"], start_new_session=True)
        procs.append(p)
        (fake_gpu.holders_dir / str(p.pid)).write_text(f"0 {app.used_memory_mib:g}")
    return procs


@pytest.fixture
def holders():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def config(ssh_server, fake_gpu, *, nvml: str | None, **kw) -> Config:
    return Config(hosts={"gpu-host-1": ssh_host(ssh_server, nvml_python=nvml, nvidia_smi_timeout_s=2, **kw)})


async def probe_twice(ssh_server, fake_gpu) -> tuple[Snapshot, Snapshot]:
    """The same probe through nvidia-smi and through the NVML reader."""
    results = []
    for nvml in (None, str(fake_gpu.python_nvml)):
        svc = HostService(config(ssh_server, fake_gpu, nvml=nvml))
        try:
            results.append(await svc.probe("gpu-host-1", ProbeRequest()))
        finally:
            await svc.close()
    smi, nvml_snap = results
    assert isinstance(smi, Snapshot) and isinstance(nvml_snap, Snapshot), results
    return smi, nvml_snap


@pytest.mark.parametrize("capture", ["busy", "hung", "orphans", "freed"])
async def test_the_reader_gives_the_model_nvidia_smi_gives_on_the_h200_captures(ssh_server, fake_gpu, holders,
                                                                                 capture):
    holders += replay_capture(fake_gpu, capture)
    smi, nvml = await probe_twice(ssh_server, fake_gpu)
    assert smi.gpu.source == GpuSource.NVIDIA_SMI and nvml.gpu.source == GpuSource.NVML
    assert smi.gpu.ok and nvml.gpu.ok, (smi.gpu.error, nvml.gpu.error)
    assert nvml.gpu.gpus == smi.gpu.gpus
    assert sorted(nvml.gpu.processes, key=lambda p: p.pid) == sorted(smi.gpu.processes, key=lambda p: p.pid)
    assert len(nvml.gpu.processes) == len(holders)
    # the holders' rows are in both snapshots: GPU holders are always selected
    assert {p.pid for p in nvml.processes} == {p.pid for p in smi.processes} == {p.pid for p in holders}


async def test_one_reader_per_connection_started_once_and_never_shown(ssh_server, fake_gpu, holders):
    holders += replay_capture(fake_gpu, "busy")
    svc = HostService(config(ssh_server, fake_gpu, nvml=str(fake_gpu.python_nvml)))
    try:
        snaps = [await svc.probe("gpu-host-1", ProbeRequest(match="gpubot")) for _ in range(3)]
        helpers = svc.executor("gpu-host-1").helper_pids()
    finally:
        await svc.close()
    readers = [c for c in ssh_server.commands if "gpubot-nvml" in c]
    assert len(readers) == 1, ssh_server.commands
    assert len(helpers) == 2  # the probe agent and the NVML reader
    for snap in snaps:
        assert snap.gpu.source == GpuSource.NVML and snap.gpu.ok
        assert not helpers & {p.pid for p in snap.table}
        assert not any("nvidia-smi" in p.args for p in snap.table if p.ppid in helpers)
    assert "fake_nvidia_smi" not in " ".join(ssh_server.commands)


async def test_without_pynvml_nvidia_smi_answers_and_the_reader_is_not_tried_again(ssh_server, fake_gpu):
    # this machine's real pynvml finds no NVML library: the reader says so in its hello and exits
    svc = HostService(config(ssh_server, fake_gpu, nvml=sys.executable))
    try:
        first = await svc.probe("gpu-host-1", ProbeRequest())
        second = await svc.probe("gpu-host-1", ProbeRequest())
    finally:
        await svc.close()
    for snap in (first, second):
        assert isinstance(snap, Snapshot) and snap.gpu.ok and snap.gpu.source == GpuSource.NVIDIA_SMI
    assert "NVML" in (first.gpu.note or "") and "Library Not Found" in (first.gpu.note or "")
    assert len([c for c in ssh_server.commands if "gpubot-nvml" in c]) == 1


async def test_a_reader_that_died_is_replaced_and_its_probe_still_has_gpus(ssh_server, fake_gpu, holders):
    holders += replay_capture(fake_gpu, "hung")
    svc = HostService(config(ssh_server, fake_gpu, nvml=str(fake_gpu.python_nvml)))
    ex = svc.executor("gpu-host-1")
    try:
        assert (await svc.probe("gpu-host-1", ProbeRequest())).gpu.source == GpuSource.NVML
        reader_pid = ex._nvml.pid
        os.kill(reader_pid, signal.SIGKILL)
        await wait_until(lambda: not Path(f"/proc/{reader_pid}").exists(), what="the reader to die")
        during = await svc.probe("gpu-host-1", ProbeRequest())
        after = await svc.probe("gpu-host-1", ProbeRequest())
    finally:
        await svc.close()
    assert during.gpu.ok and during.gpu.source == GpuSource.NVIDIA_SMI, during.gpu
    assert after.gpu.ok and after.gpu.source == GpuSource.NVML
    assert after.gpu.gpus == during.gpu.gpus
    assert len([c for c in ssh_server.commands if "gpubot-nvml" in c]) == 2


@pytest.mark.parametrize(("mode", "words"), [("exit:15", "GPU is lost"), ("hang", "did not answer in 2 s")])
async def test_a_sick_driver_is_reported_in_nvidia_smis_words_within_the_budget(ssh_server, fake_gpu, mode, words):
    svc = HostService(config(ssh_server, fake_gpu, nvml=str(fake_gpu.python_nvml)))
    try:
        assert (await svc.probe("gpu-host-1", ProbeRequest())).gpu.ok
        fake_gpu.set_mode(mode)
        snap = await asyncio.wait_for(svc.probe("gpu-host-1", ProbeRequest()), 30)
    finally:
        fake_gpu.set_mode("normal")
        await svc.close()
    assert isinstance(snap, Snapshot) and not snap.gpu.ok
    assert words in (snap.gpu.error or ""), snap.gpu
    assert snap.table, "the rest of the snapshot is still there"
