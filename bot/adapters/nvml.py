"""GPU readings through NVML (the `pynvml` module of NVIDIA's `nvidia-ml-py`), for hosts where the bot runs
on the GPU machine itself (`local: true`). Produces the same `GpuSection` model as the nvidia-smi parser.

NVML facts (nvidia-ml-py 12/13, driver 580): memory from `nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)`
in bytes, whose `used` excludes driver-reserved memory and so matches nvidia-smi's `memory.used`; power in
milliwatts; utilization in percent; `NVMLError_NotSupported` for fields a GPU cannot report.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from bot.core.models import GpuProcess, GpuReading, GpuSection, GpuSource

log = logging.getLogger(__name__)

MIB = 1024 * 1024


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call an NVML function; None when the field is not supported or not available."""
    import pynvml

    try:
        return fn(*args, **kwargs)
    except pynvml.NVMLError_NotSupported:
        return None
    except pynvml.NVMLError_NoPermission:
        return None


def read_nvml() -> GpuSection:
    """Read every GPU and its compute processes through NVML (blocking; call it in a thread).

    Returns GpuSection(source=NVML). ok=False with a clear `error` when the NVML library or driver is
    missing (NVMLError_LibraryNotFound / DriverNotLoaded) or a GPU is lost (NVMLError_GpuIsLost).
    Memory in MiB (bytes / 2**20), power in W (mW / 1000).
    """
    try:
        import pynvml
    except ImportError:  # pragma: no cover - nvidia-ml-py is a hard dependency
        return GpuSection(ok=False, source=GpuSource.NVML, error="pynvml (nvidia-ml-py) is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return GpuSection(ok=False, source=GpuSource.NVML, error=f"NVML unavailable: {e}")
    try:
        gpus: list[GpuReading] = []
        procs: list[GpuProcess] = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _call(pynvml.nvmlDeviceGetUUID, h)
            try:
                mem = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            except (pynvml.NVMLError, TypeError, AttributeError):
                mem = _call(pynvml.nvmlDeviceGetMemoryInfo, h)
            util = _call(pynvml.nvmlDeviceGetUtilizationRates, h)
            power = _call(pynvml.nvmlDeviceGetPowerUsage, h)
            limit = _call(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
            clock = _call(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
            pstate = _call(pynvml.nvmlDeviceGetPerformanceState, h)
            gpus.append(
                GpuReading(
                    index=i,
                    uuid=uuid,
                    name=_call(pynvml.nvmlDeviceGetName, h),
                    memory_used_mib=None if mem is None else round(mem.used / MIB),
                    memory_total_mib=None if mem is None else round(mem.total / MIB),
                    utilization_gpu_pct=None if util is None else float(util.gpu),
                    utilization_memory_pct=None if util is None else float(util.memory),
                    temperature_c=_call(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
                    power_draw_w=None if power is None else power / 1000.0,
                    power_limit_w=None if limit is None else limit / 1000.0,
                    pstate=None if pstate is None else f"P{int(pstate)}",
                    clocks_sm_mhz=None if clock is None else float(clock),
                )
            )
            for p in _call(pynvml.nvmlDeviceGetComputeRunningProcesses, h) or []:
                used = getattr(p, "usedGpuMemory", None)
                procs.append(
                    GpuProcess(
                        pid=int(p.pid),
                        used_memory_mib=None if used is None else round(used / MIB),
                        gpu_uuid=uuid,
                        gpu_index=i,
                    )
                )
        return GpuSection(ok=True, gpus=gpus, processes=procs, source=GpuSource.NVML)
    except pynvml.NVMLError as e:
        return GpuSection(ok=False, source=GpuSource.NVML, error=f"NVML error: {e}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


async def read_nvml_async(timeout_s: float = 10.0, reader: Callable[[], GpuSection] = read_nvml) -> GpuSection:
    """Run `reader` (default `read_nvml`) in a worker thread with a deadline.

    Returns its GpuSection, or ok=False "NVML did not answer in N s" when it hangs (a wedged driver).
    """
    try:
        return await asyncio.wait_for(asyncio.to_thread(reader), timeout_s)
    except TimeoutError:
        return GpuSection(ok=False, source=GpuSource.NVML, error=f"NVML did not answer in {timeout_s:g} s")
