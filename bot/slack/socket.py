"""Socket Mode whose acks never wait behind the bot's work.

Slack wants every Socket Mode envelope acked within 3 s. Bolt's own handler (AsyncSocketModeHandler) receives,
dispatches and acks on the bot's event loop: an envelope's ack waits for everything else the loop has to do
first (parsing and rendering the probes of a burst of commands, database writes, the outbox), several times over
(the websocket read, the dispatch, the listener, Bolt noticing `ack()` by polling every 10 ms, the send). In a
burst of 200 commands that made acks take seconds.

`SocketModeThread` keeps the websocket (slack_sdk's aiohttp SocketModeClient, with its reconnects and pings) on
a thread of its own with its own event loop. An envelope that gpubot's listeners always ack with an empty
body (`acked_on_arrival`: slash commands, Events API events, button clicks) is handed to the Bolt app on the
bot's loop and acked there and then, without waiting for the bot's loop; Bolt's own ack of it is dropped. Any
other envelope (a view submission or an options request, whose ack carries a payload: gpubot has none) is
acked by Bolt as usual. The listeners still call `ack()` first (Bolt requires it, and HTTP mode acks that way).

The hand-over is scheduled on the bot's loop before the ack is written, so by the time anything on that loop
can see the ack, the envelope's Bolt handling is a task (passed to `spawn`, e.g. SlackBot.spawn, so that
draining the bot waits for it too).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from slack_bolt.adapter.socket_mode.async_internals import run_async_bolt_app, send_async_response
from slack_bolt.async_app import AsyncApp
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse

from bot.slack.client import make_client

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds `close_async` waits for the thread, and for envelopes already acked to be handed to Bolt.
CLOSE_WAIT_S = 5.0


def acked_on_arrival(req: SocketModeRequest) -> bool:
    """True for the envelopes gpubot's listeners always ack with an empty body (bot.slack.listeners): slash
    commands, Events API events and block actions (button clicks). A listener that answers in its ack (a
    modal's view_submission, an options request) must not be one of these."""
    if req.type in ("slash_commands", "events_api"):
        return True
    return req.type == "interactive" and (req.payload or {}).get("type") == "block_actions"


class SocketModeThread:
    """Socket Mode for a Bolt AsyncApp with the websocket on its own thread (see the module docstring); used
    like Bolt's AsyncSocketModeHandler: `await connect_async()`, `await close_async()`.

    `client` is the slack_sdk SocketModeClient (None before the first connect); it lives on the socket thread,
    so use `connected()` and `forget_url()` from the bot's loop. `early_ack(request)` picks the envelopes
    acked on arrival (default `acked_on_arrival`). `spawn(coroutine)` starts each envelope's Bolt handling as
    a task on the bot's loop (default `asyncio.ensure_future`)."""

    def __init__(self, app: AsyncApp, app_token: str, *, ping_interval: float = 10.0,
                 early_ack: Callable[[SocketModeRequest], bool] = acked_on_arrival,
                 spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Future] | None = None):
        self.app = app
        self.app_token = app_token
        self.ping_interval = ping_interval
        self.early_ack = early_ack
        self.spawn = spawn or asyncio.ensure_future
        self.client: SocketModeClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._bot_loop: asyncio.AbstractEventLoop | None = None
        self._dispatches: set[asyncio.Future] = set()

    # -- the bot's side -------------------------------------------------------------------------------------------
    async def connect_async(self) -> None:
        """Start the socket thread (once) and connect: apps.connections.open with the app token, then the
        websocket. Raises what connecting raises (e.g. slack_sdk's SlackApiError for a refused token)."""
        self._bot_loop = asyncio.get_running_loop()
        if self._thread is None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._thread = threading.Thread(target=self._serve, args=(loop,), name="gpubot-socket-mode", daemon=True)
            self._thread.start()
        await self._on_socket_thread(self._connect())

    async def close_async(self) -> None:
        """Disconnect, let the envelopes already acked reach Bolt (up to CLOSE_WAIT_S), and stop the thread.
        Never raises."""
        if self._loop is not None and self.client is not None:
            try:
                await asyncio.wait_for(self._on_socket_thread(self.client.close()), CLOSE_WAIT_S)
            except Exception as e:
                log.warning("closing the Socket Mode connection failed: %s", e)
        if self._dispatches:
            await asyncio.wait(list(self._dispatches), timeout=CLOSE_WAIT_S)
        loop, thread = self._loop, self._thread
        self._loop = self._thread = self.client = None
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # already closed
                loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            await asyncio.to_thread(thread.join, CLOSE_WAIT_S)

    async def connected(self) -> bool:
        """True while the websocket is open and its pings are answered."""
        client, loop = self.client, self._loop
        if client is None or loop is None:
            return False
        try:
            return await asyncio.wait_for(self._on_socket_thread(client.is_connected()), CLOSE_WAIT_S)
        except Exception:
            return False

    def forget_url(self) -> None:
        """Make the next reconnect ask Slack for a fresh websocket URL (apps.connections.open) instead of
        retrying the one it has (which may have expired)."""
        client, loop = self.client, self._loop
        if client is not None and loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(setattr, client, "wss_uri", None)

    def _dispatch(self, req: SocketModeRequest, acked: concurrent.futures.Future[bool]) -> None:
        """On the bot's loop: start the Bolt app's handling of `req` as a task (`spawn`)."""
        task = self.spawn(self._run_bolt(req, acked))
        self._dispatches.add(task)
        task.add_done_callback(self._dispatches.discard)

    async def _run_bolt(self, req: SocketModeRequest, acked: concurrent.futures.Future[bool]) -> None:
        """Bolt's handling of `req`; Bolt's ack goes back over the websocket unless `acked` says the envelope was
        acked on arrival. Never raises."""
        start = time.time()
        try:
            response = await run_async_bolt_app(self.app, req)
            client = self.client
            if not await asyncio.wrap_future(acked) and client is not None:
                await self._on_socket_thread(send_async_response(client, req, response, start))
        except Exception:
            log.exception("handling the Socket Mode envelope %s (%s) failed", req.envelope_id, req.type)

    async def _on_socket_thread(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the socket thread's loop and wait for its result here."""
        assert self._loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    # -- the socket thread's side ---------------------------------------------------------------------------------
    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop) -> None:
        """The socket thread: run `loop` until it is stopped, then close it."""
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.wait(tasks, timeout=CLOSE_WAIT_S))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    async def _connect(self) -> None:
        """On the socket thread: make the client (once; its aiohttp sessions belong to this thread's loop) and
        connect it."""
        if self.client is None:
            bolt = self.app.client  # same Web API URL and timeout; its own HTTP sessions, on this thread
            web = make_client(bolt.token or "", bolt.base_url, timeout=bolt.timeout)
            self.client = SocketModeClient(app_token=self.app_token, logger=self.app.logger, web_client=web,
                                           ping_interval=self.ping_interval)
            self.client.socket_mode_request_listeners.append(self._on_request)  # type: ignore[arg-type]
        await self.client.connect()

    async def _on_request(self, client: SocketModeClient, req: SocketModeRequest) -> None:
        """On the socket thread, as an envelope arrives: hand it to the bot's loop, then ack it at once when
        `early_ack` says so (else Bolt acks it)."""
        acked: concurrent.futures.Future[bool] = concurrent.futures.Future()
        try:
            bot_loop = self._bot_loop
            if bot_loop is None or bot_loop.is_closed():  # not acked: Slack delivers it again (to the next run)
                log.error("the bot's event loop is gone: Socket Mode envelope %s (%s) not taken", req.envelope_id,
                          req.type)
                return
            bot_loop.call_soon_threadsafe(self._dispatch, req, acked)
            if self.early_ack(req):
                try:
                    await client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))
                    acked.set_result(True)
                except Exception as e:  # the connection is going: Bolt's ack is tried instead
                    log.warning("could not ack the Socket Mode envelope %s on arrival: %s", req.envelope_id, e)
        finally:
            if not acked.done():
                acked.set_result(False)
