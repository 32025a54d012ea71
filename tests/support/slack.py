"""The real Bolt app (bot.slack) wired to a local fake of Slack's servers (Web API over HTTP, Socket Mode over
a websocket) and the real runtime: for the wire tests (acks, retries, reconnects, signing)."""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from slack_bolt.async_app import AsyncApp

from bot.adapters.store import Store
from bot.config import Config
from bot.slack.app import build_app, slack_runtime
from bot.slack.bot import SlackBot
from bot.slack.client import make_client
from bot.slack.socket import SocketModeThread
from bot.wiring import Runtime
from tests.support.builders import ssh_host
from tests.support.fakes.slack_server import FakeSlack
from tests.support.procs import kill_launches, wait_until


@dataclass
class SlackStack:
    """A running Slack bot against the fake Slack: `stop()` must be awaited (fixtures do it)."""

    fake: FakeSlack
    app: AsyncApp
    bot: SlackBot
    runtime: Runtime
    session: aiohttp.ClientSession
    handler: SocketModeThread | None = None
    tmpdir: str | None = None

    async def settled(self, *env_ids: str) -> None:
        """The bot is done with these envelopes (and everything before them): each is acked (the bot takes an
        envelope before its ack goes out: bot.slack.socket), every task the bot started has finished, and the
        outbox has sent (or given up on) everything. What a test checks after this cannot still be on its way."""
        for env_id in env_ids:
            await self.fake.wait_for_ack(env_id, 20)

        async def idle() -> bool:
            await self.bot.drain(30)
            return not self.bot.tasks

        await wait_until(idle, 60, what="the bot's commands to finish")
        await wait_until(lambda: self.runtime.store.outbox.pending_count() == 0, 60, what="the outbox to be empty")

    async def stop(self) -> None:
        """Disconnect (no new commands), wait for the running ones, kill whatever the launches left running (by
        tag), close everything."""
        if self.handler is not None:
            await self.handler.close_async()
        await self.bot.drain()
        kill_launches(self.runtime.store.launches.recent(200))
        await self.runtime.close(flush_s=2)
        kill_launches(self.runtime.store.launches.recent(200))
        await self.session.close()
        await self.fake.close()
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


async def start_stack(config: Config, *, socket_mode: bool = True, signing_secret: str | None = None,
                      watch: bool = False, **options: Any) -> SlackStack:
    """Start the fake Slack, then the bot (Socket Mode connected unless `socket_mode` is False; HTTP mode needs
    `signing_secret`); with `watch` the readiness checks run. `options` go to bot.wiring.build_runtime."""
    fake = FakeSlack()
    await fake.start()
    session = aiohttp.ClientSession()
    client = make_client("xoxb-test", fake.api_url, session=session)
    tmpdir = None
    if "store" not in options:
        tmpdir = tempfile.mkdtemp(prefix="gpubot-e2e-")
        options["store"] = Store(f"sqlite:///{tmpdir}/gpubot.db")
    options.setdefault("poll_s", 0.2)
    options.setdefault("start_check_s", 0.5)
    runtime = slack_runtime(config, client, **options)
    app, bot = build_app(runtime, client, signing_secret=signing_secret)
    stack = SlackStack(fake, app, bot, runtime, session, tmpdir=tmpdir)
    await runtime.start(watch=watch)
    if socket_mode:
        stack.handler = SocketModeThread(app, "xapp-test", ping_interval=5, spawn=bot.spawn)  # as `gpubot run`
        await stack.handler.connect_async()
        await fake.wait_connected(5)
    return stack


def thread_of(fake: FakeSlack, call: dict[str, Any]) -> str | None:
    """The thread an answer is in: a post's own thread_ts, or that of the message an edit replaced."""
    if call["method"] == "chat.update":
        return (fake.message_state(call["params"]["ts"]) or {}).get("thread_ts")
    return call["params"].get("thread_ts")


def text_of(call: dict[str, Any]) -> str:
    """The text of a recorded Web API call (a post or an edit)."""
    return call["params"].get("text") or ""


class GatedHost:
    """An SSH host (a loopback server, set by the `gated_host` fixture) on which every command waits until
    `open()`: the `sh` first on its commands' PATH blocks until a file exists, then runs /bin/sh. While the
    gate is shut nothing the bot asked of the host can have answered."""

    def __init__(self, directory: Path, fake_gpu: Any):
        bin_dir = directory / "bin"
        bin_dir.mkdir(parents=True)
        self.gate = directory / "open"
        self.calls = directory / "sh-calls"
        sh = bin_dir / "sh"
        sh.write_text(f"#!/bin/sh\necho \"$*\" >> {shlex.quote(str(self.calls))}\n"
                      f"while [ ! -e {shlex.quote(str(self.gate))} ]; do sleep 0.05; done\n"
                      'exec /bin/sh "$@"\n')
        sh.chmod(0o755)
        self.path = f"{bin_dir}:{fake_gpu.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        self.server: Any = None
        self.opened_at: float | None = None

    def script_runs(self) -> int:
        """How many scripts the bot ran on this host (`sh -s`, over a channel of its own or on the probe agent)."""
        try:
            lines = self.calls.read_text().splitlines()
        except FileNotFoundError:
            return 0
        return sum(1 for line in lines if line.strip() in ("-s", "-s gpubot-probe"))

    def open(self) -> None:
        """Let every waiting and later command run."""
        if self.opened_at is None:
            self.opened_at = time.monotonic()
        self.gate.touch()

    def config(self) -> Config:
        """A config whose only host, `slow-host`, is this one."""
        assert self.server is not None
        return Config(hosts={"slow-host": ssh_host(self.server, command_timeout_s=60)})
