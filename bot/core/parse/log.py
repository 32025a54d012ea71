"""Pure helpers for server log text: control/ANSI stripping, tail cleaning and the probe's log-stat line.

No I/O here. The input is whatever the probe read from the remote host: the bytes of `tail -c N FILE`
(any encoding, possibly cut mid-character, with ANSI colours and `\\r` progress bars) and the one-line
output of the probe's stat step (`SIZE MTIME LINES`, from GNU coreutils `stat -c '%s %.Y'` and
`wc -l`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

__all__ = ["clean_log_lines", "parse_log_stat", "strip_control"]

# ECMA-48 escape sequences, as emitted by terminals, colour loggers (rich, colorlog, tqdm):
# - OSC: ESC ] ... terminated by BEL, ESC \ or the 8-bit ST (0x9c). Unterminated OSC is left to the
#   control-character pass (ESC is removed, the payload stays visible).
# - CSI: ESC [ params intermediates final (e.g. "\x1b[31m", "\x1b[2K", "\x1b[?25l"), and 8-bit CSI 0x9b.
# - two-character escapes: ESC followed by one byte in 0x40-0x5f (e.g. "\x1b=", "\x1bM") or a charset
#   designation "\x1b(B".
_ANSI_RE = re.compile(
    r"""
    (?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)   # OSC ... BEL/ST
    | (?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]                    # CSI
    | \x1b[()*+][0-~]                                     # charset designation
    | \x1b[@-Z\\^_]                                       # other 2-char escapes (Fe)
    | \x1b[0-?=>`-~]                                      # private/Fp/Fs escapes (ESC 7, ESC =, ESC c ...)
    """,
    re.VERBOSE,
)

# C0 controls except TAB, DEL, C1 controls, Unicode line/paragraph separators and the bidi
# embedding/override/isolate controls (they can make a Slack message display text out of order).
_CONTROL_RE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")

_ELLIPSIS = "…"
_REDACTED = "[REDACTED]"
#: What a log window's first line becomes when the window starts inside it (see clean_log_lines).
CUT_LINE = f"{_ELLIPSIS} {_REDACTED} (line cut by the read window)"


def strip_control(text: str) -> str:
    """Return `text` without ANSI escape sequences and control characters.

    Removes CSI sequences (`ESC [ ... final`, colours, cursor moves, erase-line), OSC sequences
    (`ESC ] ... BEL` / `ESC ] ... ESC \\`, e.g. window titles and hyperlinks), other two-character
    escapes, then every C0 control character except TAB (so `\\n` and `\\r` are removed too), DEL,
    C1 controls (U+0080-U+009F), U+2028/U+2029 and the bidi override/isolate characters. Printable
    text, including non-ASCII and U+FFFD replacement characters, is kept unchanged.

    Format source: ECMA-48 / xterm control sequences as written by terminal-aware loggers.
    Never raises for any `str` input.
    """
    if not text or (text.isascii() and text.isprintable()):  # most lines: nothing to strip, no regex run
        return text if text else ""
    return _CONTROL_RE.sub("", _ANSI_RE.sub("", text))


def _last_segment(line: str) -> str:
    """Return the text a terminal would show for a line rewritten with `\\r` (the last non-empty segment)."""
    if "\r" not in line:
        return line
    for seg in reversed(line.split("\r")):
        if seg:
            return seg
    return ""


_MENTION_OPEN_RE = re.compile(r"<(?=[@#!])")


def no_mentions(text: str) -> str:
    """`text` from the host (a log line, a command line) with every Slack mention opener (`<@`, `<#`, `<!`)
    broken by a WORD JOINER (U+2060): it still reads `<@U123>`, but Slack never makes it a mention or a
    channel/group ping, however the message is later escaped. Never raises."""
    return _MENTION_OPEN_RE.sub("<\u2060", text) if "<" in text else text


def clean_log_lines(
    raw: bytes | str,
    *,
    max_lines: int = 20,
    max_width: int = 400,
    redactor: Callable[[list[str]], list[str]] | None = None,
    starts_mid_line: bool = False,
) -> list[str]:
    """Return the last `max_lines` display-safe lines of a log tail.

    `raw` is the output of `tail -c N FILE` (bytes, decoded here as UTF-8 with replacement, so a
    character cut by `tail -c` becomes U+FFFD) or an already decoded string. Lines are split on `\\n`;
    a final newline does not make an extra empty line. Within a line, `\\r` rewrites (tqdm/progress
    bars, CRLF endings) keep only the last non-empty `\\r` segment. Each line is then passed through
    `strip_control` and right-stripped of whitespace.

    `redactor` (e.g. `bot.core.redact.redact_lines`, passed in by the caller so this module stays
    dependency-free) is then applied to the cleaned, still full-width lines: to ALL lines of `raw`, not
    only the kept ones, so context above the window (the BEGIN line of a PEM key) is seen. It must return
    one line per input line (a result of another length is not trusted: every line becomes "[REDACTED]");
    its lines pass through `strip_control` again.
    Redacting happens BEFORE cutting, because a secret cut in half ("sk-ABCDEFGHIJ…") is no longer
    recognisable.

    `starts_mid_line`: `raw` is a window that may begin inside a line (`tail -c N` of a longer file). That first,
    partial line is shown as `… [REDACTED] (line cut by the read window)`: its start, where a secret's NAME
    may have been (`DB_PASSWORD=s3...`), is gone, so nothing can tell whether the rest is a secret value.

    Mention openers are broken (`no_mentions`): a log line never pings anyone in Slack.
    Last, a line longer than `max_width` characters is cut to `max_width - 1` characters plus "…" (so
    every line is at most `max_width` characters; `max_width` < 1 is treated as 1). Returns [] for empty
    input or `max_lines` <= 0. Never raises, unless `redactor` does.
    """
    if max_lines <= 0 or not raw:
        return []
    width = max(1, max_width)
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes | bytearray) else str(raw)
    if text.endswith("\n"):
        text = text[:-1]
    parts = text.split("\n") if redactor is not None else text.rsplit("\n", max_lines)[-max_lines:]
    lines = [strip_control(_last_segment(part)).rstrip() for part in parts]
    if redactor is not None:  # the redactor sees what can be shown and far more context; never a megabyte
        # imported here: only a caller that redacts needs the redaction rules (diagnose only strips controls)
        from bot.core.redact import REDACT_REACH

        reach = max(REDACT_REACH, 8 * width)
        lines = [line[:reach] for line in lines]
    if starts_mid_line and lines and len(parts) == len(text.split("\n")):
        lines[0] = CUT_LINE
    if redactor is not None:
        redacted = list(redactor(list(lines)))
        if len(redacted) != len(lines):
            redacted = [_REDACTED] * len(lines)
        lines = [strip_control(line) for line in redacted[-max_lines:]]
    lines = [no_mentions(line) for line in lines]
    return [line[: width - 1] + _ELLIPSIS if len(line) > width else line for line in lines]


def parse_log_count(text: str) -> tuple[int, int, int, int, int] | None:
    """Parse the probe's `log_count` section, `DEV INODE FROM NEWLINES BYTES` (stat's `%d %i`, the byte the count
    started at, then `wc -lc` of what was read from there: newlines and bytes), into those five non-negative ints;
    None for anything else (an error message, a count cut short). Never raises."""
    tokens = (text or "").split()
    if len(tokens) != 5:
        return None
    values = [_int_or_none(t) for t in tokens]
    if any(v is None for v in values):
        return None
    dev, inode, start, newlines, nbytes = values  # type: ignore[misc]
    return dev, inode, start, newlines, nbytes


def _int_or_none(token: str) -> int | None:
    """Return `token` as a non-negative int, or None (also for more than 20 digits: no size or line count is
    that big, and `int()` refuses strings of over 4300 digits)."""
    if token.isascii() and token.isdigit() and len(token) <= 20:
        return int(token)
    return None


def parse_log_stat(text: str) -> tuple[int | None, float | None, int | None]:
    """Parse the probe's log-stat output `SIZE MTIME LINES` into `(size_bytes, mtime, lines)`.

    Format: one line of three whitespace-separated tokens, e.g. `5652 1764402000 41` or
    `5652 1764402000.123456789 41`, as printed by `stat -c '%s %.Y' FILE` (GNU coreutils; `%Y` gives an
    integer mtime) followed by `wc -l < FILE` on the same line. `size_bytes` is bytes, `mtime` seconds
    since the epoch on the remote clock, `lines` the newline count. Tokens are taken across any
    whitespace, so the same three values split over two lines also parse.

    Returns (None, None, None) when the text does not hold exactly three tokens (e.g. an error message,
    or `wc -l FILE` which appends the file name); otherwise each value that is not a valid
    non-negative number (finite for mtime) is None on its own. Never raises.
    """
    tokens = (text or "").split()
    if len(tokens) != 3:
        return None, None, None
    size = _int_or_none(tokens[0])
    lines = _int_or_none(tokens[2])
    mtime: float | None
    try:
        mtime = float(tokens[1]) if tokens[1].isascii() else None
    except ValueError:
        mtime = None
    if mtime is not None and (not math.isfinite(mtime) or mtime < 0):
        mtime = None
    return size, mtime, lines
