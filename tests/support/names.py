"""How a default install writes the commands it suggests (bot.core.commands tokens), for tests that read pure text
(a verdict's evidence, a preflight problem) or render without a runtime."""

from __future__ import annotations

from bot.config import Config
from bot.core.commands import CommandNames
from bot.present.render import Renderer
from handlers.derive import command_names

#: The default install's names: `/kill`, `/probe`, `/gpu status`, `!logs`.
DEFAULT_NAMES: CommandNames = command_names(Config())


def said(text: str) -> str:
    """`text` as a default install shows it: its suggestion tokens written with DEFAULT_NAMES."""
    return DEFAULT_NAMES.expand(text)


def renderer(*args, **kwargs) -> Renderer:  # type: ignore[no-untyped-def]
    """A Renderer that writes suggestions as the default install does (arguments as Renderer's)."""
    kwargs.setdefault("names", DEFAULT_NAMES)
    return Renderer(*args, **kwargs)
