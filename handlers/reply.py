"""What a handler returns (`Reply`) or raises (`UserError`): typed results, no side channels."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # annotations only (bot.services.surface imports the outbox and the database)
    from bot.present.render import Message
    from bot.services.surface import Surface


class _Same:
    """The type of SAME: "the thread the request came from"."""

    def __repr__(self) -> str:
        return "SAME"


#: A Reply's thread when it answers where the request was made.
SAME: Final = _Same()


@dataclass
class Reply:
    """An answer: the `message` (None when the answer is only `edits`), where it goes (`channel` None: the
    request's channel; `thread_ts` SAME: the request's thread, None: channel level), what the audit trail
    records (`audit` result, `detail`, `launch_id`), and `edits`: (ts, message) of messages in the channel to
    replace first (a decided confirmation). `private_to`: a Slack user ID who alone sees the message
    (ephemeral: permission denials and usage errors go only to the person who typed them). `taken_over`: another
    bot took the command over and answered it (this one was taken for gone): nothing of this reply is sent."""

    message: Message | None
    thread_ts: str | object | None = SAME
    channel: str | None = None
    audit: str = "ok"
    detail: str | None = None
    launch_id: int | None = None
    edits: list[tuple[str, Message]] = field(default_factory=list)
    private_to: str | None = None
    taken_over: bool = False

    def placed(self, channel: str, thread_ts: str | None) -> Reply:
        """A copy whose channel and thread are concrete: those of the request where the reply left them."""
        return replace(self, channel=self.channel or channel,
                       thread_ts=thread_ts if self.thread_ts is SAME else self.thread_ts)


class UserError(Exception):
    """A refusal or a bad input, rendered once by the dispatcher (templates/error.*): `title`, `detail`
    (what was wrong) and `hint` (what to do); `audit` is the audit trail's result (refused, invalid,
    denied, stale, error); `thread_ts`/`launch_id` route it like a Reply."""

    def __init__(self, title: str, detail: str, hint: str | None = None, *, audit: str = "refused",
                 thread_ts: str | object | None = SAME, launch_id: int | None = None):
        super().__init__(f"{title}: {detail}")
        self.title, self.detail, self.hint = title, detail, hint
        self.audit = audit
        self.thread_ts = thread_ts
        self.launch_id = launch_id


async def deliver(surface: Surface, reply: Reply) -> str | None:
    """Send a placed Reply through `surface`: its edits first, then its message in its thread (to
    `private_to` alone when set). Returns the posted message's id (None when there was nothing to post or it
    was refused)."""
    channel = reply.channel or ""
    for ts, message in reply.edits:
        await surface.update(channel, ts, message)
    if reply.message is None:
        return None
    thread = None if reply.thread_ts is SAME else reply.thread_ts
    if reply.private_to:
        return await surface.post_ephemeral(channel, reply.private_to, reply.message,
                                            thread_ts=thread)  # type: ignore[arg-type]
    return await surface.post(channel, reply.message, thread_ts=thread)  # type: ignore[arg-type]
