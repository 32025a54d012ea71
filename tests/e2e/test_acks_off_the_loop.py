"""Acks never wait behind the bot's work: Socket Mode envelopes are acked from the websocket's own thread
(bot.slack.socket) while the bot's event loop is busy with something synchronous and slow, and the commands
are still answered once the loop is free.

The fake Slack runs on a thread of its own here (its own event loop), so that it can record the acks while the
bot's loop is blocked; everything else is the real Bolt app, runtime and outbox."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from typing import Any

import aiohttp
import pytest

from bot.adapters.store import Store
from bot.config import Config, HostConfig
from bot.slack.app import build_app, slack_runtime
from bot.slack.client import make_client
from bot.slack.socket import SocketModeThread
from tests.support.fakes.slack_server import FakeSlack
from tests.support.slack import text_of

pytestmark = pytest.mark.timeout(90)

#: The longest the bot's loop is held busy (the acks end it sooner).
BUSY_MAX_S = 20.0


class FakeSlackThread:
    """A FakeSlack served by its own event loop on its own thread: `fake`, and `run(coro)` to await on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fake-slack", daemon=True)
        self.thread.start()
        self.fake = FakeSlack()

    async def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run `coro` on the fake's loop; its result."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def close(self) -> None:
        await self.run(self.fake.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self.thread.join, 5)


@pytest.fixture
async def fake_thread():
    t = FakeSlackThread()
    await t.run(t.fake.start())
    yield t
    await t.close()


async def test_envelopes_are_acked_while_the_bots_loop_is_blocked(fake_thread, tmp_path):
    fake = fake_thread.fake
    session = aiohttp.ClientSession()
    client = make_client("xoxb-test", fake.api_url, session=session)
    runtime = slack_runtime(Config(hosts={"local": HostConfig(local=True)}), client,
                            store=Store(f"sqlite:///{tmp_path}/gpubot.db"))
    app, bot = build_app(runtime, client)
    await runtime.start(watch=False)
    handler = SocketModeThread(app, "xapp-test", ping_interval=5, spawn=bot.spawn)
    try:
        await handler.connect_async()
        await fake_thread.run(fake.wait_connected(10))
        first = await fake_thread.run(fake.push_slash_command("/gpu", "help", channel_id="C0"))
        await fake_thread.run(fake.wait_for_answer(lambda c: "/probe" in text_of(c), timeout=30))
        pushed = [asyncio.run_coroutine_threadsafe(fake.push_slash_command("/gpu", "help", channel_id=f"C{i}"),
                                                   fake_thread.loop) for i in (1, 2, 3)]
        # the bot's loop is busy (as with a long synchronous step) until the fake has the three acks
        start = time.monotonic()
        while time.monotonic() - start < BUSY_MAX_S and not (
                all(p.done() for p in pushed) and all(p.result() in fake.acks for p in pushed)):
            time.sleep(0.01)
        busy_s = time.monotonic() - start
        env_ids = [p.result(0) for p in pushed]
        acks = {e: fake.acks[e][1] - fake.envelopes[e]["pushed_at"] for e in env_ids if e in fake.acks}
        print(f"acked after {sorted(acks.values())} s while the bot's loop was busy for {busy_s:.2f} s")
        assert len(acks) == 3 and max(acks.values()) < 3.0, "not every envelope was acked while the loop was busy"
        for i in (1, 2, 3):  # and each is answered once the loop is free
            await fake_thread.run(fake.wait_for_answer(lambda c, ch=f"C{i}": c["params"].get("channel") == ch,
                                                       timeout=30))
        assert [fake.ack_count(e) for e in [first, *env_ids]] == [1, 1, 1, 1]  # Bolt's own acks were dropped
    finally:
        await handler.close_async()
        await bot.drain()
        await runtime.close(flush_s=2)
        await session.close()
