"""Pure parsers for procps-ng `ps` output, and process selection over the parsed rows.

No I/O here. Formats come from real captures (procps-ng on Ubuntu 24.04, `tests/fixtures/h200/*.ps.txt`)
and public bug reports (`ps aux`, `tests/fixtures/cases/00-*/ps.txt`):

- the probe: `ps -eww -o pid,ppid,pgid,sid,stat,pcpu,rss,etimes,time,wchan:32,user:32,args`
  (header `PID PPID PGID SID STAT %CPU RSS ELAPSED TIME WCHAN USER COMMAND`; USER is the effective user's name, or
  its number when the name is wider than 32 characters or unknown)
- the fixtures: the same plus `pmem,vsz` (`%MEM`, `VSZ` columns)
- `ps aux` (`USER PID %CPU %MEM VSZ RSS TTY STAT START TIME COMMAND`)
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType

from bot.core.models import ProcessInfo

__all__ = [
    "PS_COLUMNS",
    "parse_cputime",
    "parse_etime",
    "parse_ps",
    "process_tree",
    "select_processes",
]

PS_COLUMNS = "pid,ppid,pgid,sid,stat,pcpu,rss,etimes,time,wchan:32,user:32,args"
"""The `-o` format the probe passes to `ps -eww -o` (procps-ng). `args` must stay last."""

# Header names procps-ng prints -> internal column kind.
_HEADER_KINDS: Mapping[str, str] = MappingProxyType({
    "PID": "pid",
    "PPID": "ppid",
    "PGID": "pgid",
    "PGRP": "pgid",
    "SID": "sid",
    "SESS": "sid",
    "STAT": "stat",
    "S": "stat",
    "%CPU": "pcpu",
    "RSS": "rss",
    "RSZ": "rss",
    "ELAPSED": "elapsed",
    "TIME": "cputime",
    "WCHAN": "wchan",
    "USER": "user",
    "EUSER": "user",
    "COMMAND": "args",
    "CMD": "args",
    "ARGS": "args",
})
# `-o` format specifiers (lower case, without `:width` / `=header`) -> column kind.
_SPEC_KINDS: Mapping[str, str] = MappingProxyType({
    "pid": "pid",
    "tgid": "pid",
    "ppid": "ppid",
    "pgid": "pgid",
    "pgrp": "pgid",
    "sid": "sid",
    "sess": "sid",
    "session": "sid",
    "stat": "stat",
    "s": "stat",
    "state": "stat",
    "pcpu": "pcpu",
    "%cpu": "pcpu",
    "rss": "rss",
    "rssize": "rss",
    "rsz": "rss",
    "etimes": "elapsed",
    "etime": "elapsed",
    "time": "cputime",
    "cputime": "cputime",
    "cputimes": "cputime",
    "times": "cputime",
    "wchan": "wchan",
    "user": "user",
    "euser": "user",
    "uname": "user",
    "args": "args",
    "command": "args",
    "cmd": "args",
    "comm": "args",
    "ucmd": "args",
    "ucomm": "args",
})

#: An ELAPSED above this (about 30 years) is a procps glitch (a just-started process), not an age: None.
MAX_PLAUSIBLE_ELAPSED_S = 10**9

_DURATION_RE = re.compile(r"^(?:(?:(\d{1,6})-)?(\d{1,4}):)?(\d{1,9}):(\d{1,2})$")
_MAX_LINE = 256 * 1024  # `ps -ww` prints full command lines; Linux caps them near 128 KiB of args


def _duration(text: str) -> int | None:
    """Seconds from `[[DD-]HH:]MM:SS` or a plain integer; None on anything else."""
    if not isinstance(text, str):
        return None
    s = text.strip()
    if not s or not s.isascii():
        return None
    if s.count(":") == 1 and s.count(".") == 1 and len(s.rpartition(".")[2]) == 2 and s[-2:].isdigit():
        s = s.rpartition(".")[0]  # macOS / BSD ps: `11:00.35` (minutes, seconds, hundredths)
    if s.isdigit():
        return int(s) if len(s) <= 12 else None
    m = _DURATION_RE.match(s)
    if not m:
        return None
    days, hours, minutes, seconds = m.groups()
    if int(seconds) >= 60 or (hours is not None and int(minutes) >= 60):
        return None
    if days is not None and int(hours) >= 24:
        return None
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes) * 60 + int(seconds)


def parse_cputime(text: str) -> int | None:
    """Return cumulative CPU time in whole seconds from a ps `TIME` cell, or None.

    Accepts procps-ng `time`/`cputime` output `[DD-]HH:MM:SS` (`00:00:04`, `1-02:03:04`), the
    BSD-style `MM:SS` of `ps aux` where minutes may exceed 59 (`18:36` = 1116 s), macOS's `MM:SS.hh` (the
    hundredths dropped), and plain integer seconds (`cputimes`). Seconds must be < 60, minutes < 60 when hours are
    present, hours < 24 when days are present. Never raises.
    """
    return _duration(text)


def parse_etime(text: str) -> int | None:
    """Return elapsed time since process start in whole seconds from a ps `ELAPSED` cell, or None.

    Accepts procps-ng `etime` output `[[DD-]HH:]MM:SS` (`05:07`, `01:02:03`, `2-03:04:05`) and the
    integer seconds of `etimes` (`20`); both print the header `ELAPSED`. Never raises.
    """
    return _duration(text)


def _int(token: str) -> int | None:
    """Non-negative int from an ASCII digit token, else None."""
    return int(token) if token.isascii() and token.isdigit() and len(token) <= 18 else None


def _float(token: str) -> float | None:
    """Finite float from a numeric token (`0.2`, `137`), else None."""
    if not token.isascii() or len(token) > 32:
        return None
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _spec_kind(spec: str) -> str | None:
    """Column kind of an `-o` specifier such as `wchan:32` or `pid=`."""
    name = spec.strip().split("=", 1)[0].split(":", 1)[0].strip().lower()
    return _SPEC_KINDS.get(name)


def _header_kinds(tokens: list[str]) -> list[str | None] | None:
    """Column kinds of a header line, or None when the tokens do not look like a ps header."""
    if not tokens or "PID" not in tokens or _int(tokens[0]) is not None:
        return None
    kinds = [_HEADER_KINDS.get(t) for t in tokens]
    return kinds if sum(k is not None for k in kinds) >= 2 else None


#: The column kinds of the probe's own layout (PS_COLUMNS): rows in it take the fast path (`_probe_row`).
_PROBE_KINDS = ("pid", "ppid", "pgid", "sid", "stat", "pcpu", "rss", "elapsed", "cputime", "wchan", "user", "args")


def _clock(text: str) -> int | None:
    """Seconds from procps-ng's `HH:MM:SS` (the common TIME cell) without a regex; anything else through
    `_duration`."""
    if len(text) == 8 and text[2] == ":" and text[5] == ":" and text.isascii():
        h, m, sec = text[:2], text[3:5], text[6:]
        if h.isdigit() and m.isdigit() and sec.isdigit():
            mi, se = int(m), int(sec)
            return int(h) * 3600 + mi * 60 + se if mi < 60 and se < 60 else None
    return _duration(text)


#: The start of a row of the probe's layout: pid, ppid, pgid, sid (ASCII digits) and stat, separated by spaces;
#: the rest is read when a field of it is first read (`_read_rest`). `\S` as `str.split` sees whitespace (not
#: re.ASCII), so the cells are the ones `_probe_row_split` finds.
_PROBE_HEAD_RE = re.compile(r" *([0-9]{1,18}) +([0-9]{1,18}) +([0-9]{1,18}) +([0-9]{1,18}) +(\S+) +")


def _probe_row(line: str, redact: Callable[[str], str] | None = None) -> ProcessInfo | None:
    """One row in the probe's layout (PS_COLUMNS), or None when it does not fit: what `_row` gives for that
    layout. A row of the common shape is read up to its state at once (a microsecond or two: every row of every
    probe passes here) and the rest when a field of it is first read (`ProcessInfo.half_read`, `_read_rest`); any
    other row the careful way (`_probe_row_split`). With `redact`, its command line is redacted when first read."""
    m = _PROBE_HEAD_RE.match(line)
    if m is None:
        info = _probe_row_split(line)
        return info if info is None or redact is None else info.pending_redaction(redact)
    pid, ppid, pgid, sid, stat = m.groups()
    return ProcessInfo.half_read(int(pid), int(ppid), int(pgid), int(sid), stat if stat != "-" else "",
                                 (_read_rest, line, m.end()), redact)


#: %CPU and TIME cells already read, and what they gave: most rows of a table share a few (`0.0`, `00:00:00`), so
#: a row costs a cache lookup for them instead of a parse (pure functions, so the caches change no result).
_pcpu_cell = functools.lru_cache(maxsize=4096)(_float)
_clock_cell = functools.lru_cache(maxsize=4096)(_clock)


def _read_rest(info: ProcessInfo, line: str, start: int) -> None:
    """Set the fields after `stat` of `info` from its row `line` (they start at `start`): what
    `_probe_row_split` reads from them, split the same way, with the common cells (whole numbers for RSS and
    ELAPSED) taken at once and any other row read by `_probe_row_split` itself."""
    parts = line[start:].split(None, 6)
    if len(parts) >= 6:
        pcpu, rss, elapsed, cpu, wchan = parts[0], parts[1], parts[2], parts[3], parts[4]
        if (rss.isdigit() and elapsed.isdigit() and rss.isascii() and elapsed.isascii() and len(rss) <= 18
                and len(elapsed) <= 12):
            el = int(elapsed)
            info.set_rest(_pcpu_cell(pcpu), int(rss), el if el < MAX_PLAUSIBLE_ELAPSED_S else None, _clock_cell(cpu),
                          None if wchan == "-" else wchan, parts[6].rstrip() if len(parts) == 7 else "",
                          None if parts[5] == "-" else parts[5])
            return
    full = _probe_row_split(line)  # an unusual row: every field checked one by one
    if full is None:  # cannot happen for a row whose start matched; keep what is known
        info.set_rest(None, None, None, None, None, "", None)
        return
    info.set_rest(full.pcpu, full.rss_kib, full.elapsed_s, full.cpu_time_s, full.wchan, full.args, full.user)


def _plausible(elapsed: int | None) -> int | None:
    """`elapsed` (seconds), or None when it is a glitch (MAX_PLAUSIBLE_ELAPSED_S or more)."""
    return elapsed if elapsed is None or elapsed < MAX_PLAUSIBLE_ELAPSED_S else None


def _probe_row_split(line: str) -> ProcessInfo | None:
    """`_probe_row` for any row: split into cells, each checked."""
    parts = line.split(None, 11)
    if len(parts) < 12:
        if len(parts) != 11:
            return None
        parts.append("")  # empty command line
    pid_s, ppid_s, pgid_s, sid_s, stat, pcpu_s, rss_s, el_s, cpu_s, wchan, user, args = parts
    if not (pid_s.isdigit() and pid_s.isascii() and len(pid_s) <= 18):
        return None
    return ProcessInfo(
        int(pid_s),
        int(ppid_s) if ppid_s.isdigit() and ppid_s.isascii() and len(ppid_s) <= 18 else None,
        int(pgid_s) if pgid_s.isdigit() and pgid_s.isascii() and len(pgid_s) <= 18 else None,
        int(sid_s) if sid_s.isdigit() and sid_s.isascii() and len(sid_s) <= 18 else None,
        stat if stat != "-" else "",
        _float(pcpu_s),
        int(rss_s) if rss_s.isdigit() and rss_s.isascii() and len(rss_s) <= 18 else None,
        _plausible(int(el_s) if el_s.isdigit() and el_s.isascii() and len(el_s) <= 12 else _duration(el_s)),
        _clock(cpu_s),
        None if wchan in ("-", "") else wchan,
        args.rstrip(),
        None if user in ("-", "") else user,
    )


def _row(kinds: Sequence[str | None], line: str) -> ProcessInfo | None:
    """One ProcessInfo from a data line, or None when the line does not fit the columns."""
    n = len(kinds)
    parts = line.split(None, n - 1)
    if len(parts) < n:
        if len(parts) == n - 1 and kinds[-1] == "args":
            parts.append("")  # empty command line
        else:
            return None
    values: dict[str, str] = {}
    for kind, part in zip(kinds, parts, strict=True):
        if kind is not None and kind not in values:
            values[kind] = part
    pid = _int(values.get("pid", ""))
    if pid is None:
        return None
    info = ProcessInfo(pid=pid)
    if "ppid" in values:
        info.ppid = _int(values["ppid"])
    if "pgid" in values:
        info.pgid = _int(values["pgid"])
    if "sid" in values:
        info.sid = _int(values["sid"])
    if "stat" in values:
        info.stat = values["stat"] if values["stat"] != "-" else ""
    if "pcpu" in values:
        info.pcpu = _float(values["pcpu"])
    if "rss" in values:
        info.rss_kib = _int(values["rss"])
    if "elapsed" in values:
        elapsed = parse_etime(values["elapsed"])
        info.elapsed_s = elapsed if elapsed is None or elapsed < MAX_PLAUSIBLE_ELAPSED_S else None
    if "cputime" in values:
        info.cpu_time_s = parse_cputime(values["cputime"])
    if "wchan" in values:
        w = values["wchan"]
        info.wchan = None if w in ("-", "") else w
    if "args" in values:
        info.args = values["args"].rstrip()
    if "user" in values:
        info.user = None if values["user"] in ("-", "") else values["user"]
    return info


def parse_ps(text: str, columns: Sequence[str] | None = None, *,
             redact: Callable[[str], str] | None = None) -> list[ProcessInfo]:
    """Parse procps-ng `ps` output into ProcessInfo rows, in input order.

    Without `columns` the text must start with (or contain) a header line; its names decide the
    columns: `PID PPID PGID SID STAT %CPU RSS ELAPSED TIME WCHAN USER COMMAND` (the probe's PS_COLUMNS),
    the same with `%MEM VSZ` (fixtures) and `ps aux` (`USER PID %CPU %MEM VSZ RSS TTY STAT START TIME
    COMMAND`) all work; unknown columns (%MEM, VSZ, TTY, START, ...) are ignored. A later header
    line switches the layout (concatenated outputs). If no header appears before the first data line,
    the PS_COLUMNS layout is assumed.

    With `columns` (a sequence of `-o` specifiers such as `("pid", "ppid", "wchan:32", "args")`, or a
    comma-separated string like PS_COLUMNS) the text has no header; header-looking lines are skipped.

    Cells are whitespace-separated, and the last column keeps its internal spaces (so it must be
    `args`/`COMMAND`; columns whose values contain spaces, like `lstart`, are not supported elsewhere).
    ELAPSED may be integer seconds (`etimes`) or `[[DD-]HH:]MM:SS` (`etime`); TIME is
    `[[DD-]HH:]MM:SS` or `MM:SS` (`ps aux`). Units: `rss_kib` KiB, `pcpu` percent, times seconds.
    WCHAN `-` becomes None. Lines that do not fit (no integer PID, too few cells) are skipped.
    With `redact`, each row's command line is redacted by it when first read (`ProcessInfo.pending_redaction`):
    rows nobody reads cost nothing. Rows in the probe's own layout take a fast path (a few microseconds each).
    Never raises.
    """
    if not isinstance(text, str):
        return []
    kinds: list[str | None] | None = None
    if columns is not None:
        specs = columns.split(",") if isinstance(columns, str) else list(columns)
        kinds = [_spec_kind(str(s)) for s in specs if str(s).strip()]
        if not kinds:
            return []
    out: list[ProcessInfo] = []
    fast = kinds is not None and tuple(kinds) == _PROBE_KINDS
    row_head = _PROBE_HEAD_RE.match
    half_read = ProcessInfo.half_read
    last_fast: str | None = None  # the line of the last row taken by the fast path
    for line in text.splitlines():
        if fast:  # the probe's layout: a row of the common shape in a few operations (a header never matches)
            m = row_head(line)
            if m is not None and len(line) <= _MAX_LINE:
                pid, ppid, pgid, sid, stat = m.groups()
                out.append(half_read(int(pid), int(ppid), int(pgid), int(sid), stat if stat != "-" else "",
                                     (_read_rest, line, m.end()), redact))
                last_fast = line
                continue
        if not line.strip() or len(line) > _MAX_LINE:
            continue
        if columns is None:
            head = _header_kinds(line.split()) if "PID" in line else None  # a header names PID
            if head is not None:
                kinds = head
                fast = tuple(kinds) == _PROBE_KINDS
                continue
            if kinds is None:
                kinds = [_spec_kind(s) for s in PS_COLUMNS.split(",")]
                fast = True
        assert kinds is not None
        if fast:
            info = _probe_row(line, redact)
        else:
            info = _row(kinds, line)
            if info is not None and redact is not None:
                info.pending_redaction(redact)
        if info is not None:
            out.append(info)
        last_fast = None
    # a `ps` cut short (killed while it wrote) leaves a last row without all its cells: the careful path drops it
    if last_fast is not None and _probe_row_split(last_fast) is None:
        out.pop()
    return out


def _children_map(procs: Sequence[ProcessInfo]) -> dict[int, list[int]]:
    """ppid -> positions (in input order) of the rows with that parent."""
    children: dict[int, list[int]] = {}
    for pos, p in enumerate(procs):
        if p.ppid is not None and p.ppid != p.pid:
            children.setdefault(p.ppid, []).append(pos)
    return children


def select_processes(
    procs: Iterable[ProcessInfo],
    *,
    pids: Iterable[int] = (),
    pgid: int | None = None,
    sid: int | None = None,
    pid: int | None = None,
    match: str | None = None,
    include_descendants: bool = True,
) -> list[ProcessInfo]:
    """Return the rows matching any of the criteria, plus (by default) their descendants.

    A row is selected when its pid is in `pids`, or equals `pid`, or its pgid equals `pgid`, or its
    sid equals `sid`, or `match` is a case-sensitive plain substring of its `args` (no regex; an
    empty `match` selects nothing). With `include_descendants`, every row whose parent chain (by
    ppid, within `procs`) reaches a selected row is added too. The result keeps input order and
    holds each pid once (the first row with that pid). No criteria -> []. Pure; never raises.
    """
    rows = list(procs)
    wanted = set(pids)
    if pid is not None:
        wanted.add(pid)
    selected: set[int] = set()
    for pos, p in enumerate(rows):
        if (
            p.pid in wanted
            or (pgid is not None and p.pgid == pgid)
            or (sid is not None and p.sid == sid)
            or (match and match in p.args)
        ):
            selected.add(pos)
    if include_descendants and selected:
        children = _children_map(rows)
        stack = [rows[pos].pid for pos in selected]
        seen_pids = set(stack)
        while stack:
            parent = stack.pop()
            for child_pos in children.get(parent, ()):
                selected.add(child_pos)
                child_pid = rows[child_pos].pid
                if child_pid not in seen_pids:
                    seen_pids.add(child_pid)
                    stack.append(child_pid)
    out: list[ProcessInfo] = []
    emitted: set[int] = set()
    for pos, p in enumerate(rows):
        if pos in selected and p.pid not in emitted:
            emitted.add(p.pid)
            out.append(p)
    return out


def process_tree(procs: Iterable[ProcessInfo]) -> list[tuple[int, ProcessInfo]]:
    """Return `(depth, row)` pairs in depth-first order (children in input order under their parent).

    Roots (depth 0) are rows whose ppid is None, equal to their own pid, or not the pid of another row
    in `procs`. Every input row appears exactly once: rows caught in a ppid cycle (no root above them)
    are emitted as extra roots in input order. Iterative, so deep chains do not hit the recursion
    limit. Pure; never raises. A table where no row's parent is another row of it (the common result of a
    `match`) costs one pass.
    """
    rows = list(procs)
    present = {p.pid for p in rows}
    children: dict[int, list[int]] = {}  # ppid -> positions, for parents among the rows
    roots: list[int] = []
    for pos, p in enumerate(rows):
        ppid = p.ppid
        if ppid is None or ppid == p.pid or ppid not in present:
            roots.append(pos)
        else:
            kids = children.get(ppid)
            if kids is None:
                children[ppid] = [pos]
            else:
                kids.append(pos)
    if not children:
        return [(0, p) for p in rows]
    out: list[tuple[int, ProcessInfo]] = []
    visited = [False] * len(rows)
    expanded: set[int] = set()  # pids whose children were pushed

    def walk(root: int) -> None:
        stack: list[tuple[int, int]] = [(root, 0)]
        while stack:
            pos, depth = stack.pop()
            if visited[pos]:
                continue
            visited[pos] = True
            row = rows[pos]
            out.append((depth, row))
            kids = children.get(row.pid)
            if kids is None or row.pid in expanded:
                continue
            expanded.add(row.pid)
            below = depth + 1
            stack.extend((c, below) for c in reversed(kids) if not visited[c])

    for pos in roots:
        walk(pos)
    if len(out) < len(rows):
        for pos in range(len(rows)):
            if not visited[pos]:
                walk(pos)
    return out
