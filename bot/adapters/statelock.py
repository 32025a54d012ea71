"""One bot per database: an exclusive `flock` on `STATE_DIR/gpubot.lock` (or `FILE.lock` beside an SQLite
`database_url`), which holds the owner's PID.

Two bots on one database would both run every scheduled check and post every alert twice, and race on
kills. The kernel drops the lock when the process dies, so a crashed bot never leaves a stale lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = "gpubot.lock"


class StateDirLocked(RuntimeError):
    """Another running gpubot holds the state directory; str() names its PID and the directory."""


class StateLock:
    """The lock of one state directory. `acquire()` takes it (raises StateDirLocked naming the PID that holds
    it, OSError when the directory cannot be used); `release()` gives it back (idempotent)."""

    def __init__(self, state_dir: str, name: str = LOCK_NAME):
        self.dir = Path(os.path.expanduser(state_dir))
        self.path = self.dir / name
        self._fd: int | None = None

    @classmethod
    def for_database(cls, database_url: str | None, state_dir: str) -> StateLock | None:
        """The lock of the database a bot uses: `STATE_DIR/gpubot.lock` for the default database,
        `FILE.lock` beside an SQLite file named by `database_url`, None for a server database (PostgreSQL: bots
        that share it elect a leader instead, bot.adapters.leader)."""
        if database_url is None:
            return cls(state_dir)
        prefix = "sqlite:///"
        if database_url.startswith(prefix) and len(database_url) > len(prefix):
            db = Path(os.path.expanduser(database_url[len(prefix):].split("?", 1)[0]))
            return cls(str(db.parent), db.name + ".lock")
        return None

    def acquire(self) -> StateLock:
        """Take the lock and write this process's PID into the lock file. Returns self."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise StateDirLocked(f"another gpubot (pid {holder}) is running with state_dir {self.dir}; stop it, "
                                 "or give this one its own state_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Give the lock back (the file stays)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
