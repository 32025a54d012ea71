"""`gpubot run` as a process of its own against the fake Slack, for the service tests (failover, restarts)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.procs import free_port


class ServiceBot:
    """`gpubot run` (Socket Mode) as a process of its own, with /healthz and /metrics on `port`; its stderr goes to a
    file (read on failure)."""

    def __init__(self, name: str, config: Path, env: dict[str, str], log_dir: Path):
        self.name = name
        self.port = free_port()
        self.log = log_dir / f"{name}.log"
        self._args = [sys.executable, "-m", "bot.cli", "--log-level", "INFO", "run", "--config", str(config),
                      "--metrics-port", str(self.port)]
        self._env = env
        self.proc: asyncio.subprocess.Process | None = None
        #: the number of its Socket Mode connection to the fake Slack, where a test knows it
        self.connection: int | None = None

    async def start(self) -> ServiceBot:
        with open(self.log, "ab") as out:
            self.proc = await asyncio.create_subprocess_exec(*self._args, env=self._env, stdout=out, stderr=out,
                                                             start_new_session=True)
        return self

    async def vitals(self) -> dict | None:
        """/healthz's JSON, or None while it does not answer."""
        try:
            async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{self.port}/healthz",
                                                           timeout=aiohttp.ClientTimeout(total=5)) as r:
                return json.loads(await r.text())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def metrics(self) -> str:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{self.port}/metrics",
                                                       timeout=aiohttp.ClientTimeout(total=5)) as r:
            return await r.text()

    async def role(self) -> str | None:
        """The role /healthz names; AssertionError when the process has ended."""
        if self.proc is not None and self.proc.returncode is not None:
            raise AssertionError(f"bot {self.name} exited with {self.proc.returncode}:\n{self.output()}")
        v = await self.vitals()
        return None if v is None else v["role"]

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:] if self.log.exists() else ""

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()

    async def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM to the bot's own process (as a service manager stops it), then wait for its exit; returns its
        status. SIGKILL to its process group after `timeout_s`."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout_s)
            except TimeoutError:
                await self.kill()
        assert self.proc.returncode is not None
        return self.proc.returncode


async def stop_everything(bots: list[ServiceBot], store: Any, url: str) -> None:
    """A test's finalizer: SIGKILL every bot, close the test's `store` (when it has one), then SIGKILL every
    launch recorded in the database at `url`, read through a fresh store (another process's writes are not in an
    old one's memo)."""
    from bot.adapters.store import Store
    from tests.support.procs import kill_launches

    for bot in bots:
        await bot.kill()
    if store is not None:
        store.close()
    final = Store(url)
    try:
        kill_launches(final.launches.recent())
    finally:
        final.close()
