"""A probe worker: the process that bot.adapters.probe_pool starts (`python -m bot.services.probe_worker`) to probe
a share of the hosts for `/gpu status`. Its protocol is described there.

It keeps a HostService of its own (its own pooled SSH connections, its own Redactor with the config's patterns and
the secret values the bot sends it), probes the hosts of a call in parallel, as many at once as the call allows
(its share of the bot's `probe_concurrency`), and answers with each host's Snapshot cut to what a status needs
(`status_snapshot`): the GPU table, the GPU holders and the rows that attribute them to launches, never the
thousands of other rows. Calls are answered as they finish (several may be in flight). It exits at EOF on its stdin.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from typing import Any

from bot.adapters.probe_pool import frame, read_frame
from bot.core.models import HostFailure, Snapshot
from bot.core.probe import status_snapshot
from bot.core.redact import Redactor
from bot.services.hosts import HostService

log = logging.getLogger(__name__)


Answer = tuple[Snapshot | HostFailure, float, list[int]]


async def _answer(svc: HostService, call_id: int, hosts: list[str], limit: int, keep: dict[str, list[int]],
                  out: asyncio.StreamWriter) -> None:
    slots = asyncio.Semaphore(limit)

    async def one(host: str) -> tuple[str, Answer]:
        async with slots:
            return await _timed(host)

    async def _timed(host: str) -> tuple[str, Answer]:
        started = time.monotonic()
        try:
            result = await svc.status_here(host)
            if isinstance(result, Snapshot):
                result = status_snapshot(result, keep=keep.get(host, ()))
            helpers = list(svc.executor(host).helper_pids())
        except Exception as e:  # a bug for one host must not hide the others
            log.exception("status of %s failed in the probe worker", host)
            result, helpers = HostFailure(host=host, reason=f"internal error: {type(e).__name__}"), []
        return host, (result, time.monotonic() - started, helpers)

    answer = dict(await asyncio.gather(*(one(h) for h in hosts)))
    out.write(frame((call_id, answer)))
    await out.drain()


async def serve() -> None:
    """Answer the bot's calls on stdin/stdout until EOF."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    # the answers go to the pipe that was stdout; stdout itself becomes /dev/null, so that nothing a library prints
    # can be read by the bot as part of an answer
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, answers)
    out = asyncio.StreamWriter(transport, protocol, None, loop)
    try:
        kind, config, extra_path = await read_frame(reader)
    except asyncio.IncompleteReadError:
        return
    assert kind == "init"
    svc = HostService(config, redactor=Redactor(config.redact_patterns), extra_path=extra_path, probe_workers=0)
    tasks: set[asyncio.Task[Any]] = set()
    try:
        while True:
            try:
                kind, call_id, hosts, values, limit, keep = await read_frame(reader)
            except asyncio.IncompleteReadError:
                return
            if values:  # before any probe of this call: what it shows is masked with them
                svc.redactor.add_values(values)
            task = asyncio.ensure_future(_answer(svc, call_id, hosts, limit, keep, out))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    finally:
        for task in tasks:
            task.cancel()
        await svc.close()


if __name__ == "__main__":
    # what it logs goes to its stderr, a pipe the bot reads and logs (bot.adapters.probe_pool)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(serve())
