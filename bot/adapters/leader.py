"""Leadership among the bots that share one database: only the leader sends the outbox and runs the scheduled
checks; every bot takes commands.

PostgreSQL: the leader holds a session advisory lock (`pg_try_advisory_lock`) on a connection of its own and a lease
with a deadline in the database (table `leader_lease`, bot.adapters.store.lease: its session's backend pid and
`expires_at`, `lease_s` ahead on the database's clock), renewed by its heartbeat every `heartbeat_s`. A leader that
dies closes its connection and the server releases the lock at once (a vanished host: when TCP keepalives give up,
about 10 s); a follower tries the lock every `heartbeat_s`, so it takes over within about one heartbeat. A leader
that is alive but frozen (SIGSTOP, a paused VM, a hung event loop) keeps its session, and so the lock, but stops
renewing: a follower that finds the lease expired ends that session (`pg_terminate_backend`), and every other
session of that bot (by its `application_name`, bot.adapters.store.db: a transaction it froze in holds row
locks), and takes the lock, so it leads within `lease_s` plus a heartbeat or two. A leader whose heartbeat fails
or hangs, or finds its lease expired or taken (it was frozen past its deadline), steps down at once (it stops
sending before another bot can lead, and a frozen one that wakes up does not go on as leader). A database
without the lease table (an older schema) gets the lock alone, as before, said once in the log. SQLite (one bot
per database file, bot.adapters.statelock) and any other database: the one bot leads from the start
(`SoleLeader`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

log = logging.getLogger(__name__)

#: PostgreSQL advisory lock key of the leader ("gpuc" in ASCII; the schema lock is "gpub").
LEADER_KEY = 0x67707563
#: Seconds between a follower's tries and a leader's heartbeats.
HEARTBEAT_S = 1.0
#: Seconds a heartbeat may take before the leader steps down (the database or the network is stuck).
HEARTBEAT_TIMEOUT_S = 5.0
#: Seconds the leader's lease runs past each renewal: a leader frozen longer loses the lead (more than the
#: heartbeat timeout: a slow heartbeat steps the leader down before its lease can be taken).
LEASE_S = 10.0
#: The lease's row (table `leader_lease`).
LEASE_NAME = "leader"
#: libpq settings of the leader's connection. On the client: TCP keepalives and a TCP user timeout, so a database
#: host that vanished is noticed in about 10 s. On the server (`options`): the same for the leader's session, so
#: a leader cut off by the network loses its session, and with it the lock, in about 10 s (not after the server's
#: default 2 hours), and a follower can take over.
KEEPALIVES = MappingProxyType({"keepalives": 1, "keepalives_idle": 4, "keepalives_interval": 2,
                               "keepalives_count": 3, "tcp_user_timeout": 10000, "connect_timeout": 5,
                               "options": "-c tcp_keepalives_idle=4 -c tcp_keepalives_interval=2 "
                                          "-c tcp_keepalives_count=3 -c tcp_user_timeout=10000"})

Hook = Callable[[], Awaitable[None]]


def bot_identity() -> str:
    """`host:pid` of this bot (logs, metrics, /healthz)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class SoleLeader:
    """The only bot on its database: leading from the start, for good."""

    shared = False

    def __init__(self) -> None:
        self.leading = True

    async def run(self, on_gain: Hook, on_lose: Hook) -> None:
        """Call `on_gain` once, then wait until cancelled (`on_lose` is never called)."""
        await on_gain()
        await asyncio.Event().wait()


class AdvisoryLeader:
    """Leadership through a PostgreSQL session advisory lock (see the module's docstring)."""

    shared = True

    def __init__(self, engine: Engine, *, key: int = LEADER_KEY, heartbeat_s: float = HEARTBEAT_S,
                 heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S, lease_s: float = LEASE_S):
        self._engine = engine
        self.key = key
        self.heartbeat_s = heartbeat_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.lease_s = lease_s
        self.leading = False
        self.lease_table = True  # False once the database was found without the lease table
        self.sessions_ended = 0  # the frozen leaders' sessions this bot ended (each an expired lease)
        self._conn: Connection | None = None

    async def run(self, on_gain: Hook, on_lose: Hook) -> None:
        """Try to lead, and keep leading, until cancelled: `on_gain` when this bot becomes the leader, `on_lose`
        when it stops being one (its heartbeat failed, or it is cancelled while leading). Never raises otherwise
        (a database that cannot be reached is a follower's state, retried)."""
        try:
            while True:
                if not self.leading:
                    if await self._step(self._try_acquire):
                        self.leading = True
                        log.warning("this bot (%s) is now the leader: it sends and runs the checks", bot_identity())
                        await on_gain()
                elif not await self._step(self._heartbeat):
                    self.leading = False
                    self._drop()
                    log.error("this bot (%s) lost the lead (its heartbeat failed): it stops sending", bot_identity())
                    await on_lose()
                await asyncio.sleep(self.heartbeat_s)
        finally:
            if self.leading:
                self.leading = False
                with contextlib.suppress(Exception):
                    await on_lose()
            self._drop()

    async def _step(self, fn: Callable[[], bool]) -> bool:
        """`fn` in a thread, within the heartbeat timeout: its answer, False when it failed or timed out. Raises
        CancelledError when this task was cancelled meanwhile, even where asyncio.wait_for of Python 3.11 returned
        the answer (or raised the error) that came in the same turn of the loop as the cancel (python/cpython#86296):
        the loop of `run` would go on for ever, and whoever cancelled it would wait for ever."""
        try:
            got = await asyncio.wait_for(asyncio.to_thread(fn), self.heartbeat_timeout_s)
        except TimeoutError:
            log.error("leadership: the database did not answer in %.0f s", self.heartbeat_timeout_s)
            got = False
        except Exception as e:  # an error that came with the cancel too
            log.warning("leadership: %s", " ".join(str(e).split())[:300])
            got = False
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
        return got

    def _try_acquire(self) -> bool:
        if self._conn is not None:  # a try that timed out got the lock after all
            return True
        conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            got = bool(conn.exec_driver_sql(f"SELECT pg_try_advisory_lock({self.key})").scalar())
            if not got:
                self._end_expired(conn)
            else:
                self._lease(conn, take=True)
        except Exception:
            conn.invalidate()
            conn.close()
            raise
        if not got:
            conn.close()
            return False
        self._conn = conn
        return True

    def _heartbeat(self) -> bool:
        if self._conn is None:
            return False
        if not self._lease(self._conn, take=False):
            log.error("leadership: this bot's lease expired or was taken (it was frozen for more than %.0f s)",
                      self.lease_s)
            return False
        return True

    def _lease(self, conn: Connection, *, take: bool) -> bool:
        """Take the lease for this session (`take`: this bot just got the lock), or renew it: True when this
        session holds it now, False when it had expired (or another session holds it). Without the lease table: a
        `SELECT 1` (the lock alone decides)."""
        if not self.lease_table:
            conn.exec_driver_sql("SELECT 1").scalar()
            return True
        from sqlalchemy import text
        from sqlalchemy.exc import ProgrammingError

        args = {"name": LEASE_NAME, "holder": bot_identity()[:200], "lease": self.lease_s}
        try:
            if take:
                conn.execute(text(
                    "INSERT INTO leader_lease (name, holder, backend_pid, expires_at) "
                    "VALUES (:name, :holder, pg_backend_pid(), extract(epoch from clock_timestamp()) + :lease) "
                    "ON CONFLICT (name) DO UPDATE "
                    "SET holder = excluded.holder, backend_pid = excluded.backend_pid, "
                    "expires_at = excluded.expires_at"), args)
                return True
            row = conn.execute(text(
                "UPDATE leader_lease SET expires_at = extract(epoch from clock_timestamp()) + :lease "
                "WHERE name = :name AND backend_pid = pg_backend_pid() "
                "AND expires_at > extract(epoch from clock_timestamp()) RETURNING 1"), args).first()
            return row is not None
        except ProgrammingError as e:  # no lease table: an older schema
            if "leader_lease" not in str(e):
                raise
            self.lease_table = False
            log.warning("leadership: the database has no leader_lease table (an older schema): the advisory lock "
                        "alone decides, and a frozen leader keeps the lead")
            return self._lease(conn, take=take)

    def _end_expired(self, conn: Connection) -> None:
        """The lock is held by another session: where that session's lease expired (its bot is frozen), end the
        session (pg_terminate_backend), so that the lock is free at the next try."""
        if not self.lease_table:
            return
        from sqlalchemy import text
        from sqlalchemy.exc import ProgrammingError

        from bot.adapters.store.db import application_name

        try:
            # only the session that holds the leader's advisory lock now (pg_locks: a bigint key is classid, the
            # high 32 bits, and objid, the low ones, objsubid 1): a stale row never ends an unrelated session
            row = conn.execute(text(
                "SELECT l.backend_pid, l.holder, extract(epoch from clock_timestamp()) - l.expires_at "
                "FROM leader_lease l JOIN pg_locks k ON k.pid = l.backend_pid AND k.locktype = 'advisory' "
                "AND k.granted AND k.classid::bigint = :hi AND k.objid::bigint = :lo AND k.objsubid = 1 "
                "WHERE l.name = :name AND l.expires_at < extract(epoch from clock_timestamp()) "
                "AND l.backend_pid <> pg_backend_pid()"),
                {"name": LEASE_NAME, "hi": self.key >> 32, "lo": self.key & 0xFFFFFFFF}).first()
        except ProgrammingError as e:
            if "leader_lease" not in str(e):
                raise
            self.lease_table = False
            return
        if row is None:
            return
        pid, holder, late = int(row[0]), str(row[1]), float(row[2])
        ended = bool(conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar())
        if ended:
            self.sessions_ended += 1
        # the frozen bot's other sessions too (named after it): a transaction it froze in holds row locks that
        # would stall this bot's own writes (a delivery's claim, an outbox row) for as long as it stays frozen
        others = conn.execute(text(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = :app "
            "AND pid <> pg_backend_pid() AND pid <> :pid"), {"app": application_name(holder), "pid": pid}).scalar()
        log.warning("leadership: the lease of %s expired %.1f s ago (frozen?): %s its database session %d (and "
                    "%d other session(s) of it)", holder, late, "ended" if ended else "could not end", pid,
                    int(others or 0))

    def _drop(self) -> None:
        """Close the leader's connection without returning it to the pool (the server releases the lock)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.invalidate()
            with contextlib.suppress(Exception):
                conn.close()


def leadership_for(engine: Engine) -> SoleLeader | AdvisoryLeader:
    """AdvisoryLeader on PostgreSQL (its own engine, with TCP keepalives), else SoleLeader."""
    if engine.dialect.name != "postgresql":
        return SoleLeader()
    from sqlalchemy import create_engine

    from bot.adapters.store.db import application_name

    own = create_engine(engine.url, pool_size=1, max_overflow=1, pool_pre_ping=False,
                        connect_args={**KEEPALIVES, "application_name": application_name(bot_identity())})
    return AdvisoryLeader(own)
