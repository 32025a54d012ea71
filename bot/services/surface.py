"""Where answers go: the Surface interface, and the outbox-backed surface the Slack bot uses.

Handlers and services never know whether they talk to Slack or to a terminal: they post, edit and attach
through a `Surface`. `OutboxSurface` (Slack) writes everything to the outbox first; the console prints
(bot.console.ConsoleSurface); tests record (tests/support).
"""

from __future__ import annotations

from typing import Protocol

from bot.present.render import Message
from bot.services.outbox import Outbox, ref, ref_id


class Surface(Protocol):
    """Posts, edits and attaches. `post` returns the message id (Slack `ts`, or a `q:` reference while it is
    queued; a counter on the console), or None when the message was refused."""

    async def post(self, channel: str, message: Message, *, thread_ts: str | None = None) -> str | None:
        """Post `message` to `channel` (in `thread_ts` when given). Returns its ts, or None on failure."""
        ...

    async def update(self, channel: str, ts: str, message: Message) -> bool:
        """Replace the message `ts` with `message`. Returns True when it was queued or done."""
        ...

    async def upload(self, channel: str, filename: str, content: bytes, *, thread_ts: str | None = None,
                     title: str | None = None) -> bool:
        """Attach a file in the channel/thread. Returns True when it was queued or done."""
        ...

    async def post_ephemeral(self, channel: str, user: str, message: Message, *,
                             thread_ts: str | None = None) -> str | None:
        """Show `message` to `user` alone (it cannot be edited later; files are not sent). Returns an id for
        the record, or None when it was refused."""
        ...

    async def delete(self, channel: str, ts: str) -> bool:
        """Delete the message `ts`. Returns True when it was queued or done."""
        ...


class OutboxSurface:
    """The Surface of the Slack bot: every post, edit and file goes through the Outbox (database first, one
    sender; see bot.services.outbox).

    `post` waits up to `wait_s` seconds for the message to be sent: it returns the Slack ts when it was,
    None when Slack refused it for good (`last_error` says why, e.g. `not_in_channel`), and otherwise a
    `q:<id>` reference that stands for the ts (usable as thread_ts and for `update`) until it is sent.
    `update` and `upload` queue and return True. A post still only queued can take another message
    (`take_place`) or be dropped unsent (`withdraw`) instead of being edited or deleted after it was sent.
    """

    def __init__(self, outbox: Outbox, *, wait_s: float = 5.0):
        self.outbox = outbox
        self.wait_s = wait_s
        self.last_error: str | None = None

    async def post(self, channel: str, message: Message, *, thread_ts: str | None = None,
                   wait_s: float | None = None) -> str | None:
        """Queue a post (files follow as uploads). Returns ts, None (refused) or a `q:` reference."""
        row_id = self.outbox.post(channel, message, thread_ts=thread_ts)
        return await self._posted(row_id, wait_s)

    async def _posted(self, row_id: int, wait_s: float | None) -> str | None:
        """What `post` returns for post `row_id`, after waiting up to `wait_s` (default the surface's) seconds."""
        d = await self.outbox.wait(row_id, self.wait_s if wait_s is None else wait_s)
        if d.state == "sent":
            return d.ts
        if d.state == "failed":
            self.last_error = d.error
            return None
        return ref(row_id)

    def take_place(self, channel: str, ts: str, message: Message) -> bool:
        """Make the post `ts` (a `q:` reference) carry `message` instead while it is still only queued, so that
        one post goes instead of a post and its edit; references to `ts` stay valid, and the files of `message`
        follow as uploads into its thread (bot.services.outbox.Outbox.replace_queued_post). Returns False when it
        is too late (the post is on its way or sent, or went straight to Slack) or `ts` is a Slack ts: edit it."""
        rid = ref_id(ts)
        return rid is not None and self.outbox.replace_queued_post(rid, channel, message)

    def withdraw(self, channel: str, ts: str) -> bool:
        """Drop the post `ts` (a `q:` reference) while it is still only queued: it is never sent. Returns False
        when it is too late (see `take_place`): delete it."""
        rid = ref_id(ts)
        return rid is not None and self.outbox.withdraw_queued_post(rid, channel)

    async def settled(self, ts: str, *, wait_s: float | None = None) -> str | None:
        """What `post` would have returned for the post `ts` (a `q:` reference, e.g. after `take_place`): the
        Slack ts once sent within `wait_s` seconds (default the surface's), None when Slack refused it for good
        (`last_error` says why), else `ts` itself."""
        rid = ref_id(ts)
        return ts if rid is None else await self._posted(rid, wait_s)

    async def update(self, channel: str, ts: str, message: Message) -> bool:
        """Queue an edit of `ts` (a ts or `q:` reference); a queued older edit of it is dropped. True."""
        self.outbox.update(channel, ts, message)
        return True

    async def post_ephemeral(self, channel: str, user: str, message: Message, *,
                             thread_ts: str | None = None, wait_s: float | None = None) -> str | None:
        """Queue a message for `user` alone (chat.postEphemeral), waiting up to `wait_s` (default the
        surface's) for it. Returns its `q:` reference, or None when Slack refused it for good (`last_error`
        says why; the caller then answers through the slash command's response_url)."""
        row_id = self.outbox.ephemeral(channel, user, message, thread_ts=thread_ts)
        d = await self.outbox.wait(row_id, self.wait_s if wait_s is None else wait_s)
        if d.state == "failed":
            self.last_error = d.error
            return None
        return ref(row_id)

    async def delete(self, channel: str, ts: str) -> bool:
        """Queue the deletion of `ts` (a ts or `q:` reference). Returns True."""
        self.outbox.delete(channel, ts)
        return True

    async def upload(self, channel: str, filename: str, content: bytes, *, thread_ts: str | None = None,
                     title: str | None = None) -> bool:
        """Queue a file upload into `thread_ts`. Returns True."""
        self.outbox.upload(channel, filename, content, thread_ts=thread_ts, title=title)
        return True
