"""A clock the test moves by hand (bot.core.clock.Clock)."""

from __future__ import annotations

import time


class ManualClock:
    """Starts at the real time; `advance(s)` moves both its wall and monotonic time forward by `s` seconds.
    Never moves by itself."""

    def __init__(self, start: float | None = None):
        self._wall = time.time() if start is None else start
        self._mono = 1000.0

    def time(self) -> float:
        """Wall seconds since the epoch, as advanced."""
        return self._wall

    def monotonic(self) -> float:
        """Monotonic seconds, as advanced."""
        return self._mono

    def advance(self, seconds: float) -> None:
        """Move the clock `seconds` forward (ValueError for a negative step: time never goes back)."""
        if seconds < 0:
            raise ValueError("a clock never goes back")
        self._wall += seconds
        self._mono += seconds
