"""Error blocks of a server log (pure): where a multi-line error starts and ends, the head lines that say
what failed, the phase its words and frames name, and a failure line quoted around the words that decided.

A block is the run of lines around a failure that belong to it: error-severity lines (signatures.yaml
`error_severity`: Python logging, glog, torch c10, TensorRT-LLM, Rust tracing prefixes), traceback frames and
code lines, exception lines, and whatever was logged in the same second (a CUDA error logged as a WARNING
block right before the ERROR block of the same event).
"""

from __future__ import annotations

import re

from bot.core.diagnose.evidence import _q, _q_at
from bot.core.diagnose.logscan import _FRAME_RE, LogScan, _Hit
from bot.core.diagnose.signatures import Signatures
from bot.core.diagnose.timeline import stamp

__all__ = ["DECISIVE_QUOTE_MAX", "block_heads", "hinted_phase", "is_error_part", "quote_hit"]


#: The longest quote of a decisive failure line, in characters (other quotes keep evidence._QUOTE_MAX): the line that
#: decides is quoted whole where it can be, since its deciding words may sit anywhere in it.
DECISIVE_QUOTE_MAX = 900


def quote_hit(h: _Hit, sig: Signatures, limit: int = DECISIVE_QUOTE_MAX) -> str:
    """The failure line of `h` quoted (at most `limit` characters) around the words its signature matched, so the
    deciding words survive the cut of a long line."""
    group = sig.failures.get(h.kind) if h.kind in sig.failures else sig.killed if h.kind == "killed" else None
    pat = group.first(h.line) if group is not None else None
    m = pat.regex.search(h.line) if pat is not None else None
    return _q_at(h.line, m.start(), limit) if m else _q(h.line, limit)


#: A native backtrace frame (TensorRT-LLM's and glog's C++ stack traces): `2   0x7a14577171ec tensorrt_llm::...`.
_NATIVE_FRAME = re.compile(r"\d{1,3}\s+0x[0-9a-f]{6,16} \S")


def is_error_part(line: str, sig: Signatures, event: tuple[str, float] | None = None) -> bool:
    """Whether a line belongs to a multi-line error block: an error-severity prefix, a traceback line (frame,
    code, caret, or a native backtrace frame), an exception line, or (with `event`, the failure line's timestamp) a
    line logged in the same second, whatever its severity (a CUDA error logged as a WARNING block right before the
    ERROR block)."""
    body = line.strip()
    if not body:
        return False
    if event is not None and stamp(line) == event:
        return True
    return bool(sig.error_severity.search(line) or _FRAME_RE.search(line)
                or "Traceback (most recent call last)" in line or sig.exception_line.search(line)
                or line[:1] in (" ", "\t") or sig.error_tail.first(line) is not None
                or (line[:1].isdigit() and _NATIVE_FRAME.match(line) is not None))


def _block_after(scan: LogScan, i: int, sig: Signatures, event: tuple[str, float] | None, limit: int) -> list[int]:
    """The lines of the error block that follow line `i` (at most `limit` lines on): error parts, and a blank line or
    two where an error part follows them (a chained traceback, or excerpts a report joined with a blank line)."""
    out: list[int] = []
    j, end = i + 1, min(len(scan.lines), i + limit)
    while j < end:
        line = scan.lines[j]
        if not line.strip():
            k = j
            while k < end and not scan.lines[k].strip() and k - j < 2:
                k += 1
            if k < end and scan.lines[k].strip() and is_error_part(scan.lines[k], sig, event):
                j = k
                continue
            break
        if not is_error_part(line, sig, event):
            break
        out.append(j)
        j += 1
    return out


def block_heads(scan: LogScan, i: int, sig: Signatures, limit: int = 2) -> list[int]:
    """The message lines (not frames or code) of the multi-line error block around line `i`, other than line
    `i` itself: the head that says what failed ("EngineCore failed to start.", "Engine background task
    failed") when the decisive line is deeper in the block. At most `limit`, in log order."""
    event = stamp(scan.lines[i])
    lo = i
    while lo > 0 and i - lo < 80 and is_error_part(scan.lines[lo - 1], sig, event):
        lo -= 1
    hi = i
    while hi + 1 < len(scan.lines) and hi - i < 120 and is_error_part(scan.lines[hi + 1], sig, event):
        hi += 1
    heads = []
    for j in range(lo, hi + 1):
        line = scan.lines[j]
        if j == i or _FRAME_RE.search(line) or "Traceback (most recent call last)" in line:
            continue
        text = sig.error_severity.split(line)[-1].strip(" :]")
        if sig.error_severity.search(line) and len(text) > 8 and not text.startswith(("File ", "^", "~")) \
                and line.strip() != scan.lines[i].strip():
            heads.append(j)
    return heads[:1] + heads[-1:] if len(heads) > limit else heads


def hinted_phase(scan: LogScan, i: int, sig: Signatures) -> tuple[str | None, int | None]:
    """The phase the failure at line `i` names by meaning (signatures.yaml `phase_hints`): its own line, then its
    traceback (the lines after it, innermost frame first), then the lines just before it (a traceback that ends
    in it). Returns (phase, the line that names it), (None, None) when nothing says."""
    event = stamp(scan.lines[i])
    after = _block_after(scan, i, sig, event, 120)  # its own block only: the traceback(s) that follow
    before = []
    for j in range(i - 1, max(-1, i - 40), -1):  # the traceback that ends in it, nearest first
        if not is_error_part(scan.lines[j], sig, event):
            break
        before.append(j)
    for j in [i, *after, *before]:
        if sig.serving_evidence.first(scan.lines[j]):
            return "serving", j
    for j in [*reversed(after), *before]:  # frames and block lines only: the error message's own words never
        for p in sig.phase_hints:
            if p.regex.search(scan.lines[j]):
                return p.phase, j
    return None, None
