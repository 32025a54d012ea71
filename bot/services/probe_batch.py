"""Probes of one host asked for at about the same time, sent in one round trip.

The watcher checks every launch that serves with a cheap look of its own (bot.core.probe.batchable). The launches of
one host are checked at the same moments (their checks are aligned on the host: bot.services.watch), so their looks
arrive together: `ProbeBatches` holds the first one of a host for `gather_s` seconds, takes every look of that host
asked for meanwhile (at most `max_size`), and has them all answered by ONE script (`run`, HostService's
`_probe_together`). One SSH channel, one login, one `timeout` and one output to decrypt instead of one per launch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from bot.core.models import HostFailure, Snapshot
from bot.core.probe import ProbeRequest

log = logging.getLogger(__name__)

#: Seconds the first look of a host waits for others to share its round trip.
BATCH_GATHER_S = 0.05
#: Most looks one round trip answers (the script grows with each).
BATCH_MAX = 16

Result = Snapshot | HostFailure
RunBatch = Callable[[str, list[ProbeRequest]], Awaitable[list[Result]]]


class ProbeBatches:
    """Gathers the batchable probes of each host (`probe`) into batches that `run(host, requests)` answers, one
    result per request, in order."""

    def __init__(self, run: RunBatch, *, gather_s: float = BATCH_GATHER_S, max_size: int = BATCH_MAX):
        self._run = run
        self.gather_s = max(0.0, gather_s)
        self.max_size = max(1, max_size)
        self._open: dict[str, list[tuple[ProbeRequest, asyncio.Future[Result]]]] = {}
        self._sending: set[asyncio.Task[None]] = set()

    async def probe(self, host: str, req: ProbeRequest) -> Result:
        """The answer to `req` from the next round trip to `host`: joins the batch being gathered for it, or starts
        one. Raises what `run` raised (a bug: `run` answers a host that fails with HostFailures)."""
        fut: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        members = self._open.get(host)
        if members is None:
            members = self._open[host] = []
            task = asyncio.ensure_future(self._send(host, members))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        members.append((req, fut))
        if len(members) >= self.max_size:
            self._open.pop(host, None)  # full: the next look of this host starts another
        return await fut

    async def _send(self, host: str, members: list[tuple[ProbeRequest, asyncio.Future[Result]]]) -> None:
        """Wait `gather_s`, close the batch, and answer each of its members that still waits."""
        try:
            await asyncio.sleep(self.gather_s)
        except asyncio.CancelledError:
            _stopped(host, members)
            raise
        finally:
            if self._open.get(host) is members:
                del self._open[host]
        waiting = [(req, fut) for req, fut in members if not fut.done()]
        if not waiting:
            return
        try:
            results = await self._run(host, [req for req, _ in waiting])
            if len(results) != len(waiting):
                raise RuntimeError(f"{len(results)} answers to {len(waiting)} probes of {host}")
        except asyncio.CancelledError:
            _stopped(host, waiting)
            raise
        except Exception as e:
            log.exception("probes of %s together failed", host)
            for _, fut in waiting:
                if not fut.done():
                    fut.set_exception(e)
            return
        for (_, fut), result in zip(waiting, results, strict=True):
            if not fut.done():
                fut.set_result(result)

    async def close(self) -> None:
        """Stop every batch being gathered or sent (their probes get a HostFailure saying so)."""
        for task in list(self._sending):
            task.cancel()
        for task in list(self._sending):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _stopped(host: str, members: list[tuple[ProbeRequest, asyncio.Future[Result]]]) -> None:
    """Answer the members still waiting when their batch was stopped (`close`): the host was not reached."""
    for _, fut in members:
        if not fut.done():
            fut.set_result(HostFailure(host=host, reason="the probe was stopped: the bot is shutting down"))
