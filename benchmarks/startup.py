"""CLI start-up (issue 21: `gpubot diagnose` on a tiny bundle within 5x of `python3 -c "import asyncio, json"`).

Whole-process wall time, median of 7 after 1 warm-up (--quick: 3), round-robin, of
  gpubot --version
  gpubot check-config deploy/config.example.yaml
  gpubot diagnose tests/fixtures/cases/00-sglang-tp8-silent-after-load   (a tiny bundle)
each divided by `python -c "import asyncio, json"` with the same interpreter; also the CPU (user+sys) of each.
`gpubot` is this interpreter's console script (bot.cli:main), run with cwd and PYTHONPATH = the tree under test,
so `bot` comes from that tree (checked before timing). The runs use a bytecode cache in a temp dir
(PYTHONPYCACHEPREFIX, filled by the warm-up) as an installed bot has, whatever PYTHONDONTWRITEBYTECODE says;
then `diagnose` once more as this environment runs it (with its PYTHONDONTWRITEBYTECODE, and whatever
__pycache__ the tree has), median of 3.

    python -m benchmarks.startup [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from benchmarks.support import (
    TREE,
    children_cpu_s,
    figure,
    footer,
    header,
    median,
    note,
    parse_args,
    ratio,
    run_local,
    shared_tmpdir,
)

BUNDLE = "tests/fixtures/cases/00-sglang-tp8-silent-after-load"


def gpubot_argv() -> list[str]:
    """This interpreter's `gpubot` console script, else `python -m bot.cli`."""
    script = Path(sys.executable).parent / "gpubot"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "bot.cli"]


def commands() -> dict[str, list[str]]:
    """name -> argv of each timed command, the Python baseline first."""
    g = gpubot_argv()
    return {
        'python -c "import asyncio, json"': [sys.executable, "-c", "import asyncio, json"],
        "gpubot --version": [*g, "--version"],
        "gpubot check-config (example)": [*g, "check-config", "deploy/config.example.yaml"],
        "gpubot diagnose (tiny bundle)": [*g, "diagnose", BUNDLE],
    }


def _env(cache: Path | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(TREE))
    if cache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


def _time(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and exit status of one run."""
    c0, t = children_cpu_s(), time.perf_counter()
    res = run_local(argv, cwd=TREE, env=env, timeout=300)
    return time.perf_counter() - t, children_cpu_s() - c0, res.returncode


def measure(cmds: dict[str, list[str]], env: dict[str, str], warm: int, rounds: int
            ) -> dict[str, tuple[list[float], list[float], set[int]]]:
    """Round-robin over the commands: walls, CPUs and exit statuses of `rounds` runs after `warm`."""
    out: dict[str, tuple[list[float], list[float], set[int]]] = {k: ([], [], set()) for k in cmds}
    for i in range(warm + rounds):
        for name, argv in cmds.items():
            wall, cpu, rc = _time(argv, env)
            out[name][2].add(rc)
            if i >= warm:
                out[name][0].append(wall)
                out[name][1].append(cpu)
    return out


def main(args: argparse.Namespace) -> None:
    """Run the figures and print them."""
    rounds = 3 if args.quick else 7
    start = header("startup", "CLI start-up: whole-process wall of gpubot commands / a bare Python")
    try:
        cmds = commands()
        check = run_local([sys.executable, "-c", "import bot; print(bot.__file__)"], cwd=TREE, env=_env(None))
        where = check.stdout.decode().strip()
        if not where.startswith(str(TREE)):
            raise SystemExit(f"   ERROR: the commands would import bot from {where!r}, not from {TREE}")
        note(f"gpubot = {' '.join(cmds['gpubot --version'][:-1])}, importing bot from {Path(where).parent}")
        with shared_tmpdir("gpubot-bench-pycache-") as cache:
            res = measure(cmds, _env(cache), 1, rounds)
        base = median(res['python -c "import asyncio, json"'][0])
        base_cpu = median(res['python -c "import asyncio, json"'][1])
        print(f"  with a bytecode cache (PYTHONPYCACHEPREFIX in a temp dir), median of {rounds} after 1 warm-up:")
        for name, (walls, cpus, rcs) in res.items():
            bad = f"; EXIT {sorted(rcs)}" if rcs != {0} else ""
            figure(name, f"{median(walls) * 1e3:.0f} ms",
                   f"{ratio(median(walls), base)} the bare Python (CPU {median(cpus) * 1e3:.0f} ms, "
                   f"{ratio(median(cpus), base_cpu)}){bad}")
        note("acceptance: gpubot diagnose within x5 of the bare Python")
        flag = os.environ.get("PYTHONDONTWRITEBYTECODE")
        cached = (TREE / "bot" / "__pycache__").is_dir()
        env_rounds = 2 if args.quick else 3
        plain = measure({k: cmds[k] for k in ('python -c "import asyncio, json"', "gpubot diagnose (tiny bundle)")},
                        _env(None), 0, env_rounds)
        pb, pd = (median(v[0]) for v in plain.values())
        print(f"  as this environment runs it (PYTHONDONTWRITEBYTECODE={flag or 'unset'}, "
              f"{'a' if cached else 'no'} bot/__pycache__ in the tree), median of {env_rounds}:")
        figure("gpubot diagnose (tiny bundle)", f"{pd * 1e3:.0f} ms", f"{ratio(pd, pb)} the bare Python "
               f"({pb * 1e3:.0f} ms) in the same environment")
    finally:
        footer(start)


if __name__ == "__main__":
    main(parse_args(__doc__))
