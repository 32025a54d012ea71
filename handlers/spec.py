"""One row of the command table: a command's name, its handler, the role it needs, and what derives from it
(help text, slash commands, Slack manifest entries)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bot.core.grammar import CommandCall
from handlers.context import Context, Role
from handlers.reply import Reply

Handler = Callable[[CommandCall, Context], Awaitable[Reply]]


@dataclass(frozen=True)
class CommandSpec:
    """A command. `usage` and `summary` are the help line; `role` the least role that may run it;
    `aliases` other words for it. `slash` is the key of its own slash command (named `/<key>` unless the
    config's `slack.slash_commands` renames it); `default_of` the key of a router slash command that runs it
    when its text names no command (`/gpu` -> status). `hint` and `description` are the Slack manifest's
    usage hint and description of its slash command. `flags` are the `--words` it takes (`yes`); any other is
    refused by the dispatcher rather than ignored."""

    name: str
    handler: Handler
    role: Role
    usage: str
    summary: str
    aliases: tuple[str, ...] = ()
    slash: str | None = None
    default_of: str | None = None
    hint: str = ""
    description: str = ""
    flags: frozenset[str] = frozenset()
