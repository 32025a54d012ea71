"""Commands as data in answers: a command an answer suggests (`/kill 7`, `!logs 200`) is made here as a
suggestion, never written by hand with a default name, and written with this install's own slash command names
and thread prefix by the renderer (bot.present.render), for every message: answers, root messages, alerts.

Prose that names a command is composed in many places (a pre-launch problem "port 8000 belongs to base-3;
`/kill 3` first", a signature's next step, a usage line), so a suggestion travels inside that text as a token, the
way Slack carries a mention as `<@U123>` and its client writes the name: `slash("kill", 3)` gives the token
`\\ue000/kill 3\\ue001`, which `CommandNames.expand` writes as `/kill 3`, `/kill-staging 3` or, for a command with
no slash command of its own, `/gpu logs 3`; `thread("logs", 200)` is written `!logs 200` or `?logs 200`. The
markers are Unicode private-use characters: nothing the bot reads from a host carries them as a token by accident,
and a stray marker is dropped.

In data (bot/core/diagnose/signatures.yaml) a suggestion is written `{/status}`, `{!logs 200}` or
`{/kill pid=N}` (command names, not slash names) and `markup` turns it into the token.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

#: Opens and closes a suggestion token (Unicode private-use characters); a thread suggestion may name its launch
#: after LAUNCH_MARK, for a surface without threads (the console), which writes it with the launch (`!logs #7 200`).
OPEN, CLOSE, LAUNCH_MARK = "\ue000", "\ue001", "\ue002"
#: A suggestion's kind: typed as a slash command anywhere, or with the thread prefix in a launch's thread.
SLASH, THREAD = "/", "!"

_MARKUP = re.compile(r"\{([/!])([a-z][a-z_-]*)((?: [^{}\n]*)?)\}")


def slash(command: str, *args: object) -> str:
    """The token of `command` (a command table name: `kill`, `status`, `logs`) typed as a slash command with
    `args` (joined by spaces), e.g. `slash("kill", 7)`, written `/kill 7` (or this install's name)."""
    return _token(SLASH, command, args)


def thread(command: str, *args: object, launch: object = None) -> str:
    """The token of `command` typed in a launch's thread with the install's prefix, e.g. `thread("logs", 200)`,
    written `!logs 200` (or `?logs 200`); with `launch` (a launch id), a surface without threads writes it
    `!logs #7 200`."""
    return _token(THREAD, command, args, launch)


def _token(kind: str, command: str, args: tuple[object, ...], launch: object = None) -> str:
    rest = " ".join(str(a) for a in args if a is not None and str(a) != "")
    ref = f"{LAUNCH_MARK}{int(launch)}" if isinstance(launch, int) and not isinstance(launch, bool) else ""
    return f"{OPEN}{kind}{command}{' ' + rest if rest else ''}{ref}{CLOSE}"


def for_launch(text: str, launch_id: int) -> str:
    """`text` with every thread suggestion that names no launch naming `launch_id` (the launch an alert or answer
    is about), so a surface without threads can write it with the launch."""
    if OPEN + THREAD not in text:
        return text
    parts = text.split(OPEN)
    for i in range(1, len(parts)):
        body, sep, rest = parts[i].partition(CLOSE)
        if sep and body.startswith(THREAD) and LAUNCH_MARK not in body:
            parts[i] = f"{body}{LAUNCH_MARK}{int(launch_id)}{CLOSE}{rest}"
    return OPEN.join(parts)


def markup(text: str) -> str:
    """`text` with each `{/command args}` / `{!command args}` written as a suggestion token (data files' form of
    `slash` and `thread`); other braces are kept."""
    if "{" not in text:
        return text
    return _MARKUP.sub(lambda m: f"{OPEN}{m.group(1)}{m.group(2)}{m.group(3)}{CLOSE}", text)


def suggests(text: str, command: str) -> bool:
    """Whether `text` suggests `command`, in either kind."""
    return f"{OPEN}{SLASH}{command}" in text or f"{OPEN}{THREAD}{command}" in text


@dataclass(frozen=True)
class Suggestion:
    """One suggested command: its `kind` (SLASH or THREAD), `command` (a command table name) and `args` text."""

    kind: str
    command: str
    args: str = ""
    launch: str = ""


def suggestions(text: str) -> list[Suggestion]:
    """The suggestions carried by `text`, in order (for tests and for the console's hints)."""
    out = []
    for part in text.split(OPEN)[1:]:
        body, sep, _ = part.partition(CLOSE)
        if sep and len(body) > 1 and body[0] in (SLASH, THREAD):
            out.append(_suggestion(body))
    return out


def _suggestion(body: str) -> Suggestion:
    """A token's body (`!logs 200` + optional LAUNCH_MARK + launch id) as a Suggestion."""
    body, _, launch = body.partition(LAUNCH_MARK)
    command, _, args = body[1:].partition(" ")
    return Suggestion(body[0], command, args, launch if launch.isascii() and launch.isdigit() else "")


@dataclass(frozen=True)
class CommandNames:
    """How this install writes a suggestion: `slash_of` maps a command to the slash command text that runs it
    (`kill` -> `/kill`, `status` -> `/gpu status`, renamed: `/kill-staging`, `/gpu-staging status`), `router` the
    router slash command for commands that have none (`/gpu`), `prefix` the thread prefix (`!`). Built from the
    command table and the config (handlers.derive.command_names). `threads` False: the surface has no threads (the
    console), so a thread suggestion that names its launch is written with it (`!logs #7 200`)."""

    slash_of: Mapping[str, str] = field(default_factory=dict)
    router: str = "/gpu"
    prefix: str = "!"
    threads: bool = True

    def write(self, s: Suggestion) -> str:
        """The text a person types for `s`: `/kill 7`, `/gpu logs 3 200`, `!logs 200` (`!logs #3 200` without
        threads)."""
        if s.kind == THREAD:
            head = f"{self.prefix}{s.command}"
            if not self.threads and s.launch:
                head += f" #{s.launch}"
        else:
            head = self.slash_of.get(s.command) or f"{self.router} {s.command}"
        return f"{head} {s.args}" if s.args else head

    def expand(self, text: str) -> str:
        """`text` with every suggestion token written (`write`) and stray markers dropped. Costs one scan when
        `text` holds no token."""
        if OPEN not in text and CLOSE not in text:
            return text
        return self._expand(text, str, str)

    def expand_json(self, text: str) -> str:
        """`expand` for JSON text whose strings carry tokens as raw characters (written with `ensure_ascii`
        off): each token's body is read as the inside of one JSON string (a "token" whose markers sit in two
        strings is none: its markers are dropped), and the written suggestion is escaped once for a JSON string
        and for Slack mrkdwn (`&`, `<`, `>`)."""
        if OPEN not in text and CLOSE not in text:
            return text
        return self._expand(text, _json_inside, lambda w: json.dumps(
            w.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"), ensure_ascii=False)[1:-1])

    def _expand(self, text: str, decode, escape) -> str:  # type: ignore[no-untyped-def]
        parts = text.split(OPEN)
        out = [_bare(parts[0])]
        for part in parts[1:]:
            body, sep, rest = part.partition(CLOSE)
            raw = decode(body) if sep else None
            if raw is not None and _TOKEN_BODY.fullmatch(raw):
                out.append(escape(self.write(_suggestion(raw))))
                out.append(_bare(rest))
            else:  # no token (markers that came from elsewhere): the text stays, the markers go
                out.append(_bare(part))
        return "".join(out)


#: What a token's body may be: a kind, a command name, arguments on one line, and a launch id.
_TOKEN_BODY = re.compile(r"[/!][a-z][a-z_-]{0,40}(?: [^\n\ue000\ue001\ue002]{0,400})?(?:\ue002[0-9]{1,12})?")
_MARKERS = re.compile("[\ue000\ue001\ue002]")


def _bare(text: str) -> str:
    """`text` without marker characters."""
    return _MARKERS.sub("", text) if (OPEN in text or CLOSE in text or LAUNCH_MARK in text) else text


def _json_inside(body: str) -> str | None:
    """The text a piece of a JSON string stands for (`\\u003c` -> `<`), or None when it is no such piece (it
    holds a bare quote: the markers sat in two different strings)."""
    try:
        value = json.loads(f'"{body}"')
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, str) else None


def strip_markers(data: bytes) -> bytes:
    """`data` (text read from a host, UTF-8) without the marker characters of suggestion tokens (U+E000..U+E002),
    so nothing a host prints can pass for, or break, a suggestion. One scan when there is none."""
    return re.sub(rb"\xee\x80[\x80-\x82]", b"", data) if b"\xee\x80" in data else data
