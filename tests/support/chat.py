"""Tests that read like a chat (in the spirit of errbot's testbot): `await chat.say("!kill", thread=t)`,
`await chat.click("Kill")`. Everything goes through the real grammar, dispatcher, services and templates;
only Slack itself is replaced, by a RecordingSurface. Routing (threads, the root message, buttons) is
modelled as Slack does it: a message at channel level is answered in its own thread; slash commands have
no thread."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from bot.core.grammar import CommandCall, CommandParseError
from bot.wiring import Runtime
from handlers import Reply, Request, Source, deliver
from tests.support.procs import wait_until
from tests.support.surfaces import Post, RecordingSurface

BOT_USER = "UBOT0GPU"


@dataclass
class Answer:
    """What the bot answered: the dispatcher's placed Reply and the message it posted (None when it only
    edited messages or was not addressed)."""

    reply: Reply
    post: Post | None

    @property
    def text(self) -> str:
        """The posted text ("" when nothing was posted)."""
        return self.post.text if self.post is not None else ""

    @property
    def thread(self) -> str | None:
        """The thread the answer went into."""
        return self.post.thread_ts if self.post is not None else None

    @property
    def audit(self) -> str:
        """The audit trail's result for this command."""
        return self.reply.audit

    def buttons(self) -> list[dict]:
        """The answer's buttons (each with its `label`, `action_id` and `value`)."""
        return self.post.buttons() if self.post is not None else []


class Chat:
    """A conversation with one bot. `user` and `channel` are the defaults of `say` and `click`."""

    def __init__(self, runtime: Runtime, surface: RecordingSurface, *, user: str = "U0OPERATOR",
                 channel: str = "C1"):
        self.runtime = runtime
        self.surface = surface
        self.user = user
        self.channel = channel
        self._ts = itertools.count(1)

    @property
    def posts(self) -> list[Post]:
        """Everything the bot posted, oldest first."""
        return self.surface.posts

    def _message_ts(self) -> str:
        return f"1600000000.{next(self._ts):06d}"

    def parse(self, text: str) -> tuple[CommandCall | CommandParseError | None, Source]:
        """How Slack and the grammar read `text`: (the call or its parse error, or None when the bot would
        not be addressed; the route)."""
        grammar = self.runtime.dispatcher.grammar
        prefix = self.runtime.config.slack.command_prefix
        try:
            if text.startswith("/"):
                cmd, _, rest = text.partition(" ")
                return grammar.parse_slash(cmd, rest), Source.SLASH
            if text.startswith("@gpubot"):
                return grammar.parse_message(f"<@{BOT_USER}> {text[len('@gpubot'):].strip()}",
                                             bot_user_id=BOT_USER, prefix=prefix), Source.MENTION
            if not grammar.addresses(text, prefix, self.runtime.config.hosts):
                return None, Source.PREFIX
            return grammar.parse_message(text, bot_user_id=BOT_USER, prefix=prefix), Source.PREFIX
        except CommandParseError as e:
            return e, Source.SLASH if text.startswith("/") else Source.PREFIX

    async def say(self, text: str, *, thread: str | None = None, user: str | None = None,
                  channel: str | None = None) -> Answer | None:
        """Type `text` (`/slash ...`, `!cmd ...`, `@gpubot cmd ...`) in `channel` (in `thread` when given).
        Returns the answer, or None when the bot would ignore the message (chat that is not a command)."""
        call, source = self.parse(text)
        if call is None:
            return None
        if source == Source.SLASH and thread is not None:
            raise ValueError("Slack does not allow slash commands in threads: use ! or @gpubot")
        if source != Source.SLASH and thread is None:
            thread = self._message_ts()  # a message at channel level starts its own thread
        request = Request(user_id=user or self.user, channel_id=channel or self.channel, thread_ts=thread,
                          source=source)
        reply = await self.runtime.dispatcher.run(request, call)
        return Answer(reply, self.surface.get(await deliver(self.surface, reply)))

    def button(self, label: str, on: Answer | Post | None = None) -> tuple[Post, dict]:
        """The newest posted message with a button labelled `label` (or `on`'s), and that button. A message
        edited since (a decided confirmation) still offers its old buttons, as a client that has not
        refreshed does."""
        posts = [on.post if isinstance(on, Answer) else on] if on is not None else list(reversed(self.posts))
        for original in (False, True):
            for post in posts:
                for b in post.buttons(original=original) if post is not None else []:
                    if b["label"] == label or b.get("action_id") == label:
                        return post, b
        raise AssertionError(f"no button {label!r} in {[p.text[:60] for p in posts if p]}")

    async def click(self, label: str, *, on: Answer | Post | None = None, user: str | None = None) -> Answer:
        """Click the button labelled `label` on `on` (default: the newest message that has one)."""
        post, b = self.button(label, on)
        request = Request(user_id=user or self.user, channel_id=post.channel, thread_ts=post.thread_ts or post.ts,
                          source=Source.BUTTON, message_ts=post.ts)
        reply = await self.runtime.dispatcher.click(request, b["action_id"], b.get("value", ""))
        return Answer(reply, self.surface.get(await deliver(self.surface, reply)))

    async def wait_post(self, predicate: Callable[[Post], bool], timeout: float = 30.0, *,
                        what: str = "a post") -> Post:
        """Wait until the bot has posted a message matching `predicate` (an alert, say) and return it."""
        return await wait_until(lambda: next((p for p in self.posts if predicate(p)), None), timeout, what=what)

    def thread_of(self, launch_id: int) -> str | None:
        """The incident thread of launch `launch_id`."""
        la = self.runtime.launches.get(launch_id)
        return la.thread_ts if la is not None else None
