"""The bot's CPU per check on the watcher's pure path (issue 44): probe snapshot -> Observation and record
(bot.core.observe) -> the verdict (readiness rules while a launch starts, liveness rules once it serves), for many
launches at once, without SSH, database or Slack (watch_load measures the whole check; this isolates the part the
diagnosis owns).

Each of `--launches` launches writes an engine-like log (vLLM stats and access lines, a new line every few seconds,
each launch's own counters so no two lines are alike); the checks go round the launches as the watcher does, each
launch checked every 10 s: while starting, a full look (its log's last 200 lines) every check; once it serves, the
cheap liveness look (only the lines since the last check) with a full look every 10th check. A launch's first check
(its whole tail new) is a warm-up, not counted: a launch is checked for hours. Prints the CPU per check
(microseconds, process time) for each kind and the mix.

    python -m benchmarks.check_cost [--quick] [--launches 500] [--rounds 20]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from benchmarks.support import figure, footer, header, note, parse_args
from bot.core.models import GpuReading, GpuSection, Launch, LaunchState, LogInfo, ProcessInfo, Snapshot
from bot.core.observe import judge, new_log_lines, observation_from_snapshot
from bot.core.records import CheckRecord
from bot.core.serving import judge_serving

try:  # the code before issue 44 has no memo of a launch's lines (measured side by side with it)
    from bot.core.diagnose import LineMemo
except ImportError:  # pragma: no cover
    LineMemo = None  # type: ignore[assignment,misc]

INTERVAL_S = 10.0
TAIL = 200


def _args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--launches", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=None, help="checks per launch (default 31, --quick 12)")


def _line(k: int, n: int) -> str:
    """The n-th log line of launch k: a stats line every third line, access lines between (vLLM's words)."""
    if n % 3 == 0:
        return (f"INFO 12-06 10:{(n // 60) % 60:02d}:{n % 60:02d} [loggers.py:120] Engine 000: Avg prompt throughput: "
                f"{k}.{n % 10} tokens/s, Avg generation throughput: 12.{n} tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
                f"GPU KV cache usage: 1.{n}%, Prefix cache hit rate: 0.0%")
    return f'INFO:     10.0.{k % 250}.{n % 250}:{40000 + n} - "POST /v1/chat/completions HTTP/1.1" 200 OK'


def _start_lines(k: int) -> list[str]:
    return [f"INFO 12-06 09:59:{s:02d} [api_server.py:1] vLLM API server version 0.11.0 (launch {k})"
            for s in range(3)] + \
        [f"INFO 12-06 09:59:5{s} [gpu_model_runner.py:1] Loading weights took {k}.{s} seconds" for s in range(3)]


def _snap(k: int, log: list[str], t: float, since: int | None) -> Snapshot:
    tail = log[since:] if since is not None else log[-TAIL:]
    info = LogInfo(path=f"/logs/l{k}.log", exists=True, size_bytes=100 * len(log), mtime=t - 1, lines=len(log),
                   tail=tail, since=since)
    proc = ProcessInfo(pid=1000 + k, ppid=1, pgid=1000 + k, sid=1000 + k, stat="Sl", pcpu=3.0, rss_kib=1 << 20,
                       elapsed_s=int(t - 1000), cpu_time_s=int(t / 10), args=f"python3 -m vllm serve m{k}")
    gpu = GpuSection(ok=True, gpus=[GpuReading(index=0, memory_used_mib=70000.0, memory_total_mib=81559.0,
                                               utilization_gpu_pct=40.0, power_draw_w=300.0, power_limit_w=700.0)])
    return Snapshot(host="h", clock=t, local_clock=t, processes=[proc], table=[proc], gpu=gpu, log=info, port=8000,
                    port_listening=True, tagged_pids=[proc.pid], launch_tags={proc.pid: f"t{k}"})


def _launch(k: int, ready: bool) -> Launch:
    return Launch(id=k, host="h", variant="v", params={}, command="x", log_path=f"/logs/l{k}.log", port=8000,
                  gpus=[0], pid=1000 + k, pgid=1000 + k, sid=1000 + k, state=LaunchState.RUNNING, state_detail=None,
                  created_by="U1", created_at=1000.0, ended_at=None, channel=None, thread_ts=None,
                  ready_at=1000.0 if ready else None, alert_state="ready" if ready else "loading", tag=f"t{k}")


def _run(launches: int, rounds: int, serving: bool) -> tuple[float, float, int, int]:
    """(CPU seconds in full looks, in cheap looks, full looks, cheap looks) over `rounds` checks of each launch."""
    # each launch has a history already: its log's last 200 lines are a full look's tail from the first check on
    logs = {k: _start_lines(k) + [_line(k, n) for n in range(6, 260)] for k in range(launches)}
    prev: dict[int, CheckRecord | None] = dict.fromkeys(range(launches))
    history: dict[int, list[CheckRecord]] = {k: [] for k in range(launches)}
    la = {k: _launch(k, serving) for k in range(launches)}
    memos = {k: LineMemo() for k in range(launches)} if LineMemo is not None else dict.fromkeys(range(launches))
    full_s = cheap_s = 0.0
    fulls = cheaps = 0
    t = 2000.0
    for r in range(rounds):
        for k in range(launches):
            log = logs[k]
            log += [_line(k, len(log) + j) for j in range(3)]  # about three lines per 10 s
            full = not serving or r % 10 == 0 or prev[k] is None
            since = None if full else len(log) - 3
            snap = _snap(k, log, t + r * INTERVAL_S, since)
            start = time.process_time()
            memo = {"memo": memos[k]} if memos[k] is not None else {}
            obs, record = observation_from_snapshot(snap, la[k], prev[k], **memo)
            if serving:
                verdict = judge_serving(obs, new_log_lines(snap, prev[k]), [*history[k][-20:], record])
            else:
                verdict = judge(obs, prev[k], grace_s=None, silence_after_s=300.0, **memo)
            record = replace(record, verdict=verdict.verdict, phase=verdict.phase)
            spent = time.process_time() - start
            if r == 0:
                pass  # a launch's first check reads its whole tail for the first time: the warm-up, not counted
            elif full:
                full_s, fulls = full_s + spent, fulls + 1
            else:
                cheap_s, cheaps = cheap_s + spent, cheaps + 1
            prev[k] = record
            history[k].append(record)
    return full_s, cheap_s, fulls, cheaps


def main() -> None:
    """Run the starting and the serving mix and print the CPU per check."""
    args = parse_args(__doc__, _args)
    rounds = args.rounds or (12 if args.quick else 31)
    start = header("check_cost", f"{args.launches} launches, {rounds} checks each (CPU of the pure per-check path)")
    full_s, _, fulls, _ = _run(args.launches, rounds, serving=False)
    figure("starting: full look", f"{1e6 * full_s / max(1, fulls):.0f} µs/check",
           f"{fulls} checks of a 200-line tail, readiness rules")
    full_s, cheap_s, fulls, cheaps = _run(args.launches, rounds, serving=True)
    figure("serving: full look", f"{1e6 * full_s / max(1, fulls):.0f} µs/check", f"{fulls} checks (every 10th)")
    figure("serving: cheap look", f"{1e6 * cheap_s / max(1, cheaps):.0f} µs/check",
           f"{cheaps} checks of the lines since the last one")
    figure("serving: the mix", f"{1e6 * (full_s + cheap_s) / max(1, fulls + cheaps):.0f} µs/check",
           "what a serving launch costs per check on average")
    note("process CPU time; the probe's parsing, SSH, the database and Slack are watch_load's")
    footer(start)


if __name__ == "__main__":
    main()
