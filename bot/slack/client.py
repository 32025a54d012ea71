"""Slack Web API clients: one with slack_sdk's retry handlers for the bot's own reads (auth.test, user
groups), and one without them for the outbox, which retries itself (bot.services.outbox)."""

from __future__ import annotations

from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient


def retry_handlers() -> list:
    """slack_sdk retry handlers: connection errors, 429 honoring Retry-After (3 tries), 5xx (2 tries)."""
    return [
        AsyncConnectionErrorRetryHandler(max_retry_count=2),
        AsyncRateLimitErrorRetryHandler(max_retry_count=3),
        AsyncServerErrorRetryHandler(max_retry_count=2),
    ]


def make_client(token: str, base_url: str | None = None, *, retries: bool = True, **kwargs) -> AsyncWebClient:
    """An AsyncWebClient with gpubot's retry handlers (none with `retries=False`: the outbox's client,
    which retries itself); `base_url` overrides https://slack.com/api/."""
    if base_url:
        kwargs["base_url"] = base_url
    return AsyncWebClient(token=token, retry_handlers=retry_handlers() if retries else [], **kwargs)


def sender_client(client: AsyncWebClient) -> AsyncWebClient:
    """A copy of `client` (same token, URL and HTTP session) without retry handlers, for the outbox."""
    return AsyncWebClient(token=client.token, base_url=client.base_url, session=client.session,
                          timeout=client.timeout, retry_handlers=[])
