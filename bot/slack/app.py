"""The Bolt AsyncApp and the glue between Bolt and the dispatcher.

Every listener acks first (nothing slow before the ack: no SSH connect, no database wait), then hands the
work to `SlackBot.run` as a tracked task. Listeners are registered per family (bot.slack.listeners:
commands, messages, actions), each with `register(app, bot)`. Duplicate deliveries (Slack retries, Socket
Mode reconnects) are dropped by envelope/event id.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_sdk.web.async_client import AsyncWebClient

from bot.config import Config
from bot.slack import listeners
from bot.slack.bot import SlackBot
from bot.slack.client import sender_client
from bot.slack.transport import SlackTransport
from bot.wiring import Runtime, build_runtime

log = logging.getLogger(__name__)


class _DropClientTokenWarning(logging.Filter):
    """Bolt warns that `token` is unused whenever SLACK_BOT_TOKEN is set and a client is passed: expected."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()  # also: the token is ignored because gpubot passes its own `authorize`
        return "`token` will be unused" not in text and "will be ignored" not in text


logging.getLogger("slack_bolt.AsyncApp").addFilter(_DropClientTokenWarning())

#: Seconds between auth.test attempts while Slack's Web API fails (requests are handled meanwhile).
AUTH_RETRY_S = 30.0


def build_app(runtime: Runtime, client: AsyncWebClient, *,
              signing_secret: str | None = None) -> tuple[AsyncApp, SlackBot]:
    """The Bolt AsyncApp with every listener family registered, and its SlackBot.

    `signing_secret` is required for HTTP mode (request signing); Socket Mode does not use it."""
    identity: dict[str, Any] = {}
    quick = sender_client(client)

    async def identify() -> None:
        """One quick auth.test (no SDK retries, 1 s at most): its answer is kept; after a failure it is not
        tried again for AUTH_RETRY_S."""
        try:
            identity["auth"] = await asyncio.wait_for(quick.auth_test(), 1.0)
        except Exception as e:
            identity["failed_at"] = time.monotonic()
            log.warning("auth.test failed (%s); handling requests without the bot's identity for now",
                        type(e).__name__)

    async def authorize(enterprise_id, team_id, user_id) -> AuthorizeResult:
        """The bot's identity from auth.test, cached after the first success. While Slack's Web API is
        down, requests are still handled with the token alone (answers wait in the outbox) instead of
        Bolt's default, which refuses every request whose auth.test call fails."""
        if "auth" not in identity:
            # runs before the listener (in Socket Mode after the ack: bot.slack.socket); requests arriving
            # together wait for one auth.test, not one each
            if time.monotonic() - identity.get("failed_at", -AUTH_RETRY_S) >= AUTH_RETRY_S:
                asking = identity.get("asking")
                if asking is None or asking.done():
                    asking = identity["asking"] = asyncio.ensure_future(identify())
                await asyncio.shield(asking)
            if "auth" not in identity:
                return AuthorizeResult(enterprise_id=enterprise_id, team_id=team_id, user_id=user_id,
                                       bot_token=client.token)
        return AuthorizeResult.from_auth_test_response(auth_test_response=identity["auth"], bot_token=client.token)

    # process_before_response: the listeners are short (they ack, then hand the work to SlackBot.run), so Bolt
    # runs each to its end before answering, without polling for its ack every 10 ms; a Socket Mode envelope's
    # Bolt task then ends once its work is spawned (bot.slack.socket)
    app = AsyncApp(client=client, signing_secret=signing_secret, authorize=authorize,
                   request_verification_enabled=signing_secret is not None, process_before_response=True)
    bot = SlackBot(runtime, client)
    listeners.register(app, bot)
    return app, bot


def slack_runtime(config: Config, client: AsyncWebClient, **options: Any) -> Runtime:
    """The runtime of a Slack bot: answers through the outbox over a SlackTransport on a copy of `client`
    without retry handlers (see bot.wiring.build_runtime for `options`)."""
    return build_runtime(config, transport=SlackTransport(sender_client(client)), **options)

