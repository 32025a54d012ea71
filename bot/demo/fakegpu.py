"""Install the replaying fake `nvidia-smi` (bot/demo/fake_nvidia_smi.py) into a directory.

Used by `gpubot demo` on machines without nvidia-smi, and by the tests. The GPU rows are the real H200
capture `bot/demo/h200-idle.query-gpu.csv` (nvidia-smi 580.159.04, `--query-gpu` with the fields of
`bot.core.parse.nvidia_smi.GPU_QUERY_FIELDS`), repeated `gpu_count` times with distinct indexes and UUIDs.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

FIELDS = (
    "index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu", "utilization.memory",
    "temperature.gpu", "power.draw", "power.limit", "pstate", "clocks.sm", "ecc.errors.uncorrected.volatile.total",
)
REPLAY_NOTE = "replayed sample GPU data (real NVIDIA H200 captures); this machine has no nvidia-smi"


@dataclass
class FakeGpu:
    """An installed fake: `bin_dir` (put it first on PATH), `nvidia_smi` (the wrapper's absolute path),
    `state_dir` (where fake servers register `holders/<pid>` files), `python_nvml` (a Python whose `pynvml` is
    the replaying fake, bot/demo/fake_pynvml: for a host's `nvml_python`), and `set_mode()` to misbehave (both
    fakes act it out)."""

    bin_dir: Path
    nvidia_smi: Path
    state_dir: Path
    python_nvml: Path | None = None

    @property
    def holders_dir(self) -> Path:
        """Directory of `<pid>` files, each holding `GPU_INDEX MIB`."""
        return self.state_dir / "holders"

    def set_mode(self, mode: str) -> None:
        """`normal`, `hang`, `slow:SECONDS` or `exit:CODE` (6, 9, 12, 15, 255 print the real error text)."""
        (self.state_dir / "mode").write_text(mode)


def _value(text: str) -> float | str | None:
    t = text.strip()
    if t in ("[N/A]", "[Not Supported]", ""):
        return None
    try:
        return float(t)
    except ValueError:
        return t


def install_fake_gpu(directory: str | os.PathLike[str], *, gpu_count: int = 1, python: str | None = None) -> FakeGpu:
    """Write `DIR/bin/nvidia-smi` (a sh wrapper around fake_nvidia_smi.py) and `DIR/state/gpus.json`.

    Returns the FakeGpu. The wrapper calls `python` (default: this interpreter) by absolute path, so it
    works from a bare login shell over SSH too. Raises OSError if the directory cannot be written.
    """
    root = Path(directory)
    bin_dir, state = root / "bin", root / "state"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (state / "holders").mkdir(parents=True, exist_ok=True)
    state.chmod(0o777)
    (state / "holders").chmod(0o1777)
    row = (resources.files("bot.demo") / "h200-idle.query-gpu.csv").read_text().strip()
    base = dict(zip(FIELDS, (_value(v) for v in row.split(",")), strict=False))
    gpus = []
    for i in range(gpu_count):
        g = dict(base)
        g["index"] = i
        g["uuid"] = f"GPU-5a1c0de2-7b3e-4f10-9c8d-0e1f2a3b4c{i:02x}"
        g["bus_id"] = f"00000000:{6 + i:02X}:00.0"
        gpus.append(g)
    (state / "gpus.json").write_text(json.dumps(gpus))
    script = resources.files("bot.demo") / "fake_nvidia_smi.py"
    wrapper = bin_dir / "nvidia-smi"
    py, scr, st = (shlex.quote(x) for x in (python or sys.executable, str(script), str(state)))
    wrapper.write_text(f"#!/bin/sh\nexec {py} {scr} --state {st} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    # a Python whose pynvml is the replaying fake (bot/demo/fake_pynvml), for `nvml_python:`
    fake_nvml = shlex.quote(str(resources.files("bot.demo") / "fake_pynvml"))
    python_nvml = bin_dir / "python-nvml"
    python_nvml.write_text(f"#!/bin/sh\nGPUBOT_FAKE_GPU_STATE={st} PYTHONPATH={fake_nvml} exec {py} \"$@\"\n")
    python_nvml.chmod(python_nvml.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return FakeGpu(bin_dir=bin_dir, nvidia_smi=wrapper, state_dir=state, python_nvml=python_nvml)
