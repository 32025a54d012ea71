"""The NVML reader's answer (bot.adapters.nvml_reader: JSON from a GPU host, or the same dict in-process) as the
GpuSection model that the nvidia-smi parser also produces (pure).

The answer comes from another machine: every value is checked (type, finite, in range) and anything else is
None, an answer that is not an object of the expected shape is an error. Never raises.
"""

from __future__ import annotations

import math
from typing import Any

from bot.core.models import GpuProcess, GpuReading, GpuSection, GpuSource

__all__ = ["gpu_section_from_reading"]

MIB = 1024 * 1024
#: Largest number taken from an answer (bytes of memory included); anything larger is None.
_MAX = 1 << 62


def _num(value: Any) -> float | None:
    """A finite, non-negative number below _MAX (bools are not numbers), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and 0 <= value < _MAX else None


def _int(value: Any) -> int | None:
    n = _num(value)
    return int(n) if n is not None and n == int(n) else None


def _str(value: Any, limit: int = 200) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


def _mib(value: Any) -> float | None:
    """Bytes -> MiB, rounded to a whole MiB like nvidia-smi prints them."""
    n = _num(value)
    return None if n is None else float(round(n / MIB))


def _gpu(g: dict) -> GpuReading | None:
    index = _int(g.get("index"))
    if index is None:
        return None
    power, limit, pstate = _num(g.get("power_mw")), _num(g.get("limit_mw")), _int(g.get("pstate"))
    return GpuReading(
        index=index,
        uuid=_str(g.get("uuid")),
        name=_str(g.get("name")),
        memory_used_mib=_mib(g.get("mem_used")),
        memory_total_mib=_mib(g.get("mem_total")),
        utilization_gpu_pct=_num(g.get("util_gpu")),
        utilization_memory_pct=_num(g.get("util_mem")),
        temperature_c=_num(g.get("temp")),
        power_draw_w=None if power is None else power / 1000.0,
        power_limit_w=None if limit is None else limit / 1000.0,
        pstate=None if pstate is None or pstate > 32 else f"P{pstate}",
        clocks_sm_mhz=_num(g.get("sm_mhz")),
        ecc_uncorrected=_num(g.get("ecc")),
    )


def _process(p: dict) -> GpuProcess | None:
    pid = _int(p.get("pid"))
    if pid is None or pid < 1:
        return None
    return GpuProcess(pid=pid, used_memory_mib=_mib(p.get("used")), gpu_uuid=_str(p.get("uuid")),
                      gpu_index=_int(p.get("index")))


def gpu_section_from_reading(answer: Any) -> GpuSection:
    """GpuSection(source=NVML) from one answer of the NVML reader: memory in MiB (bytes / 2**20, rounded), power
    in W (mW / 1000), pstate `P<n>`. ok False with the reader's `error` when it could not read, or "the NVML
    reader's answer is not readable" for an answer of another shape; ok False "NVML reported no GPU" for none."""
    if not isinstance(answer, dict):
        return GpuSection(ok=False, source=GpuSource.NVML, error="the NVML reader's answer is not readable")
    if "error" in answer:
        return GpuSection(ok=False, source=GpuSource.NVML, error=f"NVML: {str(answer['error'])[:300]}")
    gpus_in, procs_in = answer.get("gpus"), answer.get("procs")
    if not isinstance(gpus_in, list) or not isinstance(procs_in, list):
        return GpuSection(ok=False, source=GpuSource.NVML, error="the NVML reader's answer is not readable")
    gpus = [g for g in (_gpu(x) for x in gpus_in if isinstance(x, dict)) if g is not None]
    procs = [p for p in (_process(x) for x in procs_in if isinstance(x, dict)) if p is not None]
    if not gpus:
        return GpuSection(ok=False, processes=procs, source=GpuSource.NVML, error="NVML reported no GPU")
    return GpuSection(ok=True, gpus=gpus, processes=procs, source=GpuSource.NVML)
