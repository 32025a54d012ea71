"""What every handler gets and returns: CommandContext in, Message(s) out; roles and the command table."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import IntEnum

from bot.config import Config, Permissions
from bot.core.grammar import CommandCall
from bot.present.render import Message, render
from bot.services.hosts import HostService
from bot.services.launches import LaunchService
from bot.services.surface import Surface

log = logging.getLogger(__name__)


class Role(IntEnum):
    """Permission levels, ordered: a higher role may do everything a lower one may."""

    NONE = 0
    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3


def role_of(user_id: str | None, perms: Permissions, user_groups: set[str] | None = None) -> Role:
    """The role of a Slack user ID under `perms`. `user_groups` are the S... IDs the user belongs to.

    Empty `viewers` means every user may view. The console user ("console") is an admin.
    """
    if user_id == "console":
        return Role.ADMIN
    ids = {user_id} | (user_groups or set())
    ids.discard(None)
    if ids & set(perms.admins) or "*" in perms.admins:
        return Role.ADMIN
    if ids & set(perms.operators) or "*" in perms.operators:
        return Role.OPERATOR
    if not perms.viewers or ids & set(perms.viewers) or "*" in perms.viewers:
        return Role.VIEWER
    return Role.NONE


@dataclass
class CommandContext:
    """Who asked, where, and the services to answer with. `thread_ts` is the Slack thread (None at
    channel level); `source` is "slash", "mention", "prefix", "button" or "console"."""

    user_id: str
    channel_id: str
    config: Config
    hosts: HostService
    thread_ts: str | None = None
    source: str = "console"
    user_groups: set[str] = field(default_factory=set)
    surface: Surface | None = None
    launches: LaunchService | None = None
    #: Set by a handler that opened an incident thread: the answer goes there instead of `thread_ts`.
    reply_thread_ts: str | None = None

    @property
    def role(self) -> Role:
        """This user's role (see `role_of`)."""
        return role_of(self.user_id, self.config.permissions, self.user_groups)


Handler = Callable[[CommandCall, CommandContext], Awaitable[Message]]


@dataclass
class CommandSpec:
    """One row of the command table: name, usage line, one-line summary, minimum role, handler."""

    name: str
    usage: str
    summary: str
    role: Role
    handler: Handler
    aliases: tuple[str, ...] = ()


def error_message(title: str, detail: str, hint: str | None = None) -> Message:
    """A rendered error answer (templates/error.*), marked not ok for the audit trail."""
    msg = render("error", title=title, detail=detail, hint=hint)
    msg.ok = False
    return msg
