"""Runs a command as the child of a Linux child subreaper, so the CPU of every process it orphans is counted.

    python benchmarks/subreaper.py /usr/sbin/sshd -D -f CONFIG ...

OpenSSH's per-connection monitor exits without reaping the session process (the user's `sshd: USER@notty`,
which reaped the commands), so that CPU would never reach the listener's cutime. This process sets
PR_SET_CHILD_SUBREAPER, runs the command as its child, and reaps every orphan that is reparented to it: its own
cutime+cstime (/proc/PID/stat) then holds their CPU. SIGTERM and SIGINT are passed to the command; it exits
with the command's status. Standard library only (it runs by path).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36


def main() -> int:
    """Run argv[1:] under this subreaper until it exits; return its exit status."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"subreaper: prctl failed (errno {ctypes.get_errno()})", file=sys.stderr)
    pid = os.fork()
    if pid == 0:
        try:
            os.execv(sys.argv[1], sys.argv[1:])
        finally:
            os._exit(127)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    while True:
        try:
            got, status = os.wait()
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if got == pid:
            break
    while True:  # reap what is left without waiting
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    return os.waitstatus_to_exitcode(status) if status >= 0 else 1


if __name__ == "__main__":
    code = main()
    sys.exit(code if code >= 0 else 128 - code)
