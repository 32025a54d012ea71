"""GPU readings through NVML (the `pynvml` module of NVIDIA's `nvidia-ml-py`), for hosts where the bot runs
on the GPU machine itself (`local: true`). Produces the same `GpuSection` model as the nvidia-smi parser: the
reading is bot.adapters.nvml_reader's (the same code the bot keeps running on SSH hosts with `nvml_python`),
turned into the model by bot.core.parse.nvml.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

from bot.adapters import nvml_reader
from bot.core.models import GpuSection, GpuSource
from bot.core.parse.nvml import gpu_section_from_reading

log = logging.getLogger(__name__)

def _unavailable(error: str) -> GpuSection:
    return GpuSection(ok=False, source=GpuSource.NVML, error=error)


def read_nvml() -> GpuSection:
    """Read every GPU and its compute processes through NVML once (blocking; call it in a thread): init, one
    reading (bot.adapters.nvml_reader.read), shutdown.

    Returns GpuSection(source=NVML). ok=False with a clear `error` when the NVML library or driver is
    missing (NVMLError_LibraryNotFound / DriverNotLoaded) or a GPU is lost (NVMLError_GpuIsLost).
    Memory in MiB (bytes / 2**20), power in W (mW / 1000).
    """
    try:
        import pynvml
    except ImportError:  # pragma: no cover - nvidia-ml-py is a hard dependency
        return _unavailable("pynvml (nvidia-ml-py) is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return _unavailable(f"NVML unavailable: {e}")
    try:
        return gpu_section_from_reading(nvml_reader.read(pynvml))
    except pynvml.NVMLError as e:
        return _unavailable(f"NVML error: {e}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


class LocalNvml:
    """NVML in the bot's own process for a host that is the bot's machine: initialised ONCE (80-300 ms on a GPU
    host, far more than a reading), then each `read` is one reading (bot.adapters.nvml_reader.read). A failed
    reading shuts NVML down so the next one initialises it again (a reloaded driver). Thread-safe; blocking
    (call it in a thread: `read_async`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = False

    def read(self) -> GpuSection:
        """One reading as a GpuSection(source=NVML); ok False with the NVML error when there is no NVML or the
        reading failed."""
        try:
            import pynvml
        except ImportError:  # pragma: no cover - nvidia-ml-py is a hard dependency
            return _unavailable("pynvml (nvidia-ml-py) is not installed")
        with self._lock:
            if not self._ready:
                try:
                    pynvml.nvmlInit()
                except pynvml.NVMLError as e:
                    return _unavailable(f"NVML unavailable: {e}")
                self._ready = True
            try:
                return gpu_section_from_reading(nvml_reader.read(pynvml))
            except pynvml.NVMLError as e:
                self._ready = False
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlShutdown()
                return _unavailable(f"NVML error: {e}")

    async def read_async(self, timeout_s: float = 10.0) -> GpuSection:
        """`read` in a worker thread with a deadline (see `read_nvml_async`)."""
        return await read_nvml_async(timeout_s, reader=self.read)


async def read_nvml_async(timeout_s: float = 10.0, reader: Callable[[], GpuSection] = read_nvml) -> GpuSection:
    """Run `reader` (default `read_nvml`) in a worker thread with a deadline.

    Returns its GpuSection, or ok=False "NVML did not answer in N s" when it hangs (a wedged driver).
    """
    try:
        return await asyncio.wait_for(asyncio.to_thread(reader), timeout_s)
    except TimeoutError:
        return GpuSection(ok=False, source=GpuSource.NVML, error=f"NVML did not answer in {timeout_s:g} s")
