"""The store's error, in a module of its own: a caller that only catches it (the CLI's command group) does not
import SQLAlchemy. The class itself is bot.core.errors.DatabaseUnavailable, so that handlers catch it without
importing this layer."""

from __future__ import annotations

from bot.core.errors import DatabaseUnavailable

__all__ = ["DatabaseUnavailable"]
