"""Run the Slack app: Socket Mode (`gpubot run`) or HTTP with request signing (`gpubot serve-http`).

Tokens come from the environment only: SLACK_BOT_TOKEN (xoxb-...), SLACK_APP_TOKEN (xapp-..., Socket
Mode), SLACK_SIGNING_SECRET (HTTP mode). SLACK_API_URL optionally overrides https://slack.com/api/.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

import aiohttp
from aiohttp import web

from bot.adapters import sdnotify
from bot.config import Config
from bot.slack.app import build_app, slack_runtime
from bot.slack.client import make_client
from bot.slack.health import HealthEndpoints
from bot.slack.socket import SocketModeThread

log = logging.getLogger(__name__)


class MissingSecret(RuntimeError):
    """A required environment variable is not set; str() names it."""


def env_secret(name: str) -> str:
    """Read a secret from the environment. Raises MissingSecret when it is unset or empty."""
    value = os.environ.get(name, "").strip()
    if not value:
        raise MissingSecret(f"{name} is not set; export it in the environment (never in the config file)")
    return value


def _api_url(config: Config) -> str | None:
    return os.environ.get("SLACK_API_URL") or config.slack.api_url


async def _wait_for_stop(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    await stop.wait()


#: auth.test errors that mean the bot token itself is refused: retrying cannot help.
REFUSED_TOKEN_ERRORS = frozenset({"invalid_auth", "not_authed", "account_inactive", "token_revoked",
                                  "token_expired", "not_allowed_token_type"})


async def check_bot_token(client) -> None:
    """Ask Slack's auth.test once before serving. Raises MissingSecret naming the error when Slack refuses the bot
    token (REFUSED_TOKEN_ERRORS: a placeholder, a revoked or a wrong-type token), so the service stops with one
    clear line instead of retrying forever; any other failure (Slack unreachable, 5xx) is logged and left to the
    retries of the running bot."""
    from slack_sdk.errors import SlackApiError

    try:
        await asyncio.wait_for(client.auth_test(), 30.0)
    except SlackApiError as e:
        error = str((e.response or {}).get("error", ""))
        if error in REFUSED_TOKEN_ERRORS:
            raise MissingSecret(f"Slack refused SLACK_BOT_TOKEN ({error}): set the app's Bot User OAuth Token "
                                "(xoxb-...) in the environment") from None
        log.warning("auth.test failed at start (%s); starting anyway", error or e)
    except Exception as e:
        log.warning("auth.test failed at start (%s); starting anyway", type(e).__name__)


async def _not_connected() -> bool:
    """Slack's connection before Socket Mode connects: not there."""
    return False


@contextlib.asynccontextmanager
async def _bolt_app(config: Config, bot_token: str, signing_secret: str | None = None):
    """Yield the Bolt app, its SlackBot and its HealthEndpoints, wired (bot.wiring) to a shared aiohttp session and
    the Slack client. The metrics port (`metrics.port`) is bound before the bot starts (before it leads, sends or
    takes a command), so a port in use stops it first. On exit wait (bounded) for running commands, close the
    endpoints, stop the checks, flush the outbox, close SSH connections and the session. Raises MissingSecret for a
    refused bot token, OSError for a metrics port that cannot be bound."""
    session = aiohttp.ClientSession()
    try:
        client = make_client(bot_token, _api_url(config), session=session)
        await check_bot_token(client)
        runtime = slack_runtime(config, client)
        app, bot = build_app(runtime, client, signing_secret=signing_secret)
        # Socket Mode: not connected until the websocket is (run_socket_mode sets the real check); HTTP: not known
        health = HealthEndpoints(runtime, _not_connected if signing_secret is None else None)
        try:
            runner = await health.serve(config.metrics.host, config.metrics.port) if config.metrics.port else None
            try:
                await runtime.start(settle_heap=True)  # the outbox sender first: what an earlier run left queued
                try:
                    yield app, bot, health
                finally:
                    await bot.drain()
            finally:
                if runner is not None:
                    await runner.cleanup()
        finally:
            await runtime.close()
    finally:
        await session.close()


#: Socket Mode ping interval (seconds): a dead connection is noticed within about two of these.
PING_INTERVAL_S = 5.0


async def socket_watchdog(handler: SocketModeThread, every_s: float = 10.0, misses: int = 2) -> None:
    """Keep Socket Mode connected: after `misses` checks `every_s` seconds apart that found no open
    websocket, clear the client's websocket URL so that its next reconnect asks Slack for a fresh one.

    slack_sdk's aiohttp client (3.x) retries the URL it already has forever when opening the websocket
    fails; those URLs are temporary, so after an outage at the wrong moment it would never reconnect.
    Runs until cancelled; never raises otherwise."""
    down = 0
    while True:
        await asyncio.sleep(every_s)
        down = 0 if await handler.connected() else down + 1
        if down >= misses:
            log.warning("Socket Mode has been disconnected for %.0f s; asking Slack for a new websocket URL",
                        down * every_s)
            handler.forget_url()
            down = 0


@contextlib.asynccontextmanager
async def _serving(status: str):
    """While the bot serves: systemd told READY=1 with `status` and its watchdog fed; on the way out STOPPING=1."""
    feeder = asyncio.get_running_loop().create_task(sdnotify.keep_watchdog_fed(), name="gpubot-sd-watchdog")
    sdnotify.notify(f"READY=1\nSTATUS={status}")
    try:
        yield
    finally:
        sdnotify.notify("STOPPING=1")
        feeder.cancel()


async def run_socket_mode(config: Config, *, stop: asyncio.Event | None = None) -> None:
    """Connect over Socket Mode and serve until SIGINT/SIGTERM (or `stop` is set). The websocket and the acks
    live on a thread of their own (bot.slack.socket), so acks never wait behind the bot's work. With
    `metrics.port`, /healthz and /metrics are served there; under systemd (`Type=notify`) READY=1 is sent once
    connected, and the watchdog fed while the event loop runs.

    Raises MissingSecret when SLACK_BOT_TOKEN or SLACK_APP_TOKEN is missing, OSError when the metrics port cannot
    be bound.
    """
    bot_token, app_token = env_secret("SLACK_BOT_TOKEN"), env_secret("SLACK_APP_TOKEN")
    stop = stop or asyncio.Event()
    async with _bolt_app(config, bot_token) as (app, bot, health):
        handler = SocketModeThread(app, app_token, ping_interval=PING_INTERVAL_S, spawn=bot.spawn)
        health.slack_connected = handler.connected
        watchdog = asyncio.get_running_loop().create_task(socket_watchdog(handler))
        try:
            await handler.connect_async()
            log.info("connected to Slack over Socket Mode")
            role = "leading" if bot.runtime.leading else "following"
            async with _serving(f"connected to Slack over Socket Mode ({role} at start)"):
                await _wait_for_stop(stop)
        finally:
            watchdog.cancel()
            await handler.close_async()


async def run_http(config: Config, *, port: int, host: str = "0.0.0.0", stop: asyncio.Event | None = None) -> None:
    """Serve Slack's HTTP requests on `host:port` at /slack/events, with GET /healthz beside them (for the load
    balancer; /metrics, which names hosts, only on `metrics.port`, with /healthz), verifying request signatures.
    systemd is told as in Socket Mode.

    Raises MissingSecret when SLACK_BOT_TOKEN or SLACK_SIGNING_SECRET is missing, OSError when a port cannot be
    bound.
    """
    bot_token, secret = env_secret("SLACK_BOT_TOKEN"), env_secret("SLACK_SIGNING_SECRET")
    stop = stop or asyncio.Event()
    async with _bolt_app(config, bot_token, secret) as (app, _bot, health):
        web_app = app.web_app(path="/slack/events")
        health.add_routes(web_app, metrics=False)  # /metrics names hosts: only on the metrics port (loopback)
        runner = web.AppRunner(web_app)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            log.info("serving Slack HTTP requests on %s:%s/slack/events", host, port)
            async with _serving(f"serving Slack HTTP requests on port {port}"):
                await _wait_for_stop(stop)
        finally:
            await runner.cleanup()
