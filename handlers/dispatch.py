"""One pipeline for every route: slash commands, mentions, `!` messages, button clicks and the console.

`Dispatcher.run(request, call)`: resolve the command in the table (a host name is `/gpu status HOST`;
anything else unknown gets the help) -> filters (channel, then role; once) -> handler -> one audit row
(`command:<name>`, with the route, the text, the result and where it came from; a command written ahead
(`request.command_id`) has its row completed) -> a placed Reply. Bad
input, refusals and internal errors become answers, never exceptions. A click first becomes the command
text its button stands for (bot.present.actions), then runs the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from bot.config import NAME_RE
from bot.core.commands import SLASH, slash, suggestions, thread
from bot.core.errors import DatabaseUnavailable
from bot.core.grammar import CommandCall, CommandParseError, Grammar
from bot.present.actions import click_command
from bot.services.audit import Audit
from handlers.context import Context, Request, Services, Source
from handlers.derive import grammar
from handlers.filters import FILTERS, Filter
from handlers.help import help_message
from handlers.reply import Reply, UserError
from handlers.spec import CommandSpec
from handlers.table import COMMANDS

#: Audit results whose answer only the person who asked sees: permission denials and usage errors.
PRIVATE_RESULTS = frozenset({"denied", "invalid"})

log = logging.getLogger(__name__)


#: Commands that change a host: after a database fault, what they did is worth checking before a repeat.
_ACTS_ON_HOSTS = frozenset({"launch", "kill", "relaunch", "confirm"})


def database_hint(command: str, reason: str) -> str:
    """What to do after the database refused a command, by the database's own words (`reason`): a corrupted
    file needs an operator, a lock or a full disk passes or needs space."""
    r = reason.lower()
    if "malformed" in r or "not a database" in r or "corrupt" in r:
        hint = ("The database file is corrupted: an operator should stop the bot, move the file aside (or restore a "
                "backup) and start it again.")
    elif "full" in r:
        hint = "The disk is full: free space on the bot's machine, then try again."
    else:
        hint = "Nothing the bot already recorded is lost. Try again in a minute."
    if command in _ACTS_ON_HOSTS:
        hint += f" Check the host with `{slash('status')}` before repeating it."
    return hint


class Dispatcher:
    """Runs commands for every front end. `filters` run in order before every handler; `audit` is the one
    writer of the `command:*` rows."""

    def __init__(self, services: Services, audit: Audit, *, commands: Sequence[CommandSpec] = COMMANDS,
                 filters: Sequence[Filter] = FILTERS):
        self.services = services
        self.audit = audit
        self.commands = tuple(commands)
        self.filters = list(filters)
        self.grammar: Grammar = grammar(services.config, self.commands)
        self._by_name = {c.name: c for c in self.commands}

    def find(self, name: str) -> CommandSpec | None:
        """The command named `name` (a canonical name; the grammar maps aliases), or None."""
        return self._by_name.get(name)

    async def run(self, request: Request, call: CommandCall | CommandParseError) -> Reply:
        """Run `call` (or answer its parse error) for `request`. Returns the Reply placed in a channel and
        thread, audited once. Never raises for user input or a failing handler."""
        ctx = Context(request, self.services, self.commands)
        # secret params typed in the command are masked by value from here on: also when it is denied, refused,
        # misspelled or malformed, before anything is audited or posted
        self.services.launches.secrets.learn_typed(call.raw, getattr(call, "kwargs", None))
        if isinstance(call, CommandParseError):
            reply = self._error(ctx, UserError("Bad command", str(call), f"Try `{slash('help')}`.", audit="invalid"))
            return self._finish(ctx, "?", call.raw, reply)
        spec = self.find(call.name)
        if spec is None and (call.word in self.services.config.hosts or call.word.lower() == "all"):
            # "/gpu gpu-host-1" is "/gpu status gpu-host-1"; "/gpu all" is "/gpu status all"
            call = replace(call, name="status", args=[call.word, *call.args])
            spec = self.find("status")
        if spec is None:
            word = call.word or call.name
            hosts = ", ".join(self.services.config.host_names()) or "(none configured)"
            if NAME_RE.fullmatch(word):  # `/gpu HOST` is status HOST: a word like a name is a host or a command
                usage = " · ".join(dict.fromkeys(
                    (slash if s.kind == SLASH else thread)(s.command) for c in self.commands if c.role <= ctx.role
                    for s in suggestions(c.usage)[:1]))
                message = self.services.renderer.error(
                    "Unknown host or command", f"{word[:40]!r}. Hosts: {hosts}.",
                    f"Commands: {usage}. `{slash('help')}` explains each.")
            else:
                message = help_message(ctx, f"Unknown command {word[:40]!r}. Hosts: {hosts}. Here is what I can do:")
            return self._finish(ctx, call.name[:40], call.raw, Reply(message, audit="unknown",
                                                                      private_to=request.user_id))
        try:
            for f in self.filters:
                f(spec, call, ctx)
            unknown = sorted(call.flags - spec.flags)
            if unknown:
                raise UserError("Bad arguments", f"`--{unknown[0][:40]}` is no option of {spec.name}"
                                + (f" (it takes {', '.join('--' + f for f in sorted(spec.flags))})" if spec.flags
                                   else ""), f"Usage: {spec.usage}", audit="invalid")
            reply = await spec.handler(call, ctx)
        except UserError as e:
            reply = self._error(ctx, e)
        except DatabaseUnavailable as e:
            log.error("command %s: the database refused: %s", spec.name, e)
            reply = Reply(self.services.renderer.error(
                "Database unavailable", f"{spec.name} was not finished: the bot's database refused ({e.reason}).",
                database_hint(spec.name, e.reason)), audit="error", detail=f"database: {e.reason}"[:300])
        except Exception as e:
            log.exception("command %s failed", spec.name)
            reply = Reply(self.services.renderer.error(
                "Internal error", f"{spec.name} failed: {type(e).__name__}",
                f"The bot logged the details. Check what happened with `{slash('status')}` or `{thread('probe')}` "
                "before trying again."),
                audit="error", detail=type(e).__name__)
        return self._finish(ctx, spec.name, call.raw, reply)

    async def run_text(self, request: Request, text: str) -> Reply:
        """Parse command text without a prefix (`kill 7 --yes`), then `run` it."""
        try:
            call: CommandCall | CommandParseError = self.grammar.parse_command(text)
        except CommandParseError as e:
            call = e
        return await self.run(request, call)

    async def ignored(self, request: Request, raw: str, why: str) -> Reply:
        """An attempt that is not run (an edited command message): audited as `ignored` (what was typed,
        redacted) and answered to its author alone with `why`."""
        ctx = Context(request, self.services, self.commands)
        reply = Reply(self.services.renderer.error("Not run", why, None), audit="ignored", detail=why[:300],
                      private_to=request.user_id)
        return self._finish(ctx, "edit", raw, reply)

    async def click(self, request: Request, action_id: str, value: str) -> Reply:
        """A button click: the command its button stands for (`confirm 12`, `relaunch 7`), run like a typed
        one with `request.source` BUTTON. A forged or garbled click is audited as invalid and not answered."""
        request = replace(request, source=Source.BUTTON)
        text = click_command(action_id, value)
        if text is None:
            ctx = Context(request, self.services, self.commands)
            return self._finish(ctx, "button", f"[button {action_id[:40]} {value[:40]}]",
                                Reply(None, audit="invalid", detail="unknown button or value"))
        return await self.run_text(request, text)

    def _error(self, ctx: Context, e: UserError) -> Reply:
        private = ctx.request.user_id if e.audit in PRIVATE_RESULTS else None
        return Reply(self.services.renderer.error(e.title, e.detail, e.hint), thread_ts=e.thread_ts, audit=e.audit,
                     detail=e.detail[:300], launch_id=e.launch_id, private_to=private)

    def _finish(self, ctx: Context, name: str, raw: str, reply: Reply) -> Reply:
        r = ctx.request
        reply = reply.placed(r.channel_id, r.thread_ts)
        if reply.message is not None and reply.private_to is None and r.source in (Source.SLASH, Source.BUTTON):
            # a slash command or a click leaves no message in the channel: the answer says who asked
            # what was typed, redacted like everything else (`api_key=...` in a /launch)
            reply.message = reply.message.asked_by(r.user_id, self.services.renderer.redactor(raw))
        launch_id = reply.launch_id
        if launch_id is None:
            try:
                la = self.services.launches.thread_launch(r.channel_id, r.thread_ts)
            except DatabaseUnavailable:  # the answer matters more than the audit row's launch id
                la = None
            launch_id = la.id if la is not None else None
        args = {"text": raw[:500], "source": str(r.source)}
        if r.command_id is None:
            self.audit.record(user_id=r.user_id, action=f"command:{name}", result=reply.audit, detail=reply.detail,
                              args=args, launch_id=launch_id, channel=r.channel_id)
        elif not self.audit.finish_command(r.command_id, user_id=r.user_id, action=f"command:{name}", args=args,
                                           result=reply.audit, detail=reply.detail, launch_id=launch_id,
                                           channel=r.channel_id, expects_answer=reply.message is not None):
            # another bot took this command over (this one was taken for gone) and answered it: say nothing more
            log.warning("command %s of %s was taken over by another bot; its answer here is dropped", name,
                        r.user_id)
            return Reply(None, audit=reply.audit, taken_over=True).placed(r.channel_id, r.thread_ts)
        return reply
