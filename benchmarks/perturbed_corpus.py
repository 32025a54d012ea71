"""Whether `gpubot diagnose` reads the evidence's structure or its layout: the rule-writing bundles it gets fully right,
presented the way users paste the same evidence, must still be fully right.

Each presentation changes only the layout of what a bundle holds, never its content (the same event in the same
words), so a verdict, phase or quote that changes with it is a reading that depends on layout:

- `wrap80` / `wrap120`: server.log hard-wrapped by an 80- or 120-column terminal (a long line goes on at column 0);
- `compose`: every server.log line under a docker compose prefix (`engine-1  | `);
- `journald`: under a journald / syslog prefix (`Dec 07 10:11:12 gpu-host-1 engine[4242]: `);
- `kubectl`: under `kubectl logs --timestamps` (`2026-12-07T10:11:12.123456789Z `);
- `ansi`: each line's first word coloured (ANSI SGR escapes, as a terminal capture keeps them);
- `crlf`: lines ending in CR LF (a log copied from Windows or a serial console);
- `ps_noheader`: ps.txt without its header row (a `ps ... | grep` paste);
- `tb_cut`: every Python traceback cut before its final exception line (a paste that stopped short): scored on the
  phase and on raising an alarm at all (the exception's type may be gone with its line), not on the quotes.

Only the shared and rule-writing bundles are used (never a held-out one): the names of the bundles that change are
printed, for the reader to mend. `python -m benchmarks.perturbed_corpus [--only NAME] [--list]`
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from benchmarks.sealed_corpus import QUIET, verdict_of
from tests.support.paths import CASES
from tests.support.presentations import PRESENTATIONS
from tests.support.split import fourth_set, split, third_set


def _score(bundle: Path, exp: dict, loose: bool) -> bool:
    got = verdict_of(bundle)
    joined = "\n".join(str(x) for x in got.get("evidence") or [])
    if got["phase"] != exp.get("phase"):
        return False
    if loose:  # the exception's line is gone: an alarm where one is due, quiet where not
        return (got["verdict"] in QUIET) == (exp["verdict"] in QUIET) and (
            got["verdict"] == exp["verdict"] or exp["verdict"] not in QUIET)
    return got["verdict"] == exp["verdict"] and all(q in joined for q in exp.get("evidence_must_mention") or [])


def rule_writing() -> list[Path]:
    """The shared and rule-writing bundles (the parts whose misses may be read)."""
    every = sorted(p for p in CASES.iterdir() if (p / "expected.json").is_file())
    shared, rules, _held = split(every)
    rules_3, _held_3 = third_set(every)
    return sorted({*shared, *rules, *rules_3, *fourth_set(every)}, key=lambda p: p.name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="one presentation")
    ap.add_argument("--list", action="store_true", help="name the bundles that change")
    args = ap.parse_args()
    bundles = []
    for b in rule_writing():
        exp = json.loads((b / "expected.json").read_text(encoding="utf-8"))
        try:
            if _score(b, exp, loose=False):
                bundles.append((b, exp))
        except Exception:  # a crash on the bundle as it is: not a presentation's doing
            continue
    print(f"{len(bundles)} shared and rule-writing bundles fully right as they are")
    with tempfile.TemporaryDirectory(prefix="gpubot-perturb-") as tmp:
        for name, (file, how) in PRESENTATIONS.items():
            if args.only and name != args.only:
                continue
            n = kept = 0
            changed: list[str] = []
            for b, exp in bundles:
                src = b / file
                if not src.is_file():
                    continue
                text = src.read_text(encoding="utf-8", errors="replace")
                new = how(text)
                if new == text:
                    continue
                dst = Path(tmp) / name / b.name
                shutil.copytree(b, dst)
                (dst / file).write_text(new, encoding="utf-8")
                n += 1
                try:
                    ok = _score(dst, exp, loose=name == "tb_cut")
                except Exception as e:  # a crash is a change, counted
                    ok = False
                    changed.append(f"{b.name} (crash: {type(e).__name__})")
                else:
                    if not ok:
                        got = verdict_of(dst)
                        changed.append(f"{b.name}: {got['verdict']}/{got['phase']} "
                                       f"(was {exp['verdict']}/{exp.get('phase')})")
                kept += ok
            print(f"{name:<12} {n:>4} bundles changed by it, {kept:>4} still right ({100 * kept / max(1, n):.0f} %)")
            if args.list:
                for c in changed:
                    print(f"    {c}")


if __name__ == "__main__":
    main()
