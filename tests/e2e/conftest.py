"""The real Bolt app wired to a local fake of Slack's servers and a loopback SSH host."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from dataclasses import dataclass

import aiohttp
import pytest
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp

from bot.adapters.store import Store
from bot.config import Config
from bot.services.hosts import HostService
from bot.services.launches import LaunchService
from bot.slack.app import GpuBot, build_app
from bot.slack.surface import make_client
from tests.fakes.slack_server import FakeSlack


@dataclass
class SlackStack:
    fake: FakeSlack
    app: AsyncApp
    bot: GpuBot
    hosts: HostService
    handler: AsyncSocketModeHandler | None = None


async def start_stack(config: Config, *, socket_mode: bool = True, signing_secret: str | None = None):
    fake = FakeSlack()
    await fake.start()
    session = aiohttp.ClientSession()
    client = make_client("xoxb-test", fake.api_url, session=session)
    hosts = HostService(config)
    store = Store(f"sqlite:///{tempfile.mkdtemp(prefix='gpubot-e2e-')}/gpubot.db")
    launches = LaunchService(config, hosts, store, kill_grace_s=3, release_timeout_s=10, poll_s=0.2,
                             start_check_s=0.5)
    app, bot = build_app(config, hosts, client, signing_secret=signing_secret, launches=launches)
    stack = SlackStack(fake, app, bot, hosts)
    if socket_mode:
        stack.handler = AsyncSocketModeHandler(app, app_token="xapp-test", ping_interval=1)
        await stack.handler.connect_async()
        await fake.wait_connected(5)

    async def stop():
        from tests.integration.test_lifecycle import pids_of_launch

        for la in store.recent_launches(200):  # whatever a failed test left running, by its launch tag
            for pid in pids_of_launch(la):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if stack.handler is not None:
            await stack.handler.close_async()
        await bot.close(flush_s=2)
        await hosts.close()
        store.close()
        await session.close()
        await fake.close()

    return stack, stop


@pytest.fixture
async def slack(ssh_config):
    stack, stop = await start_stack(ssh_config)
    yield stack
    await stop()
