"""Watching a fleet's launches for their whole life: N serving launches checked every 10 s (issue 21: 500 launches
under 15 % of a core, under 200 MB, scheduling lag p99 under 1 s).

The launches are real: N processes (each a shell loop in its own session, carrying its launch's GPUBOT_LAUNCH tag,
writing an engine-like stats line every 5 s to its own log), spread over H host entries (default 64) that are all
the same loopback SSH host (benchmarks/support.py: OpenSSH sshd, /bin/sh), one shared health endpoint, the
replayed GPUs through a `sh` stub of nvidia-smi. They are recorded as ready in a fresh database, and the real
runtime (bot.wiring.build_runtime: watcher, APScheduler jobs in SQLite, store, renderer) follows them with
`serving_interval_s` 10, as a bot would after a restart. After every launch had its first check, a window (60 s;
--quick 30 s) is measured: the bot's CPU (user+sys, this process and its workers) as a share of one core, its
RSS (VmRSS now, VmHWM peak), the scheduling lag of each check (when APScheduler submitted the job minus when it
was due: p50/p99/max), checks run and checks skipped (still running when due again, or missed), and the event
loop's own lag (a 100 ms ticker's oversleep: p50/p99; what an ack would wait).

    python -m benchmarks.watch_load [--quick] [--launches 500] [--hosts 64] [--window 60]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pwd
import resource
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.support import (
    bench_host,
    bot_cpu_s,
    cleanup,
    fake_gpu,
    figure,
    footer,
    header,
    health_server,
    host_config,
    median,
    note,
    parse_args,
    shared_tmpdir,
    static_gpu_stub,
)
from bot.adapters.store import Store
from bot.config import Config, WatchPolicy
from bot.core.models import LaunchState
from bot.wiring import build_runtime
from tests.support.surfaces import RecordingSurface

INTERVAL_S = 10.0
#: What each launch's process writes every 5 s (a vLLM-like stats line with a counter, so lines differ).
LOOP = ('i=0; while :; do i=$((i+1)); echo "INFO [metrics.py:120] Avg prompt throughput: 0.0 tokens/s, '
        'Avg generation throughput: 12.$i tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.$i%"; '
        'sleep 5; done')


def _args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--launches", type=int, default=500)
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--window", type=float, default=None, help="seconds measured (default 60, --quick 30)")
    ap.add_argument("--profile", metavar="FILE", default=None,
                    help="write a cProfile (CPU time of the process) over the window to FILE (pstats format)")


def _vm(field: str) -> float:
    """A /proc/self/status size (VmRSS, VmHWM) in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _start_launches(tmp: Path, tags: list[str], user: str) -> list[tuple[subprocess.Popen[bytes], Path]]:
    """A shell loop per tag, run as `user` (the host's login user, who must read their /proc/PID/environ, as a
    bot's SSH user reads its own launches'), each in its own session with its launch's tag in its environment and
    stdout to its own log (world-readable)."""
    logs = tmp / "logs"
    logs.mkdir(mode=0o755, exist_ok=True)
    out = []
    for i, tag in enumerate(tags):
        log = logs / f"bench-{i}.log"
        with open(log, "wb") as f:
            f.write(b"INFO [api_server.py:1] Starting vLLM API server on http://0.0.0.0:8000\n"
                    b"INFO:     Application startup complete.\n")
        os.chmod(log, 0o644)
        fh = open(log, "ab")
        # the user's own group too: /proc/PID/environ is readable only with matching uid AND gid (ptrace rules)
        as_user = ({"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}
                   if os.geteuid() == 0 and user != "root" else {})
        proc = subprocess.Popen(["sh", "-c", LOOP], stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd="/", **as_user,
                                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GPUBOT_LAUNCH": tag})
        fh.close()
        out.append((proc, log))
    return out


def _stop_launches(launches: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    """Kill every launch's session."""
    for proc, _ in launches:
        try:
            os.killpg(proc.pid, 9)
        except OSError:
            pass
    for proc, _ in launches:
        proc.wait()


async def _run(args: argparse.Namespace) -> None:
    n, hosts = args.launches, max(1, args.hosts)
    window = args.window or (30.0 if args.quick else 60.0)
    with shared_tmpdir("gpubot-bench-watch") as tmp, \
            bench_host(tmp, max_sessions=16, max_startups=hosts + 10) as host, health_server() as health_port:
        fake = fake_gpu(tmp / "gpu", host)
        smi = static_gpu_stub(tmp / "stub", fake)
        names = [f"h{i:03d}" for i in range(hosts)]
        logs_dir = str(tmp / "logs")
        cfg = Config(
            hosts={h: host_config(host, nvidia_smi=str(smi), log_dirs=[logs_dir], command_timeout_s=30) for h in names},
            variants={"bench": {"host": names[0], "command": "sleep {{ port }}", "port": health_port,
                                "health": "/health"}},
            state_dir=str(tmp / "state"),
        )
        store = Store(f"sqlite:///{tmp / 'state.db'}")
        rows = [store.launches.create(host=names[i % hosts], variant="bench", params={}, command=LOOP,
                                      log_path=str(tmp / "logs" / f"bench-{i}.log"), port=health_port, gpus=[0],
                                      created_by="U0BENCH") for i in range(n)]
        launches = _start_launches(tmp, [la.tag for la in rows], host.username)
        with cleanup(lambda: _stop_launches(launches)):
            now = time.time()
            for la, (proc, _log) in zip(rows, launches, strict=True):
                store.launches.update(la.id, pid=proc.pid, pgid=proc.pid, sid=proc.pid, ready_at=now - 60,
                                      alert_state="ready", state=LaunchState.RUNNING)
            policy = WatchPolicy(interval_s=INTERVAL_S, serving_interval_s=INTERVAL_S, silence_after_s=600,
                                 stack_dump_on_hang=False)
            runtime = build_runtime(cfg, surface=RecordingSurface(), store=store, watch_policy=policy)
            stats = _Stats()
            runtime.watcher.scheduler._aps.add_listener(stats.on_event)
            ticker = asyncio.ensure_future(stats.tick())
            try:
                t0 = time.monotonic()
                await runtime.start(watch=True)
                await _wait(lambda: len(stats.checked) >= n, 4 * INTERVAL_S + n * 0.4, "every launch's first check")
                note(f"every launch had its first check {time.monotonic() - t0:.1f} s after the start")
                stats.reset()
                profiler = cProfile.Profile(time.process_time) if args.profile else None
                c0, w0, m0 = bot_cpu_s(), time.monotonic(), _machine_busy()
                if profiler is not None:
                    profiler.enable()
                await asyncio.sleep(window)
                if profiler is not None:
                    profiler.disable()
                    profiler.dump_stats(args.profile)
                cpu, wall = bot_cpu_s() - c0, time.monotonic() - w0
                m1 = _machine_busy()
                snapshot = stats.copy()
                states = Counter(f"{la.state.value}/{la.alert_state}" for la in (store.launches.get(r.id)
                                                                                 for r in rows) if la)
            finally:
                ticker.cancel()
                await runtime.close()
        expected = n * wall / INTERVAL_S
        figure(f"{n} launches on {hosts} hosts", f"{100 * cpu / wall:.1f} % of a core",
               f"bot CPU over {wall:.0f} s ({cpu:.2f} s; {1000 * cpu / max(1, snapshot['runs']):.2f} ms per check)")
        per_check = cpu / max(1, snapshot["runs"])
        figure("projected, every due check run", f"{100 * per_check * expected / wall:.1f} % of a core",
               f"{1000 * per_check:.2f} ms per check x {expected / wall:.1f} checks due per s")
        busy = (m1[0] - m0[0]) / max(1e-9, m1[1] - m0[1])
        figure("machine busy", f"{100 * busy:.0f} % of its {os.cpu_count()} CPUs",
               "bot, sshd, the launches and their checks' commands (every host is this machine)")
        figure("RSS", f"{_vm('VmRSS'):.0f} MB now, {_vm('VmHWM'):.0f} MB peak",
               f"ru_maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
        lag = snapshot["lag"]
        figure("scheduling lag", f"p50 {_pct(lag, 0.5) * 1000:.0f} ms, p99 {_pct(lag, 0.99) * 1000:.0f} ms, "
               f"max {max(lag, default=float('nan')) * 1000:.0f} ms",
               "when a check was submitted minus when it was due")
        note("launches by state/verdict at the end: " + ", ".join(f"{k} {v}" for k, v in sorted(states.items())))
        figure("checks", f"{snapshot['runs']} run of ~{expected:.0f} due, {snapshot['skipped']} skipped "
               f"(still running), {snapshot['missed']} missed", "in the window")
        ticks = snapshot["ticks"]
        figure("event loop lag", f"p50 {_pct(ticks, 0.5) * 1000:.1f} ms, p99 {_pct(ticks, 0.99) * 1000:.1f} ms, "
               f"max {max(ticks, default=float('nan')) * 1000:.0f} ms", "a 100 ms ticker's oversleep")
        if snapshot["durations"]:
            figure("check duration", f"median {median(snapshot['durations']) * 1000:.0f} ms",
                   "submitted to executed (probe round trip included)")


def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot, from the first line of /proc/stat (proc(5))."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return float(sum(fields[:8]) - idle), float(sum(fields[:8]))


async def _wait(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


class _Stats:
    """APScheduler events and the loop ticker."""

    def __init__(self) -> None:
        self.checked: set[str] = set()
        self.reset()

    def reset(self) -> None:
        self.lag: list[float] = []
        self.ticks: list[float] = []
        self.durations: list[float] = []
        self.runs = self.skipped = self.missed = 0
        self._submitted: dict[str, float] = {}

    def copy(self) -> dict[str, Any]:
        return {"lag": list(self.lag), "ticks": list(self.ticks), "runs": self.runs, "skipped": self.skipped,
                "missed": self.missed, "durations": list(self.durations)}

    def on_event(self, event: Any) -> None:
        from apscheduler.events import (
            EVENT_JOB_EXECUTED,
            EVENT_JOB_MAX_INSTANCES,
            EVENT_JOB_MISSED,
            EVENT_JOB_SUBMITTED,
        )

        job = getattr(event, "job_id", "")
        if not str(job).startswith("watch:"):
            return
        now = time.time()
        if event.code == EVENT_JOB_SUBMITTED:
            due = event.scheduled_run_times[0].timestamp() if event.scheduled_run_times else now
            self.lag.append(max(0.0, now - due))
            self._submitted[job] = now
        elif event.code == EVENT_JOB_EXECUTED:
            self.runs += 1
            self.checked.add(job)
            if job in self._submitted:
                self.durations.append(now - self._submitted.pop(job))
        elif event.code == EVENT_JOB_MAX_INSTANCES:
            self.skipped += 1
        elif event.code == EVENT_JOB_MISSED:
            self.missed += 1

    async def tick(self) -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.1)
            self.ticks.append(max(0.0, time.monotonic() - t - 0.1))


def main() -> None:
    args = parse_args(__doc__, _args)
    start = header("watch_load", f"{args.launches} serving launches watched every {INTERVAL_S:g} s")
    asyncio.run(_run(args))
    footer(start)


if __name__ == "__main__":
    main()
