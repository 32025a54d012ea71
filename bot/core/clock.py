"""The bot's one clock: wall time (seconds since the epoch, as stored in the database and compared with a host's
clock) and monotonic time (seconds, for durations). Built in the composition root (bot.wiring) and handed to
whatever records or compares times, so tests drive time instead of waiting for it (tests.support.clock): a
clock that is not moved holds what waits on it (the outbox's next send, a snooze's end) until it is. Times
compared with a host's own clock (the bot's activity on a launch's processes) and deadlines of real waits
(SSH, kills, the scheduler's flush) stay on the system's clocks."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]


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
