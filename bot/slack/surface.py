"""Slack implementation of the Surface: chat.postMessage / chat.update / files_upload_v2 via AsyncWebClient.

Failures (429 after the SDK's retries, 5xx, not_in_channel, ...) are logged and reported as None/False,
never raised into handlers.
"""

from __future__ import annotations

import logging

from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from bot.render import Message, mrkdwn_escape

log = logging.getLogger(__name__)


def slack_error(e: BaseException) -> str:
    """A short description of a failed Slack call: the API error code (`not_in_channel`), or the HTTP
    status for non-JSON answers (`HTTP 502`), or the exception type for network errors."""
    if isinstance(e, SlackApiError) and e.response is not None:
        data = getattr(e.response, "data", None)
        if isinstance(data, dict) and data.get("error"):
            return str(data["error"])
        status = getattr(e.response, "status_code", None)
        return f"HTTP {status}" if status else "Slack API error"
    if isinstance(e, SlackClientError):
        return f"Slack client error: {type(e).__name__}"
    return f"{type(e).__name__}: {e}"[:200]


def retry_handlers() -> list:
    """slack_sdk retry handlers: connection errors, 429 honoring Retry-After (3 tries), 5xx (2 tries)."""
    return [
        AsyncConnectionErrorRetryHandler(max_retry_count=2),
        AsyncRateLimitErrorRetryHandler(max_retry_count=3),
        AsyncServerErrorRetryHandler(max_retry_count=2),
    ]


def make_client(token: str, base_url: str | None = None, **kwargs) -> AsyncWebClient:
    """An AsyncWebClient with gpubot's retry handlers; `base_url` overrides https://slack.com/api/."""
    if base_url:
        kwargs["base_url"] = base_url
    return AsyncWebClient(token=token, retry_handlers=retry_handlers(), **kwargs)


class SlackSurface:
    """Posts Messages with the bot token. `last_error` keeps the last Slack error code for callers."""

    def __init__(self, client: AsyncWebClient):
        self.client = client
        self.last_error: str | None = None

    async def post(self, channel: str, message: Message, *, thread_ts: str | None = None) -> str | None:
        """chat.postMessage with blocks + text fallback; attached files go to the same thread. Returns ts."""
        try:
            resp = await self.client.chat_postMessage(
                channel=channel, text=mrkdwn_escape(message.text)[:40_000], blocks=message.blocks, thread_ts=thread_ts,
                unfurl_links=False, unfurl_media=False,
            )
        except Exception as e:  # SlackApiError (any body, even HTML), client, network: never into handlers
            self.last_error = slack_error(e)
            log.warning("chat.postMessage to %s failed: %s", channel, self.last_error)
            return None
        ts = resp.get("ts")
        for name, data in message.files:
            await self.upload(channel, name, data, thread_ts=thread_ts or ts)
        return ts

    async def update(self, channel: str, ts: str, message: Message) -> bool:
        """chat.update of a message the bot posted. Returns True on success."""
        try:
            await self.client.chat_update(channel=channel, ts=ts, text=mrkdwn_escape(message.text)[:40_000],
                                          blocks=message.blocks)
            return True
        except Exception as e:
            self.last_error = slack_error(e)
            log.warning("chat.update %s/%s failed: %s", channel, ts, self.last_error)
            return False

    async def upload(self, channel: str, filename: str, content: bytes, *, thread_ts: str | None = None,
                     title: str | None = None) -> bool:
        """files_upload_v2 into the channel/thread. Returns True on success."""
        try:
            await self.client.files_upload_v2(channel=channel, thread_ts=thread_ts, filename=filename,
                                              content=content, title=title or filename)
            return True
        except Exception as e:
            self.last_error = slack_error(e)
            log.warning("file upload %s to %s failed: %s", filename, channel, self.last_error)
            return False
