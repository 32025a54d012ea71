"""The Bolt AsyncApp: slash commands, app mentions and `!` messages -> handlers -> Slack.

Every listener acks first (nothing slow before the ack: no SSH connect, no DB wait), then runs the
command and posts the answer with chat.postMessage: slash commands to the channel, messages in the thread
they were typed in (slash commands cannot be used inside threads, so `@gpubot probe` / `!probe` serve
there). Duplicate deliveries (Slack retries, Socket Mode reconnects) are dropped by envelope/event id.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_sdk.web.async_client import AsyncWebClient

from bot.config import Config
from bot.core.grammar import CommandCall, CommandParseError, parse_message, parse_slash
from bot.present.render import Message, mrkdwn_escape, render
from bot.services.hosts import HostService
from bot.services.launches import LaunchService
from bot.services.outbox import Outbox, ref_id
from bot.slack.surface import OutboxSurface, sender_client

log = logging.getLogger(__name__)


class _DropClientTokenWarning(logging.Filter):
    """Bolt warns that `token` is unused whenever SLACK_BOT_TOKEN is set and a client is passed: expected."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()  # also: the token is ignored because gpubot passes its own `authorize`
        return "`token` will be unused" not in text and "will be ignored" not in text


logging.getLogger("slack_bolt.AsyncApp").addFilter(_DropClientTokenWarning())

#: Seconds between auth.test attempts while Slack's Web API fails (requests are handled meanwhile).
AUTH_RETRY_S = 30.0
#: Seconds a Slack user-group membership lookup is cached.
GROUP_CACHE_S = 300.0
#: While lookups fail, the last known members count this many seconds after they were read, then none.
GROUP_STALE_MAX_S = 3600.0

SLASH_COMMANDS = ("/gpu", "/probe", "/gpubot", "/launch", "/kill", "/relaunch")


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


class GpuBot:
    """Glue between Bolt and the handlers. `tasks` tracks running command tasks for a clean shutdown."""

    def __init__(self, config: Config, hosts: HostService, client: AsyncWebClient, launches: LaunchService):
        self.config = config
        self.hosts = hosts
        self.launches = launches
        self.client = client
        # every message goes through the outbox in the launches' database
        self.outbox = Outbox(launches.store, sender_client(client), min_interval_s=config.slack.post_interval_s,
                             on_posted=launches.store.replace_thread_ts)
        self.surface = OutboxSurface(self.outbox)
        self.seen = SeenIds()
        self.tasks: set[asyncio.Task] = set()
        self._groups: dict[str, tuple[float, set[str]]] = {}

    def _configured_groups(self) -> set[str]:
        p = self.config.permissions
        return {x for x in (*p.admins, *p.operators, *p.viewers) if x.startswith("S")}

    async def user_groups_of(self, user_id: str) -> set[str]:
        """The configured Slack user groups (S...) that `user_id` belongs to, via usergroups.users.list
        (cached GROUP_CACHE_S seconds per group). A failed lookup counts as "not a member" and is logged."""
        out: set[str] = set()
        now = time.monotonic()
        for gid in sorted(self._configured_groups()):
            cached = self._groups.get(gid)
            if cached is None or now - cached[0] > GROUP_CACHE_S:
                try:
                    resp = await self.client.usergroups_users_list(usergroup=gid)
                    self._groups[gid] = cached = (now, set(resp.get("users") or []))
                except Exception as e:
                    # keep the last members for a while, then fail closed (a removed operator loses the role)
                    log.warning("cannot read members of user group %s: %s", gid, e)
                    if cached is not None and now - cached[0] > GROUP_STALE_MAX_S:
                        cached = None
            if cached is not None and user_id in cached[1]:
                out.add(gid)
        return out

    async def run_call(self, call: CommandCall | None, *, user_id: str, channel_id: str, thread_ts: str | None,
                       source: str, parse_error: str | None = None, respond: Any = None) -> str | None:
        """Dispatch `call` and post the answer. A command slower than `slack.progress_after_s` gets a
        placeholder message at once, edited into the answer when it is ready. Returns the ts of the
        answer (a `q:` reference while it is queued; None if Slack refused it)."""
        from handlers import dispatch
        from handlers.base import CommandContext, error_message

        placeholder: str | None = None
        reply_thread = thread_ts
        if call is None:
            msg: Message = error_message("Bad command", parse_error or "could not parse the command",
                                         "Try `/gpu help`.")
        else:
            groups = await self.user_groups_of(user_id) if self._configured_groups() else set()
            ctx = CommandContext(user_id=user_id, channel_id=channel_id, config=self.config, hosts=self.hosts,
                                 thread_ts=thread_ts, source=source, user_groups=groups, surface=self.surface,
                                 launches=self.launches)
            task = asyncio.ensure_future(dispatch(call, ctx))
            done, _ = await asyncio.wait({task}, timeout=self.config.slack.progress_after_s)
            if not done:  # slow: say so at once; the placeholder becomes the answer
                progress = render("progress", command=call.word or call.name, user_id=user_id, elsewhere=False)
                placeholder = await self.surface.post(channel_id, progress, thread_ts=thread_ts, wait_s=0)
            msg = await task
            reply_thread = ctx.reply_thread_ts or thread_ts
        if placeholder is not None and (rid := ref_id(placeholder)) is not None:
            d = await self.outbox.wait(rid, 5.0)
            if d.state == "failed":  # e.g. not_in_channel: answer as if there were none (response_url below)
                placeholder = None
        if placeholder is not None:
            if reply_thread == thread_ts:
                files, msg.files = msg.files, []
                await self.surface.update(channel_id, placeholder, msg)
                for name, data in files:  # into the thread the placeholder is in (its own when top-level)
                    await self.surface.upload(channel_id, name, data, thread_ts=thread_ts or placeholder)
                return placeholder
            note = render("progress", command=call.word or call.name if call else "", user_id=user_id,
                          elsewhere=True)
            await self.surface.update(channel_id, placeholder, note)
        ts = await self.surface.post(channel_id, msg, thread_ts=reply_thread)
        if ts is None and respond is not None:
            # e.g. not_in_channel: answer the user privately through the response_url instead.
            try:
                note_text = f"\n(could not post in the channel: {self.surface.last_error})"
                await respond(text=mrkdwn_escape(msg.text[:2900]) + note_text, response_type="ephemeral")
            except Exception as e:  # the response_url may be expired as well
                log.warning("respond() fallback failed: %s", e)
        return ts

    async def start(self) -> None:
        """Start the outbox sender (messages left queued by an earlier run go out first)."""
        self.outbox.start()

    async def close(self, flush_s: float = 5.0) -> None:
        """Stop taking work: wait (bounded) for running commands, give the outbox `flush_s` seconds to
        send what is queued, then stop it (what is left stays queued in the database)."""
        await self.drain()
        await self.outbox.flush(flush_s)
        await self.outbox.stop()

    def spawn(self, coro) -> asyncio.Task:
        """Run `coro` as a tracked task (Bolt does not track work started after the ack)."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def drain(self, timeout_s: float = 10.0) -> None:
        """Wait (bounded) for running command tasks to finish."""
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=timeout_s)


def build_app(config: Config, hosts: HostService, client: AsyncWebClient, *,
              launches: LaunchService, signing_secret: str | None = None) -> tuple[AsyncApp, GpuBot]:
    """Build the Bolt AsyncApp with every listener registered. Returns (app, GpuBot).

    `signing_secret` is required for HTTP mode (request signing); Socket Mode does not use it.
    """
    identity: dict[str, Any] = {}
    quick = sender_client(client)

    async def authorize(enterprise_id, team_id, user_id) -> AuthorizeResult:
        """The bot's identity from auth.test, cached after the first success. While Slack's Web API is
        down, requests are still handled with the token alone (answers wait in the outbox) instead of
        Bolt's default, which refuses every request whose auth.test call fails."""
        if "auth" not in identity:
            # runs before the ack: one quick try (no SDK retries), then not again for AUTH_RETRY_S
            if time.monotonic() - identity.get("failed_at", -AUTH_RETRY_S) >= AUTH_RETRY_S:
                try:
                    identity["auth"] = await asyncio.wait_for(quick.auth_test(), 1.0)
                except Exception as e:
                    identity["failed_at"] = time.monotonic()
                    log.warning("auth.test failed (%s); handling requests without the bot's identity for now",
                                type(e).__name__)
            if "auth" not in identity:
                return AuthorizeResult(enterprise_id=enterprise_id, team_id=team_id, user_id=user_id,
                                       bot_token=client.token)
        return AuthorizeResult.from_auth_test_response(auth_test_response=identity["auth"], bot_token=client.token)

    app = AsyncApp(client=client, signing_secret=signing_secret, authorize=authorize,
                   request_verification_enabled=signing_secret is not None)
    bot = GpuBot(config, hosts, client, launches)
    register_commands(app, bot)
    register_messages(app, bot)
    register_actions(app, bot)
    return app, bot


def register_commands(app: AsyncApp, bot: GpuBot) -> None:
    """Slash commands: `/gpu [status|probe|help] ...`, `/probe ...`, `/gpubot ...`."""

    async def on_slash(ack, command, respond, body, request):
        await ack()  # first, always: Slack shows an error after 3 s without it
        env_id = request.headers.get("x-slack-retry-num")
        key = f"cmd:{command.get('trigger_id') or ''}" if command.get("trigger_id") else None
        if not bot.seen.first(key):
            log.info("duplicate slash command delivery dropped (retry %s)", env_id)
            return
        try:
            call, err = parse_slash(command.get("command", ""), command.get("text", "")), None
        except CommandParseError as e:
            call, err = None, str(e)
        await bot.spawn(bot.run_call(call, user_id=command.get("user_id", ""),
                                     channel_id=command.get("channel_id", ""), thread_ts=None, source="slash",
                                     parse_error=err, respond=respond))

    for name in SLASH_COMMANDS:
        app.command(name)(on_slash)


#: Alert buttons -> the command they run in the launch's thread (the button's value is the launch id).
BUTTON_COMMANDS = {"gpubot_probe": "probe", "gpubot_stack": "stack", "gpubot_kill": "kill",
                   "gpubot_relaunch": "relaunch", "gpubot_snooze": "snooze"}
#: Alert buttons whose click is itself the confirmation (they carry a Block Kit confirm dialog).
CONFIRMED_BUTTONS = {"gpubot_kill", "gpubot_relaunch"}
#: [Kill] / [Cancel] under a typed kill: their value is a one-shot confirmation id (store table).
CONFIRMATION_BUTTONS = ("gpubot_kill_confirm", "gpubot_killpid_confirm", "gpubot_kill_cancel")
#: Seconds a typed kill's [Kill] button stays valid.
CONFIRM_TTL_S = 3600.0


def _small_int(value: str) -> int | None:
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 12 else None


def register_actions(app: AsyncApp, bot: GpuBot) -> None:
    """Alert buttons [Probe] [Stack dump] [Kill] [Relaunch] [Snooze 15 min], and [Kill] [Cancel] under a
    typed `/kill`: the same commands, checked against the clicking user's role on the server (a confirm
    dialog is only client-side), answered in the launch's thread; a double click or a redelivery acts once.
    A typed kill's confirmation is decided once, atomically in the store, by the first operator's click
    ([Kill] or [Cancel]); the message is then replaced with who decided, and later clicks are told so."""
    from handlers import find
    from handlers.base import error_message, role_of

    clicks = SeenIds(ttl_s=10.0)  # a double click (two action_ts within seconds) acts once

    async def may_kill(user_id: str) -> bool:
        groups = await bot.user_groups_of(user_id) if bot._configured_groups() else set()
        spec = find("kill")
        return spec is not None and role_of(user_id, bot.config.permissions, groups) >= spec.role

    def audit(user: str, text: str, result: str, channel: str, detail: str | None = None,
              launch_id: int | None = None) -> None:
        bot.launches.store.add_event(user_id=user, action="command:kill",
                                     args={"text": text[:200], "source": "button"}, result=result, detail=detail,
                                     launch_id=launch_id, channel=channel)

    async def first_click(ack, body, action) -> tuple[str, str, str, str, str | None, str | None] | None:
        """Ack, then (user ID, action_id, value, channel, the clicked message's ts, its thread); None for a
        redelivered click or a double click."""
        await ack()
        channel = (body.get("channel") or {}).get("id") or (body.get("container") or {}).get("channel_id", "")
        msg_ts = (body.get("container") or {}).get("message_ts")
        thread = (body.get("message") or {}).get("thread_ts") or msg_ts
        if not bot.seen.first(f"act:{msg_ts}:{action.get('action_ts')}"):
            return None  # the same click delivered twice
        user = (body.get("user") or {}).get("id", "")
        action_id, value = str(action.get("action_id", "")), str(action.get("value", ""))
        if not clicks.first(f"click:{msg_ts}:{action_id}:{value}:{user}"):
            return None
        return user, action_id, value, channel, msg_ts, thread

    async def on_button(ack, body, action):
        click = await first_click(ack, body, action)
        if click is None:
            return
        user, action_id, value, channel, _msg_ts, _thread = click
        name, launch_id = BUTTON_COMMANDS.get(action_id), _small_int(value)
        if name is None or launch_id is None:
            audit(user, f"[button {action_id} {value[:40]}]", "invalid", channel, "unknown button or value")
            return
        la = bot.launches.store.get_launch(launch_id)
        call = CommandCall(name=name, args=["15"] if name == "snooze" else [value] if name == "kill" else [],
                           flags={"yes"} if action_id in CONFIRMED_BUTTONS else set(),
                           raw=f"[button {name} {value}]", word=name)
        await bot.spawn(bot.run_call(call, user_id=user, channel_id=la.channel if la and la.channel else channel,
                                     thread_ts=la.thread_ts if la else None, source="button"))

    async def on_confirmation(ack, body, action):
        click = await first_click(ack, body, action)
        if click is None:
            return
        user, action_id, value, channel, msg_ts, thread = click
        cancel = action_id == "gpubot_kill_cancel"
        conf_id = _small_int(value)
        if conf_id is None:
            audit(user, f"[button {action_id} {value[:40]}]", "invalid", channel, "not a confirmation id")
            return
        if not await may_kill(user):  # the dispatcher refuses it, answers and audits
            call = CommandCall(name="kill", args=[], raw=f"[button {action_id} {value}]", word="kill")
            await bot.spawn(bot.run_call(call, user_id=user, channel_id=channel, thread_ts=thread, source="button"))
            return
        conf, won = bot.launches.store.claim_confirmation(conf_id, state="cancelled" if cancel else "confirmed",
                                                          user_id=user, max_age_s=CONFIRM_TTL_S)
        if conf is None:
            audit(user, f"[button {action_id} {value}]", "invalid", channel, "unknown confirmation")
            return
        la = bot.launches.store.get_launch(conf.launch_id) if conf.launch_id is not None else None
        if la is not None and la.thread_ts and la.channel == channel:
            thread = la.thread_ts  # the launch's incident thread, where the [Kill] [Cancel] message is
        if not won:
            why = (f"already {conf.state} by <@{conf.decided_by}>" if conf.state != "pending"
                   else f"expired (older than {CONFIRM_TTL_S / 60:.0f} min); type the kill again")
            audit(user, f"[button {action_id} {value}]", "stale", channel, why, conf.launch_id)
            await bot.surface.post(channel, error_message("Nothing done", f"this kill was {why}"), thread_ts=thread)
            return
        what = f"pid {conf.pid} on {conf.host}" if conf.pid is not None else f"launch {conf.launch_id}"
        if cancel:
            audit(user, f"[cancel {what}]", "cancelled", channel, launch_id=conf.launch_id)
            if msg_ts:
                await bot.surface.update(channel, msg_ts, render(
                    "kill_confirm", decided=f":no_entry_sign: Nothing was stopped: kill of {what} cancelled", by=user))
            return
        if msg_ts:
            await bot.surface.update(channel, msg_ts, render(
                "kill_confirm", decided=f":white_check_mark: Kill of {what} confirmed", by=user))
        if conf.pid is not None:
            kwargs = {"pid": str(conf.pid), "host": conf.host, **({"expect_command": conf.command}
                                                                   if conf.command else {})}
            call = CommandCall(name="kill", kwargs=kwargs, flags={"yes"}, word="kill",
                               raw=f"[button kill pid={conf.pid} host={conf.host}]")
            await bot.spawn(bot.run_call(call, user_id=user, channel_id=channel, thread_ts=thread, source="button"))
            return
        call = CommandCall(name="kill", args=[str(conf.launch_id)], flags={"yes"}, word="kill",
                           raw=f"[button kill {conf.launch_id}]")
        await bot.spawn(bot.run_call(call, user_id=user, channel_id=la.channel if la and la.channel else channel,
                                     thread_ts=la.thread_ts if la and la.thread_ts else thread, source="button"))

    for action_id in BUTTON_COMMANDS:
        app.action(action_id)(on_button)
    for action_id in CONFIRMATION_BUTTONS:
        app.action(action_id)(on_confirmation)


def _addresses_bot(text: str, prefix: str, bot: GpuBot) -> bool:
    """True when a `!word ...` message names a command (or `gpu`/`gpubot`, or a configured host)."""
    from handlers import find

    body = text.lstrip()[len(prefix):]
    first = body.split(None, 1)[0] if body.split() else ""
    first = first.rstrip(":,.")
    return bool(first) and (first.lower() in ("gpu", "gpubot") or find(first.lower()) is not None
                            or first in bot.config.hosts)


def register_messages(app: AsyncApp, bot: GpuBot) -> None:
    """`@gpubot CMD` mentions and `!CMD` messages, answered in their thread."""
    prefix = bot.config.slack.command_prefix

    async def handle(event: dict, context, via: str) -> None:
        if event.get("bot_id") or event.get("subtype") in ("bot_message", "message_changed", "message_deleted"):
            return
        if not event.get("channel") or not event.get("user"):
            return
        key = f"msg:{event['channel']}:{event['ts']}" if event.get("ts") else None
        if not bot.seen.first(key):
            return
        text = event.get("text") or ""
        if via == "prefix" and not _addresses_bot(text, prefix, bot):
            return  # "!important: prod is down" is chat, not a command
        try:
            call = parse_message(text, bot_user_id=context.get("bot_user_id"), prefix=prefix)
            err = None
        except CommandParseError as e:
            call, err = None, str(e)
        if call is None and err is None:
            return
        thread_ts = event.get("thread_ts") or event.get("ts")
        await bot.spawn(bot.run_call(call, user_id=event["user"], channel_id=event["channel"],
                                     thread_ts=thread_ts, source=via, parse_error=err))

    @app.event("app_mention")
    async def on_mention(event, context):
        await handle(event, context, "mention")

    @app.message(re.compile(r"^\s*" + re.escape(prefix) + r"\S"))
    async def on_prefix(message, context):
        await handle(message, context, "prefix")

    @app.event("message")
    async def on_other_message(event):
        return None  # every other channel message: nothing to do (keeps Bolt from logging "unhandled")
