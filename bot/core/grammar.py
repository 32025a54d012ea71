"""Command text -> CommandCall (pure). One grammar for `/gpu ...`, `/probe ...`, `@gpubot ...` and `!...`.

Examples (all give name "probe", host "gpu-host-1", kwargs {"pgid": "123"}):
    slash "/probe" with text "gpu-host-1 pgid=123"
    slash "/gpu" with text "probe gpu-host-1 pgid=123"
    message "<@UBOT> probe gpu-host-1 pgid=123"  (app mention, in a channel or a thread)
    message "!probe gpu-host-1 pgid=123"
Text is split like a POSIX shell would (shlex, no expansion of anything); nothing here ever runs a shell.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_COMMAND_CHARS = 4000
_LINK_RE = re.compile(r"<((?:https?|mailto|ftp):[^|>\s]*)(?:\|([^>]*))?>")
_KWARG_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]{0,40})=(.*)$", re.DOTALL)
_MENTION_RE = re.compile(r"^\s*<@([A-Z0-9]+)(?:\|[^>]*)?>\s*")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,30}$")
#: Words that may name a host (same rule as config host names): `/gpu HOST` shorthand.
_HOSTLIKE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")

class CommandParseError(ValueError):
    """The text could not be parsed; str() is a user-facing message, `raw` the text as typed (for the audit
    trail; set by the Grammar)."""

    raw: str = ""


@dataclass
class CommandCall:
    """A parsed command: `name` (lower case), positional `args`, `kwargs` from key=value words, the
    original `raw` text, and `flags` from words like --yes."""

    name: str
    args: list[str] = field(default_factory=list)
    kwargs: dict[str, str] = field(default_factory=dict)
    flags: set[str] = field(default_factory=set)
    raw: str = ""
    word: str = ""


def _split(text: str) -> list[str]:
    if len(text) > MAX_COMMAND_CHARS:
        raise CommandParseError(f"command is too long ({len(text)} characters; at most {MAX_COMMAND_CHARS})")
    if "\x00" in text:
        raise CommandParseError("command contains a NUL character")
    # Slack turns host names and paths it recognises into links: <http://gpu1.example.com|gpu1.example.com>,
    # <mailto:a@b|a@b>, <#C123|name>; keep the label (or the bare URL) the user typed.
    text = _LINK_RE.sub(lambda m: m.group(2) if m.group(2) is not None else m.group(1), text)
    # Slack sends &amp; &lt; &gt; escaped in message text and slash command text.
    text = text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    # Smart quotes typed in Slack clients.
    text = text.translate(str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"}))
    text = show_invisible(text)
    try:
        return shlex.split(text, posix=True)
    except ValueError as e:
        raise CommandParseError(f"could not parse the command: {e} (check your quotes)") from None


#: Bidi embedding/override/isolate controls and zero-width characters: they make typed text read other than
#: it is (a value that displays reversed, an invisible character inside a name).
_INVISIBLE_RE = re.compile("[\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


def show_invisible(text: str) -> str:
    """`text` with every bidi control and zero-width character written out visibly as `<U+202E>` (pure).
    Applied to everything typed, so what is echoed back, audited or matched is what it really is."""
    return _INVISIBLE_RE.sub(lambda m: f"<U+{ord(m.group(0)):04X}>", text)


def _build(name: str, words: list[str], raw: str, *, word: str | None = None) -> CommandCall:
    word = name if word is None else word
    name = name.lower()
    if not _NAME_RE.match(name) and not _HOSTLIKE_RE.match(word):
        raise CommandParseError(f"{name[:40]!r} is not a command name")
    call = CommandCall(name=name, raw=raw, word=word)
    for w in words:
        m = _KWARG_RE.match(w)
        if m:
            key = m.group(1).lower().replace("-", "_")
            if key in call.kwargs:
                raise CommandParseError(f"{key}= given twice")
            call.kwargs[key] = m.group(2)
        elif w.startswith("--") and len(w) > 2 and re.fullmatch(r"--[a-z][a-z0-9-]{0,30}", w):
            call.flags.add(w[2:])
        else:
            call.args.append(w)
    return call


@dataclass(frozen=True)
class SlashCommand:
    """One slash command: its `name` ("/gpu"), the command run when its text names none (`default`), and
    whether its first word may name any other command (`router`: "/gpu probe ...")."""

    name: str
    default: str
    router: bool = False


@dataclass(frozen=True)
class Vocabulary:
    """The words the grammar knows, derived from the command table (handlers.COMMANDS): `words` maps every
    command name and alias (lower case) to its command name; `slash` maps each slash command name (lower
    case, with "/") to its SlashCommand; `routers` are the words that route in messages like a router slash
    command does (`!gpu probe ...`, `@gpubot status`), each with its default command."""

    words: dict[str, str]
    slash: dict[str, SlashCommand]
    routers: dict[str, str] = field(default_factory=dict)


class Grammar:
    """Command text -> CommandCall for one Vocabulary. The same meaning on every route: `/gpu snooze 5`,
    `!gpu snooze 5`, `@gpubot snooze 5` and `!snooze 5` all give the command `snooze` with args ["5"]."""

    def __init__(self, vocabulary: Vocabulary):
        self.vocabulary = vocabulary

    def command_name(self, word: str) -> str | None:
        """The command a word (or alias) names, case-insensitively, or None."""
        return self.vocabulary.words.get((word or "").lower())

    def _routed(self, default: str, words: list[str], raw: str) -> CommandCall:
        """After a router word: a first word that names a command runs it; a key=value or --flag first word
        goes to `default`; any other first word is kept as the (unknown) name, which the dispatcher reads as
        a host (`/gpu gpu-host-1` is `/gpu status gpu-host-1`) or answers with the help."""
        if words and "=" not in words[0] and not words[0].startswith("--"):
            name = self.command_name(words[0])
            return _build(name or words[0], words[1:], raw, word=words[0])
        return _build(default, words, raw)

    def parse_slash(self, command: str, text: str) -> CommandCall:
        """Parse a slash command (`command` like "/gpu", `text` what followed it). Raises CommandParseError
        for an unknown slash command or unparseable text."""
        try:
            return self._parse_slash(command, text)
        except CommandParseError as e:
            e.raw = show_invisible(f"{command} {text or ''}".strip())
            raise

    def _parse_slash(self, command: str, text: str) -> CommandCall:
        words = _split(text or "")
        cmd = (command or "").strip().lower()
        slash = self.vocabulary.slash.get(cmd)
        if slash is None:
            raise CommandParseError(f"unknown slash command {cmd[:40]}")
        raw = show_invisible(f"{cmd} {text or ''}".strip())  # as typed, with its slash command (audit, "asked")
        if slash.router:
            return self._routed(slash.default, words, raw)
        return _build(slash.default, words, raw)

    def parse_message(self, text: str, *, bot_user_id: str | None, prefix: str = "!") -> CommandCall | None:
        """Parse a channel/thread message addressed to the bot: `<@BOT> cmd ...` or `{prefix}cmd ...`.

        Returns None when the message is not addressed to the bot. Raises CommandParseError for a message
        addressed to the bot that cannot be parsed.
        """
        raw = text or ""
        mentioned, rest = strip_mention(raw)
        if mentioned is not None:
            if bot_user_id is not None and mentioned != bot_user_id:
                return None
            body = rest
        elif prefix and raw.lstrip().startswith(prefix):
            body = raw.lstrip()[len(prefix) :]
            if not body or body[0].isspace():
                return None
        else:
            return None
        return self.parse_command(body, raw=raw)

    def parse_command(self, body: str, *, raw: str | None = None) -> CommandCall:
        """Parse command text without a prefix (`probe h1 pgid=1`, `gpu status`, a button's command). Empty
        text is `help`. Raises CommandParseError."""
        raw = show_invisible(body if raw is None else raw)
        try:
            return self._parse_command(body, raw)
        except CommandParseError as e:
            e.raw = raw
            raise

    def _parse_command(self, body: str, raw: str) -> CommandCall:
        words = _split(body)
        if not words:
            return CommandCall(name="help", raw=raw)
        first = words[0].lower().lstrip("/")
        if first in self.vocabulary.routers:
            return self._routed(self.vocabulary.routers[first], words[1:], raw)
        return _build(self.command_name(first) or first, words[1:], raw, word=words[0].lstrip("/"))

    def addresses(self, text: str, prefix: str, hosts: Iterable[str] = ()) -> bool:
        """True when a `{prefix}word ...` message names a command, a router word (`gpu`) or one of `hosts`:
        "!important: prod is down" is chat, not a command."""
        body = (text or "").lstrip()[len(prefix):]
        first = body.split(None, 1)[0] if body.split() else ""  # "!status: prod is down" is chat
        return bool(first) and (first.lower() in self.vocabulary.routers or self.command_name(first) is not None
                                or first in set(hosts))


def strip_mention(text: str) -> tuple[str | None, str]:
    """Split a leading `<@U123>` mention off message text. Returns (user id or None, rest)."""
    m = _MENTION_RE.match(text or "")
    if not m:
        return None, text or ""
    return m.group(1), text[m.end() :]
