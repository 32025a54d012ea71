"""Small wording helpers for what the bot writes (pure)."""

from __future__ import annotations

__all__ = ["counted"]


def counted(n: int, word: str, plural: str | None = None) -> str:
    """`n` and `word` in the number it takes: `1 process`, `2 processes`, `0 GPUs` (`plural` defaults to
    `word` + "s", or + "es" after s, x, z, ch, sh)."""
    if n == 1:
        return f"{n} {word}"
    if plural is None:
        plural = word + ("es" if word.endswith(("s", "x", "z", "ch", "sh")) else "s")
    return f"{n} {plural}"
