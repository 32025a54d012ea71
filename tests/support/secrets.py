"""What counts as a secret surviving redaction in the tests: any 8-character piece of its value."""

from __future__ import annotations


def pieces(secret: str, n: int = 8) -> set[str]:
    """Every n-character piece of `secret` (the whole of a shorter one)."""
    return {secret} if len(secret) <= n else {secret[i:i + n] for i in range(len(secret) - n + 1)}
