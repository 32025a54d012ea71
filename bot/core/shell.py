"""Shell text for the host, the one place it is made safe (pure).

Everything gpubot runs on a host is a POSIX `sh` script or command line built here or from these helpers:
values from users pass through `quote` (`shlex.quote`), process ids through `check_pid`, and every
command is bounded by coreutils `timeout -k` (`wrap_timeout`), so a hung tool (nvidia-smi on a wedged
driver) never hangs the bot.
"""

from __future__ import annotations

import shlex

#: Seconds coreutils `timeout -k` waits after SIGTERM before it sends SIGKILL.
KILL_AFTER_S = 5
#: Largest process id Linux can hand out (`/proc/sys/kernel/pid_max` upper bound, 2**22).
MAX_PID = 4_194_304


def quote(value: str) -> str:
    """Shell-quote one value (`shlex.quote`): the only way values from users reach a command line."""
    return shlex.quote(value)


def wrap_timeout(command: str, budget_s: float, kill_after_s: int = KILL_AFTER_S) -> str:
    """Return `command` prefixed with `timeout -k KILL_AFTER BUDGET` (coreutils), budget in seconds
    (rounded, at least 1). The command must already be a safe shell string (values quoted)."""
    budget = max(1, round(budget_s))
    return f"timeout -k {int(kill_after_s)} {budget} {command}"


def is_pid(value: int, *, lowest: int = 1) -> bool:
    """True when `value` is an int process id in `lowest`..MAX_PID (bools are not pids)."""
    return isinstance(value, int) and not isinstance(value, bool) and lowest <= value <= MAX_PID


def parse_pid(text: str, *, lowest: int = 1) -> int | None:
    """The process id written in `text` (ASCII digits only, `lowest`..MAX_PID), or None. Unicode digits
    such as '²' are refused (`str.isdigit` accepts them, `int` does not)."""
    t = (text or "").strip()
    if not (t.isascii() and t.isdigit()) or len(t) > 7:
        return None
    n = int(t)
    return n if is_pid(n, lowest=lowest) else None
