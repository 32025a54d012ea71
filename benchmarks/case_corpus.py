"""How right `gpubot diagnose` is on the case corpus, per part of the split (tests/support/split.py).

    python -m benchmarks.case_corpus              # the shared bundles and the rule-writing part, misses listed
    python -m benchmarks.case_corpus --held-out   # also the held-out third: counts only, no misses listed
    python -m benchmarks.case_corpus --held-out-2 # also the second held-out set (76-99), likewise
    python -m benchmarks.case_corpus --held-out-3 # also the held-out third of the issue-24 set (100 and up)

Per part it prints how many bundles get the verdict right, the phase right, every evidence_must_mention quoted,
and all three ("fully right"), and the false alarms on the controls (bundles that expect `ready` or `loading` and
get another verdict). The held-out third is measured once per issue and reported; its misses are not
listed, so no rule is written against them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bot.adapters.bundle import read_bundle
from bot.core.diagnose import diagnose
from tests.support.paths import CASES
from tests.support.split import fourth_set, second_held_out, split, third_set

#: Verdicts that raise no alarm: a control bundle (a healthy or still-progressing launch) expects one of them.
QUIET = frozenset({"ready", "loading"})


def score(bundle: Path) -> dict[str, object]:
    """{verdict_ok, phase_ok, quotes_ok, got, expected} for one bundle."""
    expected = json.loads((bundle / "expected.json").read_text(encoding="utf-8"))
    v = diagnose(read_bundle(bundle))
    joined = "\n".join(v.evidence)
    return {"verdict_ok": v.verdict == expected["verdict"], "phase_ok": v.phase == expected["phase"],
            "quotes_ok": all(m in joined for m in expected["evidence_must_mention"]),
            "got": (v.verdict, v.phase), "expected": (expected["verdict"], expected["phase"]),
            "missing": [m for m in expected["evidence_must_mention"] if m not in joined]}


def report(name: str, bundles: list[Path], list_misses: bool) -> None:
    """Print one part's counts (and, when `list_misses`, each bundle not fully right)."""
    rows = [(b, score(b)) for b in bundles]
    n = len(rows)
    count = {k: sum(1 for _, r in rows if r[k]) for k in ("verdict_ok", "phase_ok", "quotes_ok")}
    full = sum(1 for _, r in rows if r["verdict_ok"] and r["phase_ok"] and r["quotes_ok"])
    # controls: healthy or still-progressing launches; an alarm verdict on one is a false alarm
    controls = [r for _, r in rows if r["expected"][0] in QUIET]
    alarms = sum(1 for r in controls if r["got"][0] not in QUIET)
    print(f"{name:<13} {n:>3} bundles  verdict {count['verdict_ok']:>2}/{n}  phase {count['phase_ok']:>2}/{n}  "
          f"quotes {count['quotes_ok']:>2}/{n}  fully right {full:>2}/{n} ({100 * full / max(1, n):.0f} %)  "
          f"false alarms {alarms}/{len(controls)} controls")
    if list_misses:
        for b, r in rows:
            if not (r["verdict_ok"] and r["phase_ok"] and r["quotes_ok"]):
                print(f"    {b.name}: got {r['got']}, expected {r['expected']}"
                      + (f", not quoted {r['missing']}" if r["missing"] else ""))


def main() -> None:
    """Parse the flags and print the report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--held-out", action="store_true", help="also measure the held-out third (counts only)")
    ap.add_argument("--held-out-2", action="store_true", help="also measure the second held-out set (counts only)")
    ap.add_argument("--held-out-3", action="store_true", help="also the held-out third of 100 and up (counts only)")
    ap.add_argument("--quiet", action="store_true", help="counts only, no misses listed")
    a = ap.parse_args()
    bundles = sorted(p for p in CASES.iterdir() if p.is_dir())
    shared, rule_writing, held_out = split(bundles)
    rule_writing_3, held_out_3 = third_set(bundles)
    report("shared", shared, not a.quiet)
    report("rule-writing", rule_writing, not a.quiet)
    if rule_writing_3:
        report("rule-writing 3", rule_writing_3, not a.quiet)
    if rule_writing_4 := fourth_set(bundles):
        report("issue 44 open", rule_writing_4, not a.quiet)
    if a.held_out:
        report("held-out", held_out, False)
    if a.held_out_2:
        report("held-out 2", second_held_out(bundles), False)
    if a.held_out_3:
        report("held-out 3", held_out_3, False)


if __name__ == "__main__":
    main()
