"""A whole bot for a test: the real runtime (bot.wiring) with a RecordingSurface, a Chat on it, and a
close() that stops every process its launches left, even when the test failed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bot.adapters.store import Store
from bot.config import Config
from bot.core.models import Event, Launch
from bot.wiring import Runtime, build_runtime
from tests.support.chat import Chat
from tests.support.procs import kill_launches
from tests.support.surfaces import RecordingSurface


@dataclass
class TestBot:
    """One running bot: its runtime, what it posted (`surface`) and a `chat` with it."""

    runtime: Runtime
    surface: RecordingSurface
    chat: Chat
    watching: bool = False

    __test__ = False  # not a test class

    @property
    def config(self) -> Config:
        return self.runtime.config

    @property
    def store(self) -> Store:
        return self.runtime.store

    def launch(self, launch_id: int) -> Launch:
        """Launch `launch_id` as stored now (AssertionError when unknown)."""
        la = self.runtime.launches.get(launch_id)
        assert la is not None, f"no launch {launch_id}"
        return la

    def events(self, action: str | None = None) -> list[Event]:
        """The audit trail (optionally of one action)."""
        return self.runtime.audit.events(action=action)

    def commands(self) -> list[Event]:
        """The audit rows of commands (`command:*`)."""
        return [e for e in self.events() if e.action.startswith("command:")]

    async def close(self) -> None:
        """Kill what the launches left running, close the runtime (checks, SSH, database), and kill again
        whatever a command still in flight started meanwhile."""
        kill_launches(self.runtime.store.launches.recent(500))
        await self.runtime.close(flush_s=1.0)
        kill_launches(self.runtime.store.launches.recent(500))


async def start_bot(config: Config, *, watch: bool = False, surface: RecordingSurface | None = None,
                    settle_heap: bool = False, **options: Any) -> TestBot:
    """Build and start a bot for `config` (see bot.wiring.build_runtime for `options`); with `watch` the
    readiness checks run; with `settle_heap` its start-up heap is frozen as the service's is (benchmarks; see
    bot.wiring.settle_heap_now). Quick kill polling by default."""
    surface = surface or RecordingSurface()
    options.setdefault("poll_s", 0.2)
    options.setdefault("start_check_s", 0.8)
    runtime = build_runtime(config, surface=surface, **options)
    await runtime.start(watch=watch, settle_heap=settle_heap)
    return TestBot(runtime, surface, Chat(runtime, surface), watching=watch)
