"""What every handler gets: who asked, where, by which route (`Request`), the services it may call
(`Services`), and the command table (`Context`); roles keyed on Slack user IDs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from bot.config import Config, Permissions
from bot.core.models import Launch
from handlers.reply import SAME, Reply

if TYPE_CHECKING:  # annotations only: the command table (handlers.table) loads without the services' libraries
    from bot.present.render import Message, Renderer
    from bot.services.bundles import BundleService
    from bot.services.confirmations import ConfirmationService
    from bot.services.hosts import HostService
    from bot.services.launches import LaunchService
    from bot.services.stacks import StackService
    from bot.services.watch import Watcher

#: The user id of the console's operator (an admin: the console runs where the bot's config is).
CONSOLE_USER = "console"


class Source(StrEnum):
    """The route a command came by."""

    SLASH = "slash"
    MENTION = "mention"
    PREFIX = "prefix"
    BUTTON = "button"
    CONSOLE = "console"


class Role(IntEnum):
    """Permission levels, ordered: a higher role may do everything a lower one may."""

    NONE = 0
    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3


def role_of(user_id: str | None, perms: Permissions, user_groups: set[str] | frozenset[str] | None = None) -> Role:
    """The role of a Slack user ID under `perms`; `user_groups` are the S... IDs the user belongs to.

    Empty `viewers` means every user may view. The console user ("console") is an admin."""
    if user_id == CONSOLE_USER:
        return Role.ADMIN
    ids = {user_id} | set(user_groups or ())
    ids.discard(None)
    if ids & set(perms.admins) or "*" in perms.admins:
        return Role.ADMIN
    if ids & set(perms.operators) or "*" in perms.operators:
        return Role.OPERATOR
    if not perms.viewers or ids & set(perms.viewers) or "*" in perms.viewers:
        return Role.VIEWER
    return Role.NONE


@dataclass(frozen=True)
class Request:
    """Who asked (Slack user ID and the user groups they belong to), where (channel, thread), by which
    route, for a click the ts of the message that carried the button, and the command's journal row."""

    user_id: str
    channel_id: str
    thread_ts: str | None = None
    source: Source = Source.CONSOLE
    user_groups: frozenset[str] = field(default_factory=frozenset)
    message_ts: str | None = None
    #: the command's row in the journal when it was written ahead (bot.services.audit.Audit.begin_command)
    command_id: int | None = None


@dataclass
class Services:
    """The services handlers may call (built once by bot.wiring). Handlers never reach past them."""

    config: Config
    renderer: Renderer
    hosts: HostService
    launches: LaunchService
    stacks: StackService
    bundles: BundleService
    confirmations: ConfirmationService
    watcher: Watcher


class TableEntry(Protocol):
    """What a handler may read of the command table (help lists it): a row's name, usage, summary and role
    (handlers.spec.CommandSpec is one)."""

    name: str
    usage: str
    summary: str
    role: Role


@dataclass
class Context:
    """One command's request, the services and the command table (for help)."""

    request: Request
    services: Services
    commands: Sequence[TableEntry] = ()

    @property
    def config(self) -> Config:
        """The bot's config."""
        return self.services.config

    @property
    def role(self) -> Role:
        """The requesting user's role."""
        return role_of(self.request.user_id, self.config.permissions, self.request.user_groups)

    @property
    def user(self) -> str:
        """The requesting Slack user ID."""
        return self.request.user_id

    @property
    def channel(self) -> str:
        """The channel the request came from."""
        return self.request.channel_id

    def render(self, name: str, /, **context: Any) -> Message:
        """Render template pair NAME (see bot.present.render.Renderer.render)."""
        return self.services.renderer.render(name, **context)

    def thread_for(self, launch: Launch | None) -> str | object | None:
        """Where an answer about `launch` goes: the launch's incident thread when the launch lives in this
        channel, otherwise the request's own thread (SAME)."""
        if launch is not None and launch.thread_ts and launch.channel == self.channel:
            return launch.thread_ts
        return SAME

    def reply(self, message: Message | None, *, launch: Launch | None = None, audit: str = "ok",
              detail: str | None = None, edits: list[tuple[str, Message]] | None = None) -> Reply:
        """A Reply for this request (about `launch`: in its thread, see `thread_for`)."""
        return Reply(message, thread_ts=self.thread_for(launch), audit=audit, detail=detail,
                     launch_id=launch.id if launch is not None else None, edits=list(edits or []))
