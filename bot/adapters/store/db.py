"""The database: one SQLAlchemy engine, its sessions, and the declarative base of every table.

SQLite through SQLAlchemy 2.0 is the embedded default (a file `gpubot.db` in the config's `state_dir`,
WAL journal, mode 0600); any SQLAlchemy URL can be given instead. Every write is its own short
transaction, so a crash never leaves half a launch. Synchronous by design: SQLite on the event loop is fine
at chat-ops volumes (a few writes per command).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.engine.url import make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, NoSuchModuleError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from bot.adapters.store.errors import DatabaseUnavailable  # defined there so that catching it needs no SQLAlchemy
from bot.adapters.store.migrate import SchemaError, ensure_schema


def _reason(e: BaseException) -> str:
    """The driver's own message of a sqlalchemy error (`database is locked`), on one line."""
    orig = getattr(e, "orig", None) or e
    return " ".join(str(orig).split())[:300] or type(orig).__name__


#: Seconds SQLite's busy handler keeps retrying (with its own backoff: 1, 2, 5, 10 ... 100 ms) to take a lock
#: another connection holds before the statement fails with `database is locked`. Short, because the database
#: is used on the event loop: a write lock held longer blocks the loop this long per write, and the answer
#: then goes around the database (bot.services.outbox).
BUSY_TIMEOUT_S = 1.0


class Base(DeclarativeBase):
    """SQLAlchemy declarative base of gpubot's tables (one repository module per table)."""


def default_url(state_dir: str) -> str:
    """SQLite URL of `gpubot.db` in `state_dir` (`~` expanded; the directory is created with mode 0700).
    Raises OSError when the directory cannot be created."""
    d = Path(os.path.expanduser(state_dir))
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return f"sqlite:///{d / 'gpubot.db'}"


class Database:
    """An engine on `url` with every table created (and older databases brought up to date). `transaction()`
    is the only way in for the repositories. An SQLite file is checked when it is opened (`PRAGMA
    quick_check`). Raises DatabaseUnavailable for a database that cannot be opened or read, or that the check
    finds corrupted (a malformed page), or in a directory that cannot be written."""

    def __init__(self, url: str):
        self.url = url
        try:
            parsed = make_url(url)
        except (ArgumentError, ValueError) as e:  # ValueError: e.g. a port that is no number
            raise DatabaseUnavailable(url.split("@")[-1], f"not a database URL: {e}") from e
        #: The file of an SQLite database, else the URL with its password hidden (for messages).
        self.path = parsed.database if parsed.drivername.startswith("sqlite") and parsed.database else \
            parsed.render_as_string(hide_password=True)
        try:
            # pre-ping: a connection the server dropped (a PostgreSQL restart) is replaced, not the next call's error
            self.engine: Engine = create_engine(url, future=True, pool_pre_ping=not url.startswith("sqlite"),
                                                connect_args=pg_connect_args(url))
        except (ImportError, NoSuchModuleError, ArgumentError) as e:
            raise DatabaseUnavailable(self.path, f"no database driver for {parsed.drivername!r} ({e}); install it "
                                      "(e.g. pip install psycopg for postgresql) or use the SQLite default") from e
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        file = url[len("sqlite:///"):] if url.startswith("sqlite:///") and len(url) > len("sqlite:///") else None
        if file and file != ":memory:":
            # launches hold params and commands: readable by the bot's user only. Made private before SQLite first
            # opens it, so its -wal and -shm files (created with the database's mode) are private from the start
            with contextlib.suppress(OSError):
                os.close(os.open(file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        try:
            from bot.adapters.store import tables  # every repository's table, whoever opened the database

            ensure_schema(self.engine, tables())
            problem = _integrity_problem(self.engine) if url.startswith("sqlite") else None
        except (OperationalError, DatabaseError) as e:
            self.engine.dispose()
            raise DatabaseUnavailable(self.path, _reason(e)) from e
        except SchemaError as e:
            self.engine.dispose()
            raise DatabaseUnavailable(self.path, str(e)) from e
        if problem is not None:
            self.engine.dispose()
            raise DatabaseUnavailable(self.path, f"database disk image is malformed ({problem})")
        if file and file != ":memory:":  # an older database, made before this: private from now on
            for f in (file, f"{file}-wal", f"{file}-shm"):
                with contextlib.suppress(OSError):
                    os.chmod(f, 0o600)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session whose work is committed on exit (rolled back on an exception). A lock another connection
        holds is waited for up to BUSY_TIMEOUT_S (SQLite's busy handler, with backoff). Raises
        DatabaseUnavailable when the database refuses (still locked after that, disk full, corrupted,
        read-only); other errors (a constraint, a bug) as they are."""
        with self._refusals(), self._sessions.begin() as s:
            yield s

    @contextmanager
    def _refusals(self) -> Iterator[None]:
        """Turn the database refusing (OperationalError, DatabaseError themselves) into DatabaseUnavailable;
        IntegrityError and the other subclasses (the caller's business) pass as they are."""
        try:
            yield
        except (OperationalError, DatabaseError) as e:
            if type(e) not in (OperationalError, DatabaseError):
                raise
            raise DatabaseUnavailable(self.path, _reason(e)) from e

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """A connection for reads with SQLAlchemy Core (no ORM session: a hot read, such as a watch check's look
        at its launch, costs a fifth). Raises DatabaseUnavailable as `transaction` does."""
        with self._refusals(), self.engine.connect() as c:
            yield c

    @contextmanager
    def writing(self) -> Iterator[Connection]:
        """A connection in a transaction for writes with SQLAlchemy Core (committed on exit, rolled back on an
        exception). Raises DatabaseUnavailable as `transaction` does."""
        with self._refusals(), self.engine.begin() as c:
            yield c

    def ping(self) -> None:
        """Ask the database for `SELECT 1` (a health check). Raises DatabaseUnavailable when it does not answer."""
        with self.reading() as c:
            c.exec_driver_sql("SELECT 1")

    def close(self) -> None:
        """Dispose of the engine's connections."""
        self.engine.dispose()


#: libpq settings of every PostgreSQL connection: a server that does not answer a connect within 5 s, or a network
#: that stops carrying the connection's data for 15 s (TCP keepalives, TCP user timeout), is an error, not a wait
#: without end (the outbox reads its queue on the event loop).
PG_CONNECT_ARGS = MappingProxyType({"connect_timeout": 5, "keepalives": 1, "keepalives_idle": 5,
                                    "keepalives_interval": 2, "keepalives_count": 3, "tcp_user_timeout": 15000})


def application_name(identity: str) -> str:
    """PostgreSQL's `application_name` of every session of the bot `identity` (`host:pid`): `gpubot host:pid`, cut to
    PostgreSQL's 63 bytes. A follower that takes the lead from a frozen leader ends every session of that name (the
    frozen bot's row locks go with them; bot.adapters.leader)."""
    return f"gpubot {identity}".encode()[:63].decode("utf-8", "ignore")


def pg_connect_args(url: str) -> dict[str, Any]:
    """The DBAPI connect arguments for the database at `url`: PG_CONNECT_ARGS and this bot's `application_name`
    for a libpq driver (psycopg, psycopg2), none otherwise. Raises ValueError (or ArgumentError) for a URL that does
    not parse."""
    driver = make_url(url).drivername
    if driver not in ("postgresql", "postgresql+psycopg", "postgresql+psycopg2"):
        return {}
    return {**PG_CONNECT_ARGS, "application_name": application_name(f"{socket.gethostname()}:{os.getpid()}")}


def _integrity_problem(engine: Engine) -> str | None:
    """SQLite's `PRAGMA quick_check` (every page and index entry readable; linear in the file's size): None
    when it says ok, else its first complaint (`*** in database main *** Page 5: ...`), on one line."""
    with engine.connect() as c:
        rows = [str(r[0]) for r in c.exec_driver_sql("PRAGMA quick_check(3)")]
    return None if rows == ["ok"] else " ".join(" ".join(rows).split())[:200]


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
    cur.close()
