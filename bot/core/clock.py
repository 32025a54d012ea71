"""The bot's one clock: wall time (seconds since the epoch, as stored in the database and compared with a host's
clock) and monotonic time (seconds, for durations). Built in the composition root (bot.wiring) and handed to
whatever records or compares times, so tests drive time instead of waiting for it (tests.support.clock): a
clock that is not moved holds what waits on it (the outbox's next send, a snooze's end) until it is. Times
compared with a host's own clock (the bot's activity on a launch's processes) and deadlines of real waits
(SSH, kills, the scheduler's flush) stay on the system's clocks."""

from __future__ import annotations

import time
import zlib
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock", "aligned_delay"]


class Clock(Protocol):
    """What reads the time."""

    def time(self) -> float:
        """Wall time, seconds since the epoch (float)."""
        ...

    def monotonic(self) -> float:
        """Monotonic time, seconds from an arbitrary start (float): for durations only."""
        ...


class SystemClock:
    """The operating system's clocks (`time.time`, `time.monotonic`). Holds no state."""

    __slots__ = ()

    def time(self) -> float:
        """`time.time()`: wall seconds since the epoch."""
        return time.time()

    def monotonic(self) -> float:
        """`time.monotonic()`: seconds, for durations."""
        return time.monotonic()


#: The clock of a bot that was given none.
SYSTEM_CLOCK: Clock = SystemClock()


def aligned_delay(key: str, interval_s: float, now: float) -> float:
    """Seconds from `now` (epoch seconds) to the next moment of the phase that `key` names within a period of
    `interval_s` seconds (0 <= result < interval_s): everything scheduled with the same key and interval comes due at
    the same moments, and different keys spread over the period (a CRC-32 of the key picks the phase)."""
    if not interval_s > 0:
        return 0.0
    phase = (zlib.crc32(key.encode("utf-8", "surrogatepass")) % 100_000) / 100_000 * interval_s
    return (phase - now) % interval_s
