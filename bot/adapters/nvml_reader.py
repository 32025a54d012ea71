"""The NVML reader: how gpubot takes GPU readings through NVML (the `pynvml` module of nvidia-ml-py).

One function, `read(nv)`, takes a reading of every GPU and its compute processes as plain JSON-ready values; the
bot turns it into its GpuSection model (bot.core.parse.nvml). It runs in two places:

- on a GPU host, as a program the bot keeps running on the host's SSH connection (`python -u -c SOURCE
  gpubot-nvml`, SOURCE being this file): NVML is initialised ONCE (that takes 80-300 ms, more than the reading),
  then every line the bot writes on its stdin gets one JSON line on its stdout. Its first line says hello:
  `{"hello": PID}`, or `{"hello": PID, "error": "..."}` when pynvml or the driver is missing (it then exits);
- in the bot itself, for a host that is the bot's own machine (`local: true`), through the same function.

So this file uses the standard library and pynvml only, and runs on the host's Python 3.

NVML facts (nvidia-ml-py 12/13, driver 580): memory from `nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)` in
bytes, whose `used` excludes driver-reserved memory and so matches nvidia-smi's `memory.used`; power in
milliwatts; utilization in percent; `NVMLError_NotSupported` for fields a GPU cannot report (None here).
"""

import json
import os
import sys

#: The word in the reader's arguments that names it in `ps`.
NAME = "gpubot-nvml"
#: A process's used memory at or above this is NVML's "not available" marker, not a size.
_NOT_AVAILABLE = 1 << 63
#: NVML error codes that mean "this field cannot be reported" (not supported, no permission, not found, function
#: not found, no data, not supported for a vGPU, frequency not supported, deprecated); any other error (the GPU is
#: lost, the driver is gone, unknown) fails the whole reading, as nvidia-smi does.
_FIELD_UNAVAILABLE = frozenset({3, 4, 6, 13, 21, 22, 24, 26})


def _get(fn, *args, **kwargs):
    """fn(*args) or None when NVML cannot report the field (_FIELD_UNAVAILABLE, or a function this pynvml
    release lacks); raises the NVML error for anything else."""
    try:
        return fn(*args, **kwargs)
    except (AttributeError, TypeError):
        return None
    except Exception as e:
        if getattr(e, "value", None) in _FIELD_UNAVAILABLE:
            return None
        raise


def _text(value):
    """NVML strings come as bytes from older pynvml releases."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _memory(nv, handle):
    """(used, total) bytes: the v2 structure (what nvidia-smi shows), else v1."""
    try:
        mem = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
    except (AttributeError, TypeError):  # a pynvml release without the v2 structure
        mem = _get(nv.nvmlDeviceGetMemoryInfo, handle)
    except Exception as e:
        if getattr(e, "value", None) not in _FIELD_UNAVAILABLE:
            raise
        mem = _get(nv.nvmlDeviceGetMemoryInfo, handle)
    if mem is None:
        return None, None
    return int(mem.used), int(mem.total)


def read(nv):
    """One reading through the initialised pynvml module `nv`: {"gpus": [...], "procs": [...]}. Each GPU: index,
    uuid, name, mem_used and mem_total (bytes), util_gpu and util_mem (%), temp (C), power_mw, limit_mw (mW),
    pstate (0..15), sm_mhz, ecc (uncorrected volatile errors); each compute process: pid, used (bytes or None), uuid,
    index. A field NVML cannot report is None. Raises nv.NVMLError when the reading as a whole fails (driver gone,
    a GPU lost)."""
    gpus, procs = [], []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        uuid = _text(_get(nv.nvmlDeviceGetUUID, h))
        used, total = _memory(nv, h)
        util = _get(nv.nvmlDeviceGetUtilizationRates, h)
        gpus.append({
            "index": i, "uuid": uuid, "name": _text(_get(nv.nvmlDeviceGetName, h)),
            "mem_used": used, "mem_total": total,
            "util_gpu": None if util is None else util.gpu, "util_mem": None if util is None else util.memory,
            "temp": _get(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
            "power_mw": _get(nv.nvmlDeviceGetPowerUsage, h),
            "limit_mw": _get(nv.nvmlDeviceGetPowerManagementLimit, h),
            "pstate": _get(nv.nvmlDeviceGetPerformanceState, h),
            "sm_mhz": _get(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
            "ecc": _get(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                        nv.NVML_VOLATILE_ECC),
        })
        for p in _get(nv.nvmlDeviceGetComputeRunningProcesses, h) or []:
            mem = getattr(p, "usedGpuMemory", None)
            procs.append({"pid": int(p.pid), "used": None if mem is None or mem >= _NOT_AVAILABLE else int(mem),
                          "uuid": uuid, "index": i})
    return {"gpus": gpus, "procs": procs}


def _say(obj):
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def main():
    """The reader's loop on a host: hello, then one JSON answer per line read on stdin, until EOF."""
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception as e:  # no pynvml, no driver, no permission
        _say({"hello": os.getpid(), "error": f"{type(e).__name__}: {e}"})
        return 1
    _say({"hello": os.getpid()})
    for _line in sys.stdin:
        try:
            answer = read(nv)
        except Exception as e:
            answer = {"error": f"{type(e).__name__}: {e}"}
        _say(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
