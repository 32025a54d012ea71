"""Filters every command passes through, once, before its handler (in the spirit of errbot's
`@cmdfilter`): the channel allow-list, then the role check. Each raises UserError (audited `denied`) or
returns nothing."""

from __future__ import annotations

import logging
from collections.abc import Callable

from bot.core.grammar import CommandCall
from handlers.context import Context, Role, Source
from handlers.reply import UserError
from handlers.spec import CommandSpec

log = logging.getLogger(__name__)

Filter = Callable[[CommandSpec, CommandCall, Context], None]


def channel_filter(spec: CommandSpec, call: CommandCall, ctx: Context) -> None:
    """With `permissions.channels` set, commands that need a role are taken only in those channels (the
    console is not a channel)."""
    chans = ctx.config.permissions.channels
    if chans and ctx.request.source != Source.CONSOLE and ctx.channel not in chans and spec.role > Role.NONE:
        raise UserError("Not allowed here", "gpubot does not take commands in this channel",
                        f"Allowed channel IDs: {', '.join(chans)}", audit="denied")


def role_filter(spec: CommandSpec, call: CommandCall, ctx: Context) -> None:
    """The user's role (by Slack user ID and user groups) must be at least the command's."""
    role = ctx.role
    if role < spec.role:
        log.info("denied %s to %s (role %s, needs %s)", spec.name, ctx.user, role.name, spec.role.name)
        raise UserError("Permission denied", f"`{spec.name}` needs the {spec.role.name.lower()} role",
                        "Ask an admin to add your Slack user ID to the config's permissions.", audit="denied")


#: The filters of every route, in order.
FILTERS: tuple[Filter, ...] = (channel_filter, role_filter)
