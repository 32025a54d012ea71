"""Jinja2 rendering: templates in `templates/` -> Block Kit JSON plus a plain-text fallback.

Each answer has two templates: `NAME.blocks.j2` builds a list of Block Kit blocks with the `do` extension
and ends in `{{ blocks | tojson }}`; `NAME.txt.j2` renders plain text, used as the Slack `text` fallback
and by the console. Remote text (log lines, command lines) is escaped for Slack mrkdwn (`&`, `<`, `>`)
before it is put into blocks, so a log line cannot mention @channel or forge a link.

`fit_blocks` enforces Slack's Block Kit limits (50 blocks per message, 3000 characters per section
text, 150 per header text, 40 000 for the top-level text) and marks anything it cuts.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import jinja2

from bot.core.commands import CommandNames, slash, thread
from bot.core.redact import Redactor
from bot.present.actions import ActionId

MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3000
MAX_HEADER_TEXT = 150
MAX_MESSAGE_TEXT = 40_000
TRUNCATED = "… (truncated, full output attached)"


@dataclass
class Message:
    """One answer: `text` (plain text; Slack fallback and console output), `blocks` (Block Kit list or
    None), and optional `files` as (filename, bytes) to attach in the thread."""

    text: str
    blocks: list[dict[str, Any]] | None = None
    files: list[tuple[str, bytes]] = field(default_factory=list)

    def then(self, other: Message) -> Message:
        """This message followed by `other` in one answer: texts joined by a line break, blocks and files
        concatenated (e.g. a relaunch's kill result, then its launch result)."""
        blocks = None if self.blocks is None and other.blocks is None else [*(self.blocks or []), *(other.blocks or [])]
        return Message(text=f"{self.text}\n{other.text}", blocks=blocks, files=[*self.files, *other.files])

    def asked_by(self, user_id: str, command: str) -> Message:
        """This message with who asked for it (a slash command or a click leaves no message of its own in the
        channel): a context block `<@U…> asked: `/gpu status`` last, and `(asked by <@U…>)` in the text."""
        if not re.fullmatch(r"[UW][A-Z0-9]{2,20}", user_id):
            return self
        note = f"<@{user_id}> asked: `{code_escape(command[:200])}`"
        blocks = None if self.blocks is None else [
            *self.blocks, {"type": "context", "elements": [{"type": "mrkdwn", "text": note}]}]
        if blocks is not None and len(blocks) > MAX_BLOCKS:
            blocks = self.blocks
        return Message(text=f"{self.text}\n(asked by <@{user_id}>)", blocks=blocks, files=list(self.files))


def mrkdwn_escape(value: Any) -> str:
    """Escape `&`, `<`, `>` for Slack mrkdwn (in that order). Returns a str."""
    s = "" if value is None else str(value)
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_MENTION_RE = re.compile(r"&lt;(@[UW][A-Z0-9]{2,20})&gt;")


def slack_text(value: Any) -> str:
    """`mrkdwn_escape`, then user mentions put back (`<@U123>`, the only kind the bot writes): a message's
    text (its notification) names people, it does not show `&lt;@U123&gt;`. Channel links, group mentions,
    `<!here>` and `<!channel>` stay escaped; host text (logs, command lines, stack dumps, nvidia-smi names)
    has its mention openers broken before it gets here (bot.core.parse.log.no_mentions)."""
    return _MENTION_RE.sub(r"<\1>", mrkdwn_escape(value))


def code_escape(value: Any) -> str:
    """Escape text for inside a ``` code block: mrkdwn escaping, and a zero-width space breaks any ```
    in remote text so it cannot close the block."""
    return mrkdwn_escape(value).replace("```", "`\u200b``")


def fmt_num(value: Any, fmt: str = "{:.0f}", missing: str = "-") -> str:
    """Format a number with `fmt`; None or NaN becomes `missing`."""
    if value is None:
        return missing
    try:
        if isinstance(value, float) and math.isnan(value):
            return missing
        return fmt.format(value)
    except (ValueError, TypeError):
        return missing


def fmt_gib(mib: Any, missing: str = "-") -> str:
    """MiB -> GiB text with one decimal (e.g. 76015 -> '74.2'); None -> `missing`."""
    return fmt_num(None if mib is None else mib / 1024.0, "{:.1f}", missing)


def fmt_duration(seconds: Any, missing: str = "-") -> str:
    """Seconds -> compact text: 42 -> '42s', 192 -> '3m12s', 7260 -> '2h01m', 90000 -> '1d01h'."""
    if seconds is None:
        return missing
    try:
        s = int(seconds)
    except (TypeError, ValueError, OverflowError):
        return missing
    if s < 0:
        return missing
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def fmt_bytes(n: Any, missing: str = "-") -> str:
    """Bytes -> '812 B', '4.2 KiB', '1.3 MiB', '2.0 GiB'."""
    try:
        v = float(n)
    except (TypeError, ValueError):
        return missing
    if not math.isfinite(v) or v < 0:
        return missing
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return missing  # pragma: no cover


def cut(value: Any, width: int) -> str:
    """Cut text to `width` characters, ending in '…' when cut."""
    s = "" if value is None else str(value)
    return s if len(s) <= width else s[: max(0, width - 1)] + "…"


def chunk_lines(lines: list[str], limit: int = MAX_SECTION_TEXT - 20) -> list[str]:
    """Join lines into chunks of at most `limit` characters each (a line longer than `limit` is cut)."""
    chunks: list[str] = []
    cur: list[str] = []
    size = 0
    for line in lines:
        if not isinstance(line, str) or len(line) > limit:
            line = cut(line, limit)
        if cur and size + len(line) + 1 > limit:
            chunks.append("\n".join(cur))
            cur, size = [], 0
        cur.append(line)
        size += len(line) + 1
    if cur:
        chunks.append("\n".join(cur))
    return chunks


def code_chunks(lines: list[str], limit: int = MAX_SECTION_TEXT - 20) -> list[str]:
    """`chunk_lines` of the lines escaped for a code block (`code_escape`): one filter call for a whole table (a
    Jinja2 `map` costs microseconds per line)."""
    if not lines:
        return []
    try:
        text = "\n".join(lines)
    except TypeError:  # not all text
        return chunk_lines([code_escape(line) for line in lines], limit)
    if text.count("\n") != len(lines) - 1:  # a line holds a break of its own: line by line
        return chunk_lines([code_escape(line) for line in lines], limit)
    return chunk_lines(code_escape(text).split("\n"), limit)  # one pass over the whole table


def _template_env() -> jinja2.Environment:
    loader = jinja2.FileSystemLoader(str(resources.files("templates")))
    env = jinja2.Environment(
        loader=loader,
        autoescape=False,  # noqa: S701 - output is Block Kit JSON, not HTML; remote text goes through |esc
        undefined=jinja2.StrictUndefined,
        extensions=["jinja2.ext.do"],
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
    )
    env.filters.update(
        esc=mrkdwn_escape,
        code=code_escape,
        num=fmt_num,
        gib=fmt_gib,
        dur=fmt_duration,
        bytes=fmt_bytes,
        cut=cut,
        chunk_lines=chunk_lines,
        code_chunks=code_chunks,
    )
    # suggested commands are tokens (bot.core.commands) written with this install's names after rendering; tokens
    # stay raw characters in the blocks' JSON (`ensure_ascii` off) so they are written there in one pass too
    env.policies["json.dumps_kwargs"] = {"sort_keys": True, "ensure_ascii": False}
    env.globals.update(slash=slash, thread=thread)
    env.globals["actions"] = ActionId  # button action ids: `actions.KILL`, defined once in bot.present.actions
    return env


def _cut_text_obj(obj: dict[str, Any], limit: int) -> None:
    t = obj.get("text")
    if isinstance(t, str) and len(t) > limit:
        suffix = "\n" + TRUNCATED
        if t.rstrip().endswith("```") and t.count("```") % 2 == 0:
            obj["text"] = t[: limit - len(suffix) - 4] + "\n```" + suffix
        else:
            obj["text"] = t[: limit - len(suffix)] + suffix


def _limited_texts(block: Any) -> list[tuple[Any, int]]:
    """The text objects of `block` that Slack limits, each with its limit in characters: a header's text (150),
    a section's text (3000) and fields (2000), a context's elements (3000). Entries that are no text object
    (not a dict) are listed too; callers skip them."""
    kind = block.get("type")
    if kind == "header":
        return [(block.get("text"), MAX_HEADER_TEXT)]
    if kind == "section":
        return [(block.get("text"), MAX_SECTION_TEXT), *((f, 2000) for f in block.get("fields", []) or [])]
    if kind == "context":
        return [(el, MAX_SECTION_TEXT) for el in block.get("elements", []) or []]
    return []


def _too_long(block: Any) -> bool:
    """Whether a text of `block` is over its limit (`_limited_texts`); a block that is no dict counts."""
    if not isinstance(block, dict):
        return True
    return any(isinstance(t, dict) and isinstance(t.get("text"), str) and len(t["text"]) > limit
               for t, limit in _limited_texts(block))


def fit_blocks(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return blocks within Slack's limits: at most 50 blocks (the last one says how many were dropped),
    section/context texts at most 3000 characters, header texts at most 150. Only a block that must be cut is
    copied; the others are returned as they are."""
    out = []
    for b in blocks:
        if _too_long(b):
            b = json.loads(json.dumps(b))  # a copy to cut
            for obj, limit in _limited_texts(b):
                if isinstance(obj, dict):
                    _cut_text_obj(obj, limit)
        out.append(b)
    if len(out) > MAX_BLOCKS:
        dropped = len(out) - (MAX_BLOCKS - 1)
        out = out[: MAX_BLOCKS - 1]
        out.append(
            {"type": "context", "elements": [{"type": "mrkdwn", "text": f"{TRUNCATED}: {dropped} more blocks"}]}
        )
    return out


def _tidy(text: str) -> str:
    """Collapse runs of blank lines to one and strip surrounding newlines."""
    return (re.sub(r"\n{3,}", "\n\n", text) if "\n\n\n" in text else text).strip("\n")


class Renderer:
    """Renders `templates/NAME.txt.j2` + `templates/NAME.blocks.j2` into a Message, redacting everything with
    `redactor` (the built-in rules plus the config's `redact_patterns`), and writing every suggested command
    (bot.core.commands) with `names`, this install's slash command names and thread prefix (default: `/gpu` for
    every command, `!` in threads). One Jinja2 environment per renderer (StrictUndefined: a missing variable is an
    error, not a blank); build one per bot (bot.wiring)."""

    def __init__(self, redactor: Redactor | None = None, names: CommandNames | None = None):
        self.redactor = redactor or Redactor()
        self.names = names or CommandNames()
        self.env = _template_env()

    def render(self, name: str, /, **context: Any) -> Message:
        """Render template pair NAME with `context`.

        Returns a Message whose blocks fit Slack's limits and whose text is at most 40 000 characters. When
        anything had to be cut, the full plain text is attached as `gpubot-NAME.txt` (Message.files) and the
        cut places say "(truncated, full output attached)". Everything is redacted (`self.redactor`): the context's
        strings before rendering (a list of lines as lines: `Redactor.deep`), then the rendered text and blocks.
        Raises jinja2.TemplateError on a template bug (the dispatcher turns it into an error answer).
        """
        context = self.redactor.deep(context)  # the data first, with its lines' context (a name above its value)
        full_text = self.redactor(self.names.expand(_tidy(self.env.get_template(f"{name}.txt.j2").render(**context))))
        raw = self._redact_blocks(json.loads(self.names.expand_json(
            self.env.get_template(f"{name}.blocks.j2").render(**context))))
        blocks = fit_blocks(raw)
        text = full_text
        if len(text) > MAX_MESSAGE_TEXT:
            text = text[: MAX_MESSAGE_TEXT - len(TRUNCATED) - 1] + "\n" + TRUNCATED
        msg = Message(text=text, blocks=blocks)
        if blocks != raw or text != full_text:
            msg.files.append((f"gpubot-{name}.txt", full_text.encode("utf-8", "replace")))
        return msg

    def text(self, name: str, /, **context: Any) -> str:
        """Render only the plain-text template `templates/NAME.txt.j2`, redacted (its context first, as `render`)."""
        context = self.redactor.deep(context)
        return self.redactor(self.names.expand(_tidy(self.env.get_template(f"{name}.txt.j2").render(**context))))

    def notice(self, title: str, detail: str, icon: str = ":white_check_mark:", hint: str | None = None) -> Message:
        """A success answer (templates/notice.*): `icon` (Slack emoji markup), then `title: detail`, and a hint."""
        return self.render("notice", icon=icon, text=f"{title}: {detail}", hint=hint)

    def error(self, title: str, detail: str, hint: str | None = None) -> Message:
        """The error answer (templates/error.*): a title, what was wrong, and what to do."""
        return self.render("error", title=title, detail=detail, hint=hint)

    def _redact_blocks(self, obj: Any) -> Any:
        """Apply the redactor to the texts of a Block Kit structure (a safety net after the views)."""
        return redact_blocks(obj, self.redactor)


def redact_blocks(obj: Any, redact: Callable[[str], str]) -> Any:
    """A Block Kit structure (decoded JSON: lists, dicts, strings) with `redact` applied to every string under a
    `text`, `elements`, `fields` or `blocks` key, or inside a nested list or dict; other values (a button's
    `value` and `action_id`, which the bot made) are kept as they are."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, list):
        return [redact_blocks(x, redact) for x in obj]
    if isinstance(obj, dict):
        return {k: (redact_blocks(v, redact) if k in ("text", "elements", "fields", "blocks")
                    or isinstance(v, (list, dict)) else v) for k, v in obj.items()}
    return obj
