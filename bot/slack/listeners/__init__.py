"""Bolt listeners, one module per family, each with `register(app, bot)` (the Bolt starter template's
layout). Every callback acks first and stays small: the work goes to `SlackBot.run` and the dispatcher."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slack_bolt.async_app import AsyncApp

from bot.slack.listeners import actions, commands, messages

if TYPE_CHECKING:
    from bot.slack.bot import SlackBot


def register(app: AsyncApp, bot: SlackBot) -> None:
    """Register every listener family on `app`."""
    commands.register(app, bot)
    messages.register(app, bot)
    actions.register(app, bot)
