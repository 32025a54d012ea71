"""What the listeners share (`SlackBot`): the runtime, delivery dedupe, user-group lookups, and `run`, which
answers a request through the outbox with a placeholder for slow commands."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from bot.config import Config
from bot.present.render import mrkdwn_escape
from bot.services.outbox import TakenOver, answering, ref_id
from bot.services.surface import OutboxSurface
from bot.wiring import Runtime
from handlers import SAME, Reply, Request, Source, deliver

log = logging.getLogger(__name__)

#: Seconds a Slack user-group membership lookup is cached.
GROUP_CACHE_S = 300.0
#: While lookups fail, the last known members count this many seconds after they were read, then none.
GROUP_STALE_MAX_S = 3600.0


class SeenIds:
    """A bounded, time-limited set of delivery ids: `first(id)` is True only the first time an id is seen."""

    def __init__(self, max_items: int = 5000, ttl_s: float = 3600.0):
        self._items: OrderedDict[str, float] = OrderedDict()
        self.max_items = max_items
        self.ttl_s = ttl_s

    def first(self, key: str | None) -> bool:
        """True if `key` was not seen within the TTL (None keys are always 'first')."""
        if not key:
            return True
        now = time.monotonic()
        while self._items:
            _key, t = next(iter(self._items.items()))
            if now - t > self.ttl_s or len(self._items) > self.max_items:
                self._items.popitem(last=False)
            else:
                break
        if key in self._items:
            return False
        self._items[key] = now
        return True


class SlackBot:
    """What the listeners share: the runtime, delivery dedupe, user-group lookups, and `run`, which answers
    a request through the outbox (with a placeholder for slow commands). `tasks` tracks running work for a
    clean shutdown."""

    def __init__(self, runtime: Runtime, client: AsyncWebClient):
        self.runtime = runtime
        self.config: Config = runtime.config
        self.client = client
        self.dispatcher = runtime.dispatcher
        self.surface = runtime.surface
        self.seen = SeenIds()
        self.clicks = SeenIds(ttl_s=3.0)  # a double click (two action_ts within a moment) acts once
        self.tasks: set[asyncio.Task] = set()
        self._claiming = asyncio.Lock()  # FIFO: deliveries are claimed, and so started, in the order they came
        self._beginning = asyncio.Lock()  # FIFO: commands are written ahead, and so started, in that order too
        self._groups: dict[str, tuple[float, set[str]]] = {}

    def _configured_groups(self) -> set[str]:
        p = self.config.permissions
        return {x for x in (*p.admins, *p.operators, *p.viewers) if x.startswith("S")}

    async def user_groups_of(self, user_id: str) -> frozenset[str]:
        """The configured Slack user groups (S...) that `user_id` belongs to, via usergroups.users.list
        (cached GROUP_CACHE_S seconds per group). A failed lookup keeps the last members for at most
        GROUP_STALE_MAX_S, then fails closed (a removed operator loses the role); it is logged."""
        out: set[str] = set()
        now = time.monotonic()
        for gid in sorted(self._configured_groups()):
            cached = self._groups.get(gid)
            if cached is None or now - cached[0] > GROUP_CACHE_S:
                try:
                    resp = await self.client.usergroups_users_list(usergroup=gid)
                    self._groups[gid] = cached = (now, set(resp.get("users") or []))
                except Exception as e:
                    log.warning("cannot read members of user group %s: %s", gid, e)
                    if cached is not None and now - cached[0] > GROUP_STALE_MAX_S:
                        cached = None
            if cached is not None and user_id in cached[1]:
                out.add(gid)
        return frozenset(out)

    async def first_delivery(self, key: str | None, *, click: str | None = None) -> bool:
        """True when this delivery (`key`, e.g. `cmd:<trigger_id>`) is to be acted on: not seen by this bot (the
        in-memory `seen`) and claimed in the database (the `deliveries` table, shared by every bot of the database,
        so a delivery Slack retries to another bot is acted on once) within the hour. `click` (a button's
        `click:<message>:<action>:<value>:<user>`) must also be new within the double-click window (`clicks`).
        Claims are made one delivery at a time, in the order they came, so deliveries start in that order. A
        database that refuses is logged and the delivery taken: an answer twice beats none. None keys: True."""
        if not key:
            return True
        if not self.seen.first(key) or (click is not None and not self.clicks.first(click)):
            return False
        return await self.claimed(key, *([(click, self.clicks.ttl_s)] if click is not None else []))

    async def claimed(self, key: str, *more: tuple[str, float]) -> bool:
        """The database half of `first_delivery`: True when this bot's claim of `key` (for an hour) and of each
        (key, seconds) of `more` in the `deliveries` table won (or the database refused, logged)."""
        def claim_all() -> bool:
            deliveries = self.runtime.store.deliveries
            return deliveries.claim(key) and all(deliveries.claim(k, ttl) for k, ttl in more)

        try:
            async with self._claiming:
                return await asyncio.to_thread(claim_all)
        except Exception as e:
            log.warning("cannot record delivery %s in the database (acting on it anyway): %s", key, e)
            return True

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task:
        """Run `coro` as a tracked task (Bolt does not track work started after the ack)."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def drain(self, timeout_s: float = 10.0) -> None:
        """Wait (bounded) for running work to finish."""
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=timeout_s)

    async def run(self, *, user_id: str, channel_id: str, thread_ts: str | None, source: Source, word: str,
                  work: Callable[[Request], Awaitable[Reply]], message_ts: str | None = None,
                  respond: Any = None, text: str = "") -> str | None:
        """Build the request (with the user's groups), run `work` (a dispatcher call) and deliver its Reply.
        A command slower than `slack.progress_after_s` gets a placeholder message at once, edited into the
        answer (or deleted, with a pointer to the launch's thread for its user). A placeholder still waiting in
        the outbox when the answer is ready is never sent: the answer takes its place (one Slack call instead of
        two), or it is dropped. When Slack refuses the answer for good (e.g. not_in_channel), a slash command's
        user gets it privately through `respond`. Returns the answer's ts (a `q:` reference while queued; None
        if there was none or it was refused).

        The command (`text`, what was typed) is written ahead with its audit row before the work starts, its
        placeholder is noted there, and the rows of its answer are queued only while this bot still holds it
        (bot.services.journal): a bot that dies meanwhile leaves it to the leader to answer, once; one the leader
        took over (this bot was taken for gone) sends nothing more."""
        # a secret param's value typed in the command is masked from here on, in the journal too
        self.runtime.launches.secrets.learn_typed(text)
        async with self._beginning:
            command_id = await self.runtime.audit.begin_command(user_id=user_id, channel=channel_id,
                                                                thread_ts=thread_ts, source=str(source), word=word,
                                                                text=text or word)

        async def answer() -> Reply:  # the user-group lookup counts as the command's time (it may be slow)
            groups = await self.user_groups_of(user_id) if self._configured_groups() else frozenset()
            return await work(Request(user_id=user_id, channel_id=channel_id, thread_ts=thread_ts, source=source,
                                      user_groups=groups, message_ts=message_ts, command_id=command_id))

        task = asyncio.ensure_future(answer())
        placeholder = None
        try:
            done, _ = await asyncio.wait({task}, timeout=self.config.slack.progress_after_s)
            if not done:  # slow: say so at once; the placeholder becomes the answer
                progress = self.runtime.renderer.render("progress", command=word, user_id=user_id, elsewhere=False)
                placeholder = await self._post_now(channel_id, progress, thread_ts)
                if placeholder is not None and command_id is not None:
                    await self._noted(self.runtime.store.commands.set_placeholder, command_id, placeholder)
            reply = await task
            if reply.taken_over:  # another bot answered it (this one was taken for gone): its placeholder too
                return None
            with answering(command_id, self.runtime.audit.owner):
                if placeholder is not None and self._absorbed(reply, placeholder, thread_ts):
                    ts = await self._deliver_absorbed(reply, placeholder, thread_ts)
                else:
                    if placeholder is not None and not await self._placeholder_alive(placeholder):
                        placeholder = None  # refused by Slack (not_in_channel, ...): answer as if there were none
                    if placeholder is not None:
                        return await self._into_placeholder(reply, placeholder, thread_ts, word, user_id)
                    ts = await deliver(self.surface, reply)
        except TakenOver:
            log.warning("the answer to %s of %s is not sent: another bot took the command over and answered it",
                        word, user_id)
            return None
        except Exception:  # e.g. the database refused the outbox row: say so privately rather than vanish
            log.exception("answering %s of %s in %s failed", word, user_id, channel_id)
            text = (f"gpubot could not answer `{word}`: it failed while answering (the bot logged the details); "
                    "try again")
            if respond is not None:
                await self._respond_text(respond, text)
            else:  # a message or a click: tell its author where they asked
                try:
                    await self.surface.post_ephemeral(channel_id, user_id, self.runtime.renderer.error(
                        "Internal error", text, None), thread_ts=thread_ts)
                except Exception:
                    log.exception("could not tell %s that %s failed", user_id, word)
            return None
        if ts is None and reply.message is not None and respond is not None:
            await self._respond_privately(respond, reply)
        return ts

    @staticmethod
    async def _noted(write: Callable[..., Any], *args: Any) -> None:
        """A journal write off the event loop; a database that refuses is logged (the answer matters more)."""
        try:
            await asyncio.to_thread(write, *args)
        except Exception as e:
            log.warning("command journal: %s", e)

    async def _post_now(self, channel: str, message: Any, thread_ts: str | None) -> str | None:
        """Post the placeholder without waiting for Slack; None when it was refused at once."""
        if isinstance(self.surface, OutboxSurface):
            return await self.surface.post(channel, message, thread_ts=thread_ts, wait_s=0)
        return await self.surface.post(channel, message, thread_ts=thread_ts)

    async def _placeholder_alive(self, placeholder: str, wait_s: float = 5.0) -> bool:
        """False when the queued placeholder failed for good (its edit would fail too), waiting up to `wait_s`
        for an answer; True when it was sent, or is still queued after that (its edit then follows it)."""
        rid = ref_id(placeholder)
        if rid is None or not isinstance(self.surface, OutboxSurface):
            return True
        return (await self.surface.outbox.wait(rid, wait_s)).state != "failed"

    @staticmethod
    def _for_placeholder(reply: Reply, thread_ts: str | None) -> bool:
        """True when `reply` is a public message for the request's own thread: the placeholder's place."""
        return not reply.private_to and reply.message is not None and (
            reply.thread_ts is SAME or reply.thread_ts == thread_ts)

    def _absorbed(self, reply: Reply, placeholder: str, thread_ts: str | None) -> bool:
        """Take a placeholder that is still only queued out of the answer's way, so that the answer costs one
        Slack call: an answer for its place takes its row over (OutboxSurface.take_place), any other (for one
        person, or for the launch's thread) drops it unsent (OutboxSurface.withdraw). Returns False, changing
        nothing, when the placeholder is already on its way to Slack (it is then edited or deleted)."""
        if not isinstance(self.surface, OutboxSurface):
            return False
        channel = reply.channel or ""
        if self._for_placeholder(reply, thread_ts):
            assert reply.message is not None
            return self.surface.take_place(channel, placeholder, reply.message)
        return self.surface.withdraw(channel, placeholder)

    async def _deliver_absorbed(self, reply: Reply, placeholder: str, thread_ts: str | None) -> str | None:
        """Deliver `reply` after `_absorbed`: its edits and the answer in the placeholder's row, waited for like
        any post (returns its ts, a `q:` reference, or None when Slack refused it); or, the placeholder dropped,
        the reply as if there had been none (returns what `deliver` returns)."""
        if not self._for_placeholder(reply, thread_ts):
            return await deliver(self.surface, reply)
        assert isinstance(self.surface, OutboxSurface)
        for ts, message in reply.edits:  # queued after the answer's row: they go right after it
            await self.surface.update(reply.channel or "", ts, message)
        return await self.surface.settled(placeholder)

    async def _into_placeholder(self, reply: Reply, placeholder: str, thread_ts: str | None, word: str,
                                user_id: str) -> str | None:
        """Deliver `reply` through a placeholder already on its way to Slack: edited into the answer (files follow
        as uploads into its thread), or deleted when the answer is for one person or for another thread (its user
        then gets a pointer). Returns the answer's ts, as `run`."""
        channel = reply.channel or ""
        if reply.private_to:  # an answer for one person never goes into the public placeholder
            await self.surface.delete(channel, placeholder)
            return await deliver(self.surface, reply)
        for ts, message in reply.edits:
            await self.surface.update(channel, ts, message)
        if reply.message is not None and (reply.thread_ts is SAME or reply.thread_ts == thread_ts):
            message = reply.message
            files, message.files = message.files, []
            await self.surface.update(channel, placeholder, message)
            for name, data in files:  # into the thread the placeholder is in (its own when top-level)
                await self.surface.upload(channel, name, data, thread_ts=thread_ts or placeholder)
            return placeholder
        # the answer goes elsewhere (the launch's thread): the placeholder goes away, and only the person who
        # asked gets the pointer, so the channel never holds a second message about it
        note = self.runtime.renderer.render("progress", command=word, user_id=user_id, elsewhere=True)
        await self.surface.delete(channel, placeholder)
        ts = await deliver(self.surface, Reply(reply.message, thread_ts=reply.thread_ts, channel=channel,
                                               private_to=reply.private_to))
        await self.surface.post_ephemeral(channel, user_id, note, thread_ts=thread_ts)
        return ts

    async def _respond_privately(self, respond: Any, reply: Reply) -> None:
        why = getattr(self.surface, "last_error", None)
        assert reply.message is not None
        await self._respond_text(respond, mrkdwn_escape(reply.message.text[:2900])
                                 + f"\n(could not post in the channel: {why})")

    @staticmethod
    async def _respond_text(respond: Any, text: str) -> None:
        """Send `text` to the user alone (the slash command's response_url); failures are logged."""
        try:
            await respond(text=text, response_type="ephemeral")
        except Exception as e:  # the response_url may be expired as well
            log.warning("respond() fallback failed: %s", e)
