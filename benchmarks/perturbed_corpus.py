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
import tempfile
from pathlib import Path

from bot.adapters.bundle import diagnose_bundle
from tests.support.presentations import PRESENTATIONS, fully_right, laid_out, rule_writing_bundles


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="one presentation")
    ap.add_argument("--list", action="store_true", help="name the bundles that change")
    args = ap.parse_args()
    bundles = []
    for b in rule_writing_bundles():
        exp = json.loads((b / "expected.json").read_text(encoding="utf-8"))
        try:
            if fully_right(b, exp):
                bundles.append((b, exp))
        except Exception:  # a crash on the bundle as it is: not a presentation's doing
            continue
    print(f"{len(bundles)} shared and rule-writing bundles fully right as they are")
    with tempfile.TemporaryDirectory(prefix="gpubot-perturb-") as tmp:
        for name in PRESENTATIONS:
            if args.only and name != args.only:
                continue
            n = kept = 0
            changed: list[str] = []
            for b, exp in bundles:
                copy = laid_out(b, name, Path(tmp))
                if copy is None:
                    continue
                n += 1
                try:
                    ok = fully_right(copy, exp, loose=name == "tb_cut")
                except Exception as e:  # a crash is a change, counted
                    ok = False
                    changed.append(f"{b.name} (crash: {type(e).__name__})")
                else:
                    if not ok:
                        got = diagnose_bundle(copy)
                        changed.append(f"{b.name}: {got.verdict}/{got.phase} (was {exp['verdict']}/{exp.get('phase')})")
                kept += ok
            print(f"{name:<12} {n:>4} bundles changed by it, {kept:>4} still right ({100 * kept / max(1, n):.0f} %)")
            if args.list:
                for c in changed:
                    print(f"    {c}")


if __name__ == "__main__":
    main()
