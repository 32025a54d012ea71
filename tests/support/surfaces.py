"""A Surface that records what would be posted (the Slack one is tested end to end against the fake Slack)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from bot.present.render import Message


@dataclass
class Post:
    """One posted message: channel, ts, thread (None at channel level), the message, and its edits."""

    channel: str
    ts: str
    thread_ts: str | None
    message: Message
    edits: list[Message] = field(default_factory=list)
    files: list[tuple[str, bytes]] = field(default_factory=list)
    ephemeral_to: str | None = None
    deleted: bool = False

    @property
    def current(self) -> Message:
        """The message as it reads now (after its edits)."""
        return self.edits[-1] if self.edits else self.message

    @property
    def text(self) -> str:
        """The current text."""
        return self.current.text

    @property
    def blocks(self) -> list[dict[str, Any]]:
        """The current blocks."""
        return self.current.blocks or []

    def buttons(self, *, original: bool = False) -> list[dict[str, Any]]:
        """Every button of the current blocks (of the message as first posted with `original`: what a
        client that has not refreshed still shows); the label is in `label`."""
        out = []
        for b in (self.message.blocks or []) if original else self.blocks:
            if b.get("type") == "actions":
                for el in b.get("elements", []):
                    if el.get("type") == "button":
                        out.append({**el, "label": el.get("text", {}).get("text", "")})
        return out


class RecordingSurface:
    """Records posts, edits and uploads; ts values look like Slack's and increase."""

    def __init__(self, channel_prefix: str = "1700000000"):
        self._n = itertools.count(1)
        self._prefix = channel_prefix
        self.posts: list[Post] = []
        self.uploads: list[tuple[str, str | None, str, bytes]] = []

    def _ts(self) -> str:
        return f"{self._prefix}.{next(self._n):06d}"

    async def post(self, channel: str, message: Message, *, thread_ts: str | None = None) -> str | None:
        """Record a post; returns its new ts."""
        ts = self._ts()
        self.posts.append(Post(channel, ts, thread_ts, message, files=list(message.files)))
        return ts

    async def post_ephemeral(self, channel: str, user: str, message: Message, *,
                             thread_ts: str | None = None) -> str | None:
        """Record a message only `user` sees (`ephemeral_to`); returns its ts (for the record only)."""
        ts = self._ts()
        self.posts.append(Post(channel, ts, thread_ts, message, ephemeral_to=user))
        return ts

    async def delete(self, channel: str, ts: str) -> bool:
        """Mark message `ts` deleted (False when no such message was posted)."""
        post = self.get(ts)
        if post is None:
            return False
        post.deleted = True
        return True

    async def update(self, channel: str, ts: str, message: Message) -> bool:
        """Record an edit of message `ts` (False when no such message was posted)."""
        post = self.get(ts)
        if post is None:
            return False
        post.edits.append(message)
        return True

    async def upload(self, channel: str, filename: str, content: bytes, *, thread_ts: str | None = None,
                     title: str | None = None) -> bool:
        """Record an upload."""
        self.uploads.append((channel, thread_ts, filename, content))
        return True

    def get(self, ts: str | None) -> Post | None:
        """The post with this ts, or None."""
        return next((p for p in self.posts if p.ts == ts), None)

    def in_thread(self, thread_ts: str | None) -> list[Post]:
        """Posts in the thread under `thread_ts`, oldest first."""
        return [p for p in self.posts if p.thread_ts == thread_ts and thread_ts is not None]
