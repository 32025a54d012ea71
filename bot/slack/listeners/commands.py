"""Slash commands: one listener for every slash command of the command table, under its configured name."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from slack_bolt.async_app import AsyncApp

from bot.core.grammar import CommandCall, CommandParseError
from handlers import Source, slash_names

if TYPE_CHECKING:
    from bot.slack.bot import SlackBot

log = logging.getLogger(__name__)


def register(app: AsyncApp, bot: SlackBot) -> None:
    """`/gpu ...`, `/probe ...`, `/launch ...` (and the others the table declares): ack, drop a redelivery
    (same trigger_id), parse, run."""

    async def on_slash(ack, command, respond) -> None:
        """One slash command: ack, dedupe, parse, dispatch."""
        await ack()  # first, always: Slack shows an error after 3 s without it
        if not await bot.first_delivery(f"cmd:{command['trigger_id']}" if command.get("trigger_id") else None):
            log.info("duplicate slash command delivery dropped")
            return
        try:
            call: CommandCall | CommandParseError = bot.dispatcher.grammar.parse_slash(command.get("command", ""),
                                                                                      command.get("text", ""))
        except CommandParseError as e:
            call = e
        bot.spawn(bot.run(user_id=command.get("user_id", ""), channel_id=command.get("channel_id", ""),
                          thread_ts=None, source=Source.SLASH, word=getattr(call, "word", "") or "command",
                          work=lambda r: bot.dispatcher.run(r, call), respond=respond,
                          text=f"{command.get('command', '')} {command.get('text', '')}".strip()))

    for name in slash_names(bot.config).values():
        app.command(name)(on_slash)
