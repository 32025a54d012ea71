"""The commands: one module per command, one table (`COMMANDS`), one pipeline (`Dispatcher`) for every
route. A handler gets a `Context` (request + services) and returns a `Reply` or raises `UserError`.

The public names are re-exported lazily (PEP 562 `__getattr__`): `from handlers import Dispatcher` imports
handlers.dispatch on first use, so checking a config against the command table (handlers.derive, for
`gpubot check-config`) does not import the dispatcher, the services and their libraries."""

from __future__ import annotations

from importlib import import_module
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from handlers.context import CONSOLE_USER, Context, Request, Role, Services, Source, role_of
    from handlers.derive import grammar, manifest, slash_names, vocabulary
    from handlers.dispatch import Dispatcher
    from handlers.reply import SAME, Reply, UserError, deliver
    from handlers.spec import CommandSpec
    from handlers.table import COMMANDS

#: Each public name -> the module that defines it.
_EXPORTS = MappingProxyType({name: f"handlers.{module}" for module, names in {
    "context": ("CONSOLE_USER", "Context", "Request", "Role", "Services", "Source", "role_of"),
    "derive": ("grammar", "manifest", "slash_names", "vocabulary"),
    "dispatch": ("Dispatcher",),
    "reply": ("SAME", "Reply", "UserError", "deliver"),
    "spec": ("CommandSpec",),
    "table": ("COMMANDS",),
}.items() for name in names})

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


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (then kept here). Anything else is not an attribute,
    so `from handlers import args` still imports the submodule."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
