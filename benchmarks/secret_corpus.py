"""How much of the secret corpus the redactor masks, per part, and how much it over-redacts (issue 23 point 6).

    python -m benchmarks.secret_corpus              # the asserted shapes (shapes.yaml), leaks listed
    python -m benchmarks.secret_corpus --held-out   # also the held-out third (heldout.yaml): counts only

Per part: the shapes with a piece of a secret left (a leak, counted as tests/unit/test_secret_corpus.py counts one:
any 8 characters of a secret value in the redacted text, redacted whole or line by line) and the shapes whose kept
names are gone. Over-redaction: the near misses that come out changed (near_misses.yaml) and the lines of every other
fixture (logs, ps tables, nvidia-smi outputs, case bundles) that the redactor changes. The held-out third is measured
once per issue and reported; its leaks are not listed, so no rule is written against them. Figures, never judged.
"""

from __future__ import annotations

import argparse

import yaml

from bot.core.redact import Redactor
from tests.support.paths import FIXTURES
from tests.support.secrets import pieces

SECRETS = FIXTURES / "secrets"


def load(name: str) -> list[dict]:
    """The entries of tests/fixtures/secrets/NAME."""
    return yaml.safe_load((SECRETS / name).read_text(encoding="utf-8"))


def leaks(entries: list[dict]) -> tuple[list[str], list[str]]:
    """(ids of the shapes with a secret piece left, ids of the shapes with a kept name gone)."""
    leaked, lost = [], []
    for e in entries:
        redactor = Redactor(values=e.get("known", []))
        out = redactor(e["text"])
        by_lines = "\n".join(redactor.lines(e["text"].split("\n")))
        if any(p in out or p in by_lines for s in e["secrets"] for p in pieces(s)):
            leaked.append(e["id"])
        if any(k not in out for k in e.get("keep", [])):
            lost.append(e["id"])
    return leaked, lost


def report(name: str, entries: list[dict], list_them: bool) -> None:
    """Print one part's counts (and, when `list_them`, the ids)."""
    leaked, lost = leaks(entries)
    n = len(entries)
    print(f"{name:<14} {n:>4} shapes  leak {len(leaked):>3}/{n} ({100 * len(leaked) / max(1, n):.0f} %)  "
          f"kept name lost {len(lost):>3}/{n}")
    if list_them:
        for i in leaked:
            print(f"    leak: {i}")
        for i in lost:
            print(f"    kept name lost: {i}")


def fixture_lines() -> list[str]:
    """Every line of every fixture file outside tests/fixtures/secrets (none of them holds a secret)."""
    out: list[str] = []
    for path in sorted(FIXTURES.rglob("*")):
        if path.is_file() and "secrets" not in path.relative_to(FIXTURES).parts:
            try:
                out.extend(path.read_text(encoding="utf-8", errors="replace").splitlines())
            except OSError:
                continue
    return out


def over_redaction(list_them: bool) -> None:
    """Print how many near misses and fixture lines the redactor changes."""
    near = load("near_misses.yaml")
    changed = [e["text"] for e in near if Redactor()(e["text"]) != e["text"]]
    print(f"{'near misses':<14} {len(near):>4} lines   changed {len(changed)}")
    lines = fixture_lines()
    out = Redactor().lines(lines)
    diff = [(a, b) for a, b in zip(lines, out, strict=True) if a != b]
    print(f"{'fixture lines':<14} {len(lines):>4} lines   changed {len(diff)}")
    if list_them:
        for text in changed:
            print(f"    near miss changed: {text!r}")
        for a, b in diff:
            print(f"    {a[:100]!r} -> {b[:100]!r}")


def main() -> None:
    """Parse the flags and print the report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--held-out", action="store_true", help="also measure the held-out third (counts only)")
    ap.add_argument("--quiet", action="store_true", help="counts only, nothing listed")
    a = ap.parse_args()
    report("asserted", load("shapes.yaml"), not a.quiet)
    if a.held_out:
        report("held-out", load("heldout.yaml"), False)
    over_redaction(not a.quiet)


if __name__ == "__main__":
    main()
