"""Decision locks: one launch decision at a time per host, one kill at a time per launch, across every bot on the
database.

In one process an asyncio.Lock per name; on PostgreSQL also a session advisory lock (`pg_try_advisory_lock(k1,
k2)`, tried every POLL_S up to `timeout_s`) on a connection held for the decision, so two bots on one database take
turns too. A lock that is free tells a bot that nobody is deciding: the leader settles a launch left `starting` or
`stopping` only when its lock is free (the bot that was launching or killing it is gone), never behind a live bot's
back. SQLite (one bot per database): the process's own locks are the whole story.

A bot's life lock (`hold_life`) is held on a connection of its own for as long as the bot runs: another bot that
finds it free (`alive` False) knows that bot is gone (dead, or frozen and its sessions ended by a new leader), and
answers the commands it left (bot.services.journal). On SQLite every other bot is an earlier run: gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

#: Seconds between tries of a lock another bot holds.
POLL_S = 0.1
#: Advisory lock classes (the first key): a host's launch decision, a launch's kill.
HOST_CLASS = 0x6770
KILL_CLASS = 0x6771
#: Advisory lock class of a bot's life (the second key: its `host:pid`).
LIFE_CLASS = 0x6772


class LockTimeout(Exception):
    """A decision lock stayed taken longer than the caller would wait; str() says which."""


def _key(name: str) -> int:
    """A signed 32-bit key for `name` (crc32)."""
    k = zlib.crc32(name.encode("utf-8", "surrogateescape"))
    return k - (1 << 32) if k >= 1 << 31 else k


class DecisionLocks:
    """Named locks shared by the bots of one database (see the module's docstring). `engine` None, or not
    PostgreSQL: in-process only."""

    def __init__(self, engine: Engine | None = None, *, timeout_s: float = 120.0):
        self._engine = engine if engine is not None and engine.dialect.name == "postgresql" else None
        self.timeout_s = timeout_s
        self._local: dict[tuple[int, str], asyncio.Lock] = {}
        self._life: tuple[str, Connection] | None = None
        self._identity: str | None = None  # this bot's, once it held its life lock

    @property
    def shared(self) -> bool:
        """True when other bots may hold these locks (PostgreSQL)."""
        return self._engine is not None

    @contextlib.asynccontextmanager
    async def host(self, host: str) -> AsyncIterator[None]:
        """Hold the launch decision of `host`. Raises LockTimeout after `timeout_s` seconds."""
        async with self._hold(HOST_CLASS, host):
            yield

    @contextlib.asynccontextmanager
    async def kill(self, launch_id: int, *, wait_s: float | None = None) -> AsyncIterator[None]:
        """Hold the kill of launch `launch_id`. Raises LockTimeout after `wait_s` seconds (default `timeout_s`;
        0: at once when another holds it)."""
        async with self._hold(KILL_CLASS, str(launch_id), wait_s):
            yield

    async def host_free(self, host: str) -> bool:
        """True when no bot decides a launch on `host` now (checked and let go at once)."""
        return await self._free(HOST_CLASS, host)

    async def kill_free(self, launch_id: int) -> bool:
        """True when no bot kills launch `launch_id` now (checked and let go at once)."""
        return await self._free(KILL_CLASS, str(launch_id))

    async def hold_life(self, identity: str) -> bool:
        """Hold this bot's life lock (`identity`: its `host:pid`) until `release_life`, taking it again when its
        session was lost (ended by a leader that found this bot frozen, or a dropped connection). Returns True
        when it is held (always, off PostgreSQL). Raises what the database raises."""
        self._identity = identity
        if self._engine is None:
            return True
        if self._life is not None and await asyncio.to_thread(self._session_alive, self._life[1]):
            return True
        self.release_life()
        conn = await asyncio.to_thread(self._try, LIFE_CLASS, _key(identity))
        if conn is not None:
            self._life = (identity, conn)
        return conn is not None

    def release_life(self) -> None:
        """Let go of the life lock (its session closes: the server lets go of the lock)."""
        if self._life is not None:
            conn, self._life = self._life[1], None
            with contextlib.suppress(Exception):
                conn.invalidate()
                conn.close()

    async def alive(self, identity: str) -> bool:
        """True while the bot `identity` (`host:pid`) holds its life lock: it runs (or is frozen and nobody ended
        its session yet). This bot itself: True. Off PostgreSQL, any other bot: False (an earlier run)."""
        if identity == self._identity:
            return True
        if self._engine is None:
            return False
        return not await self._free(LIFE_CLASS, identity)

    @staticmethod
    def _session_alive(conn: Connection) -> bool:
        try:
            conn.exec_driver_sql("SELECT 1")
            return True
        except Exception:
            return False

    @contextlib.asynccontextmanager
    async def _hold(self, cls: int, name: str, wait_s: float | None = None) -> AsyncIterator[None]:
        wait = self.timeout_s if wait_s is None else max(0.0, wait_s)
        local = self._local.setdefault((cls, name), asyncio.Lock())
        if wait == 0 and local.locked():
            raise LockTimeout(f"another command holds the decision on {name}")
        try:
            await asyncio.wait_for(local.acquire(), wait or None)
        except TimeoutError:
            raise LockTimeout(f"another command has held the decision on {name} for {wait:.0f} s") from None
        try:
            if self._engine is None:
                yield
                return
            conn = await asyncio.to_thread(self._acquire, cls, _key(name), name, wait)
            try:
                yield
            finally:
                await asyncio.to_thread(self._release, conn, cls, _key(name))
        finally:
            local.release()

    async def _free(self, cls: int, name: str) -> bool:
        local = self._local.get((cls, name))
        if local is not None and local.locked():
            return False
        if self._engine is None:
            return True
        conn = await asyncio.to_thread(self._try, cls, _key(name))
        if conn is None:
            return False
        await asyncio.to_thread(self._release, conn, cls, _key(name))
        return True

    def _try(self, cls: int, key: int) -> Connection | None:
        assert self._engine is not None
        conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            if conn.exec_driver_sql(f"SELECT pg_try_advisory_lock({cls}, {key})").scalar():
                return conn
        except Exception:
            conn.close()
            raise
        conn.close()
        return None

    def _acquire(self, cls: int, key: int, name: str, wait_s: float) -> Connection:
        deadline = time.monotonic() + wait_s
        while True:
            conn = self._try(cls, key)
            if conn is not None:
                return conn
            if time.monotonic() >= deadline:
                raise LockTimeout(f"another bot holds the decision on {name}" + (f" (waited {wait_s:.0f} s)"
                                                                                   if wait_s else ""))
            time.sleep(POLL_S)

    @staticmethod
    def _release(conn: Connection, cls: int, key: int) -> None:
        try:
            conn.exec_driver_sql(f"SELECT pg_advisory_unlock({cls}, {key})")
        except Exception:
            conn.invalidate()  # the session ends: the server lets go of its locks
        finally:
            conn.close()
