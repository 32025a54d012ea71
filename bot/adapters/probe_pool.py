"""Probe workers: Python processes of the bot's own (`python -m bot.services.probe_worker`), each probing its share
of the hosts over SSH connections of its own, so that a `/gpu status` of a fleet spreads its SSH I/O, parsing and
redaction over several cores instead of queueing on the one event loop that acks Slack.

A host always goes to the same worker (`ProbePool.shard`: CRC-32 of its name), so its connection stays warm there.
Protocol on the worker's stdin and stdout, framed like bot.adapters.cpu_worker (an 8-byte big-endian length, then a
pickle; only the bot writes to the worker's stdin, so the pickles are the bot's own):

- bot -> worker, once: `("init", config, extra_path)`;
- bot -> worker, per call: `("status", call_id, hosts, new_secret_values, limit, keep)`: the values are those the
  bot learnt since its last call to that worker (they only grow), added to the worker's Redactor before it probes;
  at most `limit` of the call's hosts are probed at once (the call's share of the bot's `probe_concurrency`); `keep`
  maps a host to pids whose rows the answer keeps (its launches' recorded pids: bot.core.probe.status_snapshot);
- worker -> bot: `(call_id, {host: (Snapshot | HostFailure, seconds, helper_pids)})`, `helper_pids` being the
  worker's own long-lived processes on that host (its probe agents), which the bot's own probes leave out.

A worker ends at EOF on its stdin: when the pool closes it and when the bot dies, however it died. What it logs
(its stderr, a pipe) is logged by the bot, each line prefixed with the worker's pid; it never holds the bot's own
streams open. A worker that dies or stops answering fails the calls it had (`WorkerGone`); the caller probes those
hosts itself, and the next call starts a new worker, unless the last one ended within START_FAILED_S of its start
without answering anything: then the pool probes nothing for RETRY_AFTER_S (every call raises WorkerGone at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import pickle
import struct
import sys
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

_LEN = struct.Struct("!Q")
#: The worker's module (`python -m`): kept as a name, since adapters never import services.
WORKER_MODULE = "bot.services.probe_worker"
#: A worker that ended within this many seconds of its start, before it answered any call, could not start (a broken
#: install, a missing module).
START_FAILED_S = 5.0
#: Seconds a pool whose worker could not start probes nothing (its caller probes the hosts itself) before it tries
#: again.
RETRY_AFTER_S = 60.0
#: Seconds `ProbePool.close` waits for the workers to end at EOF before it kills them.
CLOSE_WAIT_S = 2.0


#: A `/gpu status` of at least this many SSH hosts is spread over the probe workers (when there are any).
POOL_MIN_HOSTS = 8
#: The most probe workers that `probe_workers` left unset gives (one per core but one).
AUTO_WORKERS_MAX = 8


#: Fewest usable CPUs for which `probe_workers` left unset gives workers: on fewer, one worker only moves the work
#: (and adds its pickling), it does not spread it.
AUTO_WORKERS_MIN_CPUS = 4


def usable_cpus() -> int:
    """CPUs this process may use: those of its affinity mask, fewer where its cgroup's `cpu.max` quota allows fewer
    (cgroup v2, /sys/fs/cgroup/cpu.max: `QUOTA PERIOD` or `max PERIOD`). At least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def probe_worker_count(config: Any) -> int:
    """How many probe workers `config` (bot.config.Config) asks for: `probe_workers`, or when unset one per usable
    CPU but one, at most AUTO_WORKERS_MAX, and none below AUTO_WORKERS_MIN_CPUS usable CPUs (`usable_cpus`)."""
    if config.probe_workers is not None:
        return config.probe_workers
    cpus = usable_cpus()
    return 0 if cpus < AUTO_WORKERS_MIN_CPUS else min(AUTO_WORKERS_MAX, cpus - 1)


class WorkerGone(Exception):
    """A probe worker ended, could not start, or did not answer in time, before it answered a call."""


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

    def __init__(self, proc: asyncio.subprocess.Process, started: float):
        self.proc = proc
        self.started = started
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.values_sent = 0
        self.tasks: list[asyncio.Task[None]] = []
        self.alive = True
        self.answered = False  # it answered a call: it did start

    async def read_answers(self) -> None:
        assert self.proc.stdout is not None
        try:
            while True:
                call_id, answer = await read_frame(self.proc.stdout)
                self.answered = True
                fut = self.pending.pop(call_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(answer)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # EOF, a broken pipe, or an answer that is not one (a worker of other code)
            why = "it ended" if isinstance(e, asyncio.IncompleteReadError) else f"{type(e).__name__}: {e}"
            self.gone(f"the probe worker (pid {self.proc.pid}) stopped answering: {why}")

    async def relay_log(self) -> None:
        """Log what the worker writes on its stderr, line by line, as the bot's own warnings."""
        assert self.proc.stderr is not None
        with contextlib.suppress(Exception):
            while line := await self.proc.stderr.readline():
                log.warning("probe worker %d: %s", self.proc.pid, line.decode("utf-8", "replace").rstrip()[:2000])

    def fail_pending(self, why: str) -> None:
        """Fail every call still waiting with WorkerGone(why)."""
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(WorkerGone(why))
                fut.exception()  # seen: a caller that gave up on it leaves no "never retrieved" warning
        self.pending.clear()

    def gone(self, why: str) -> None:
        """Mark it dead, fail its waiting calls and kill it (it may still run)."""
        if not self.alive:
            return
        self.alive = False
        log.warning("%s", why)
        self.fail_pending(why)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()


class ProbePool:
    """`size` probe workers, started on first use. `init` is what each worker is started with: the config and the
    extra PATH entries for local commands."""

    def __init__(self, size: int, init: tuple[Any, ...]):
        if size < 1:
            raise ValueError("a ProbePool needs at least one worker")
        self.size = size
        self._init = init
        self._workers: list[_Worker | None] = [None] * size
        self._starting: list[asyncio.Lock] = [asyncio.Lock() for _ in range(size)]
        self._next_id = 0
        self._closed = False
        self._paused_until = 0.0  # a worker could not start: none is started before then (loop time)

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
            now = asyncio.get_running_loop().time()
            if w is not None:
                self._workers[k] = None
                if not w.answered and now - w.started < START_FAILED_S:
                    self._paused_until = now + RETRY_AFTER_S
                    log.warning("a probe worker ended %.1f s after its start; the bot probes every host itself for "
                                "%g s", now - w.started, RETRY_AFTER_S)
            if now < self._paused_until:
                raise WorkerGone("probe workers could not start lately")
            try:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", WORKER_MODULE, stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, close_fds=True)
            except OSError as e:
                self._paused_until = now + RETRY_AFTER_S
                raise WorkerGone(f"a probe worker could not start: {e}") from e
            w = _Worker(proc, now)
            log.info("probe worker %d of %d started (pid %d)", k + 1, self.size, proc.pid)
            assert proc.stdin is not None
            proc.stdin.write(frame(("init", *self._init)))
            w.tasks = [asyncio.ensure_future(w.read_answers()), asyncio.ensure_future(w.relay_log())]
            self._workers[k] = w
            return w

    async def call(self, k: int, hosts: Sequence[str], values: Sequence[str], timeout_s: float, *,
                   limit: int = 32, keep: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:
        """Status probes of `hosts` (all of shard `k`) in worker `k`, at most `limit` at once: {host: (Snapshot |
        HostFailure, seconds, the worker's helper pids on the host)}. `values` are every secret value the bot knows
        (the worker is sent those it has not had yet); `keep`: pids per host whose rows the answer keeps. Raises
        WorkerGone when the worker could not start, ended, or gave no answer within `timeout_s` seconds for each
        call it has in flight, this one included (then it is killed: the next call starts another)."""
        w = await self._worker(k)
        timeout_s *= 1 + len(w.pending)  # queued behind the worker's other calls
        self._next_id += 1
        call_id = self._next_id
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        w.pending[call_id] = fut
        new_values = list(values[w.values_sent:])
        w.values_sent = max(w.values_sent, len(values))
        assert w.proc.stdin is not None
        try:
            w.proc.stdin.write(frame(("status", call_id, list(hosts), new_values, max(1, limit),
                                      {h: list(keep[h]) for h in hosts if keep and h in keep})))
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
        """End every worker (EOF on its stdin; killed after CLOSE_WAIT_S), all at once, and wait for them. Later calls
        raise WorkerGone."""
        self._closed = True
        workers = [w for w in self._workers if w is not None]
        self._workers = [None] * self.size
        await asyncio.gather(*(self._end(w) for w in workers))

    @staticmethod
    async def _end(w: _Worker) -> None:
        w.alive = False
        if w.proc.stdin is not None:
            w.proc.stdin.close()
        try:
            await asyncio.wait_for(w.proc.wait(), CLOSE_WAIT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                w.proc.kill()
            await w.proc.wait()
        for task in w.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        w.fail_pending("the probe pool closed")
