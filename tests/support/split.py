"""The honest split of the case corpus: the shared bundles, the rule-writing part, and the held-out third.

Fixed BEFORE the first new bundle (issue 13) existed and before any rule was written against them:

- the 21 shared bundles (ids 00-29) are the original corpus, always asserted;
- of the bundles added for issue 13 (ids 30 and up), the third whose sha256(directory name) sorts first is
  held out: no rule is written against them, they are measured once (`benchmarks/case_corpus.py --held-out`)
  and never asserted by the tests, so no test failure could push a rule towards them;
- the rest is the rule-writing part, asserted like the shared bundles;
- bundles numbered SECOND_HELD_OUT_FROM (76) and up are a second held-out set, whole: fixed (this paragraph,
  committed) before any of them existed, after the first held-out third had been measured once, so the rule
  changes made after that measurement are measured once more on reports no rule saw.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

FIRST_NEW_ID = 30
"""Bundles numbered below this are the shared corpus; from this id on they were added for issue 13."""
SECOND_HELD_OUT_FROM = 76
"""Bundles numbered from this id on are the second held-out set (all of them)."""


def bundle_id(directory: Path) -> int:
    """The bundle's number, the `NN` of `NN-short-name`. Raises ValueError for a name without one."""
    return int(directory.name.split("-", 1)[0])


def _key(directory: Path) -> str:
    return hashlib.sha256(directory.name.encode("utf-8")).hexdigest()


def split(bundles: list[Path]) -> tuple[list[Path], list[Path], list[Path]]:
    """(shared, rule_writing, held_out) bundle directories, each sorted by name.

    held_out is ceil(n / 3) of the n new bundles numbered 30..75: those whose sha256(name) is smallest. The
    second held-out set is `second_held_out`.
    """
    shared = sorted(b for b in bundles if bundle_id(b) < FIRST_NEW_ID)
    new = [b for b in bundles if FIRST_NEW_ID <= bundle_id(b) < SECOND_HELD_OUT_FROM]
    held = set(sorted(new, key=_key)[: math.ceil(len(new) / 3)])
    return shared, sorted(b for b in new if b not in held), sorted(held)


def second_held_out(bundles: list[Path]) -> list[Path]:
    """The second held-out set: every bundle numbered SECOND_HELD_OUT_FROM and up, sorted by name."""
    return sorted(b for b in bundles if bundle_id(b) >= SECOND_HELD_OUT_FROM)
