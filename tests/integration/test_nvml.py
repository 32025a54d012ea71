"""NVML readings (pynvml from nvidia-ml-py) give the same model as nvidia-smi; local hosts fall back."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pynvml
import pytest

from bot.adapters.nvml import read_nvml, read_nvml_async
from bot.config import Config, HostConfig
from bot.core.models import GpuSource, Snapshot
from bot.core.parse.nvidia_smi import parse_query_apps, parse_query_gpu
from bot.core.probe import ProbeRequest
from bot.services.hosts import HostService
from tests.support.paths import H200

MIB = 1024 * 1024


@pytest.fixture
def h200_nvml(monkeypatch):
    """Emulate the NVML library answering with the values of the real `hung.*` H200 capture."""
    gpu = parse_query_gpu((H200 / "hung.query-gpu.csv").read_text())[0]
    apps = parse_query_apps((H200 / "hung.query-apps.csv").read_text())
    calls = {"init": 0, "shutdown": 0}

    def init():
        calls["init"] += 1

    def shutdown():
        calls["shutdown"] += 1

    def not_supported(*a, **k):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlInit", init)
    monkeypatch.setattr(pynvml, "nvmlShutdown", shutdown)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: ("h", i))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: gpu.uuid)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: gpu.name)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda h, version=None: SimpleNamespace(
        used=int(gpu.memory_used_mib * MIB), total=int(gpu.memory_total_mib * MIB), free=0))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(
        gpu=int(gpu.utilization_gpu_pct), memory=int(gpu.utilization_memory_pct)))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", lambda h, s: int(gpu.temperature_c))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", lambda h: int(gpu.power_draw_w * 1000))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerManagementLimit", lambda h: int(gpu.power_limit_w * 1000))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEccErrors", lambda h, kind, counter: int(gpu.ecc_uncorrected))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetClockInfo", not_supported)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPerformanceState", lambda h: 0)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda h: [
        SimpleNamespace(pid=a.pid, usedGpuMemory=int(a.used_memory_mib * MIB)) for a in apps])
    return gpu, apps, calls


def test_nvml_and_nvidia_smi_produce_the_same_model(h200_nvml):
    gpu, apps, calls = h200_nvml
    sec = read_nvml()
    assert sec.ok and sec.source == GpuSource.NVML
    (g,) = sec.gpus
    assert g.memory_used_mib == pytest.approx(gpu.memory_used_mib, rel=0.01)
    assert g.memory_total_mib == pytest.approx(gpu.memory_total_mib, rel=0.01)
    assert g.utilization_gpu_pct == gpu.utilization_gpu_pct and g.temperature_c == gpu.temperature_c
    assert g.power_draw_w == pytest.approx(gpu.power_draw_w, abs=0.01)
    assert g.clocks_sm_mhz is None  # NotSupported -> None, not an error
    assert sorted(p.pid for p in sec.processes) == sorted(a.pid for a in apps)
    assert all(p.gpu_index == 0 and p.used_memory_mib == 8610 for p in sec.processes)
    assert calls == {"init": 1, "shutdown": 1}


@pytest.mark.parametrize(("code", "text"), [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
])
def test_nvml_init_failures_are_reported(monkeypatch, code, text):
    def boom():
        raise pynvml.NVMLError(code)

    monkeypatch.setattr(pynvml, "nvmlInit", boom)
    sec = read_nvml()
    assert not sec.ok and text in (sec.error or "")


def test_gpu_lost_is_reported(h200_nvml, monkeypatch):
    def lost(h):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", lost)
    sec = read_nvml()
    assert not sec.ok and "GPU is lost" in (sec.error or "")


async def test_hung_nvml_times_out():
    wedged = threading.Event()  # the reader hangs until the test is over (a wedged driver), however slow the box
    try:
        sec = await read_nvml_async(0.3, reader=lambda: wedged.wait(60) and None)
    finally:
        wedged.set()
    assert not sec.ok and "did not answer in 0.3 s" in (sec.error or "")


async def test_local_host_uses_nvml_when_it_works(h200_nvml, fake_gpu):
    cfg = Config(hosts={"me": HostConfig(local=True, nvidia_smi=str(fake_gpu.nvidia_smi))})
    svc = HostService(cfg)
    try:
        snap = await svc.probe("me", ProbeRequest())
    finally:
        await svc.close()
    assert isinstance(snap, Snapshot) and snap.gpu.source == GpuSource.NVML
    assert snap.gpu.gpus[0].memory_used_mib == 17235


async def test_local_host_falls_back_to_nvidia_smi_without_nvml(fake_gpu):
    # This machine has no libnvidia-ml.so: the real nvmlInit fails and nvidia-smi answers instead.
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this machine")
    except pynvml.NVMLError:
        pass
    cfg = Config(hosts={"me": HostConfig(local=True, nvidia_smi=str(fake_gpu.nvidia_smi))})
    svc = HostService(cfg)
    try:
        snap = await svc.probe("me", ProbeRequest())
    finally:
        await svc.close()
    assert isinstance(snap, Snapshot) and snap.gpu.ok
    assert snap.gpu.source == GpuSource.NVIDIA_SMI and snap.gpu.gpus[0].name == "NVIDIA H200"
