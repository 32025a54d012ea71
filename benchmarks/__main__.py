"""The benchmark suite of issue 21 (`./dev bench`): runs the selected benchmarks, each in its own subprocess, one
after another, and prints everything they print (figures, never assertions) plus a summary.

    python -m benchmarks                               # the whole suite on this checkout (about 10 minutes)
    python -m benchmarks row_cost probe_speed --quick  # some of them, fewer rounds
    python -m benchmarks --tree /work/baseline         # the same benchmark code against another checkout
    python -m benchmarks --tree . --tree /work/baseline  # side by side: each benchmark on each tree in turn
    python -m benchmarks --list                        # the suite and the other benchmark modules

`--tree PATH` runs each benchmark with cwd=PATH and PYTHONPATH=PATH, so `import bot` (and `tests.support`)
resolve to that checkout, while the benchmark code is this folder's (benchmarks/_bootstrap.py binds the package
name `benchmarks` to it, whatever `benchmarks` folder PATH has). Every benchmark prints where `bot` came from and
stops when that is not the tree asked for. Trees share this interpreter (this checkout's .venv). Several
`--tree`s interleave: benchmark 1 on every tree, then benchmark 2 on every tree, so each pair ran under about the
same load. Any module of this folder can be named (e.g. probe_roundtrip), not only the suite.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: The suite, in the order it runs by default: the ones that leave the machine loaded (fleet, watch_load) late.
SUITE = ["row_cost", "probe_speed", "big_log", "startup", "fleet", "watch_load", "burst"]
#: Modules of this folder that are not benchmarks.
NOT_BENCHMARKS = {"__init__", "__main__", "_bootstrap", "support", "delay_proxy", "health_server", "loopback_host",
                  "replay_host", "subreaper", "fake_slack_server"}


def available() -> list[str]:
    """Every benchmark module of this folder (the suite first)."""
    others = sorted(p.stem for p in HERE.glob("*.py") if p.stem not in NOT_BENCHMARKS and p.stem not in SUITE)
    return SUITE + others


def run_one(name: str, tree: Path, extra: list[str]) -> tuple[int, float]:
    """Run benchmark `name` against `tree` in a subprocess (output straight through); its exit status and
    seconds. Ctrl-C reaches it too (same process group); it cleans up, and this waits for it."""
    env = dict(os.environ, PYTHONPATH=str(tree), GPUBOT_BENCH_TREE=str(tree))
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(HERE / "_bootstrap.py"), name, *extra], cwd=tree, env=env)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            rc = proc.wait()
        raise
    return rc, time.monotonic() - start


def main() -> int:
    """Parse the command line, run the benchmarks, print a summary; exit 1 when one failed."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("names", nargs="*", help=f"benchmarks to run (default: the suite: {' '.join(SUITE)})")
    ap.add_argument("--quick", action="store_true", help="fewer rounds in every benchmark")
    ap.add_argument("--tree", action="append", type=Path, default=[],
                    help="a gpubot checkout to run against (repeatable; default: this one)")
    ap.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = ap.parse_args()
    if args.list:
        for n in available():
            print(f"{n}{'  (suite)' if n in SUITE else ''}")
        return 0
    names = args.names or SUITE
    unknown = [n for n in names if n not in available()]
    if unknown:
        ap.error(f"unknown benchmark(s): {', '.join(unknown)} (known: {', '.join(available())})")
    trees = [t.resolve() for t in args.tree] or [HERE.parent]
    for t in trees:
        if not (t / "bot" / "__init__.py").is_file():
            ap.error(f"{t} is not a gpubot checkout (no bot/__init__.py)")
    extra = ["--quick"] if args.quick else []
    results: list[tuple[str, Path, int, float]] = []
    load = os.getloadavg()
    print(f"benchmarks: {' '.join(names)} on {len(trees)} tree(s){' (quick)' if args.quick else ''}; load "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs", flush=True)
    for name in names:
        for tree in trees:
            print(f"\n##### {name} @ {tree}", flush=True)
            rc, took = run_one(name, tree, extra)
            results.append((name, tree, rc, took))
            if rc in (128 + signal.SIGINT, 128 + signal.SIGTERM, -signal.SIGINT, -signal.SIGTERM):
                print("benchmarks: interrupted; the rest is not run", file=sys.stderr)
                return 130
    print("\nsummary (ok: it ran to the end; its figures are printed above, never judged here):")
    for name, tree, rc, took in results:
        print(f"  {name:<14} {tree!s:<30} {'ok' if rc == 0 else f'FAILED (exit {rc})':<16} {took:6.0f} s")
    load = os.getloadavg()
    print(f"  total {sum(r[3] for r in results):.0f} s; load now {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0 if all(r[2] == 0 for r in results) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\nbenchmarks: interrupted", file=sys.stderr)
        sys.exit(130)
