"""`@gpubot CMD` mentions and `!CMD` messages, answered in their thread (slash commands cannot be used in
threads: this is how a launch's thread runs commands)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from slack_bolt.async_app import AsyncApp

from bot.core.grammar import CommandCall, CommandParseError
from handlers import Source

if TYPE_CHECKING:
    from bot.slack.bot import SlackBot

#: Message subtypes that are never commands (the bot's own posts, edits, deletions).
IGNORED_SUBTYPES = ("bot_message", "message_changed", "message_deleted")


def register(app: AsyncApp, bot: SlackBot) -> None:
    """Mentions and `!` messages: drop bots, edits and redeliveries; a `!word` that names no command is chat."""
    prefix = bot.config.slack.command_prefix
    grammar = bot.dispatcher.grammar

    async def handle(event: dict, context, source: Source) -> None:
        """One message event: run it when it is a command for the bot, once."""
        key = f"msg:{event.get('channel')}:{event['ts']}" if event.get("ts") else None
        if event.get("bot_id") or event.get("subtype") in IGNORED_SUBTYPES or not event.get("channel") \
                or not event.get("user") or not bot.seen.first(key):
            return
        text = event.get("text") or ""
        if source == Source.PREFIX and not grammar.addresses(text, prefix, bot.config.hosts):
            return  # "!important: prod is down" is chat, not a command
        try:
            call: CommandCall | CommandParseError | None = grammar.parse_message(
                text, bot_user_id=context.get("bot_user_id"), prefix=prefix)
        except CommandParseError as e:
            call = e
        if call is None or (key and not await bot.claimed(key)):  # chat costs no database write
            return
        bot.spawn(bot.run(user_id=event["user"], channel_id=event["channel"], source=source,
                          thread_ts=event.get("thread_ts") or event.get("ts"),
                          word=getattr(call, "word", "") or "command", work=lambda r: bot.dispatcher.run(r, call),
                          text=text))

    @app.event("app_mention")
    async def on_mention(event, context):
        """`@gpubot CMD`."""
        await handle(event, context, Source.MENTION)

    @app.message(re.compile(r"^\s*" + re.escape(prefix) + r"\S"))
    async def on_prefix(message, context):
        """`!CMD`."""
        await handle(message, context, Source.PREFIX)

    @app.event("message")
    async def on_other_message(event, context):
        """Any other message: an edit that makes (or keeps) a command is not run, but audited and answered to
        its author; everything else is chat (handled here so Bolt does not log "unhandled")."""
        if event.get("subtype") != "message_changed":
            return None
        edited = event.get("message") or {}
        text, user, channel = edited.get("text") or "", edited.get("user"), event.get("channel")
        if not user or not channel or edited.get("bot_id"):
            return None
        addressed = grammar.addresses(text, prefix, bot.config.hosts) or (
            context.get("bot_user_id") and f"<@{context.get('bot_user_id')}>" in text)
        if not addressed or not await bot.first_delivery(f"edit:{channel}:{edited.get('ts')}:{event.get('event_ts')}"):
            return None
        why = "an edited message is not run as a command; send it again as a new message"
        bot.spawn(bot.run(user_id=user, channel_id=channel, source=Source.PREFIX,
                          thread_ts=edited.get("thread_ts") or edited.get("ts"), word="edit",
                          work=lambda r: bot.dispatcher.ignored(r, text, why), text=text))
        return None
