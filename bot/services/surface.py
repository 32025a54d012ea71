"""The Surface interface: where answers go. Slack (bot/slack/surface.py) and the console implement it.

Handlers never know which one they talk to.
"""

from __future__ import annotations

from typing import Protocol

from bot.present.render import Message


class Surface(Protocol):
    """Posts, edits and attaches. `post` returns the message id (Slack `ts`; a counter on the console)."""

    async def post(self, channel: str, message: Message, *, thread_ts: str | None = None) -> str | None:
        """Post `message` to `channel` (in `thread_ts` when given). Returns its ts, or None on failure."""
        ...

    async def update(self, channel: str, ts: str, message: Message) -> bool:
        """Replace the message `ts` with `message`. Returns True on success."""
        ...

    async def upload(self, channel: str, filename: str, content: bytes, *, thread_ts: str | None = None,
                     title: str | None = None) -> bool:
        """Attach a file in the channel/thread. Returns True on success."""
        ...
