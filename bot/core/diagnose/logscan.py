"""The log scanner: classify every line of a server log against the signatures (`scan_log` -> `LogScan`).

Finds the last run's start, the engines, the phase reached (and whether it finished on every rank), failure
signatures (dropping tracebacks that end in KeyboardInterrupt / SystemExit: 0), progress bars, heartbeats,
known-benign warnings, readiness and shutdown lines. Pure; never raises for any text.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bot.core.diagnose.signatures import _FAILURE_KINDS, SIGNATURES, Signatures, _Pat
from bot.core.parse.log import strip_control

__all__ = ["LogScan", "scan_log"]

_READY_RE = re.compile("ready")  # stands for a readiness line taken as the serving phase's marker
_MAX_LINE = 4000  # longer log lines are cut before matching (bounds regex work per line)


@dataclass
class _Hit:
    """A failure signature found in a log line (`index` into the scanned lines)."""

    index: int
    line: str
    kind: str  # a failure kind, or "killed"
    echo: bool = False
    phase: str | None = None


@dataclass
class _Progress:
    index: int
    line: str
    phase: str | None
    label: str
    done: int | None
    total: int | None


@dataclass
class LogScan:
    """What `scan_log` found in a server log. Indexes point into `lines` (cleaned copies of the input).

    `phase` is the phase the launch is in (None when the last phase finished on every rank and the next step is
    unknown, or no marker was seen); `finished_phase` names that finished phase; `phase_index` the line of the
    newest marker of the furthest phase. `ranks` are the rank ids seen (`TP3`, `gpu_id=0`). `heartbeat_run` is
    how many heartbeat lines end the log and `heartbeat_span_s` the seconds they cover (from their timestamps).
    """

    lines: list[str]
    start: int = 0
    engines: list[str] = field(default_factory=list)
    phase: str | None = None
    finished_phase: str | None = None
    phase_index: int | None = None
    phase_grace_s: float | None = None
    ranks: set[str] = field(default_factory=set)
    failures: list[_Hit] = field(default_factory=list)
    context: dict[str, list[int]] = field(default_factory=dict)
    progress: list[_Progress] = field(default_factory=list)
    heartbeats: list[int] = field(default_factory=list)
    heartbeat_run: int = 0
    heartbeat_span_s: float | None = None
    benign: list[int] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    shutdown: list[int] = field(default_factory=list)
    meaningful: list[int] = field(default_factory=list)

    @property
    def progress_advancing(self) -> bool:
        """Whether one progress bar's counter went up within the scanned lines."""
        by_label: dict[str, list[_Progress]] = {}
        for p in self.progress:
            if p.done is not None:
                by_label.setdefault(p.label, []).append(p)
        return any(len(ps) > 1 and ps[-1].done > ps[0].done for ps in by_label.values())  # type: ignore[operator]


_TS_FULL = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)")
_TS_MD = re.compile(r"(?<![\d-])(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")
_TS_HMS = re.compile(r"\[(\d\d):(\d\d):(\d\d)[\] .,]")
_FRAME_RE = re.compile(r'\bFile "([^"]+)", line (\d+)(?:, in (\S+))?')
_DIGITS_RE = re.compile(r"\d+(?:\.\d+)?")


def _timestamp(line: str) -> tuple[str, float] | None:
    """(format, seconds) of the first timestamp in a log line, comparable only within one format."""
    if m := _TS_FULL.search(line):
        y, mo, d, h, mi, s = (int(x) for x in m.groups())
        return "full", ((y * 12 + mo) * 31 + d) * 86400.0 + h * 3600 + mi * 60 + s
    if m := _TS_MD.search(line):
        mo, d, h, mi, s = (int(x) for x in m.groups())
        return "md", (mo * 31 + d) * 86400.0 + h * 3600 + mi * 60 + s
    if m := _TS_HMS.search(line):
        h, mi, s = (int(x) for x in m.groups())
        return "hms", h * 3600.0 + mi * 60 + s
    return None


def _clean_lines(lines: Iterable[str]) -> list[str]:
    """Split `\\r` rewrites into separate lines, strip ANSI/control characters, cut very long lines."""
    out: list[str] = []
    for raw in lines:
        text = raw if isinstance(raw, str) else str(raw)
        parts = text.split("\r") if "\r" in text else [text]
        segs = [strip_control(p)[:_MAX_LINE] for p in parts]
        segs = [s for s in segs if s.strip()] or [""]
        out.extend(segs)
    return out


def _rank(line: str, sig: Signatures) -> str | None:
    for rx in sig.ranks:
        if m := rx.search(line):
            return m.group(1) if rx.groups else m.group(0)
    return None


def _benign(line: str, lines: Sequence[str], i: int, sig: Signatures) -> bool:
    for p in sig.benign.all(line):
        if p.next_re is None:
            return True
        if any(p.next_re.search(lines[j]) for j in range(i + 1, min(len(lines), i + 3))):
            return True
    return False


#: Scans remembered (a check scans the same lines twice: for its observation and for its verdict; a full look's
#: 200-line tail is mostly the last one's): then forgotten all at once.
_SCANS_KEPT = 256
_scans: dict[tuple[int, tuple[str, ...]], LogScan] = {}


def scan_log(lines: Sequence[str] | None, sig: Signatures = SIGNATURES) -> LogScan:
    """Classify every line of a server log against the signatures. Pure; never raises for any text. The result is
    shared by calls with the same lines: treat it as read-only.

    Only the last run is judged: scanning starts at the last run-start line (`server_args=ServerArgs(`,
    `vLLM API server version`, ...) so a crash-loop's earlier attempts do not count.
    """
    key = (id(sig), tuple(lines or ()))
    done = _scans.get(key)
    if done is None:
        done = _scan(key[1], sig)
        if len(_scans) >= _SCANS_KEPT:
            _scans.clear()
        _scans[key] = done
    return done


def _scan(lines: Sequence[str], sig: Signatures) -> LogScan:
    """`scan_log` without the memory."""
    cleaned = _clean_lines(lines or [])
    scan = LogScan(lines=cleaned)
    n = len(cleaned)
    for i, line in enumerate(cleaned):
        if sig.run_start.first(line):
            scan.start = i
    body = range(scan.start, n)
    counts = Counter()
    for i in body:
        for name, group in sig.detect.items():
            if group.first(cleaned[i]):
                counts[name] += 1
    top = max(counts.values(), default=0)
    scan.engines = [name for name, c in counts.most_common() if c * 5 >= top]
    active = [*scan.engines, *(["generic"] if "generic" in sig.markers else [])]
    if not scan.engines:
        active = list(sig.markers)
    ready_groups = [sig.ready[e] for e in scan.engines if e in sig.ready and sig.ready[e].pats]
    if not ready_groups:
        ready_groups = [g for g in sig.ready.values() if g.pats]
    order = {p: k for k, p in enumerate(sig.phase_order)}
    furthest = -1
    last_kind: str | None = None
    ended: set[str] = set()
    grace: float | None = None
    last_meaningful_ts: tuple[str, float] | None = None
    run_first_ts: tuple[str, float] | None = None
    last_marker: tuple[int, _Pat] | None = None
    for i in body:
        line = cleaned[i]
        if not line.strip():
            continue
        if _benign(line, cleaned, i, sig):
            scan.benign.append(i)
            continue
        rank = _rank(line, sig)
        if rank is not None:
            scan.ranks.add(rank)
        is_heartbeat = sig.heartbeat.first(line) is not None
        # failures: the first kind (in priority order) that matches; SIGKILL hints rank just above `crashed`
        hit: _Hit | None = None
        for kind in _FAILURE_KINDS:
            if kind == "crashed" and (k := sig.killed.first(line)):
                hit = _Hit(i, line, "killed", phase=k.phase)
                break
            if p := sig.failures[kind].first(line):
                hit = _Hit(i, line, kind, echo=p.echo, phase=p.phase)
                break
        if hit is not None:
            scan.failures.append(hit)
        for kind, group in sig.context.items():
            if group.first(line):
                scan.context.setdefault(kind, []).append(i)
        # phase markers of the engines seen (all engines when none was recognised)
        best: _Pat | None = None
        for eng in active:
            group = sig.markers.get(eng)
            if group is None:
                continue
            for p in group.all(line):
                if p.phase in order and (best is None or order[p.phase] > order.get(best.phase or "", -1)):
                    best = p
        counter = sig.progress_counter.search(line)
        is_progress = (best is not None and best.marker == "progress") or bool(
            counter or sig.progress_generic.first(line)
        )
        if is_progress:
            done = total = None
            if counter:
                try:
                    done, total = int(counter.group("done")), int(counter.group("total"))
                except (IndexError, ValueError):
                    done = total = None
            label = _DIGITS_RE.sub("#", line[: counter.start()] if counter else line)[-60:]
            phase = best.phase if best is not None and best.marker == "progress" else None
            scan.progress.append(_Progress(i, line, phase, label, done, total))
        is_ready = any(group.first(line) for group in ready_groups)
        if best is None and is_ready and "serving" in order:  # a readiness line: serving from here on
            best = _Pat(regex=_READY_RE, engine="generic", phase="serving", marker="begin")
        if best is not None and best.phase is not None:
            last_marker = (i, best)
            k = order[best.phase]
            if k > furthest:
                furthest, ended, grace = k, set(), None
            if k == furthest:
                last_kind = best.marker
                scan.phase_index = i
                if best.marker == "end":
                    ended.add(rank or "*")
                if best.grace_s is not None:
                    grace = max(grace or 0.0, best.grace_s)
        if is_ready:
            scan.ready.append(i)
        if sig.shutdown.first(line):
            scan.shutdown.append(i)
        ts = _timestamp(line)
        if is_heartbeat:
            scan.heartbeats.append(i)
            scan.heartbeat_run += 1
            if ts is not None and run_first_ts is None:
                run_first_ts = ts
            if ts is not None:
                base = last_meaningful_ts if last_meaningful_ts and last_meaningful_ts[0] == ts[0] else run_first_ts
                if base is not None and base[0] == ts[0] and ts[1] >= base[1]:
                    scan.heartbeat_span_s = ts[1] - base[1]
        else:
            scan.meaningful.append(i)
            scan.heartbeat_run = 0
            scan.heartbeat_span_s = None
            run_first_ts = None
            if ts is not None:
                last_meaningful_ts = ts
    if furthest >= 0:
        phase = sig.phase_order[furthest]
        scan.phase_grace_s = grace
        done_everywhere = "*" in ended if not scan.ranks else scan.ranks <= ended
        if last_kind == "end" and done_everywhere:
            scan.finished_phase = phase
        else:
            scan.phase = phase
    if last_marker is not None and last_marker[1].phase == "comm_init" and last_marker[1].marker == "begin" \
            and sig.comm_init_start.first(cleaned[last_marker[0]]) is not None \
            and not sig.warning_severity.search(cleaned[last_marker[0]]) \
            and (scan.phase_index is None or last_marker[0] >= scan.phase_index) and scan.phase != "serving":
        # the newest step line starts a communicator (a new process group after loading, a second init):
        # the launch is in comm_init, whatever phase came before
        scan.phase, scan.finished_phase, scan.phase_index = "comm_init", None, last_marker[0]
        scan.phase_grace_s = None
    _drop_benign_tracebacks(scan, sig)
    return scan


def _traceback_end(scan: LogScan, i: int, sig: Signatures) -> int | None:
    """Index of the exception line that ends the traceback starting at line `i`, or None if cut off."""
    for j in range(i + 1, min(len(scan.lines), i + 200)):
        line = scan.lines[j]
        if _FRAME_RE.search(line):
            continue
        if sig.exception_line.search(line) or sig.benign_exceptions.first(line):
            return j
    return None


def _drop_benign_tracebacks(scan: LogScan, sig: Signatures) -> None:
    """A traceback that ends in KeyboardInterrupt / SystemExit: 0 is a stop, not a failure."""
    drop: set[int] = set()
    for h in scan.failures:
        if "Traceback (most recent call last)" in h.line:
            end = _traceback_end(scan, h.index, sig)
            if end is not None and sig.benign_exceptions.first(scan.lines[end]):
                drop.update({h.index, end})
    if drop:
        scan.failures = [h for h in scan.failures if h.index not in drop]
