"""systemd's notification protocol (sd_notify(3)) for a `Type=notify` unit: READY=1 once the bot serves,
WATCHDOG=1 while its event loop runs, STOPPING=1 on the way out.

The protocol is one datagram of `KEY=value` lines to the AF_UNIX socket named in NOTIFY_SOCKET (a leading `@` is
Linux's abstract namespace); WATCHDOG_USEC (with WATCHDOG_PID, when set, naming this process) gives the watchdog's
period. Without NOTIFY_SOCKET (not under systemd, or `Type=simple`) every call does nothing. A dozen lines of the
standard library, so no libsystemd binding is needed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)
#: The watchdog period is taken within these bounds (seconds): a tiny WATCHDOG_USEC would feed it in a busy loop.
MIN_PERIOD_S, MAX_PERIOD_S = 1.0, 3600.0


def notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send `state` (e.g. "READY=1\\nSTATUS=connected") to systemd. Returns True when it was sent, False without
    NOTIFY_SOCKET or when the socket refused (logged once per call at debug level). Never raises."""
    env = os.environ if environ is None else environ
    path = env.get("NOTIFY_SOCKET", "")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as s:
            s.sendto(state.encode("utf-8", "replace"), address)  # never waits: a full socket drops this one
        return True
    except OSError as e:
        log.debug("sd_notify %r to %s failed: %s", state.split("\n", 1)[0], path, e)
        return False


def watchdog_period_s(environ: Mapping[str, str] | None = None) -> float | None:
    """The watchdog's period in seconds (WATCHDOG_USEC), or None when systemd watches no watchdog of this process
    (unset, not a positive number, or WATCHDOG_PID names another process)."""
    env = os.environ if environ is None else environ
    pid = env.get("WATCHDOG_PID", "")
    if pid and pid != str(os.getpid()):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", "")[:20])
    except ValueError:
        return None
    return min(max(usec / 1e6, MIN_PERIOD_S), MAX_PERIOD_S) if usec > 0 else None


async def keep_watchdog_fed(environ: Mapping[str, str] | None = None) -> None:
    """Send WATCHDOG=1 every half period for as long as this task runs on the event loop: a loop that is wedged
    (or a process that hangs) stops feeding it, and systemd restarts the unit. Returns at once without a
    watchdog; runs until cancelled otherwise."""
    period = watchdog_period_s(environ)
    if period is None:
        return
    while True:
        notify("WATCHDOG=1", environ)
        await asyncio.sleep(period / 2)
