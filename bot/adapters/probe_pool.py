"""Probe workers: Python processes of the bot's own (`python -m bot.services.probe_worker`), each probing its share
of the hosts over SSH connections of its own, so that a `/gpu status` of a fleet spreads its SSH I/O, parsing and
redaction over several cores instead of queueing on the one event loop that acks Slack.

A host always goes to the same worker (`ProbePool.shard`: CRC-32 of its name), so its connection stays warm there.
Protocol on the worker's stdin and stdout, framed like bot.adapters.cpu_worker (an 8-byte big-endian length, then a
pickle; only the bot writes to the worker's stdin, so the pickles are the bot's own):

- bot -> worker, once: `("init", config, extra_path)`;
- bot -> worker, per call: `("status", call_id, hosts, new_secret_values, limit)`: the values are those the bot
  learnt since its last call to that worker (they only grow), added to the worker's Redactor before it probes; at
  most `limit` of the call's hosts are probed at once (the call's share of the bot's `probe_concurrency`);
- worker -> bot: `(call_id, {host: (Snapshot | HostFailure, seconds)})`.

A worker ends at EOF on its stdin: when the pool closes it and when the bot dies, however it died; its stderr is
/dev/null (it never holds the bot's streams open). A worker that dies or stops answering fails the calls it had
(`WorkerGone`); the caller probes those hosts itself, and the next call starts a new worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import struct
import sys
import zlib
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

_LEN = struct.Struct("!Q")
#: The worker's module (`python -m`): kept as a name, since adapters never import services.
WORKER_MODULE = "bot.services.probe_worker"


class WorkerGone(Exception):
    """A probe worker ended, or did not answer in time, before it answered a call."""


def frame(message: Any) -> bytes:
    """One message as the workers' protocol frames it: 8-byte big-endian length, then the pickle."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next message from `reader`. Raises asyncio.IncompleteReadError at EOF."""
    (size,) = _LEN.unpack(await reader.readexactly(_LEN.size))
    return pickle.loads(await reader.readexactly(size))  # noqa: S301 - our own child's (or parent's) pipe


class _Worker:
    """One worker process: its pipes, its calls waiting for an answer, and how many secret values it was sent."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.values_sent = 0
        self.reader: asyncio.Task[None] | None = None
        self.alive = True

    async def read_answers(self) -> None:
        assert self.proc.stdout is not None
        try:
            while True:
                call_id, answer = await read_frame(self.proc.stdout)
                fut = self.pending.pop(call_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(answer)
        except (asyncio.IncompleteReadError, ConnectionError, EOFError, pickle.UnpicklingError) as e:
            why = "it ended" if isinstance(e, asyncio.IncompleteReadError) else f"{type(e).__name__}: {e}"
            self.gone(f"the probe worker (pid {self.proc.pid}) stopped answering: {why}")

    def gone(self, why: str) -> None:
        """Mark it dead, fail its waiting calls and kill it (it may still run)."""
        if not self.alive:
            return
        self.alive = False
        log.warning("%s", why)
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(WorkerGone(why))
        self.pending.clear()
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()


class ProbePool:
    """`size` probe workers, started on first use. `init` is what each worker is started with: the config (its
    `probe_concurrency` already divided among the workers) and the extra PATH entries for local commands."""

    def __init__(self, size: int, init: tuple[Any, ...]):
        if size < 1:
            raise ValueError("a ProbePool needs at least one worker")
        self.size = size
        self._init = init
        self._workers: list[_Worker | None] = [None] * size
        self._starting: list[asyncio.Lock] = [asyncio.Lock() for _ in range(size)]
        self._next_id = 0
        self._closed = False

    def shard(self, host: str) -> int:
        """The worker that probes `host` (always the same one for a name)."""
        return zlib.crc32(host.encode("utf-8", "surrogatepass")) % self.size

    @property
    def pids(self) -> list[int]:
        """The pids of the workers running now."""
        return [w.proc.pid for w in self._workers if w is not None and w.alive]

    async def _worker(self, k: int) -> _Worker:
        async with self._starting[k]:
            w = self._workers[k]
            if w is not None and w.alive and w.proc.returncode is None:
                return w
            if self._closed:
                raise WorkerGone("the probe pool is closed")
            try:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", WORKER_MODULE, stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, close_fds=True)
            except OSError as e:
                raise WorkerGone(f"a probe worker could not start: {e}") from e
            w = _Worker(proc)
            assert proc.stdin is not None
            proc.stdin.write(frame(("init", *self._init)))
            w.reader = asyncio.ensure_future(w.read_answers())
            self._workers[k] = w
            return w

    async def call(self, k: int, hosts: Sequence[str], values: Sequence[str], timeout_s: float, *,
                   limit: int = 32) -> dict[str, Any]:
        """Status probes of `hosts` (all of shard `k`) in worker `k`, at most `limit` at once: {host: (Snapshot |
        HostFailure, seconds)}. `values` are every secret value the bot knows (the worker is sent those it has not
        had yet). Raises
        WorkerGone when the worker could not start, ended, or gave no answer within `timeout_s` seconds (then it is
        killed: the next call starts another)."""
        w = await self._worker(k)
        self._next_id += 1
        call_id = self._next_id
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        w.pending[call_id] = fut
        new_values = list(values[w.values_sent:])
        w.values_sent = len(values)
        assert w.proc.stdin is not None
        try:
            w.proc.stdin.write(frame(("status", call_id, list(hosts), new_values, max(1, limit))))
            await w.proc.stdin.drain()
        except (ConnectionError, RuntimeError) as e:
            w.gone(f"the probe worker (pid {w.proc.pid}) could not be written to: {e}")
            raise WorkerGone(str(e)) from e
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            w.gone(f"the probe worker (pid {w.proc.pid}) gave no answer within {timeout_s:g} s; killed")
            raise WorkerGone(f"no answer within {timeout_s:g} s") from None
        finally:
            w.pending.pop(call_id, None)

    async def close(self) -> None:
        """End every worker (EOF on its stdin; killed after 5 s) and wait for it. Later calls raise WorkerGone."""
        self._closed = True
        for k, w in enumerate(self._workers):
            self._workers[k] = None
            if w is None:
                continue
            w.alive = False
            if w.proc.stdin is not None:
                w.proc.stdin.close()
            try:
                await asyncio.wait_for(w.proc.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.kill()
                await w.proc.wait()
            if w.reader is not None:
                w.reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await w.reader
            for fut in w.pending.values():
                if not fut.done():
                    fut.set_exception(WorkerGone("the probe pool closed"))
