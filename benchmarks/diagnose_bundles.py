"""`diagnose()` per bundle (issue 44: no slower than 1.5x the code before it): every bundle of this checkout's corpus
(tests/fixtures/cases, shared and rule-writing ones alike) is read once into an Observation, then diagnosed
`--rounds` times; the CPU (process time) per diagnose is printed as the mean over bundles, the median bundle and the
slowest bundle. The bundles are always this checkout's, so `--tree` compares the code on the same inputs:

    python -m benchmarks diagnose_bundles --tree /work/before44 --tree .
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks.support import figure, footer, header, median, note, parse_args
from bot.adapters.bundle import read_bundle
from bot.core.diagnose import diagnose

#: This checkout's corpus, whatever tree the code comes from.
CASES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "cases"


def _args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=None, help="diagnoses per bundle (default 20, --quick 5)")


def main() -> None:
    """Diagnose every bundle `--rounds` times; print the CPU per diagnose."""
    args = parse_args(__doc__, _args)
    rounds = args.rounds or (5 if args.quick else 20)
    bundles = sorted(p for p in CASES.iterdir() if p.is_dir() and (p / "expected.json").exists())
    start = header("diagnose_bundles", f"{len(bundles)} bundles, {rounds} diagnoses each (process CPU time)")
    observations, cold = [], []
    for b in bundles:  # the first look at each bundle, its lines new to the caches: what `gpubot diagnose DIR` pays
        t0 = time.process_time()
        try:
            obs = read_bundle(b)
            diagnose(obs)
        except Exception as e:  # a bundle the older code cannot read: left out, said
            note(f"{b.name}: not read ({type(e).__name__})")
            continue
        cold.append(time.process_time() - t0)
        observations.append(obs)
    per: list[float] = []
    for obs in observations:
        t0 = time.process_time()
        for _ in range(rounds):
            diagnose(obs)
        per.append((time.process_time() - t0) / rounds)
    figure("first read + diagnose", f"{1e3 * sum(cold) / max(1, len(cold)):.2f} ms/bundle",
           f"mean of {len(cold)} bundles, caches cold")
    figure("diagnose, mean", f"{1e3 * sum(per) / max(1, len(per)):.2f} ms/bundle", "the same Observation again")
    figure("diagnose, median bundle", f"{1e3 * median(per):.2f} ms", "")
    figure("diagnose, slowest bundle", f"{1e3 * max(per, default=0.0):.2f} ms", "")
    footer(start)


if __name__ == "__main__":
    main()
