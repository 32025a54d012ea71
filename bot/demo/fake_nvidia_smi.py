#!/usr/bin/env python3
"""A stand-in for `nvidia-smi` on machines without a GPU (the demo and the tests). Standard library only.

It replays real H200 captures (driver 580.159.04): the GPU rows come from `STATE/gpus.json`, written by
`bot.demo.fakegpu.install_fake_gpu`, and `memory.used` is the replayed baseline plus the fake memory of
every LIVE process registered in `STATE/holders/<pid>` (a line `GPU_INDEX MIB`), so killing a fake server
frees its "GPU memory" exactly like a real one. `STATE/mode` can make it misbehave: `hang` (sleep forever),
`slow:SECONDS`, or `exit:CODE` (print the matching real error text and exit with CODE).

Usage (as nvidia-smi): --query-gpu=F1,F2 --format=csv[,noheader][,nounits]; --query-compute-apps=...
"""

import json
import os
import sys
import time
from types import MappingProxyType

ERRORS = MappingProxyType({
    6: "No devices were found",
    9: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.",
    12: "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system.",
    15: "Unable to determine the device handle for GPU0000:00:06.0: GPU is lost.  "
    "Reboot the system to recover this GPU",
    255: "Failed to initialize NVML: Unknown Error",
})
UNITS = MappingProxyType({"memory.used": " MiB", "memory.total": " MiB", "memory.free": " MiB", "utilization.gpu": " %",
         "utilization.memory": " %", "power.draw": " W", "power.limit": " W", "clocks.sm": " MHz",
         "used_memory": " MiB", "used_gpu_memory": " MiB"})
HEADER = MappingProxyType({"clocks.sm": "clocks.current.sm", "used_memory": "used_gpu_memory"})


def live(pid):
    """True when /proc/PID exists and the process is not a zombie (Linux /proc/PID/stat state field)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
        return data.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def holders(state):
    """Live fake GPU holders registered under STATE/holders: list of (pid, gpu index, MiB)."""
    out = []
    d = os.path.join(state, "holders")
    try:
        names = os.listdir(d)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(d, name)) as f:
                gpu, mib = f.read().split()[:2]
            pid = int(name)
        except (OSError, ValueError):
            continue
        if live(pid):
            out.append((pid, int(gpu), float(mib)))
    return out


def cmdline(pid):
    """argv[0] of PID from /proc/PID/cmdline, or `[Not Found]` like nvidia-smi prints for a vanished PID."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode(errors="replace") or "?"
    except OSError:
        return "[Not Found]"


def fmt(field, value, units):
    """One CSV cell as nvidia-smi prints it: `[N/A]` for None, W with 2 decimals, units when asked."""
    if value is None:
        return "[N/A]"
    if isinstance(value, float):
        text = f"{value:.2f}" if field.startswith("power") else f"{value:.0f}"
    else:
        text = str(value)
    return text + (UNITS.get(field, "") if units else "")


def main(argv):
    """Answer an nvidia-smi command line (`--state DIR` first). Returns the exit code nvidia-smi would."""
    if len(argv) < 2 or argv[0] != "--state":
        print("usage: fake_nvidia_smi --state DIR [nvidia-smi args]", file=sys.stderr)
        return 2
    state, args = argv[1], argv[2:]
    try:
        with open(os.path.join(state, "mode")) as f:
            mode = f.read().strip()
    except OSError:
        mode = "normal"
    if mode == "hang":
        while True:
            time.sleep(3600)
    if mode.startswith("slow:"):
        time.sleep(float(mode.split(":", 1)[1]))
    if mode.startswith("exit:"):
        code = int(mode.split(":", 1)[1])
        print(ERRORS.get(code, "nvidia-smi failed"))
        return code
    with open(os.path.join(state, "gpus.json")) as f:
        gpus = json.load(f)
    fmt_opts = ""
    query = None
    kind = None
    for a in args:
        if a.startswith("--query-gpu="):
            kind, query = "gpu", a.split("=", 1)[1].split(",")
        elif a.startswith("--query-compute-apps="):
            kind, query = "apps", a.split("=", 1)[1].split(",")
        elif a.startswith("--format="):
            fmt_opts = a.split("=", 1)[1]
    if kind is None:
        print("fake nvidia-smi (replayed H200 captures): use --query-gpu or --query-compute-apps")
        return 0
    units = "nounits" not in fmt_opts
    header = "noheader" not in fmt_opts
    held = holders(state)
    rows = []
    if kind == "gpu":
        for g in gpus:
            used = float(g.get("memory.used") or 0) + sum(m for _, i, m in held if i == g["index"])
            vals = dict(g)
            vals["memory.used"] = used
            if g.get("memory.total") is not None:
                vals["memory.free"] = float(g["memory.total"]) - used
            rows.append(vals)
    else:
        by_index = {g["index"]: g for g in gpus}
        for pid, i, mib in sorted(held):
            g = by_index.get(i, {})
            rows.append({"pid": pid, "process_name": cmdline(pid), "gpu_uuid": g.get("uuid"),
                         "gpu_bus_id": g.get("bus_id", "00000000:00:06.0"), "used_memory": mib,
                         "used_gpu_memory": mib, "gpu_name": g.get("name")})
    for field in query:
        if rows and field not in rows[0] and field not in ("memory.free",):
            print(f'Field "{field}" is not a valid field to query.')
            return 2
    if header:
        print(", ".join(HEADER.get(f, f) + (f" [{UNITS[f].strip()}]" if units and f in UNITS else "") for f in query))
    for r in rows:
        print(", ".join(fmt(f, r.get(f), units) for f in query))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
