"""The outbox's Slack transport: one Web API call per outbox row, Slack's failures sorted into retry / fail.

`chat.postMessage` (with message metadata `{"event_type": "gpubot_outbox", "event_payload": {"key": KEY}}`
so a post can be found again), `chat.update`, `files_upload_v2`, and the lookup before a retry
(`conversations.history` / `conversations.replies` with `include_all_metadata`). The client must have no
retry handlers of its own (`make_client(retries=False)` / `sender_client`): the outbox retries.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.present.render import MAX_MESSAGE_TEXT, slack_text
from bot.services.outbox import DeliveryFailed, DeliveryRetry

log = logging.getLogger(__name__)

#: Message metadata event type that marks gpubot's posts (looked up to avoid posting twice).
METADATA_EVENT = "gpubot_outbox"
#: Slack API error codes that are worth retrying (the rest are permanent for that message).
RETRYABLE_ERRORS = frozenset({"ratelimited", "internal_error", "fatal_error", "service_unavailable",
                              "request_timeout"})
#: Slack errors about the blocks themselves: the message goes again as text alone.
BLOCK_ERRORS = frozenset({"invalid_blocks", "invalid_blocks_format", "msg_blocks_too_long"})
#: Errors of the metadata lookup that mean "cannot look": the post goes out without the check.
LOOKUP_UNAVAILABLE = frozenset({"missing_scope", "not_allowed_token_type", "not_in_channel", "channel_not_found",
                                "thread_not_found", "no_permission", "method_not_supported_for_channel_type"})


def classify(e: BaseException) -> DeliveryRetry | DeliveryFailed:
    """Sort a failed Slack call: 429 -> retry after Retry-After (not ambiguous); 5xx, retryable API errors,
    timeouts and connection errors -> retry with backoff (ambiguous: Slack may have stored the message);
    any other API error -> failed (with `blocks_refused` for the block errors)."""
    if isinstance(e, SlackApiError) and e.response is not None:
        status = getattr(e.response, "status_code", 0) or 0
        data = getattr(e.response, "data", None)
        code = data.get("error") if isinstance(data, dict) else None
        if status == 429 or code == "ratelimited":
            headers = getattr(e.response, "headers", None) or {}
            raw = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
            try:
                delay: float | None = max(0.0, float(raw if not isinstance(raw, list) else raw[0]))
            except (TypeError, ValueError):
                delay = None
            return DeliveryRetry(code or "HTTP 429", delay, ambiguous=False)
        if status >= 500:
            return DeliveryRetry(f"HTTP {status}", None, ambiguous=True)
        if code in RETRYABLE_ERRORS:
            return DeliveryRetry(str(code), None, ambiguous=True)
        return DeliveryFailed(str(code or f"HTTP {status}"), blocks_refused=code in BLOCK_ERRORS)
    if isinstance(e, (asyncio.TimeoutError, OSError, ConnectionError)) or type(e).__module__.startswith("aiohttp"):
        return DeliveryRetry(f"{type(e).__name__}", None, ambiguous=True)
    return DeliveryFailed(f"{type(e).__name__}: {e}"[:200])


async def _call(call: Any) -> Any:
    """Await one Web API call; its failures become DeliveryRetry or DeliveryFailed (see `classify`)."""
    try:
        return await call
    except asyncio.CancelledError:
        raise
    except Exception as e:
        raise classify(e) from e


def _text(text: str) -> str:
    """Message text for Slack: mrkdwn-escaped except for user mentions (`<@U...>`, which stay real mentions
    in notifications), within Slack's limit, never empty."""
    return slack_text(text or "")[:MAX_MESSAGE_TEXT] or " "


class SlackTransport:
    """The outbox Transport over an AsyncWebClient without retry handlers."""

    def __init__(self, client: AsyncWebClient):
        self.client = client

    async def post(self, *, channel: str, text: str, blocks: list | None, thread_ts: str | None, key: str) -> str:
        """chat.postMessage with the row key as metadata; returns the message ts."""
        resp = await _call(self.client.chat_postMessage(
            channel=channel, text=_text(text), blocks=blocks, thread_ts=thread_ts, unfurl_links=False,
            unfurl_media=False, metadata={"event_type": METADATA_EVENT, "event_payload": {"key": key}}))
        return str(resp.get("ts"))

    async def update(self, *, channel: str, ts: str, text: str, blocks: list | None) -> None:
        """chat.update; blocks None sends `[]`, which clears the old blocks."""
        await _call(self.client.chat_update(channel=channel, ts=ts, text=_text(text),
                                            blocks=blocks if blocks is not None else []))

    async def post_ephemeral(self, *, channel: str, user: str, text: str, blocks: list | None,
                             thread_ts: str | None) -> None:
        """chat.postEphemeral: `text`/`blocks` shown to `user` alone in the channel or thread."""
        await _call(self.client.chat_postEphemeral(channel=channel, user=user, text=_text(text), blocks=blocks,
                                                   thread_ts=thread_ts))

    async def delete(self, *, channel: str, ts: str) -> None:
        """chat.delete of the bot's own message `ts`."""
        await _call(self.client.chat_delete(channel=channel, ts=ts))

    async def upload(self, *, channel: str, thread_ts: str | None, filename: str, content: bytes, title: str) -> None:
        """files_upload_v2 into the channel or thread."""
        await _call(self.client.files_upload_v2(channel=channel, thread_ts=thread_ts, filename=filename,
                                                content=content, title=title))

    async def find_posted(self, *, channel: str, thread_ts: str | None, key: str, oldest: float) -> str | None:
        """The ts of a gpubot post carrying `key` since `oldest`, from the newest 1000 messages of the channel
        or thread; None when there is none or Slack refuses the lookup for good (missing scope, ...)."""
        args = {"channel": channel, "oldest": f"{oldest:.6f}", "include_all_metadata": True, "limit": 1000}
        try:
            if thread_ts:
                resp = await self.client.conversations_replies(ts=thread_ts, **args)
            else:
                resp = await self.client.conversations_history(**args)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            c = classify(e)
            if isinstance(c, DeliveryFailed):
                if str(c) not in LOOKUP_UNAVAILABLE:
                    log.warning("outbox: cannot look for an earlier copy of a post (%s); posting", c)
                return None
            raise c from e
        for m in resp.get("messages") or []:
            meta = m.get("metadata") or {}
            if meta.get("event_type") == METADATA_EVENT and (meta.get("event_payload") or {}).get("key") == key:
                return str(m.get("ts"))
        return None
