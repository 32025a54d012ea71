"""The log scanner: classify every line of a server log against the signatures (`scan_log` -> `LogScan`).

Finds the last run's start, the engines, the phase reached (and whether it finished on every rank), failure
signatures (dropping tracebacks that end in KeyboardInterrupt / SystemExit: 0), progress bars, heartbeats,
known-benign warnings, readiness and shutdown lines. Pure; never raises for any text.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from bot.core.diagnose.errors import ErrorBlock, TraceFrame, error_blocks
from bot.core.diagnose.lines import MAX_LINE, LogLine, normalise
from bot.core.diagnose.meaning import STOP_SIGNALS, block_family, frame_phase, is_echo
from bot.core.diagnose.signatures import _FAILURE_KINDS, SIGNATURES, Signatures, _Pat, all_in, found_in
from bot.core.diagnose.timeline import stamp, timeline
from bot.core.parse.log import strip_control

__all__ = ["LineMemo", "LogScan", "line_facts", "newest_meaningful", "scan_log"]

_READY_RE = re.compile("ready")  # stands for a readiness line taken as the serving phase's marker
#: The serving phase's marker that a readiness line, or a request line after one, stands for.
_SERVING_MARK = _Pat(regex=_READY_RE, engine="generic", phase="serving", marker="begin")
_MAX_LINE = 4000  # longer log lines are cut before matching (bounds regex work per line)


@dataclass
class _Hit:
    """A failure signature found in a log line (`index` into the scanned lines)."""

    index: int
    line: str
    kind: str  # a failure kind, or "killed"
    echo: bool = False
    phase: str | None = None
    rank: str | None = None
    #: The milestone its rank had reached when it was logged: (phase, whether that phase had ended there, the line
    #: of its newest marker), or None when no milestone came before it. A line without a rank takes the launch's
    #: furthest; a ranked line its own rank's, and the milestones logged without a rank.
    reached: tuple[str, bool, int] | None = None
    #: The error block (a traceback, a native crash) this hit stands for, when it came from one; `frame_phase` the
    #: start-up step its frames show and `frame` the line of the frame that shows it.
    block: ErrorBlock | None = None
    frame_phase: str | None = None
    frame: int | None = None
    frame_sure: bool = True  # False: a per-batch loop or a file name said it (see meaning.frame_phase)


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
    norm: list[LogLine] = field(default_factory=list)  # the structured lines (bot.core.diagnose.lines), one per line
    facts: list[_Facts] = field(default_factory=list)  # what the signatures say about each line by itself
    blocks: list[ErrorBlock] = field(default_factory=list)  # the errors of this run, as structures
    times: list[float | None] = field(default_factory=list)  # each line's time on the log's own clock (seconds)
    engines: list[str] = field(default_factory=list)
    phase: str | None = None
    finished_phase: str | None = None
    phase_index: int | None = None
    phase_entered: int | None = None  # the first marker of the furthest phase: where the launch entered it
    phase_order: tuple[str, ...] = ()  # the start-up order the phases were read in (the engine's own, or the common)
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
    completed: list[int] = field(default_factory=list)
    stop_requested: int | None = None  # the first line that says a stop was asked for (a signal, Ctrl-C)
    exits: list[int] = field(default_factory=list)  # lines in the words of a process ending in order (not errors)
    #: Where the run began to end in order: the stop request, else the first of the exit events after the run's last
    #: work line (None while the log does not end that way). Failures after it are its teardown.
    ending: int | None = None

    @property
    def progress_advancing(self) -> bool:
        """Whether one progress bar's counter went up within the scanned lines."""
        by_label: dict[str, list[_Progress]] = {}
        for p in self.progress:
            if p.done is not None:
                by_label.setdefault(p.label, []).append(p)
        return any(len(ps) > 1 and ps[-1].done > ps[0].done for ps in by_label.values())  # type: ignore[operator]


_FRAME_RE = re.compile(r'\bFile "([^"]+)", line (\d+)(?:, in (\S+))?')
_DIGITS_RE = re.compile(r"\d+(?:\.\d+)?")


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
#: 200-line tail is mostly the last one's); the least recently used are forgotten first.
_SCANS_KEPT = 256


class LineMemo:
    """What a watcher remembers of one launch's log between its checks, so that the signatures run only on lines it
    has not seen before: each line's facts and parsed prefix, for the lines of the last tail it scanned (bounded by
    that tail: older lines are forgotten), and that last scan (the same tail seen again costs nothing). One per
    launch, owned by its caller (bot.services.watch); not shared between threads."""

    __slots__ = ("facts", "key", "parsed", "scan")

    def __init__(self) -> None:
        self.facts: dict[str, _Facts] = {}
        self.parsed: dict[str, tuple] = {}
        self.key: tuple[str, ...] | None = None
        self.scan: LogScan | None = None

    #: Lines remembered: a little over two tails' worth (a full look reads the last 200 lines).
    KEEP = 512

    def trim(self) -> None:
        """Forget the oldest lines beyond KEEP (dicts keep insertion order: the oldest seen go first)."""
        for d in (self.facts, self.parsed):
            extra = len(d) - self.KEEP
            if extra > 64:  # in batches: a line at a time would cost a dict rebuild each check
                for k in list(d)[:extra]:
                    del d[k]


def newest_meaningful(lines: Sequence[str], sig: Signatures = SIGNATURES,
                      memo: LineMemo | None = None) -> tuple[str | None, bool]:
    """(the newest line that is neither blank, a heartbeat nor a known-benign line, whether it is the last line) of
    `lines`, from each line's facts alone (no scan: what a watcher needs to tell new progress at every check).
    (None, False) when there is none."""
    known = memo.facts if memo is not None else None
    for k in range(len(lines) - 1, -1, -1):
        raw = lines[k]
        text = strip_control(raw.rsplit("\r", 1)[-1] if "\r" in raw else raw)[:MAX_LINE]
        if not text.strip():
            continue
        if known is not None:
            f = known.get(text)
            if f is None:
                f = known[text] = _line_facts(text, sig)
        else:
            f = _line_facts(text, sig)
        if not f.heartbeat and not f.benign:
            return raw, k == len(lines) - 1
    return None, False


def scan_log(lines: Sequence[str] | None, sig: Signatures = SIGNATURES, memo: LineMemo | None = None) -> LogScan:
    """Classify every line of a server log against the signatures. Pure; never raises for any text. The result is
    shared by calls with the same lines: treat it as read-only.

    Only the last run is judged: scanning starts at the last run-start line (`server_args=ServerArgs(`,
    `vLLM API server version`, ...) so a crash-loop's earlier attempts do not count. With `memo` (a launch's
    LineMemo), lines it saw in the previous tail are not matched again.
    """
    key = tuple(lines or ())
    if memo is None:
        return _scan(key, sig)
    if memo.key == key and memo.scan is not None:
        return memo.scan
    scan = _scan_with(key, sig, memo)
    memo.key, memo.scan = key, scan
    memo.trim()
    return scan


@functools.lru_cache(maxsize=_SCANS_KEPT)
def _scan(lines: tuple[str, ...], sig: Signatures) -> LogScan:
    """`scan_log` of a tuple (cached: a pure function of its lines and signatures)."""
    return _scan_with(lines, sig, None)


def _scan_with(lines: tuple[str, ...], sig: Signatures, memo: LineMemo | None) -> LogScan:
    """One scan of `lines`; the facts and prefixes of lines `memo` holds are taken from it (and new ones added)."""
    norm = normalise(lines or [], memo.parsed if memo is not None else None)
    scanner = _Scanner([n.text for n in norm], sig, memo)
    scanner.scan.norm = norm
    scanner.blocks = error_blocks(norm)
    scanner.in_blocks = {j for b in scanner.blocks for j in range(b.start, b.end + 1)}
    for i in range(scanner.scan.start, len(scanner.lines)):
        scanner.line(i)
    return scanner.finish()


@dataclass(frozen=True, slots=True)
class _Facts:
    """What the signatures say about one line by itself (pure: a function of its text alone), worked out once per
    distinct line (`line_facts`): the stateful pass over a log (`_Scanner`) only folds these."""

    run_start: bool
    detect: frozenset[str]  # engines whose detect patterns match
    completion: bool
    benign: bool  # a known-benign line (always)
    benign_next: tuple[re.Pattern[str], ...]  # benign only when one of these matches within the next two lines
    rank: str | None
    hit: tuple[str, bool, str | None] | None  # (kind, echo, phase) of its failure signature
    context: tuple[str, ...]
    markers: tuple[_Pat, ...]  # every engine's phase markers on it
    lexicon: tuple[_Pat, ...]  # the start-up steps in any engine's words (a line no marker, error or warning is)
    counter: tuple[int, int] | bool | None  # a progress counter (done, total); True: one that did not parse
    counter_start: int
    progress_generic: bool
    ready: frozenset[str]  # engines whose readiness lines match
    request: bool
    exit_event: bool
    stop: bool
    shutdown: bool
    heartbeat: bool
    severe: bool  # error severity
    ts: tuple[str, float] | None
    hang: bool  # the engine's own stall detector reporting (signatures.yaml `hang_report`)


_NO_PATS: tuple[_Pat, ...] = ()


def line_facts(line: str, sig: Signatures = SIGNATURES) -> _Facts:
    """What the signatures say about `line` by itself (see _Facts). Pure; cached per (line, signature set)."""
    return _line_facts(line, sig)


#: Distinct lines whose facts are remembered: a full look's 200-line tail is mostly the previous one's.
_FACTS_KEPT = 1 << 15


@functools.lru_cache(maxsize=_FACTS_KEPT)
def _line_facts(line: str, sig: Signatures) -> _Facts:
    hit = _failure_hit(0, line, sig)
    benign_all = sig.benign.all(line)
    counter = sig.progress_counter.search(line)
    parsed: tuple[int, int] | bool | None = None
    if counter:
        try:
            parsed = (int(counter.group("done")), int(counter.group("total")))
        except (IndexError, ValueError):
            parsed = True
    markers = tuple(all_in(sig.markers, line))
    severe = bool(sig.error_severity.search(line))
    # a phase word of the lexicon counts only on a line that is no marker, no error and no warning (asked last: few
    # lines hold one)
    lexicon = tuple(sig.lexicon.all(line)) if not markers and not severe else _NO_PATS
    warning = bool(lexicon) and bool(sig.warning_severity.search(line))
    return _Facts(
        run_start=sig.run_start.first(line) is not None,
        detect=frozenset(found_in(sig.detect, line)),
        completion=sig.completion.first(line) is not None,
        benign=any(p.next_re is None for p in benign_all),
        benign_next=tuple(p.next_re for p in benign_all if p.next_re is not None),
        rank=_rank(line, sig),
        hit=(hit.kind, hit.echo, hit.phase) if hit is not None else None,
        context=found_in(sig.context, line),
        markers=markers,
        lexicon=lexicon if not warning else _NO_PATS,
        counter=parsed,
        counter_start=counter.start() if counter else -1,
        progress_generic=sig.progress_generic.first(line) is not None,
        ready=frozenset(found_in(sig.ready, line)),
        request=sig.request_line.first(line) is not None,
        exit_event=sig.exit_events.first(line) is not None,
        stop=sig.stop_requested.first(line) is not None,
        shutdown=sig.shutdown.first(line) is not None,
        heartbeat=sig.heartbeat.first(line) is not None,
        severe=severe,
        ts=stamp(line),
        hang=sig.hang_report.first(line) is not None,
    )


class _Scanner:
    """One pass over a log's lines (from its last run start): failures, context, phase markers, progress,
    readiness, shutdown and heartbeats per line (`line`), then the phase it reached (`finish`). What a line says
    by itself comes from `line_facts` (once per distinct line); the pass only folds it."""

    def __init__(self, cleaned: list[str], sig: Signatures, memo: LineMemo | None = None):
        self.lines, self.sig = cleaned, sig
        if memo is None:
            self.facts = [_line_facts(line, sig) for line in cleaned]
        else:
            known = memo.facts
            self.facts = [known.get(line) or known.setdefault(line, _line_facts(line, sig)) for line in cleaned]
        self.scan = scan = LogScan(lines=cleaned, facts=self.facts)
        for i, f in enumerate(self.facts):
            if f.run_start:
                scan.start = i
        counts: Counter[str] = Counter()
        for f in self.facts[scan.start:]:
            counts.update(f.detect)
        top = max(counts.values(), default=0)
        scan.engines = [name for name, c in counts.most_common() if c * 5 >= top]
        self.active = [*scan.engines, *(["generic"] if "generic" in sig.markers else [])]
        if not scan.engines:
            self.active = list(sig.markers)
        self.ready_engines = frozenset(e for e in scan.engines if e in sig.ready and sig.ready[e].pats)
        if not self.ready_engines:
            self.ready_engines = frozenset(e for e, g in sig.ready.items() if g.pats)
        self.active_set = frozenset(self.active)
        # the start-up order of the engine the log is from, where it has its own (TGI warms up before it sizes its
        # KV cache; TensorRT-LLM autotunes before it captures graphs), else the common one
        scan.phase_order = next((sig.engine_order[e] for e in scan.engines if e in sig.engine_order),
                                sig.phase_order)
        self.order = {p: k for k, p in enumerate(scan.phase_order)}
        self.furthest = -1
        self.last_kind: str | None = None
        self.ended: set[str] = set()
        self.grace: float | None = None
        self.last_meaningful_ts: tuple[str, float] | None = None
        self.run_first_ts: tuple[str, float] | None = None
        self.last_marker: tuple[int, _Pat] | None = None
        self.per_rank: dict[str | None, tuple[int, bool, int]] = {}  # rank -> (phase order, ended, marker line)
        self.entered_by_lexicon = False
        self.blocks: list[ErrorBlock] | None = None  # the log's error blocks, read before its lines
        self.in_blocks: set[int] = set()  # lines of error blocks (tracebacks' frames and code): never a milestone

    def line(self, i: int) -> None:
        """Take line `i` into the scan."""
        scan, line, f = self.scan, self.lines[i], self.facts[i]
        if not line.strip():
            return
        if f.completion:  # a program that came to its end (often a benign warning too)
            scan.completed.append(i)
        if f.benign or (f.benign_next and any(rx.search(self.lines[j]) for rx in f.benign_next
                                              for j in range(i + 1, min(len(self.lines), i + 3)))):
            scan.benign.append(i)
            return
        rank = f.rank
        if rank is not None:
            scan.ranks.add(rank)
        hit = _Hit(i, line, f.hit[0], echo=f.hit[1], phase=f.hit[2]) if f.hit is not None else None
        if hit is not None:
            hit.rank, hit.reached = rank, self._reached(rank)
            scan.failures.append(hit)
        for kind in f.context:
            scan.context.setdefault(kind, []).append(i)
        best = self._marker(f, i)
        if hit is not None and best is not None and best.marker != "progress":
            best = None  # the words of an error message never set the phase (a progress bar the error ran into does)
        if (best is not None and best.marker == "progress") or f.counter is not None or f.progress_generic:
            scan.progress.append(_progress_of(i, line, f, best))
        is_ready = bool(f.ready & self.ready_engines)
        # a readiness line, or a request once ready: serving from here on
        if best is None and "serving" in self.order and (is_ready or (scan.ready and f.request)):
            best = _SERVING_MARK
        if best is not None and best.phase is not None:
            self._advance(i, best, rank)
        if is_ready:
            scan.ready.append(i)
        if hit is None and f.exit_event and not f.severe:
            scan.exits.append(i)  # an exit in order (not a kill, not an error)
        stop = f.stop and hit is None
        if stop or f.shutdown:  # a stop request is shutdown wording too
            scan.shutdown.append(i)
            if scan.stop_requested is None and stop:
                scan.stop_requested = i
        self._heartbeat(i, f)

    def _marker(self, f: _Facts, i: int = -1) -> _Pat | None:
        """The phase marker of the furthest phase on line `i`, among the engines seen (all when none was); else a
        start-up step in any engine's words (signatures.yaml `lexicon`) on a line outside an error block."""
        best: _Pat | None = None
        order = self.order
        for p in f.markers:
            if p.engine in self.active_set and p.phase in order and (
                    best is None or order[p.phase] > order.get(best.phase or "", -1)):
                best = p
        if best is None and f.lexicon and i not in self.in_blocks:
            for p in f.lexicon:  # a step in an engine's words the tables do not know
                if p.phase in order and (best is None or order[p.phase] > order.get(best.phase or "", -1)):
                    best = p
        return best

    def _reached(self, rank: str | None) -> tuple[str, bool, int] | None:
        """The milestone `rank` (None: the launch as a whole) has reached so far: (phase, ended there, marker line)."""
        if rank is None:
            if self.furthest < 0 or self.scan.phase_index is None:
                return None
            return self.scan.phase_order[self.furthest], self._ended_everywhere(), self.scan.phase_index
        own, shared = self.per_rank.get(rank), self.per_rank.get(None)
        best = max((x for x in (own, shared) if x is not None), default=None)
        return (self.scan.phase_order[best[0]], best[1], best[2]) if best is not None else None

    def _ended_everywhere(self) -> bool:
        """Whether the furthest phase's newest marker ends it, on every rank seen (or once, without ranks)."""
        ranks = self.scan.ranks
        return self.last_kind == "end" and ("*" in self.ended if not ranks else ranks <= self.ended)

    def _advance(self, i: int, best: _Pat, rank: str | None) -> None:
        """A phase marker at line `i`: the furthest phase so far, its last marker kind, which ranks ended it,
        its grace; and the furthest milestone of the rank that logged it."""
        self.last_marker = (i, best)
        k = self.order[best.phase or ""]
        mine = self.per_rank.get(rank)
        if mine is None or k >= mine[0]:
            self.per_rank[rank] = (k, best.marker == "end", i)
        if k > self.furthest:
            self.furthest, self.ended, self.grace = k, set(), None
            self.scan.phase_entered = i
            self.entered_by_lexicon = best.engine == "lexicon"
        elif k == self.furthest and self.entered_by_lexicon and best.engine != "lexicon":
            # the engine's own marker of the step the words entered first: where it began, in its own words
            self.scan.phase_entered, self.entered_by_lexicon = i, False
        if k == self.furthest:
            self.last_kind = best.marker
            self.scan.phase_index = i
            if best.marker == "end":
                self.ended.add(rank or "*")
            if best.grace_s is not None:
                self.grace = max(self.grace or 0.0, best.grace_s)

    def _heartbeat(self, i: int, f: _Facts) -> None:
        """Heartbeat lines: the run of them at the end of the log, and the time it spans."""
        scan = self.scan
        ts = f.ts
        if f.heartbeat:
            scan.heartbeats.append(i)
            scan.heartbeat_run += 1
            if ts is not None and self.run_first_ts is None:
                self.run_first_ts = ts
            if ts is not None:
                last = self.last_meaningful_ts
                base = last if last and last[0] == ts[0] else self.run_first_ts
                if base is not None and base[0] == ts[0] and ts[1] >= base[1]:
                    scan.heartbeat_span_s = ts[1] - base[1]
        else:
            scan.meaningful.append(i)
            scan.heartbeat_run = 0
            scan.heartbeat_span_s = None
            self.run_first_ts = None
            if ts is not None:
                self.last_meaningful_ts = ts

    def finish(self) -> LogScan:
        """The phase reached (or finished on every rank), a communicator started last, benign tracebacks
        dropped; returns the scan."""
        scan, sig = self.scan, self.sig
        if self.furthest >= 0:
            phase = scan.phase_order[self.furthest]
            scan.phase_grace_s = self.grace
            if self._ended_everywhere():
                scan.finished_phase = phase
            else:
                scan.phase = phase
        last = self.last_marker
        if last is not None and last[1].phase == "comm_init" and last[1].marker == "begin" \
                and sig.comm_init_start.first(self.lines[last[0]]) is not None \
                and not sig.warning_severity.search(self.lines[last[0]]) \
                and (scan.phase_index is None or last[0] >= scan.phase_index) and scan.phase != "serving":
            # the newest step line starts a communicator (a new process group after loading, a second init):
            # the launch is in comm_init, whatever phase came before
            scan.phase, scan.finished_phase, scan.phase_index = "comm_init", None, last[0]
            scan.phase_entered = last[0]
            scan.phase_grace_s = None
        scan.times = timeline([(n.ts_kind, n.ts) for n in scan.norm])
        _drop_benign_tracebacks(scan, sig)
        _structured_failures(scan, sig, self.blocks)
        _terminal_error(scan, sig)
        _host_allocations(scan, sig)
        scan.ending = _ending(scan)
        stop = scan.ending
        if stop is not None and not any(h.index < stop for h in scan.failures):
            if scan.stop_requested is not None:
                scan.failures = []  # the teardown of a deliberate stop: workers killed by it, communicators aborted
            else:  # an exit in order: what unwinds after it (a cut traceback, a generic error) is its teardown; a
                # kill or a specific failure after it is not
                scan.failures = [h for h in scan.failures if h.kind not in ("crashed",)
                                 and not (h.block is not None and h.block.cut)]
                if scan.failures:
                    scan.ending = None
        return scan


def _last_work(scan: LogScan) -> int:
    """The index of the run's last line of work: a readiness line, a progress line, its newest milestone (-1: none)."""
    marks = [*scan.ready, *(p.index for p in scan.progress)]
    if scan.phase_index is not None:
        marks.append(scan.phase_index)
    return max(marks, default=-1)


def _terminal_error(scan: LogScan, sig: Signatures) -> None:
    """With no failure found by its words or structure: the first error-level line (by the line's own level: Python
    logging, vLLM, glog, tracing) after which the run did no more work (no progress, milestone, readiness or request
    line), and that is not a known-benign line, is a failure: an event the engine itself called an error, that the run
    did not go on from (`Engine core proc EngineCore_DP0 died unexpectedly`)."""
    if scan.failures:
        return
    last_work = _last_work(scan)
    benign = set(scan.benign)
    for i in range(max(scan.start, last_work + 1), len(scan.lines)):
        if i < len(scan.norm) and scan.norm[i].level in ("ERROR", "CRITICAL") and i not in benign:
            if scan.norm[i].body.strip():
                scan.failures.append(_Hit(i, scan.lines[i], "crashed", reached=None))
                return


def _ending(scan: LogScan) -> int | None:
    """Where the run began to end in order (see LogScan.ending): the stop request; else the first exit event after the
    last line of work (a progress line, a milestone, a request or stats line, a readiness line), when the exit events
    come before any failure."""
    if scan.stop_requested is not None:
        return scan.stop_requested
    if not scan.exits:
        return None
    last_work = _last_work(scan)
    after = [i for i in scan.exits if i > last_work]
    return after[0] if after else None


#: Exception types that end a traceback without a failure: a stop asked for, a clean exit, a warning raised as one.
_NOT_FAILURES = frozenset({"KeyboardInterrupt", "SystemExit", "CancelledError", "GeneratorExit", "StopIteration"})


def _structured_failures(scan: LogScan, sig: Signatures, blocks: list[ErrorBlock] | None = None) -> None:
    """Read the run's errors as structures (bot.core.diagnose.errors) and let them decide over the signature hits on
    their lines: one hit per error block, at the line that says what failed, with the verdict its exception TYPE gives
    (then its message: bot.core.diagnose.meaning), whether it echoes an earlier failure, and the step its frames show.
    Hits on a block's other lines (its header, frames, code) are dropped: code is no evidence. A traceback that ends
    in KeyboardInterrupt or SystemExit is a stop, not a failure."""
    blocks = [b for b in (blocks if blocks is not None else error_blocks(scan.norm)) if b.start >= scan.start]
    scan.blocks = blocks
    if not blocks:
        return
    covered: set[int] = set()
    added: list[_Hit] = []
    hits = sorted(scan.failures, key=lambda h: h.index)  # a block finds its hits by bisection: linear in blocks
    at = [h.index for h in hits]
    for b in blocks:
        covered.update(range(b.start, b.end + 1))
        own = b.short_type
        if own in _NOT_FAILURES and not (own == "SystemExit" and b.message not in ("", "0", "None")):
            if own == "KeyboardInterrupt" and scan.stop_requested is None:
                scan.stop_requested = b.line
            continue
        if own and own.endswith("Warning"):
            continue
        line = scan.lines[b.line]
        if b.kind == "signal" and sig.benign.first(line):
            continue
        if b.kind == "signal" and b.exc_type in STOP_SIGNALS:  # a stop someone sent, not a fault of its own
            if scan.stop_requested is None:
                scan.stop_requested = b.line
            continue
        if b.cut:  # no exception line: what its own message lines said (a header line that carries the error's words,
            # `Exception in worker ...: <message>, Traceback ...`) stands for it, with the frames it has
            inside = hits[bisect.bisect_left(at, b.start):bisect.bisect_right(at, b.end)]
            said = [h for h in inside if not _is_frame_part(scan.lines[h.index])
                    and "Traceback (most recent call last)" not in scan.lines[h.index][:40]]
            if said:
                for h in said:
                    h.block = b
                    _frame_of(h, b, scan, sig)
                    added.append(h)
                continue
        kind = block_family(b, sig)
        if b.kind == "signal" and kind == "crashed" and sig.killed.first(line):
            kind = "killed"
        hit = _Hit(b.line, line, kind, echo=is_echo(b, sig), block=b)
        k = bisect.bisect_left(at, b.line)
        sig_hit = hits[k] if k < len(at) and at[k] == b.line else None
        if sig_hit is not None:
            hit.phase, hit.rank, hit.reached = sig_hit.phase, sig_hit.rank, sig_hit.reached
            hit.echo = hit.echo or (sig_hit.echo and sig_hit.kind == kind)
        else:
            k = bisect.bisect_left(at, b.start)
            hit.reached = hits[k - 1].reached if k else None
        _frame_of(hit, b, scan, sig)
        added.append(hit)
    kept = [h for h in scan.failures if h.index not in covered]
    scan.failures = sorted(kept + added, key=lambda h: h.index)


def _is_frame_part(line: str) -> bool:
    """Whether a line is a traceback's frame or the code line under one (no evidence by itself)."""
    return _FRAME_RE.search(line) is not None


#: The function a line of Python source calls first: `x = self.init_torch_distributed()` -> init_torch_distributed,
#: `self.model_runner = ModelRunner(` -> ModelRunner (the name right before the first `(` that follows a name).
_CALLED_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]{0,80})\s*\(")


def _called_frame(b: ErrorBlock, scan: LogScan) -> TraceFrame | None:
    """A traceback cut before its exception line: the function its innermost frame's code line was calling, as one
    more frame (no file, no line). What failed was in there or below: `min_per_gpu_memory =
    self.init_torch_distributed()` says comm_init where the frames above say only `__init__`. None when the block
    is whole, or its last line is no code line."""
    if not b.cut or not b.frames or b.end >= len(scan.lines):
        return None
    code = scan.lines[b.end]
    if _FRAME_RE.search(code) or (m := _CALLED_RE.search(code)) is None:
        return None
    return TraceFrame("", m.group(1))


def _frame_of(hit: _Hit, b: ErrorBlock, scan: LogScan, sig: Signatures) -> None:
    """Set the start-up step `b`'s frames show on `hit` (with, for a cut traceback, the function its last code line
    calls), with the line of the frame that shows it."""
    called = _called_frame(b, scan)
    if (fp := frame_phase([*b.frames, called] if called else b.frames, sig)) is not None:
        hit.frame_phase, hit.frame_sure = fp[0], fp[2]
        hit.frame = b.end if fp[1] is called else next(
            (j for j in range(b.end, b.start - 1, -1) if fp[1].func and f"in {fp[1].func}" in scan.lines[j]), None)


def _host_allocations(scan: LogScan, sig: Signatures) -> None:
    """An out-of-memory hit that names host memory (signatures.yaml `host_allocation`) and no GPU (`gpu_memory`), and
    the OOM hits of the next 3 lines that name no GPU (the same failed allocation, said by its callers), are
    `crashed`: the host, not the GPU, ran out of memory."""
    until = -1
    for h in scan.failures:
        if h.kind != "oom" or sig.gpu_memory.first(h.line):
            continue
        if sig.host_allocation.first(h.line):
            h.kind, until = "crashed", h.index + 3
        elif h.index <= until:
            h.kind = "crashed"


def _failure_hit(i: int, line: str, sig: Signatures) -> _Hit | None:
    """The failure on line `i`: the first kind (in priority order) that matches, with the phase its pattern (or,
    when it gives none, another pattern of its kind or of a lower-ranked one on the same line) names; a SIGKILL
    hint ranks just above `crashed`."""
    for n, kind in enumerate(_FAILURE_KINDS):
        if kind == "crashed" and (k := sig.killed.first(line)):
            return _Hit(i, line, "killed", phase=k.phase)
        if p := sig.failures[kind].first(line):
            phase = p.phase
            if phase is None:  # the engine's own words on the same line may say where ("Capture cuda graph
                # failed: <a gloo timeout>"): the first phase another pattern of this or a lower kind gives there
                phase = next((q.phase for other in _FAILURE_KINDS[n:] for q in sig.failures[other].all(line)
                              if q.phase is not None), None)
            return _Hit(i, line, kind, echo=p.echo, phase=phase)
    return None


def _progress_of(i: int, line: str, f: _Facts, best: _Pat | None) -> _Progress:
    """A progress line: its counter (done/total) when it has one, a label without digits, the phase its
    marker names."""
    done = total = None
    if isinstance(f.counter, tuple):
        done, total = f.counter
    label = _DIGITS_RE.sub("#", line[: f.counter_start] if f.counter is not None else line)[-60:]
    phase = best.phase if best is not None and best.marker == "progress" else None
    return _Progress(i, line, phase, label, done, total)


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
