"""The commands: one module per command, one table (`COMMANDS`), one pipeline (`Dispatcher`) for every
route. A handler gets a `Context` (request + services) and returns a `Reply` or raises `UserError`."""

from handlers.context import CONSOLE_USER, Context, Request, Role, Services, Source, role_of
from handlers.derive import grammar, manifest, slash_names, vocabulary
from handlers.dispatch import Dispatcher
from handlers.reply import SAME, Reply, UserError, deliver
from handlers.spec import CommandSpec
from handlers.table import COMMANDS

__all__ = [
    "COMMANDS",
    "CONSOLE_USER",
    "SAME",
    "CommandSpec",
    "Context",
    "Dispatcher",
    "Reply",
    "Request",
    "Role",
    "Services",
    "Source",
    "UserError",
    "deliver",
    "grammar",
    "manifest",
    "role_of",
    "slash_names",
    "vocabulary",
]
