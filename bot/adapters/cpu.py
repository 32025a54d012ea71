"""CPU-bound work off the event loop: a worker process (bot.adapters.cpu_worker), for work that holds the GIL for
long (a thread would stall the loop that acks Slack) and whose inputs and result pickle small, such as the timeline
chart (records in, PNG out: 0.2-1.5 s of matplotlib).

One worker per CpuPool, started on first use (the composition root, bot.wiring, keeps one pool for the whole
process, so several bots in one process (the tests) start it once). The call is written to its stdin and its answer
read from its stdout in a worker thread of the bot (the pipes are not bound to any event loop), one call at a time.
It ends with the bot, even a SIGKILLed one (EOF on its stdin), and holds none of the bot's standard streams. A worker
that dies (killed, out of memory) is started again and the call tried once more. `inline` pools run the function
in a thread of the bot instead, also one call at a time (matplotlib is not thread-safe).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import pickle
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

_LEN = struct.Struct("!Q")


class WorkerDied(Exception):
    """The CPU worker ended during a call."""


def _start() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "bot.adapters.cpu_worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)


def _read(stream: Any, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise WorkerDied("the CPU worker ended")
        data += chunk
    return data


class CpuPool:
    """Runs module-level functions in a CPU worker process of its own (`run`), one call at a time. `inline` runs
    them in a worker thread of this process instead (where starting a process is not wanted). `close` ends the
    worker (also done at exit)."""

    def __init__(self, *, inline: bool = False):
        self.inline = inline
        self.calls = 0
        self._lock = threading.Lock()
        self._worker: subprocess.Popen[bytes] | None = None
        if not inline:
            atexit.register(self.close)

    @property
    def worker_pid(self) -> int | None:
        """The pid of the worker process while it runs, else None."""
        w = self._worker
        return w.pid if w is not None and w.poll() is None else None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in the worker process; returns its result, raises its exception. `fn` must be a
        module-level function and `args` plain data (they are pickled)."""
        self.calls += 1
        if self.inline:
            return await asyncio.to_thread(self._inline, fn, args)
        try:
            return await asyncio.to_thread(self._call, fn.__module__, fn.__qualname__, args)
        except WorkerDied:
            log.warning("the CPU worker process died; starting another for this call")
            return await asyncio.to_thread(self._call, fn.__module__, fn.__qualname__, args)

    def _inline(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        with self._lock:
            return fn(*args)

    def _call(self, module: str, name: str, args: tuple[Any, ...]) -> Any:
        """Run module.name(*args) in the worker (blocking; under the lock, one call at a time): its result, or its
        exception raised here. Starts the worker when there is none; raises WorkerDied when it ends meanwhile."""
        request = pickle.dumps((module, name, args))
        with self._lock:
            if self._worker is None or self._worker.poll() is not None:
                self._worker = _start()
            w = self._worker
            assert w.stdin is not None and w.stdout is not None
            try:
                w.stdin.write(_LEN.pack(len(request)) + request)
                w.stdin.flush()
                (size,) = _LEN.unpack(_read(w.stdout, _LEN.size))
                ok, value = pickle.loads(_read(w.stdout, size))  # noqa: S301 - our own child's answer
            except (WorkerDied, OSError) as e:
                w.kill()
                w.wait()
                self._worker = None
                raise WorkerDied(str(e)) from None
        if ok:
            return value
        raise value

    def close(self) -> None:
        """End the worker process (EOF on its stdin; killed after 5 s). The pool starts another on its next call."""
        with self._lock:
            w, self._worker = self._worker, None
        if w is not None and w.stdin is not None:
            w.stdin.close()  # EOF: it exits
            try:
                w.wait(timeout=5)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
