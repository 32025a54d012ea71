"""Time read from a log's own lines (pure): each line's timestamp in seconds, so progress, stalls and elapsed time are
known from the log alone, without an outside clock.

`stamp(text)` reads the timestamp a line's prefix carries (the first 80 characters), as (kind, seconds). Lines of one
kind compare with each other; kinds do not mix. Formats, with where they are written:
- `iso`: ISO 8601 / RFC 3339 date and time (`2024-12-06T10:00:00.123Z`, `2024-12-06 10:00:00,123`, with an offset
  or without): Python logging's default, SGLang (`[2025-02-01 07:03:54 TP6]`), TGI and Rust tracing, docker and
  kubectl `--timestamps`, Ollama's logfmt `time=`; also TensorRT-LLM's `[12/06/2024-10:00:00]`, `dmesg -T`'s
  `[Tue Dec  6 10:00:00 2024]`, Go's log package and gin (`2023/09/04 18:31:32`, `[GIN] 2025/12/23 - 10:40:50`) and
  epoch seconds at the start of a line, in brackets (`1733480000.123`) or in a `timestamp=` / `ts=` field. Seconds
  since 1970-01-01 UTC (a line without an offset is read as UTC).
- `md`: month, day and time without a year: vLLM (`INFO 06-30 13:53:19`), glog and torch c10 (`I1206 10:00:00.1`),
  syslog / journald (`Dec  6 10:00:00`). Seconds within a notional leap year.
- `hms`: a time alone (`[10:00:00]`, `10:00:00.123 `). Seconds within a day.
- `uptime`: the kernel's `[ 12345.678901]` (dmesg). Seconds since boot.
- `elapsed`: llama.cpp's `--log-timestamps` (`0.01.323.172 I ...`: minutes, seconds, ms, µs). Seconds since the
  process started.

`timeline(stamps)` puts one kind's values in order: a clock that goes back by more than half a day (`hms`) or half a
year (`md`) went past midnight or a new year, and is carried forward. Never raises.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Sequence
from types import MappingProxyType

__all__ = ["dominant_kind", "stamp", "timeline"]

_MONTHS = MappingProxyType({m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep",
                                                        "Oct", "Nov", "Dec"), start=1)})
_ISO = re.compile(r"(?<!\d)(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?(Z|[+-]\d\d:?\d\d)?")
_TRT = re.compile(r"(?<!\d)(\d\d)/(\d\d)/(\d{4})-(\d\d):(\d\d):(\d\d)")
_DMESG_T = re.compile(r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) ([A-Z][a-z]{2}) +(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})\]")
_EPOCH = re.compile(r"^\[?(1[5-9]\d{8})(?:\.(\d{1,9}))?\]?\s")
_UPTIME = re.compile(r"^\[\s*(\d{1,9})\.(\d{3,9})\]")
#: llama.cpp's `--log-timestamps` (common/log.cpp): minutes.seconds.milliseconds.microseconds since the process
#: started, then the level letter: `0.01.323.172 I common_fit_params: ...`.
_GGML_ELAPSED = re.compile(r"^(\d{1,6})\.(\d\d)\.(\d{3})\.(\d{3}) [IWEDT] ")
_MD = re.compile(r"(?<![\d-])(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?")
_GLOG = re.compile(r"(?:^|\[|\]:?\[?)[IWEF](\d{1,2})(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?")
_SYSLOG = re.compile(r"^([A-Z][a-z]{2}) ([ \d]\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?")
_HMS = re.compile(r"(?:^|\[|\s)(\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?(?=[\]\s,|]|$)")
#: Go's `log` package and gin (`2023/09/04 18:31:32`, `[GIN] 2025/12/23 - 10:40:50`).
_SLASH = re.compile(r"(?<!\d)(\d{4})/(\d\d)/(\d\d)(?: - |[ T])(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?")
#: An epoch in a key=value field anywhere in the line (`timestamp=1723904002`, llama.cpp's JSON logs in logfmt).
_KV_EPOCH = re.compile(r"(?:^|[\s,{])\"?(?:ts|time|timestamp)\"?[=:]\s?(1[5-9]\d{8})(?:\.(\d{1,9}))?\b")
_HEAD = 80
#: A time of day (`10:00:00`): every kind but the epoch ones has one.
_CLOCK = re.compile(r"\d\d:\d\d:\d\d")


def _days(y: int, m: int, d: int) -> int:
    """Days from 1970-01-01 to the civil date y-m-d (proleptic Gregorian; Howard Hinnant's algorithm)."""
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _frac(s: str | None) -> float:
    return float("0." + s) if s else 0.0


def _md(mo: int, d: int, h: int, mi: int, s: int, frac: str | None) -> float:
    """Seconds since the start of a notional leap year (2000) of month `mo`, day `d`."""
    return (_days(2000, mo, d) - _days(2000, 1, 1)) * 86400.0 + h * 3600 + mi * 60 + s + _frac(frac)


def _epoch_stamp(head: str, text: str) -> tuple[str, float] | None:
    """The clockless kinds: epoch seconds at the start or in a `ts=` field, the kernel's uptime."""
    if m := _EPOCH.match(head):
        return "iso", int(m.group(1)) + _frac(m.group(2))
    if m := _UPTIME.match(head):
        return "uptime", int(m.group(1)) + _frac(m.group(2))
    if m := _GGML_ELAPSED.match(head):
        return "elapsed", int(m.group(1)) * 60.0 + int(m.group(2)) + int(m.group(3)) / 1e3 + int(m.group(4)) / 1e6
    if ("ts" in text or "time" in text) and (m := _KV_EPOCH.search(text)):
        return "iso", int(m.group(1)) + _frac(m.group(2))
    return None


@functools.lru_cache(maxsize=8192)
def stamp(text: str) -> tuple[str, float] | None:
    """(kind, seconds) of the timestamp in the first 80 characters of a line (see the module docstring), or None.
    Impossible dates (month 13, hour 25) are no timestamp. Remembers the last lines asked about (the line reader and
    the log scanner both ask)."""
    head = text[:_HEAD]
    try:
        if not _CLOCK.search(head):  # no time of day in the head: only the epoch kinds can be there
            return _epoch_stamp(head, text)
        if m := _ISO.search(head):
            y, mo, d, h, mi, s = (int(x) for x in m.groups()[:6])
            if not (1 <= mo <= 12 and 1 <= d <= 31 and h < 24 and mi < 60 and s < 61):
                return None
            t = _days(y, mo, d) * 86400.0 + h * 3600 + mi * 60 + s + _frac(m.group(7))
            off = m.group(8)
            if off and off != "Z":
                sign = -1 if off[0] == "+" else 1
                t += sign * (int(off[1:3]) * 3600 + int(off[-2:]) * 60)
            return "iso", t
        if m := _SLASH.search(head):
            y, mo, d, h, mi, s = (int(x) for x in m.groups()[:6])
            if 1 <= mo <= 12 and 1 <= d <= 31 and h < 24:
                return "iso", _days(y, mo, d) * 86400.0 + h * 3600 + mi * 60 + s + _frac(m.group(7))
        if m := _TRT.search(head):
            mo, d, y, h, mi, s = (int(x) for x in m.groups())
            if 1 <= mo <= 12 and 1 <= d <= 31 and h < 24:
                return "iso", _days(y, mo, d) * 86400.0 + h * 3600 + mi * 60 + s
        if m := _DMESG_T.match(head):
            mon, d, h, mi, s, y = m.groups()
            if mon in _MONTHS:
                return "iso", _days(int(y), _MONTHS[mon], int(d)) * 86400.0 + int(h) * 3600 + int(mi) * 60 + int(s)
        if m := _EPOCH.match(head):
            return "iso", int(m.group(1)) + _frac(m.group(2))
        if m := _UPTIME.match(head):
            return "uptime", int(m.group(1)) + _frac(m.group(2))
        if m := _MD.search(head):
            mo, d, h, mi, s = (int(x) for x in m.groups()[:5])
            if 1 <= mo <= 12 and 1 <= d <= 31 and h < 24 and mi < 60:
                return "md", _md(mo, d, h, mi, s, m.group(6))
        if m := _GLOG.search(head):
            mo, d, h, mi, s = (int(x) for x in m.groups()[:5])
            if 1 <= mo <= 12 and 1 <= d <= 31 and h < 24 and mi < 60:
                return "md", _md(mo, d, h, mi, s, m.group(6))
        if m := _SYSLOG.match(head):
            mon = m.group(1)
            if mon in _MONTHS:
                return "md", _md(_MONTHS[mon], int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)),
                                 m.group(6))
        if m := _HMS.search(head):
            h, mi, s = (int(x) for x in m.groups()[:3])
            if h < 24 and mi < 60 and s < 61:
                return "hms", h * 3600.0 + mi * 60 + s + _frac(m.group(4))
        if m := _KV_EPOCH.search(text):
            return "iso", int(m.group(1)) + _frac(m.group(2))
    except (ValueError, OverflowError):
        return None
    return None


#: How far a clock of each kind may go back before it is read as having gone past midnight / a new year.
_WRAP = MappingProxyType({"hms": (43200.0, 86400.0), "md": (183 * 86400.0, 366 * 86400.0)})


def dominant_kind(kinds: Sequence[str | None]) -> str | None:
    """The timestamp kind most lines carry (ties: the first seen), or None when no line has one."""
    counts = Counter(k for k in kinds if k is not None and k != "uptime")
    return counts.most_common(1)[0][0] if counts else None


def timeline(stamps: Sequence[tuple[str | None, float | None]]) -> list[float | None]:
    """Per line, its time in seconds on one clock: the values of the dominant kind, carried forward past midnight (or a
    new year), None for a line of another kind or without a timestamp."""
    kind = dominant_kind([k for k, _ in stamps])
    out: list[float | None] = []
    if kind is None:
        return [None] * len(stamps)
    wrap = _WRAP.get(kind)
    carry = 0.0
    last: float | None = None
    for k, t in stamps:
        if k != kind or t is None:
            out.append(None)
            continue
        v = t + carry
        if wrap is not None and last is not None and v < last - wrap[0]:
            carry += wrap[1]
            v += wrap[1]
        out.append(v)
        last = v
    return out
