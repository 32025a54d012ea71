"""A stand-in for the `pynvml` module (nvidia-ml-py) on machines without a GPU: the demo and the tests. Standard
library only. It answers the NVML calls that bot.adapters.nvml_reader makes from the same replayed state as the fake
nvidia-smi (bot/demo/fake_nvidia_smi.py): `$GPUBOT_FAKE_GPU_STATE/gpus.json` (real H200 captures) plus the fake
memory of every live process registered in `holders/<pid>`, so both give the same readings. `mode` there makes
it misbehave like a sick driver, read at every call: `hang` (a call never returns), `slow:SECONDS`, `exit:CODE`
(6 no GPU, 9 driver not loaded, 12 no library, 15 GPU lost, 255 unknown: calls raise the matching NVMLError).

`bot.demo.fakegpu.install_fake_gpu` writes `bin/python-nvml`, a Python that imports this module as pynvml.
"""

import json
import os
import sys
import time

# the fake nvidia-smi beside this folder (bot/demo): one reading of the holders for both fakes
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fake_nvidia_smi

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
nvmlMemory_v2 = 0x02000028
_MIB = 1024 * 1024
_TEXT = {1: "Uninitialized", 3: "Not Supported", 6: "Not Found", 9: "Driver Not Loaded",
         12: "NVML Shared Library Not Found", 15: "GPU is lost", 999: "Unknown Error"}
_CODES = {6: NVML_ERROR_NOT_FOUND, 9: NVML_ERROR_DRIVER_NOT_LOADED, 12: NVML_ERROR_LIBRARY_NOT_FOUND,
          15: NVML_ERROR_GPU_IS_LOST, 255: NVML_ERROR_UNKNOWN}
_initialised = False


class NVMLError(Exception):
    """As pynvml's: `value` is the NVML error code, str() its text."""

    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return _TEXT.get(self.value, f"NVML error {self.value}")


class _Struct:
    def __init__(self, **fields):
        self.__dict__.update(fields)


def _state():
    return os.environ.get("GPUBOT_FAKE_GPU_STATE", "")


def _misbehave():
    """Act out the state's mode (see the module docstring)."""
    try:
        with open(os.path.join(_state(), "mode")) as f:
            mode = f.read().strip()
    except OSError:
        return
    if mode == "hang":
        while True:
            time.sleep(3600)
    if mode.startswith("slow:"):
        time.sleep(float(mode.split(":", 1)[1]))
    if mode.startswith("exit:"):
        raise NVMLError(_CODES.get(int(mode.split(":", 1)[1]), NVML_ERROR_UNKNOWN))


def _gpus():
    _misbehave()
    if not _initialised:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    with open(os.path.join(_state(), "gpus.json")) as f:
        return json.load(f)


def _holders():
    """(pid, gpu index, MiB) of the live registered holders: the fake nvidia-smi's own count (`holders`)."""
    return fake_nvidia_smi.holders(_state())


def _field(handle, name):
    value = handle.get(name)
    if value is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return value


def nvmlInit():
    global _initialised
    _misbehave()
    if not os.path.isfile(os.path.join(_state(), "gpus.json")):
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    _initialised = True


def nvmlShutdown():
    global _initialised
    _initialised = False


def nvmlSystemGetDriverVersion():
    return "580.159.04"


def nvmlDeviceGetCount():
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(index):
    gpus = _gpus()
    if not 0 <= index < len(gpus):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return gpus[index]


def nvmlDeviceGetUUID(handle):
    return _field(handle, "uuid")


def nvmlDeviceGetName(handle):
    return _field(handle, "name")


def nvmlDeviceGetMemoryInfo(handle, version=None):
    used = float(handle.get("memory.used") or 0) + sum(m for _, i, m in _holders() if i == handle["index"])
    total = float(_field(handle, "memory.total"))
    return _Struct(used=int(used * _MIB), total=int(total * _MIB), free=int((total - used) * _MIB))


def nvmlDeviceGetUtilizationRates(handle):
    return _Struct(gpu=int(_field(handle, "utilization.gpu")), memory=int(_field(handle, "utilization.memory")))


def nvmlDeviceGetTemperature(handle, sensor):
    return int(_field(handle, "temperature.gpu"))


def nvmlDeviceGetPowerUsage(handle):
    return round(float(_field(handle, "power.draw")) * 1000)


def nvmlDeviceGetPowerManagementLimit(handle):
    return round(float(_field(handle, "power.limit")) * 1000)


def nvmlDeviceGetPerformanceState(handle):
    return int(str(_field(handle, "pstate")).lstrip("P"))


def nvmlDeviceGetClockInfo(handle, clock):
    return int(_field(handle, "clocks.sm"))


def nvmlDeviceGetTotalEccErrors(handle, kind, counter):
    return int(_field(handle, "ecc.errors.uncorrected.volatile.total"))


def nvmlDeviceGetComputeRunningProcesses(handle):
    return [_Struct(pid=pid, usedGpuMemory=int(mib * _MIB)) for pid, i, mib in sorted(_holders())
            if i == handle["index"]]
