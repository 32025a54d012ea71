"""The store's error, in a module of its own: a caller that only catches it (the CLI's command group) does not
import SQLAlchemy."""

from __future__ import annotations

__all__ = ["DatabaseUnavailable"]


class DatabaseUnavailable(Exception):
    """The database (or the state directory that holds it) refused: locked longer than the busy timeout, disk
    full, not a database (corrupted), read-only, or not openable. `path` is the file (or the URL without its
    password), `reason` the database's own words (`database is locked`, `database or disk is full`, `file is
    not a database`). str(): `PATH: REASON`."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason
