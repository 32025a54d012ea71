"""How a process ended, in words (pure): a shell's exit status (0..255, 128+N: killed by signal N) or Python's
`Popen.returncode` (-N: killed by signal N)."""

from __future__ import annotations

import signal

__all__ = ["describe_exit", "exit_signal"]


def exit_signal(rc: int) -> int | None:
    """The signal number that ended a process with exit status `rc` (a shell's 128+N, or Python's -N), else None."""
    if rc > 128:
        return rc - 128
    if rc < 0:
        return -rc
    return None


def describe_exit(rc: int) -> str:
    """`exit status 1`, or `killed by signal 9 (SIGKILL)` for a shell status above 128 (or Python's -9)."""
    n = exit_signal(rc)
    if n is None:
        return f"exit status {rc}"
    try:
        name = signal.Signals(n).name
    except ValueError:
        name = f"signal {n}"
    return f"killed by signal {n} ({name})"
