"""The database: one SQLAlchemy engine, its sessions, and the declarative base of every table.

SQLite through SQLAlchemy 2.0 is the embedded default (a file `gpubot.db` in the config's `state_dir`,
WAL journal, mode 0600); any SQLAlchemy URL can be given instead. Every write is its own short
transaction, so a crash never leaves half a launch. Synchronous by design: SQLite on the event loop is fine
at chat-ops volumes (a few writes per command).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from bot.adapters.store.migrations import add_missing_columns


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
    is the only way in for the repositories. Raises sqlalchemy errors for a broken database."""

    def __init__(self, url: str):
        self.url = url
        self.engine: Engine = create_engine(url, future=True)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        Base.metadata.create_all(self.engine)
        add_missing_columns(self.engine, Base.metadata)
        if url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
            try:  # launches hold params and commands: readable by the bot's user only
                os.chmod(url[len("sqlite:///"):], 0o600)
            except OSError:
                pass
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session whose work is committed on exit (rolled back on an exception)."""
        with self._sessions.begin() as s:
            yield s

    def close(self) -> None:
        """Dispose of the engine's connections."""
        self.engine.dispose()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=2000")
    cur.close()
