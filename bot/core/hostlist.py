"""Slurm's hostlist notation (pure): `gpu-[01-64]`, `node[1-4,7]`, and lists of them (`n[1-2],gpu07`), as the config's
host ranges use it (bot.config.fleet) and as Slurm prints node lists (`squeue %N`, `scontrol show job` NodeList).
"""

from __future__ import annotations

import re

__all__ = ["MAX_RANGE_HOSTS", "RANGE_RE", "expand_hostlist", "range_names"]

#: `head[ITEMS]tail`, ITEMS a comma-separated list of numbers and LOW-HIGH ranges (Slurm hostlist notation).
RANGE_RE = re.compile(r"^(?P<head>[^\[\]]*)\[(?P<items>[0-9]{1,6}(?:-[0-9]{1,6})?(?:,[0-9]{1,6}(?:-[0-9]{1,6})?)*)\]"
                      r"(?P<tail>[^\[\]]*)$")
#: The most names one range may stand for.
MAX_RANGE_HOSTS = 1024


def range_names(key: str) -> list[tuple[str, int]] | None:
    """The (name, number) pairs a range name stands for, in order (`gpu-[01-03]` -> gpu-01/1, gpu-02/2,
    gpu-03/3); None for a plain name. Raises ValueError for a range that is empty, backwards or too large
    (MAX_RANGE_HOSTS)."""
    m = RANGE_RE.fullmatch(key)
    if m is None:
        return None
    out: list[tuple[str, int]] = []
    for item in m.group("items").split(","):
        low, _, high = item.partition("-")
        high = high or low
        if int(high) < int(low):
            raise ValueError(f"range {item!r} goes backwards")
        width = len(low) if low.startswith("0") and len(low) > 1 else 0
        if int(high) - int(low) + 1 + len(out) > MAX_RANGE_HOSTS:
            raise ValueError(f"stands for more than {MAX_RANGE_HOSTS} hosts")
        out += [(f"{m.group('head')}{n:0{width}d}{m.group('tail')}", n) for n in range(int(low), int(high) + 1)]
    return out


def expand_hostlist(text: str) -> list[str]:
    """The names of a Slurm node list (`n[1-2],gpu07` -> n1, n2, gpu07), in order; [] for an empty list or Slurm's
    `(null)`. A part that is not a valid range is kept as written (Slurm's own output always is one). Never raises."""
    text = (text or "").strip()
    if not text or text == "(null)":
        return []
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        depth += (ch == "[") - (ch == "]")
        cur.append(ch)
    parts.append("".join(cur))
    out: list[str] = []
    for part in filter(None, parts):
        try:
            names = range_names(part)
        except ValueError:
            names = None
        out += [n for n, _ in names] if names else [part]
    return out
