"""`/gpu status all` at fleet size: 1, 64 and 256 warm hosts (issue 21: 64 hosts within 2x of one host).

N host entries with distinct names, all the same loopback SSH host (OpenSSH sshd with MaxStartups high enough
for N concurrent logins; see benchmarks/support.py), so HostService holds N pooled connections (in its probe
workers, in trees that have them, for 8 hosts or more). All of them are connected first, by one untimed
HostService.status over the N hosts; then the median wall of HostService.status(names) (what `/gpu status all`
does), the bot's CPU per host probe (support.bot_cpu_s plus the probe workers' CPU, / N), and the host side's CPU
per probe: the CPU of sshd and of every process it reaped (sshd runs under benchmarks/subreaper.py, so sessions
are reaped too; /proc/PID/stat cutime+cstime), read after every connection closed, less N connection set-ups
(measured first on 16), divided by the probes (the warming one included). Every "host" here shares this machine's
cores, so N x host CPU / cores is a floor under the wall that a real fleet (one machine per host) does not have, and
each probe's `ps` also lists the other probes' processes (the host CPU per probe grows with N here). So the sizes
are measured again over replaying hosts (benchmarks/replay_host.py, `replayed`): each answers with the real host's
recorded probe output after sleeping as long as the real host took, using no CPU of its own for the work.

nvidia-smi is a `sh` stub printing the replayed H200 rows of bot.demo.fakegpu (support.static_gpu_stub): the
Python fake's start-up, twice per probe, times 256 hosts on 2 cores would otherwise be most of the figure.
With --rtt-ms 20, the sizes up to 64 are measured again at 20 ms RTT through one TCP delay proxy (its own
process). Rounds: 10 for one host, 3 for 64, 1 for 256 (--quick: 4, 1, 1): a call over 256 hosts costs the
previous release about a minute on 2 cores.

    python -m benchmarks.fleet [--quick] [--hosts 1,64,256] [--probe-workers N] [--rtt-ms 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.support import (
    BenchHost,
    bench_host,
    bot_cpu_s,
    delay_proxy,
    fake_gpu,
    figure,
    footer,
    header,
    host_config,
    median,
    ms,
    note,
    parse_args,
    proc_cpu_s,
    ratio,
    replay_hosts,
    shared_tmpdir,
    static_gpu_stub,
    wait_for,
)
from bot.config import Config
from bot.services.hosts import HostService


@dataclass
class Run:
    """One fleet size's figures."""

    n: int
    rounds: int
    warm_s: float
    wall_s: list[float]
    bot_cpu_per_host_s: list[float]
    host_cpu_per_probe_s: float | None
    failures: int
    rows: list[int]
    errors: list[str]
    workers: int = 0


def _names(n: int) -> list[str]:
    return [f"h{i:03d}" for i in range(n)]


async def _closed(host: BenchHost | None, svc: HostService) -> None:
    await svc.close()
    if host is not None:
        await asyncio.to_thread(wait_for, lambda: host.live_children() == 0, 120, "the server to reap every session")


async def connect_cost(host: BenchHost, hc: Any, n: int) -> float:
    """Host CPU seconds of one connection set-up (a login and one `true`), from n at once."""
    names = _names(n)
    svc = HostService(Config(hosts=dict.fromkeys(names, hc)))
    h0 = host.host_cpu_s()
    try:
        await asyncio.gather(*(svc.executor(nm).run("true", timeout_s=60) for nm in names))
    finally:
        await _closed(host, svc)
    return (host.host_cpu_s() - h0) / n


def _bot_cpu_s(svc: HostService) -> float:
    """The bot's CPU seconds so far, its probe workers' included (in trees that have them)."""
    return bot_cpu_s() + sum(proc_cpu_s(pid) for pid in getattr(svc, "worker_pids", []))


async def fleet(host: BenchHost | None, hc: Any, n: int, rounds: int, conn_cost_s: float | None, *,
                one_wave: bool = False, probe_workers: int | None = None) -> Run:
    """Warm n connections with one untimed HostService.status over all n hosts (in trees with probe workers, they
    start and connect then), then `rounds` timed calls. `hc` is the HostConfig of every host, or a list of them
    that the hosts take in turn; `host` None: no host CPU is read. `one_wave`: probe_concurrency at least n (the
    default, 32, probes 64 hosts in two waves); `probe_workers` None: the config's default."""
    names = _names(n)
    workers = 0
    hcs = hc if isinstance(hc, list) else [hc]
    extra: dict[str, Any] = {"probe_concurrency": max(32, n)} if one_wave else {}
    if probe_workers is not None and "probe_workers" in Config.model_fields:  # trees that have probe workers
        extra["probe_workers"] = probe_workers
    svc = HostService(Config(hosts={nm: hcs[i % len(hcs)] for i, nm in enumerate(names)}, **extra))
    h0 = host.host_cpu_s() if host is not None else 0.0
    walls, cpu = [], []
    failures, rows, errors = 0, [], []
    try:
        t = time.perf_counter()
        await svc.status(names)
        warm_s = time.perf_counter() - t
        for _ in range(rounds):
            c0 = _bot_cpu_s(svc)
            t = time.perf_counter()
            res = await svc.status(names)
            walls.append(time.perf_counter() - t)
            cpu.append((_bot_cpu_s(svc) - c0) / n)
            failures += sum(1 for r in res if not hasattr(r, "table"))
            rows += [r.all_process_count for r in res if hasattr(r, "table")]
            errors += [e for r in res for e in getattr(r, "errors", [])]
        workers = len(getattr(svc, "worker_pids", []))
    finally:
        await _closed(host, svc)
    per_probe = None
    if conn_cost_s is not None and host is not None:
        per_probe = (host.host_cpu_s() - h0 - n * conn_cost_s) / (n * (rounds + 1))  # + the warming round
    return Run(n, rounds, warm_s, walls, cpu, per_probe, failures, rows, errors, workers)


def _print(runs: list[Run], label: str) -> None:
    one = median(runs[0].wall_s)
    print(f"  {label}:")
    for r in runs:
        wall = median(r.wall_s)
        figure(f"{r.n} host(s): status wall", ms(wall),
               f"median of {r.rounds} HostService.status calls, all connected first ({ms(r.warm_s)}); "
               f"{r.workers or 'no'} probe worker(s)"
               + (f"; {r.failures} FAILED probes" if r.failures else ""))
        if r.errors:
            note(f"{len(r.errors)} snapshot errors, e.g. {r.errors[0]!r}")
        if r.n != runs[0].n:
            figure(f"{r.n} host(s) / {runs[0].n}", ratio(wall, one), "acceptance (64 hosts): within x2")
        figure(f"{r.n} host(s): bot CPU per host", ms(median(r.bot_cpu_per_host_s)),
               f"bot CPU per host probe ({median(r.rows):.0f} ps rows); x{r.n} = "
               f"{median(r.bot_cpu_per_host_s) * r.n:.2f} s of one core per call")
        if r.host_cpu_per_probe_s is not None:
            floor = r.n * r.host_cpu_per_probe_s / (os.cpu_count() or 1)
            figure(f"{r.n} host(s): host CPU per probe", ms(r.host_cpu_per_probe_s),
                   f"sshd and its sessions; x{r.n} / {os.cpu_count()} cores = {ms(floor)}: a floor here only")
            if r.n != runs[0].n:
                figure(f"{r.n} host(s) less that floor / {runs[0].n}", ratio(max(wall - floor, one), one),
                       "an estimate of what fanning out adds where every host has its own CPUs")


async def record(hc: Any, path: Path) -> float:
    """Write one status probe's raw output from the host of `hc` to `path` (its nonce replaced by NONCE) and return
    the median seconds the script took there, as the bot saw it (5 runs after a first)."""
    from bot.core.probe import ProbeRequest, build_script, new_nonce
    from bot.services.hosts import host_policy

    svc = HostService(Config(hosts={"recorded": hc}))
    durations = []
    try:
        for _ in range(6):
            nonce = new_nonce()
            res = await svc.executor("recorded").run_script(build_script(ProbeRequest(), nonce, host_policy(hc)),
                                                             timeout_s=60)
            durations.append(res.duration_s)
        await asyncio.to_thread(path.write_bytes, res.stdout.replace(nonce.encode(), b"NONCE"))
    finally:
        await svc.close()
    return median(durations[1:])


async def replayed(tmp: Path, hc: Any, stub: Path, sizes: list[int], quick: bool, workers: int | None) -> None:
    """The sizes again over replaying hosts (benchmarks/replay_host.py): each answers a probe with the real host's
    recorded output after sleeping as long as the real host took, so the hosts' own work costs this machine no
    CPU, as on a real fleet where every host has its own."""
    recording = tmp / "recorded-probe.out"
    delay_s = await record(hc, recording)
    # the servers' own SSH framing is this machine's CPU too: half the cores serve (one process on a small machine)
    servers = 1 if (os.cpu_count() or 1) <= 4 else min(16, (os.cpu_count() or 1) // 2)
    with replay_hosts(tmp, servers, recording, delay_s * 1000, max_sessions=10) as hosts:
        hcs = [host_config(h, nvidia_smi=str(stub), log_dirs=[str(tmp)]) for h in hosts]
        rounds = [(4 if n == 1 else 2) if quick else (10 if n == 1 else 3) for n in sizes]
        default = [await fleet(None, hcs, n, r, None, probe_workers=workers)
                   for n, r in zip(sizes, rounds, strict=True)]
        wave = [await fleet(None, hcs, n, r, None, one_wave=True, probe_workers=workers)
                for n, r in zip(sizes, rounds, strict=True)]
    what = (f"replayed hosts ({servers} server process(es), each probe answered after {ms(delay_s)}, the real host's "
            f"script time, with no CPU of its own)")
    _print(default, f"{what}, probe_concurrency 32 (the default: 64 hosts in two waves)")
    _print(wave, f"{what}, probe_concurrency = the hosts (one wave); acceptance (64 hosts within x2) read here")


async def main(args: argparse.Namespace) -> None:
    """Run the figures and print them."""
    sizes = [int(x) for x in args.hosts.split(",")]
    start = header("fleet", f"/gpu status over {', '.join(map(str, sizes))} warm hosts (HostService.status)")
    try:
        with shared_tmpdir("gpubot-bench-fleet-") as tmp, \
                bench_host(tmp, max_startups=max(sizes) * 2 + 10) as host:
            stub = static_gpu_stub(tmp / "stub", fake_gpu(tmp / "gpu", host))
            hc = host_config(host, nvidia_smi=str(stub), log_dirs=[str(tmp)])
            cost = await connect_cost(host, hc, min(16, max(sizes)))
            note(f"host CPU of one connection set-up (login + `true`): {ms(cost)}; subtracted below")
            runs = []
            for n in sizes:
                rounds = (4 if n == 1 else 1) if args.quick else (10 if n == 1 else 3 if n <= 64 else 1)
                runs.append(await fleet(host, hc, n, rounds, cost, probe_workers=args.probe_workers))
            _print(runs, "loopback (0 ms RTT)")
            await replayed(tmp, hc, stub, sizes, args.quick, args.probe_workers)
            if args.rtt_ms:
                with delay_proxy(host.port, args.rtt_ms) as pport:
                    kh = host.known_hosts_for(pport, tmp)
                    phc = host_config(host, nvidia_smi=str(stub), log_dirs=[str(tmp)], port=pport,
                                      known_hosts=str(kh))
                    rtt_runs = [await fleet(host, phc, n, 10 if n == 1 else 3, None, probe_workers=args.probe_workers)
                                for n in sizes if n <= 64]
                _print(rtt_runs, f"{args.rtt_ms:g} ms RTT (one delay proxy for every connection)")
    finally:
        footer(start)


def _add(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--hosts", default="1,64,256", help="fleet sizes, comma-separated (default 1,64,256)")
    ap.add_argument("--probe-workers", type=int, default=None,
                    help="probe_workers for every HostService (default: the config's default for this machine)")
    ap.add_argument("--rtt-ms", type=float, default=0.0,
                    help="also measure the sizes up to 64 at this RTT through a delay proxy (e.g. 20; default: skip)")


if __name__ == "__main__":
    asyncio.run(main(parse_args(__doc__, _add)))
