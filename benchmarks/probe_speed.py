"""How close a probe is to one round trip, and how it compares with probing by hand (issue 21: the warm probe at
least 10x the seed's way and 1.5x faster than a ControlMaster power user; within 1.5x of floor + slowest command).

Against the loopback SSH host (OpenSSH sshd, see benchmarks/support.py) with the replaying fake nvidia-smi, a
5,000-line log and a health endpoint (a tiny HTTP server in its own process):
  1. on ONE warm connection (HostService's pooled one, each command wrapped in `timeout -k` as the probe is):
     the median wall of `true` (the floor), of each single host command the probe runs (ps; wc -l + tail of the
     log; nvidia-smi --query-gpu; nvidia-smi --query-compute-apps; curl of the health endpoint; the
     /proc/*/environ tags grep) and of the full probe (HostService.probe with log= and port=: every section),
     also through the NVML fast path (the host's `nvml_python` a Python whose pynvml is the replaying fake: the
     GPU readings from the reader kept on the connection, no nvidia-smi), compared with the slowest of the
     commands that probe runs;
  2. at 0 ms and at 50 ms RTT (a TCP delay proxy, benchmarks/delay_proxy.py, RTT/2 each way; HostService connects
     through it too): the seed's way (the 4 checks ps, wc+tail, nvidia-smi with both queries, curl, as 4 fresh
     OpenSSH `ssh` processes one after another), the ControlMaster power user (the same 4 commands over an
     OpenSSH ControlMaster, warmed first) and the warm probe, all round-robin.

    python -m benchmarks.probe_speed [--quick] [--rtt-ms 50]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.support import (
    BenchHost,
    bench_host,
    cleanup,
    delay_proxy,
    fake_gpu,
    figure,
    footer,
    header,
    health_server,
    host_config,
    median,
    ms,
    note,
    parse_args,
    query_fields,
    ratio,
    run_local,
    shared_tmpdir,
)
from bot.config import Config
from bot.core.probe import ProbeRequest
from bot.services.hosts import HostService

PS = "ps -eww -o pid,ppid,pgid,sid,stat,pcpu,rss,etimes,time,wchan:32,args"
TAGS = ("printf '%s\\0' /proc/[0-9]*/environ | xargs -0 grep -a -z -H -s '^GPUBOT_LAUNCH=' | tr '\\000' '\\n'; "
        "printf '%s\\0' /proc/[0-9]*/cgroup | xargs -0 grep -H -s -o '/gpubot-[A-Za-z0-9_-]*[.]scope$'; true")


def single_commands(smi: str, log: Path, port: int) -> dict[str, str]:
    """The host commands of one probe, one by one (name -> command)."""
    gpu, apps = query_fields()
    return {
        "ps": PS,
        "log wc -l + tail": f"wc -l < {log}; tail -n 20 {log}",
        "nvidia-smi --query-gpu": f"{smi} --query-gpu={gpu} --format=csv,noheader,nounits",
        "nvidia-smi --query-compute-apps": f"{smi} --query-compute-apps={apps} --format=csv,noheader,nounits",
        "curl health": f"curl -s -m 2 -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/health",
        "tags grep (/proc/*/environ)": TAGS,
    }


def seed_commands(smi: str, log: Path, port: int) -> list[str]:
    """The seed's 4 checks, as typed by hand."""
    one = single_commands(smi, log, port)
    return [one["ps"], one["log wc -l + tail"],
            f"{one['nvidia-smi --query-gpu']}; {one['nvidia-smi --query-compute-apps']}", one["curl health"]]


def _ssh_all(argv: list[str], commands: list[str]) -> float:
    """Wall seconds of the commands as `ssh` processes one after another (each must exit 0)."""
    t = time.perf_counter()
    for c in commands:
        res = run_local([*argv, c], timeout=60)
        if res.returncode != 0:
            raise RuntimeError(f"ssh {c[:40]!r} failed ({res.returncode}): {res.stderr.decode(errors='replace')}")
    return time.perf_counter() - t


@contextlib.contextmanager
def control_master(host: BenchHost, path: Path, port: int, known_hosts: Path) -> Iterator[list[str]]:
    """ssh options for an OpenSSH ControlMaster at `path` (warmed: the master is up), stopped at the end."""
    opts = ("-o", "ControlMaster=auto", "-o", f"ControlPath={path}", "-o", "ControlPersist=60")
    argv = host.ssh_argv(*opts, port=port, known_hosts=known_hosts)

    def stop() -> None:
        check = run_local(host.ssh_argv("-o", f"ControlPath={path}", "-O", "check", port=port,
                                        known_hosts=known_hosts), timeout=10)
        m = re.search(rb"pid=(\d+)", check.stderr + check.stdout)
        run_local(host.ssh_argv("-o", f"ControlPath={path}", "-O", "exit", port=port, known_hosts=known_hosts),
                  timeout=10)
        if m:  # the master left running despite -O exit: stop exactly it
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(m.group(1)), signal.SIGTERM)

    with cleanup(stop):
        _ssh_all(argv, ["true"])
        yield argv


FAST = "full probe, NVML fast path"


async def _warm_connection(svc: HostService, req: ProbeRequest, rounds: int, commands: dict[str, str],
                           fast: HostService | None = None) -> dict[str, list[float]]:
    ex = svc.executor("bench")
    times: dict[str, list[float]] = {"true (the floor)": [], **{k: [] for k in commands}, "full probe": []}
    if fast is not None:
        times[FAST] = []
    for _ in range(rounds):
        for name in times:
            t = time.perf_counter()
            if name in ("full probe", FAST):
                snap = await (svc if name == "full probe" else fast).probe("bench", req)  # type: ignore[union-attr]
                if not hasattr(snap, "table"):
                    raise RuntimeError(f"probe failed: {snap}")
            else:
                res = await ex.run("true" if name == "true (the floor)" else commands[name], timeout_s=30)
                if res.exit_status != 0:
                    raise RuntimeError(f"{name} failed ({res.exit_status}): {res.stderr[:200]!r}")
            times[name].append(time.perf_counter() - t)
    return times


async def _compare(host: BenchHost, cfg: Config, req: ProbeRequest, seed: list[str], rounds: int, port: int,
                   known_hosts: Path, cm_path: Path) -> dict[str, list[float]]:
    """Round-robin: the seed's way, the ControlMaster power user, the warm probe (wall seconds each)."""
    svc = HostService(cfg)
    times: dict[str, list[float]] = {"seed": [], "controlmaster": [], "probe": []}
    try:
        await svc.probe("bench", req)  # warm the pooled connection
        fresh = host.ssh_argv(port=port, known_hosts=known_hosts)
        with control_master(host, cm_path, port, known_hosts) as cm:
            for _ in range(rounds):
                times["seed"].append(_ssh_all(fresh, seed))
                times["controlmaster"].append(_ssh_all(cm, seed))
                t = time.perf_counter()
                await svc.probe("bench", req)
                times["probe"].append(time.perf_counter() - t)
    finally:
        await svc.close()
    return times


async def main(args: argparse.Namespace) -> None:
    """Run the figures and print them."""
    rounds = 4 if args.quick else 10
    start = header("probe_speed", "probe vs the floor, its own commands, the seed's way and a ControlMaster")
    try:
        with shared_tmpdir("gpubot-bench-speed-") as tmp, bench_host(tmp) as host, health_server() as hport:
            fake = fake_gpu(tmp / "gpu", host)
            smi = str(fake.nvidia_smi)
            log = tmp / "server.log"
            log.write_text("".join(f"[2025-01-01 00:00:{i % 60:02d} TP0] INFO decode batch {i}: 12 reqs\n"
                                   for i in range(5000)))
            log.chmod(0o644)
            req = ProbeRequest(log_path=str(log), port=hport)
            cfg = Config(hosts={"bench": host_config(host, nvidia_smi=smi, log_dirs=[str(tmp)])})
            svc = HostService(cfg)
            # the same host with a Python that has pynvml (the replaying fake's): the GPU part through the NVML
            # reader kept on the connection, as on a host with `nvml_python` (trees without the reader: skipped)
            nvml_python = getattr(fake, "python_nvml", None)
            fast = (HostService(Config(hosts={"bench": host_config(host, nvidia_smi=smi, log_dirs=[str(tmp)],
                                                                   nvml_python=str(nvml_python))}))
                    if nvml_python is not None else None)
            try:
                snap = await svc.probe("bench", req)
                if not hasattr(snap, "table"):
                    raise RuntimeError(f"probe failed: {snap}")
                health = getattr(snap.health, "status", None)
                note(f"probe sees {len(snap.table)} ps rows, GPU ok={snap.gpu.ok}, port listening="
                     f"{snap.port_listening}, health={health}, log lines={snap.log.lines if snap.log else None}")
                if fast is not None:
                    fsnap = await fast.probe("bench", req)
                    note(f"the fast path's probe: GPU ok={getattr(getattr(fsnap, 'gpu', None), 'ok', None)}, "
                         f"source={getattr(getattr(getattr(fsnap, 'gpu', None), 'source', None), 'value', None)}")
                times = await _warm_connection(svc, req, rounds, single_commands(smi, log, hport), fast)
            finally:
                await svc.close()
                if fast is not None:
                    await fast.close()
            floor = median(times["true (the floor)"])
            probe = median(times["full probe"])
            fast_probe = median(times[FAST]) if FAST in times else None
            singles = {k: median(v) for k, v in times.items() if k not in ("true (the floor)", "full probe", FAST)}
            slowest = max(singles, key=lambda k: singles[k])
            no_smi = {k: v for k, v in singles.items() if not k.startswith("nvidia-smi")}
            slowest_no_smi = max(no_smi, key=lambda k: no_smi[k])
            print(f"  one warm connection, median of {rounds} (each single command is its own exec, so it "
                  "includes one floor):")
            figure("true (the floor)", ms(floor), "one exec round trip on the warm connection")
            for k, v in singles.items():
                figure(k, ms(v), f"{ratio(v, floor)} the floor")
            figure("full probe", ms(probe), "HostService.probe with log= and port= (every section), bot side incl.")
            figure("probe / floor", ratio(probe, floor), "issue 21 saw 42x; one round trip would be x1")
            figure("probe / slowest single", ratio(probe, singles[slowest]),
                   f"slowest: {slowest}; acceptance: within x1.5")
            figure("probe / sum of singles", ratio(probe, sum(singles.values())),
                   "below x1: the probe saves the per-exec round trips; near x1: it runs them one after another")
            if fast_probe is not None:
                figure("full probe, NVML fast path", ms(fast_probe),
                       "the same probe where the host has pynvml (`nvml_python`): no nvidia-smi run")
                figure("fast probe / slowest single", ratio(fast_probe, no_smi[slowest_no_smi]),
                       f"slowest of the commands it runs: {slowest_no_smi}; acceptance: within x1.5")
            seed = seed_commands(smi, log, hport)
            for rtt in (0.0, args.rtt_ms):
                if rtt:
                    with delay_proxy(host.port, rtt) as pport:
                        kh = host.known_hosts_for(pport, tmp)
                        pcfg = Config(hosts={"bench": host_config(host, nvidia_smi=smi, log_dirs=[str(tmp)],
                                                                  port=pport, known_hosts=str(kh))})
                        t = await _compare(host, pcfg, req, seed, rounds, pport, kh, tmp / f"cm{int(rtt)}")
                else:
                    t = await _compare(host, cfg, req, seed, rounds, host.port, host.known_hosts_path, tmp / "cm0")
                seed_s, cm_s, probe_s = median(t["seed"]), median(t["controlmaster"]), median(t["probe"])
                print(f"  at {rtt:g} ms RTT{' (delay proxy)' if rtt else ''}, median of {rounds}:")
                figure("seed's way (4 fresh ssh)", ms(seed_s), "ps, wc+tail, nvidia-smi x2, curl: 4 `ssh` processes")
                figure("ControlMaster (4 over mux)", ms(cm_s), "the same 4 commands over a warm ControlMaster")
                figure("warm probe", ms(probe_s), "HostService.probe, pooled connection")
                figure("seed / probe", ratio(seed_s, probe_s), "acceptance: at least x10 on loopback")
                figure("ControlMaster / probe", ratio(cm_s, probe_s),
                       "acceptance: at least x1.5 (below x1: the power user is faster)")
    finally:
        footer(start)


def _add(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rtt-ms", type=float, default=50.0, help="the second RTT (default 50 ms)")


if __name__ == "__main__":
    asyncio.run(main(parse_args(__doc__, _add)))
