"""A TCP forwarder that delays each direction by RTT/2, for the benchmarks' "remote host" figures.

    python benchmarks/delay_proxy.py --target-port PORT --rtt-ms 50 [--listen-port 0]

Listens on 127.0.0.1 (an ephemeral port unless given), prints the port on the first stdout line, and forwards
every connection to 127.0.0.1:PORT. Every chunk read from one side is written to the other RTT/2 later, in the
order read (one queue per direction), so a byte's round trip costs one RTT, as on a link with that latency and
no bandwidth limit. Serves any number of connections. Exits on SIGTERM, or when its stdin closes (the benchmark
that started it is gone). Standard library only: it runs by path, with no gpubot import.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import threading


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def receive() -> None:
        while True:
            try:
                data = await reader.read(65536)
            except ConnectionError:
                data = b""
            queue.put_nowait((loop.time() + delay_s, data))
            if not data:
                return

    async def send() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                with contextlib.suppress(OSError, RuntimeError):
                    if writer.can_write_eof():
                        writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    rx = asyncio.ensure_future(receive())
    try:
        await send()
    finally:
        rx.cancel()


async def _serve(target_port: int, delay_s: float, listen_port: int) -> None:
    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            s_reader, s_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            c_writer.close()
            return
        try:
            await asyncio.gather(_pipe(c_reader, s_writer, delay_s), _pipe(s_reader, c_writer, delay_s))
        except (ConnectionError, OSError):
            pass
        finally:
            for w in (c_writer, s_writer):
                w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def _exit_when_stdin_closes() -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stdin.read()
    os._exit(0)


def main() -> None:
    """Parse the command line and serve until stopped."""
    ap = argparse.ArgumentParser(description="TCP forwarder delaying each direction by RTT/2")
    ap.add_argument("--target-port", type=int, required=True)
    ap.add_argument("--rtt-ms", type=float, required=True)
    ap.add_argument("--listen-port", type=int, default=0)
    args = ap.parse_args()
    threading.Thread(target=_exit_when_stdin_closes, daemon=True).start()
    asyncio.run(_serve(args.target_port, args.rtt_ms / 2000.0, args.listen_port))


if __name__ == "__main__":
    main()
