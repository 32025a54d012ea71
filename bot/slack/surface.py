"""The Slack Surface and Web API clients.

`OutboxSurface` queues every post, edit and file in the outbox (bot/outbox.py), whose sender makes the
chat.postMessage / chat.update / files_upload_v2 calls; Slack's failures never reach handlers.
"""

from __future__ import annotations

from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from bot.present.render import Message
from bot.services.outbox import Outbox, ref


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


class OutboxSurface:
    """The Surface the bot uses in Slack: every post, edit and file goes through the Outbox (database
    first, one sender; see bot/outbox.py).

    `post` waits up to `wait_s` seconds for the message to be sent: it returns the Slack ts when it was,
    None when Slack refused it for good (`last_error` says why, e.g. `not_in_channel`), and otherwise a
    `q:<id>` reference that stands for the ts (usable as thread_ts and for `update`) until it is sent.
    `update` and `upload` queue and return True.
    """

    def __init__(self, outbox: Outbox, *, wait_s: float = 5.0):
        self.outbox = outbox
        self.wait_s = wait_s
        self.last_error: str | None = None

    async def post(self, channel: str, message: Message, *, thread_ts: str | None = None,
                   wait_s: float | None = None) -> str | None:
        """Queue chat.postMessage (files follow as uploads). Returns ts, None (refused) or a `q:` ref."""
        row_id = self.outbox.post(channel, message, thread_ts=thread_ts)
        d = await self.outbox.wait(row_id, self.wait_s if wait_s is None else wait_s)
        if d.state == "sent":
            return d.ts
        if d.state == "failed":
            self.last_error = d.error
            return None
        return ref(row_id)

    async def update(self, channel: str, ts: str, message: Message) -> bool:
        """Queue chat.update of `ts` (a ts or `q:` ref); a queued older edit of it is dropped. True."""
        self.outbox.update(channel, ts, message)
        return True

    async def upload(self, channel: str, filename: str, content: bytes, *, thread_ts: str | None = None,
                     title: str | None = None) -> bool:
        """Queue a file upload into `thread_ts`. Returns True."""
        self.outbox.upload(channel, filename, content, thread_ts=thread_ts, title=title)
        return True
