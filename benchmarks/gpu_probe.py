"""The GPU part of a probe on a real NVIDIA GPU (issue 21: under 5 ms through the fast path). Run it on the GPU host
itself; on a machine without nvidia-smi or pynvml it says so and measures nothing.

The host is this machine over SSH on loopback (OpenSSH sshd where installed, else the project's asyncssh server in
its own process; benchmarks/support.py `bench_host`), with the REAL nvidia-smi. On ONE warm connection, round-robin,
median of N each:
  - `true` (the floor: one exec round trip);
  - the NVML reader's answer (`SSHExecutor.nvml_reading`: one request/answer line to the reader kept on the
    connection, NVML initialised once) = the GPU part of a probe through the fast path;
  - the nvidia-smi way: both queries in one script (`build_gpu_script`: --query-gpu and --query-compute-apps run
    concurrently), over the probe agent;
  - full probes (`HostService.probe`, every default section) with `nvml_python` (fast path) and without it
    (nvidia-smi), and one without GPU sections (gpu=False): the GPU part's share of a probe's wall;
  - a fresh `python3 -c "import pynvml; nvmlInit()"` per probe (the way NOT taken), and one in-process NVML
    reading (bot.adapters.nvml.read_nvml) for the floor of NVML itself.
Then the models: the GPU table and holders from NVML and from nvidia-smi, compared (index, UUID, memory within
1 % or 2 MiB, the same PIDs). With --hold-gib G (default 2) a torch process holds G GiB on GPU 0 while it runs, so
the holders list is not empty.

    python -m benchmarks.gpu_probe [--quick] [--rounds N] [--hold-gib G] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.probe_speed import PS, TAGS
from benchmarks.support import (
    bench_host,
    figure,
    footer,
    header,
    host_config,
    median,
    ms,
    note,
    parse_args,
    ratio,
    run_local,
    shared_tmpdir,
    wait_for,
)
from bot.config import Config
from bot.core.models import GpuSection, GpuSource, Snapshot
from bot.core.parse.nvml import gpu_section_from_reading
from bot.core.probe import ProbeRequest, build_gpu_script, new_nonce, split_sections
from bot.services.hosts import HostService

SINGLES = {"true (the floor)": "true", "ps (single)": PS, "tags grep (single)": TAGS}
HOLDER = ("import sys, time, torch\n"
          "x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device='cuda:0')\n"
          "torch.cuda.synchronize(); print('held', flush=True); time.sleep(3600)\n")


def _gpu_available() -> str | None:
    """Why this machine cannot run the benchmark (None when it can)."""
    if not shutil.which("nvidia-smi"):
        return "no nvidia-smi on PATH"
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as e:  # any failure means: no NVML here
        return f"NVML unavailable ({type(e).__name__}: {e})"
    return None


@contextlib.contextmanager
def gpu_holder(gib: float) -> Iterator[int | None]:
    """A torch process holding `gib` GiB on GPU 0 (its PID), stopped at the end; None when torch is missing."""
    if gib <= 0:
        yield None
        return
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(gib)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if "held" not in line:
            note(f"the torch holder did not start (exit {proc.poll()}); the holders list may be empty")
            yield None
        else:
            yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=30)


def compare(nvml: GpuSection, smi: GpuSection) -> list[str]:
    """Differences between the two models of the same GPUs (empty: the same). Memory may differ by 1 % or 2 MiB
    (read a few ms apart); utilisation, power and temperature move and are not compared."""
    out = []
    if not (nvml.ok and smi.ok):
        return [f"a reading failed: nvml {nvml.error!r}, nvidia-smi {smi.error!r}"]
    if [g.index for g in nvml.gpus] != [g.index for g in smi.gpus]:
        out.append(f"GPU indexes {[g.index for g in nvml.gpus]} vs {[g.index for g in smi.gpus]}")
    for a, b in zip(nvml.gpus, smi.gpus, strict=False):
        if a.uuid != b.uuid or a.name != b.name:
            out.append(f"GPU {a.index}: {a.uuid} {a.name!r} vs {b.uuid} {b.name!r}")
        for f in ("memory_used_mib", "memory_total_mib"):
            x, y = getattr(a, f), getattr(b, f)
            if x is None or y is None or abs(x - y) > max(2.0, 0.01 * max(x, y)):
                out.append(f"GPU {a.index} {f}: {x} vs {y}")
    pa = sorted((p.pid, p.gpu_index) for p in nvml.processes)
    pb = sorted((p.pid, p.gpu_index) for p in smi.processes)
    if pa != pb:
        out.append(f"holders (pid, gpu) {pa} vs {pb}")
    return out


async def measure(svc_fast: HostService, svc_smi: HostService, python: str, rounds: int) -> dict[str, list[float]]:
    """Round-robin wall seconds of each way, on the two services' warm connections."""
    ex = svc_fast.executor("bench")
    ex_smi = svc_smi.executor("bench")
    gpu_script_policy = None
    times: dict[str, list[float]] = {k: [] for k in (
        *SINGLES, "NVML reader answer", "nvidia-smi x2 (one script)", "probe, fast path", "probe, nvidia-smi",
        "probe, no GPU sections", "fresh python3 + pynvml init", "in-process NVML read")}
    from bot.adapters.nvml import read_nvml

    for _ in range(rounds):
        for name in times:
            t = time.perf_counter()
            if name in SINGLES:
                res = await ex.run(SINGLES[name], timeout_s=30)
                assert res.exit_status == 0, (name, res.stderr[-300:])
            elif name == "NVML reader answer":
                gpu_section_from_reading(await ex.nvml_reading(python, 10.0))
            elif name == "nvidia-smi x2 (one script)":
                nonce = new_nonce()
                res = await ex_smi.run_script(build_gpu_script(nonce, gpu_script_policy), timeout_s=30)
                assert split_sections(res.stdout, nonce), res.stderr[-300:]
            elif name == "probe, fast path":
                snap = await svc_fast.probe("bench", ProbeRequest())
                assert isinstance(snap, Snapshot) and snap.gpu.source is GpuSource.NVML, snap
            elif name == "probe, nvidia-smi":
                snap = await svc_smi.probe("bench", ProbeRequest())
                assert isinstance(snap, Snapshot) and snap.gpu.source is GpuSource.NVIDIA_SMI, snap
            elif name == "probe, no GPU sections":
                snap = await svc_fast.probe("bench", ProbeRequest(gpu=False))
                assert isinstance(snap, Snapshot), snap
            elif name == "fresh python3 + pynvml init":
                await asyncio.to_thread(subprocess.run, [python, "-c", "import pynvml; pynvml.nvmlInit()"],
                                        check=True)
            else:
                await asyncio.to_thread(read_nvml)
            times[name].append(time.perf_counter() - t)
    return times


async def main(args: argparse.Namespace) -> None:
    """Run the figures and print them (and write them to --json)."""
    rounds = args.rounds or (10 if args.quick else 40)
    start = header("gpu_probe", "the GPU part of a probe: NVML reader vs nvidia-smi, on a real GPU")
    result: dict[str, object] = {}
    try:
        why = _gpu_available()
        if why:
            note(f"skipped: {why}")
            return
        smi_v = run_local(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                          timeout=60).stdout.decode().strip()
        note(f"GPUs: {smi_v}")
        result["gpus"] = smi_v.splitlines()
        python = sys.executable
        with shared_tmpdir("gpubot-bench-gpu-") as tmp, bench_host(tmp) as host, gpu_holder(args.hold_gib) as held:
            smi_path = shutil.which("nvidia-smi") or "nvidia-smi"
            fast = Config(hosts={"bench": host_config(host, nvidia_smi=smi_path, nvml_python=python)})
            slow = Config(hosts={"bench": host_config(host, nvidia_smi=smi_path)})
            svc_fast, svc_smi = HostService(fast), HostService(slow)
            try:
                t = time.perf_counter()
                first = await svc_fast.probe("bench", ProbeRequest())
                cold = time.perf_counter() - t
                assert isinstance(first, Snapshot), first
                if held is not None:  # the holder shows in NVML's process list a moment after cudaMalloc
                    from bot.adapters.nvml import read_nvml

                    await asyncio.to_thread(wait_for, lambda: held in {p.pid for p in read_nvml().processes}, 30,
                                            "the torch holder in NVML's process list")
                a = await svc_fast.probe("bench", ProbeRequest())
                b = await svc_smi.probe("bench", ProbeRequest())
                assert isinstance(a, Snapshot) and isinstance(b, Snapshot), (a, b)
                note(f"first probe on a new connection (connect, agent and NVML reader start): {ms(cold)}; "
                     f"GPU source of the fast path: {a.gpu.source.value}, {len(a.gpu.gpus)} GPU(s), holders "
                     f"{[(p.pid, p.used_memory_mib) for p in a.gpu.processes]}; torch holder pid {held}")
                diffs = compare(a.gpu, b.gpu)
                figure("models NVML vs nvidia-smi", "same" if not diffs else f"{len(diffs)} difference(s)",
                       "; ".join(diffs) or "index, UUID, name, memory (1 %/2 MiB), holders (pid, gpu)")
                result["models_differences"] = diffs
                result["holders"] = [(p.pid, p.used_memory_mib, p.gpu_index) for p in a.gpu.processes]
                times = await measure(svc_fast, svc_smi, python, rounds)
            finally:
                await svc_fast.close()
                await svc_smi.close()
        med = {k: median(v) for k, v in times.items()}
        floor = med["true (the floor)"]
        print(f"  one warm connection ({host.kind}), median of {rounds}, round-robin:")
        for k, v in med.items():
            figure(k, ms(v), f"{ratio(v, floor)} the floor; min {ms(min(times[k]))}, max {ms(max(times[k]))}")
        figure("GPU part, fast path", ms(med["NVML reader answer"]), "acceptance: under 5 ms")
        figure("GPU part in a probe, fast path", ms(med["probe, fast path"] - med["probe, no GPU sections"]),
               "probe with GPUs minus probe without (the reader runs beside the script)")
        figure("GPU part in a probe, nvidia-smi", ms(med["probe, nvidia-smi"] - med["probe, no GPU sections"]),
               "the same with the two nvidia-smi queries in the script")
        slowest = max(("ps (single)", "tags grep (single)", "NVML reader answer"), key=med.__getitem__)
        figure("probe fast path / slowest single", ratio(med["probe, fast path"], med[slowest]),
               f"slowest: {slowest} (a single includes one floor); issue 21 asks within x1.5")
        figure("nvidia-smi x2 / NVML reader", ratio(med["nvidia-smi x2 (one script)"], med["NVML reader answer"]),
               "the fast path's gain on the GPU part")
        figure("probe nvidia-smi / probe fast path", ratio(med["probe, nvidia-smi"], med["probe, fast path"]),
               "the fast path's gain on the whole probe")
        result.update(rounds=rounds, server=host.kind, cold_first_probe_s=cold,
                      median_s=med, min_s={k: min(v) for k, v in times.items()},
                      max_s={k: max(v) for k, v in times.items()}, load=os.getloadavg())
        if args.json:
            await asyncio.to_thread(Path(args.json).write_text, json.dumps(result, indent=1, default=str))
    finally:
        footer(start)


def _add(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=0, help="rounds per way (default 40; 10 with --quick)")
    ap.add_argument("--hold-gib", type=float, default=2.0, help="GiB a torch process holds on GPU 0 (0: none)")
    ap.add_argument("--json", default="", help="also write the figures to this JSON file")


if __name__ == "__main__":
    asyncio.run(main(parse_args(__doc__, _add)))
