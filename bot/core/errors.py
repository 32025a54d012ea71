"""Errors that the layers above the core share, defined here so that a layer may catch one without importing the
layer that raises it (handlers catch the store's refusal without importing bot.adapters)."""

from __future__ import annotations

__all__ = ["DatabaseUnavailable"]


class DatabaseUnavailable(Exception):
    """The database (or the state directory that holds it) refused: locked longer than the busy timeout, disk
    full, not a database (corrupted), read-only, or not openable. `path` is the file (or the URL without its
    password), `reason` the database's own words (`database is locked`, `database or disk is full`, `file is
    not a database`). str(): `PATH: REASON`. Raised by the store (bot.adapters.store)."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason
