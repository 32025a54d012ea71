"""The real Bolt app (bot.slack) wired to a local fake of Slack's servers (Web API over HTTP, Socket Mode over
a websocket) and the real runtime: for the wire tests (acks, retries, reconnects, signing)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import Any

import aiohttp
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp

from bot.adapters.store import Store
from bot.config import Config
from bot.slack.app import SlackBot, build_app, slack_runtime
from bot.slack.client import make_client
from bot.wiring import Runtime
from tests.support.fakes.slack_server import FakeSlack
from tests.support.procs import kill_launches


@dataclass
class SlackStack:
    """A running Slack bot against the fake Slack: `stop()` must be awaited (fixtures do it)."""

    fake: FakeSlack
    app: AsyncApp
    bot: SlackBot
    runtime: Runtime
    session: aiohttp.ClientSession
    handler: AsyncSocketModeHandler | None = None

    async def stop(self) -> None:
        """Kill whatever the launches left running (by tag), disconnect, drain, close everything."""
        kill_launches(self.runtime.store.launches.recent(200))
        if self.handler is not None:
            await self.handler.close_async()
        await self.bot.drain()
        await self.runtime.close(flush_s=2)
        await self.session.close()
        await self.fake.close()


async def start_stack(config: Config, *, socket_mode: bool = True, signing_secret: str | None = None,
                      watch: bool = False, **options: Any) -> SlackStack:
    """Start the fake Slack, then the bot (Socket Mode connected unless `socket_mode` is False; HTTP mode needs
    `signing_secret`); with `watch` the readiness checks run. `options` go to bot.wiring.build_runtime."""
    fake = FakeSlack()
    await fake.start()
    session = aiohttp.ClientSession()
    client = make_client("xoxb-test", fake.api_url, session=session)
    options.setdefault("store", Store(f"sqlite:///{tempfile.mkdtemp(prefix='gpubot-e2e-')}/gpubot.db"))
    options.setdefault("poll_s", 0.2)
    options.setdefault("start_check_s", 0.5)
    runtime = slack_runtime(config, client, **options)
    app, bot = build_app(runtime, client, signing_secret=signing_secret)
    stack = SlackStack(fake, app, bot, runtime, session)
    await runtime.start(watch=watch)
    if socket_mode:
        stack.handler = AsyncSocketModeHandler(app, app_token="xapp-test", ping_interval=1)
        await stack.handler.connect_async()
        await fake.wait_connected(5)
    return stack
