"""SIGKILL the bot while 3 launches are watched, restart it: every watch resumes, the alerts that came due
during the downtime are posted once, and nothing is posted twice (also after a second restart)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import time

import pytest
import yaml

from bot.adapters.store import Store
from tests.support.builders import three_watched_variants
from tests.support.procs import kill_launches, wait_until

pytestmark = pytest.mark.timeout(240)

SILENCE_S = 8.0


class ConsoleBot:
    """`gpubot console` as the bot process (its watcher prints alerts); its output is read in the background,
    stdin stays open to keep it alive."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.out = ""
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, config_path) -> ConsoleBot:
        return cls(await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot.cli", "console", "--config", str(config_path),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT))

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while chunk := await self.proc.stdout.read(65536):
            self.out += chunk.decode(errors="replace")

    async def say(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        await self.proc.stdin.drain()

    def alerts(self) -> list[str]:
        return re.findall(r"^(v\d#\d+) on gpu-host-1: silent_hang", self.out, re.M)

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        await self.proc.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._reader, 5)


def observations(store: Store) -> int:
    return sum(len(store.observations.list(i)) for i in (1, 2, 3))


async def test_sigkill_and_restart_loses_no_alert_and_repeats_none(ssh_server, fake_gpu, tmp_path):
    data = three_watched_variants(ssh_server, fake_gpu, tmp_path, SILENCE_S)
    data["permissions"] = {}
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump(data))
    store: Store | None = None
    bots: list[ConsoleBot] = []
    try:
        a = await ConsoleBot.start(path)
        bots.append(a)
        await a.say("".join(f"/launch v{i} mode=hang workers=1\n" for i in (1, 2, 3)))
        await wait_until(lambda: a.out.count("Launched v") == 3, 30, what=f"three launches; output:\n{a.out}")
        await a.kill()  # SIGKILL, no clean shutdown: the jobs are only in the database
        # usually nothing was due yet; on a loaded machine the first launch may already have been alerted: either
        # way, every alert is posted once across the bots (checked below), whatever the speed
        store = Store(f"sqlite:///{tmp_path / 'state' / 'gpubot.db'}")
        logs = [la.log_path for la in store.launches.recent()]
        assert len(logs) == 3
        # downtime until all three hangs are past the silence threshold: their alerts come due meanwhile
        await wait_until(lambda: time.time() - max(os.path.getmtime(p) for p in logs) > SILENCE_S + 0.5,
                         SILENCE_S + 30, what="the silence threshold to pass during the downtime")

        b = await ConsoleBot.start(path)
        bots.append(b)
        await wait_until(lambda: len(a.alerts() + b.alerts()) >= 3, 60,
                         what=f"the three due alerts; output:\n{b.out}")
        seen = observations(store)  # more checks of each launch: a late duplicate alert would show meanwhile
        await wait_until(lambda: observations(store) >= seen + 6, 60, what="two more checks of each launch")
        await b.kill()
        assert sorted(a.alerts() + b.alerts()) == ["v1#1", "v2#2", "v3#3"], (a.out, b.out)  # each exactly once

        c = await ConsoleBot.start(path)  # a second restart posts nothing again
        bots.append(c)
        before = observations(store)
        await wait_until(lambda: observations(store) >= before + 6, 60, what="two more checks of each launch")
        await c.kill()
        assert c.alerts() == [], c.out
    finally:
        for bot in bots:
            await bot.kill()
        store = store or Store(f"sqlite:///{tmp_path / 'state' / 'gpubot.db'}")
        try:
            kill_launches(store.launches.recent())
        finally:
            store.close()
