"""Log lines as structure (pure): what wraps a line (a container or orchestrator prefix, an engine's timestamp, level,
source file and rank) is read off it, and lines a terminal or a paste hard-wrapped are joined back.

`normalise(raw_lines)` -> `list[LogLine]`: one LogLine per logical line, each with
- `text`: the line as the engine wrote it: `\\r` rewrites split, ANSI and control characters removed, an OUTER prefix
  removed (one that a tool around the engine added: `docker compose` / `kubectl logs --prefix` / journald), and a
  wrapped continuation joined back on. Signatures are matched on it and quotes are taken from it.
- `body`: the message alone: the engine's own prefix (timestamp, level, `[file.py:12]`, `(Worker pid=1)`, `[rank0]:`,
  glog, Python logging, logfmt) removed. Structure readers (tracebacks, events) read it.
- `source` (the container / process / rank label of a prefix), `level` (DEBUG, INFO, WARNING, ERROR, CRITICAL),
  `module` (the source file the engine's prefix names: `gpu_model_runner.py`), `ts` (seconds, bot.core.diagnose.
  timeline) and `physical` (the input lines it came from, for "log line N").

Prefix shapes are a small table of SHAPES (a timestamp, a bracketed label, a level word, `name  | `), not per-engine
rules. Formats read, with where they come from: docker compose v2 (`svc-1  | `) and v1 (`svc_1  | `) log prefixes;
`kubectl logs --prefix` (`[pod/NAME/CONTAINER] `, kubectl 1.17+); journald's short format (`Dec 06 10:00:00 host
unit[123]: `); Python logging's default and vLLM's (`INFO 06-30 13:53:19 [core.py:123] `, vLLM 0.4-0.11), SGLang's
(`[2025-02-01 07:03:54 TP6] `, 0.2-0.5), TGI's tracing (`2024-01-01T00:00:00.000Z  INFO target: `), glog and torch c10
(`I1206 10:00:00.123456  123 file.cc:12] `, `[rank0]:[W1206 ...]`), TensorRT-LLM (`[TensorRT-LLM][ERROR] `,
`[12/06/2024-10:00:00] [TRT-LLM] [I] `), Ray worker prefixes (`(RayWorkerWrapper pid=12, ip=10.0.0.1) `), vLLM
process prefixes (`(VllmWorker rank=0 pid=12) `, `(EngineCore_DP0 pid=12) `, `(APIServer pid=1) `), NCCL's own
(`host:12:34 [0] NCCL INFO init.cc:123 `, NCCL 2.x) and logfmt (`time=... level=INFO source=server.go:12 msg="..."`,
Ollama 0.1-0.12).

A hard wrap is recognised by its shape: the log has a width its long lines were cut at, exactly (a terminal keeps
every character: three or more lines of exactly that many characters, none longer) or at word boundaries (a paste or
a chat client: four or more lines just under a width of 60 to 200 characters that none exceeds), and the line after a
cut one does not start like a line (a timestamp, a level, a bracket, a traceback's structure). Such a continuation is
joined back to the line above, with nothing between them at an exact width and one space otherwise. Never raises.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from bot.core.diagnose.timeline import stamp
from bot.core.parse.log import strip_control

__all__ = ["MAX_LINE", "LogLine", "body_of", "normalise"]

MAX_LINE = 4000
"""Longer lines are cut before anything is matched on them (bounds regex work per line)."""


@dataclass(frozen=True, slots=True)
class LogLine:
    """One logical log line (see the module docstring). `ts` is in seconds, comparable only with other lines of the
    same `ts_kind` (bot.core.diagnose.timeline); `physical` the 0-based indexes of the input lines it came from."""

    text: str
    body: str
    source: str | None = None
    level: str | None = None
    module: str | None = None
    ts: float | None = None
    ts_kind: str | None = None
    physical: tuple[int, ...] = ()


# --- outer prefixes: added by a tool around the engine --------------------------------------------------------------

#: `docker compose logs` (v2 `svc-1  | `, v1 `svc_1   | `): a name without spaces, padding, a bar.
_COMPOSE = re.compile(r"^(?P<src>[A-Za-z0-9][\w.-]{0,80}?)\s*\|(?: |$)")
#: `kubectl logs --prefix` and `stern`: `[pod/NAME/CONTAINER] `.
_KUBECTL = re.compile(r"^\[(?P<src>pod/[^\]\s/]{1,120}/[^\]\s]{1,80})\] ")
#: journald's short output: `Dec 06 10:00:00 host unit[123]: `.
#: Its `-o short-iso` / `short-iso-precise` form: `2024-12-06T10:00:00+0000 host unit[123]: ` (an offset as
#: strftime's %z writes it, never `Z`, and a host that is no level word: a Rust or Go service's `TIME LEVEL target: `
#: is no journal).
_JOURNAL = re.compile(r"^(?:(?:[^\W\d_]{2,5}\.?|\d{1,2}月) {1,2}\d{1,2} \d\d:\d\d:\d\d(?:\.\d+)?"  # `авг`, `11月`
                      r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{6})?[+-]\d{4})"  # strftime's %z: never `Z`
                      r" (?!(?:TRACE|DEBUG|INFO|WARN|WARNING|ERROR|CRITICAL|FATAL)\b)\S{1,64} "
                      r"(?P<src>[\w.@/-]{1,80})(?:\[\d+\])?: ")
#: `srun --label` (Slurm): each line after its task's number, `0: ` (padded where a job has ten tasks or more).
_SRUN_LABEL = re.compile(r"^ {0,4}(?P<src>\d{1,5}): ")
#: `kubectl logs --timestamps` and `docker logs -t`: an RFC 3339 time in nanoseconds (docker's fixed 9 digits, the
#: CRI log's RFC3339Nano less its trailing zeros; an engine's own stamp has 6 at most), Z or an offset, one space.
#: Its time stays the line's where the engine's own line has none.
_STAMPED = re.compile(r"^(?P<src>)\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{7,9}(?:Z|[+-]\d\d:\d\d) ")
#: A terminal UI's pane (k9s, lazydocker, htop-like viewers): every line between box-drawing borders.
_PANE = re.compile(r"^[│┃║|] ?(?P<src>)")
_OUTER = (("compose", _COMPOSE), ("kubectl", _KUBECTL), ("stamped", _STAMPED), ("journal", _JOURNAL),
          ("pane", _PANE), ("srun", _SRUN_LABEL))  # a stamp before a journal's: `Z I common_init: ` is no host
_PANE_RIGHT = re.compile(r"\s*[│┃║]\s*$")

# --- the engine's own prefix: read for level / module / source, removed for `body` -----------------------------------

_LEVELS = MappingProxyType({
           "TRACE": "DEBUG", "DEBUG": "DEBUG", "D": "DEBUG", "INFO": "INFO", "I": "INFO", "NOTICE": "INFO",
           "WARN": "WARNING", "WARNING": "WARNING", "W": "WARNING", "ERROR": "ERROR", "ERR": "ERROR", "E": "ERROR",
           "CRITICAL": "CRITICAL", "FATAL": "CRITICAL", "F": "CRITICAL", "PANIC": "CRITICAL",
                            "EXCEPTION": "ERROR"})
_TS_CORE = (r"(?:\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
            r"|\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?"
            r"|\d\d/\d\d/\d{4}-\d\d:\d\d:\d\d"
            r"|\d\d:\d\d:\d\d(?:[.,]\d+)?"
            r"|\d{10}(?:\.\d+)?)")
#: One prefix element at the start of what is left of the line, tried in this order, removed one after another.
_ELEMENTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # a process / rank label in parentheses: `(VllmWorker rank=0 pid=12) `, `(RayWorkerWrapper pid=1, ip=x) `
    ("source", re.compile(r"\((?P<v>(?:[\w:./-]{1,80} ){0,3}(?:rank|pid|ip|node|tp|dp)=[\w.:-]{1,40}"
                          r"(?:,? (?:rank|pid|ip|node|tp|dp)=[\w.:-]{1,40}){0,3})\)\s+")),
    # NCCL's own lines: `host:pid:tid [rank] NCCL INFO init.cc:123 ...`
    ("nccl", re.compile(r"[\w.-]{1,64}:\d{1,9}:\d{1,9} \[(?P<v>\d{1,5})\] NCCL (?P<l>INFO|WARN|TRACE) "
                        r"(?:(?P<m>[\w/.-]+\.cc):\d+ )?")),
    # torch `[rank0]:`, `[Rank 3] `
    ("source", re.compile(r"\[(?P<v>[Rr]ank ?\d{1,5})\]:?\s*")),
    # Ray's C++ logger (src/ray/util/logging.cc, spdlog): `[2025-04-17 15:09:14,925 E 812 812] ` (level, pid, tid)
    ("glog", re.compile(r"\[" + _TS_CORE + r" (?P<v>[IWEFD]) \d{1,10} \d{1,10}\]\s*"
                        r"(?:(?P<m>[\w./-]+\.(?:cc|cpp|h)):\d+:\s*)?")),
    ("ts", re.compile(r"\[?" + _TS_CORE + r"(?: ?(?:UTC|[A-Z]{3}))?\]?[ :,]?\s*")),
    # llama.cpp's `--log-timestamps`: `0.01.323.172 I ` (time since start, then the level letter)
    ("glog", re.compile(r"\d{1,6}\.\d\d\.\d{3}\.\d{3} (?P<v>[IWED]) (?:[a-z]{2,5} {1,2}(?=\w+:))?(?P<m>)")),
    # glog / c10: `I1206 10:00:00.123456  123 file.cc:12] `, `[W1206 10:00:00.1 file.cc:12] `
    ("glog", re.compile(r"\[?(?P<v>[IWEF])\d{3,4} \d\d:\d\d:\d\d\.\d+(?:\s+\d+)?\s+(?P<m>[\w./-]+):\d+\]\s*\]?\s*")),
    # torch c10's short form: `[E ProcessGroupNCCL.cpp:828] `
    ("glog", re.compile(r"\[(?P<v>[IWEF]) (?P<m>[\w./-]+\.(?:cpp|cc|h|cu|c)):\d+\]\s*")),
    # a bracketed level or tool label: `[INFO] `, `[E] `, `[TensorRT-LLM][ERROR] `, `[TRT-LLM] `, `[RANK 0] `
    ("label", re.compile(r"\[(?P<v>[A-Za-z][\w -]{0,30})\]:?\s*")),
    # a bare level word: `INFO `, `ERROR: `, `WARNING 06-30`, `level=INFO `
    ("level", re.compile(r"(?:level=)?(?P<v>TRACE|DEBUG|INFO|NOTICE|WARN(?:ING)?|ERROR|CRITICAL|FATAL|PANIC)\b:?\s+")),
    # Python logging's ` - name - LEVEL - ` and `name:LEVEL:` forms
    ("pylog", re.compile(r"-?\s*(?P<s>[\w.]{1,80}) - (?P<v>DEBUG|INFO|WARNING|ERROR|CRITICAL) - ")),
    # Rust tracing (TGI): spans `warmup{max_input_length=4096}:warmup: ` and the target `text_generation_launcher: `
    ("span", re.compile(r"(?:[\w-]{1,40}\{[^{}]{0,400}\}:?)+(?:[\w-]{1,40}:)*\s")),
    ("target", re.compile(r"(?P<v>[a-z][a-z0-9_-]*(?:_[a-z0-9]+|::[a-z0-9_]+)+|shard-manager|download): ")),
    # the source file and line: `[core.py:123] `, `core.py:123] `, `source=server.go:12 `
    ("module", re.compile(r"(?:source=)?\[?(?P<m>[\w./-]{1,80}\.(?:py|cc|cpp|cu|h|go|rs)):\d+\]?:?\s+")),
    # a component in parentheses right after a level: `[Info] (Server) Ensuring model loaded`
    ("component", re.compile(r"\((?P<v>[A-Z][\w.-]{1,30})\)\s+")),
    # a rank / TP label after a timestamp: `TP6] ` (SGLang's `[2025-01-01 07:03:54 TP6]` once the ts is gone)
    ("source", re.compile(r"(?P<v>(?:DP\d{1,4} )?(?:PP\d{1,4} )?TP\d{1,4}(?: EP\d{1,4})?)\]\s*")),
)
#: logfmt lines (Ollama, Go services): the message is the `msg` field.
_LOGFMT = re.compile(r'^time=\S+ level=(?P<level>\w+)(?: source=(?P<m>[\w./-]+):\d+)? '
                     r'msg=(?P<msg>"(?:[^"\\]|\\.)*"|\S+)')

# --- wrapped lines ----------------------------------------------------------------------------------------------------

#: What a line's first characters look like when a line starts there (not a continuation of the line above): a
#: timestamp, a bracket or parenthesis, a level word, a glog letter+date, a syslog date, logfmt, a compose prefix,
#: Python traceback structure (frames, indented code, exception lines), table and list marks, a prompt.
_LINE_START = re.compile(
    r"^(?:\s|\d{4}-\d\d-\d\d|\d\d-\d\d \d\d:|\d\d:\d\d:\d\d|\d\d/\d\d/\d{4}|[IWEFD]\d{4} |[\[(<{|+#*>$-]"
    r"|(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|CRITICAL|FATAL|PANIC)\b|[A-Z][a-z]{2} [ \d]\d \d\d:"
    r"|time=|Traceback |During handling|The above exception|File \"|(?:[\w]+\.)*[A-Z]\w*(?:Error|Exception|Exit|"
    r"Interrupt|Warning)\b|\w[\w.-]{0,80}\s+\| |terminate called|what\(\)|Exception raised from|frame #"
    r"|\d+\s*(?:%|/\d)|[a-z_][\w.]*:\s)")
#: A row that goes on after a cut at a space: one space, then a word in lower case or an opening bracket (`
#: was encountered`, ` (core dumped)`); an indented line (code, a frame) has more than one.
_SPACE_WORD = re.compile(r"^ [a-z(]")
#: How a paste's continuation starts: mid-sentence (a lower-case word, a digit, closing punctuation), never a new
#: capitalised message.
_CONTINUES = re.compile(r"^[a-z0-9)\]},.;:/'\"_-]")


#: Where an engine's own line starts inside a longer line: a timestamp, a level word, a bracket or parenthesis.
_ENGINE_START = re.compile(r"(?:\d{4}-\d\d-\d\d|\d\d-\d\d \d\d:|[IWEF]\d{4} \d|[\[(]|(?:DEBUG|INFO|WARNING|WARN|ERROR|"
                           r"CRITICAL|FATAL)\b)")


def _repeated_label(text: Sequence[str]) -> re.Pattern[str] | None:
    """A label a tool put before every line (`stern`'s `POD CONTAINER `, a host name, a job name): the same words, up
    to where the engine's own line starts (a timestamp, a level, a bracket), on at least 60 % of the lines (and at
    least 3). None when there is none."""
    counts: Counter[str] = Counter()
    for ln in text:
        m = _ENGINE_START.search(ln, 1, 120)
        if m is None or not ln[m.start() - 1].isspace():
            continue
        label = ln[:m.start()]
        if 2 <= len(label.strip()) <= 100 and not _LINE_START.match(label) and not label.strip().isdigit():
            counts[label] += 1
    if not counts:
        return None
    label, n = counts.most_common(1)[0]
    if n >= max(3, 0.6 * len(text)):
        return re.compile("^" + re.escape(label).replace("\\ ", " ") + "(?P<src>)")
    return None


def _outer(lines: Sequence[str], label: bool = True) -> tuple[str, re.Pattern[str]] | None:
    """The outer prefix shape most lines of the log carry: one that at least 60 % of its non-blank lines (at least 2,
    or the only line) start with; else (with `label`) a label repeated before every line. None when there is none."""
    text = [ln for ln in lines[:100] if ln.strip()]
    if not text:
        return None
    for name, rx in _OUTER:
        n = sum(1 for ln in text if rx.match(ln))
        if n >= max(1 if len(text) == 1 else 2, 0.6 * len(text)):
            return name, rx
    if not label or sum(1 for ln in text if _engine_start(ln)) >= 0.6 * len(text):
        return None  # most lines start with the engine's own prefix: no label before them
    label = _repeated_label(text)
    return ("label", label) if label is not None else None


#: A colour code whose ESC byte a copy or a paste dropped (`[36m(RayWorkerWrapper pid=812)[0m ...`): ECMA-48's SGR
#: sequence without its ESC. Removed only from a line that starts with one (then it is no bracketed text).
_BARE_SGR = re.compile(r"\[(?:\d{1,3}(?:;\d{1,3}){0,4})?m")
_BARE_SGR_START = re.compile(r"^\s*\[\d{1,3}(?:;\d{1,3}){0,4}m")


@functools.lru_cache(maxsize=1 << 15)
def _segments(text: str) -> tuple[str, ...]:
    """One raw line's segments: `\\r` rewrites split, controls stripped, long lines cut (cached per line)."""
    if "\r" in text:
        return tuple(s for s in (_unpasted(strip_control(p))[:MAX_LINE] for p in text.split("\r")) if s.strip()) \
            or ("",)
    if text.isascii() and text.isprintable():
        return (_unpasted(text)[:MAX_LINE],)
    return (_unpasted(strip_control(text))[:MAX_LINE],)


def _unpasted(text: str) -> str:
    """`text` without the colour codes a paste left without their ESC byte (`_BARE_SGR`)."""
    return _BARE_SGR.sub("", text) if text[:1] in "[ \t" and _BARE_SGR_START.match(text) else text


def _split_cr(lines: Iterable[object]) -> list[tuple[int, str]]:
    """(input index, text) per segment: `\\r` rewrites split into their segments, controls stripped, long lines cut."""
    out: list[tuple[int, str]] = []
    for i, raw in enumerate(lines):
        for seg in _segments(raw if isinstance(raw, str) else str(raw)):
            out.append((i, seg))
    return out


@functools.lru_cache(maxsize=1 << 15)
def _starts_a_line(text: str) -> bool:
    """Whether `text` starts like a line of its own (see _LINE_START; cached per line)."""
    return bool(_LINE_START.match(text))


@functools.lru_cache(maxsize=1 << 15)
def _engine_start(text: str) -> bool:
    """Whether `text` starts with an engine's own prefix (a timestamp, a level, a bracket; cached per line)."""
    return bool(_ENGINE_START.match(text))


def _wrap_width(texts: Sequence[str], raw: Sequence[str]) -> tuple[int, bool] | None:
    """The width this log's long lines were cut at, and whether exactly (a terminal keeps every character: three or
    more lines as it printed them, `raw`, or two in a row, have exactly that length, at least 60, none longer, and
    one of them goes on in a row that does not start like a line) or at word boundaries (a paste or a chat client:
    four or more lines of `texts` end within 15 % under a width of 60 to 200 that none exceeds). A log whose long
    rows are padded with spaces (a terminal copy that pads every row) is measured without the padding. None when
    neither."""
    long_rows = [t for t in raw if len(t) >= 50]
    padded = sum(1 for t in long_rows if t[-1:].isspace()) * 2 > len(long_rows)
    for size in ((len, _stripped_len) if not padded else (_stripped_len,)):  # a cut at a space keeps the space
        lengths = Counter(size(t) for t in long_rows)
        if not lengths or (width := max(lengths)) < 60:
            continue
        cut = [b for a, b in itertools.pairwise(raw) if size(a) == width and _goes_on(a, b)]
        if cut and (lengths[width] >= 3 or (lengths[width] == 2 and any(
                size(a) == size(b) == width and a != b and _goes_on(a, b) for a, b in itertools.pairwise(raw)))):
            return width, True
    lengths = Counter(len(t.rstrip()) for t in texts if len(t) >= 50)
    if not lengths:
        return None
    longest = max(lengths)
    if 60 <= longest <= 200 and sum(n for w, n in lengths.items() if w >= 0.85 * longest) >= 4:
        return longest, False
    return None


def _stripped_len(text: str) -> int:
    return len(text.rstrip())


def _goes_on(row: str, text: str) -> bool:
    """Whether `text` reads as the rest of a `row` a terminal cut at its width: it does not start like a line, or
    the cut fell inside a word (a letter or digit on both sides, the rest in lower case: `torch.OutOfMemoryEr` /
    `ror: CUDA out of memory`), or at a space (`_SPACE_WORD`)."""
    if not text.strip():
        return False
    return (not _starts_a_line(text) or bool(_SPACE_WORD.match(text))
            or (row[-1:].isalnum() and text[:1].isalnum() and text[:1].islower()))


def _joined(segments: list[tuple[int, str]], raw: dict[int, str] | None = None) -> list[tuple[tuple[int, ...], str]]:
    """Segments with hard-wrapped continuations joined back (see the module docstring). `raw`: each input line as
    it was before an outer prefix came off: a terminal cut the line with its prefix, so widths are read there."""
    raw = raw or {}
    wrap = _wrap_width([t for _, t in segments], [raw.get(i, t) for i, t in segments])
    out: list[tuple[tuple[int, ...], str]] = []
    prev_len = phys_len = phys_raw = 0  # the physical line above: its text's length; as printed, less / with end spaces
    for i, text in segments:
        if out and text.strip() and wrap is not None:
            phys, before = out[-1]
            width, exact = wrap
            starts = _starts_a_line(text)
            if exact and width in (phys_len, phys_raw) and len(before) < MAX_LINE and _goes_on(before, text):
                out[-1] = ((*phys, i), (before + text)[:MAX_LINE])
                prev_len, (phys_len, phys_raw) = len(text.rstrip()), _lengths(raw.get(i, text))
                continue
            if exact and phys_len == width - 1 == phys_raw and len(before) < MAX_LINE and not starts \
                    and text[:1].islower():
                # cut at a space, which the line lost with its trailing whitespace
                out[-1] = ((*phys, i), (before + " " + text)[:MAX_LINE])
                prev_len, (phys_len, phys_raw) = len(text.rstrip()), _lengths(raw.get(i, text))
                continue
            if (not exact and prev_len >= 0.85 * width and not starts and _CONTINUES.match(text)
                    and not before.rstrip().endswith((".", "!", "?", ":")) and len(before) < MAX_LINE):
                sep = "" if before.endswith((" ", "-", "/", "=")) else " "
                out[-1] = ((*phys, i), (before + sep + text)[:MAX_LINE])
                prev_len, (phys_len, phys_raw) = len(text.rstrip()), _lengths(raw.get(i, text))
                continue
        if out and text.strip() and _continues(out[-1][1], text):
            phys, before = out[-1]
            out[-1] = ((*phys, i), (before.rstrip() + " " + text.strip())[:MAX_LINE])
            prev_len, (phys_len, phys_raw) = len(text.rstrip()), _lengths(raw.get(i, text))
            continue
        out.append(((i,), text))
        prev_len, (phys_len, phys_raw) = len(text.rstrip()), _lengths(raw.get(i, text))
    return out


def _lengths(line: str) -> tuple[int, int]:
    """A physical line's length without and with its trailing whitespace."""
    return len(line.rstrip()), len(line)


_PROCESS_LABEL = re.compile(r"\((?:[\w:./-]{1,80} ){0,3}(?:rank|pid|ip|node|tp|dp)=")
_KV_ONLY = re.compile(r"^ [\w.-]{1,40}=\S{1,120}(?: [\w.-]{1,40}=\S{1,120}){0,3}\s*$")
_PREFIX_END = re.compile(r"^\[\s*\d{1,9}\.\d{3,9}\] ")


def _continues(before: str, text: str) -> bool:
    """A line that goes on with the one above whatever the log's width: one aligned under the message of a kernel
    log line (dmesg indents a record's continuation to its text's column), one of only `key=value` fields (a
    tracing span's fields printed on the next line), or one after a line a wrap cut at a space (the cut line keeps
    its trailing space) that does not start like a line of its own."""
    indent = len(text) - len(text.lstrip(" "))
    if indent >= 8 and (m := _PREFIX_END.match(before)) and indent == m.end():
        return True
    if _KV_ONLY.match(text) and not _engine_start(text.strip()):
        return True
    return (before.endswith(" ") and not before.endswith("  ") and len(before.strip()) >= 40
            and ((text[:1].isalpha() and text[:1].islower() and not _engine_start(text))
                 or (text[:1] in "(/'\"" and not _PROCESS_LABEL.match(text))))


def _pane_rows(segments: list[tuple[int, str]], raw: dict[int, str]) -> list[tuple[int, str]]:
    """A terminal pane's rows with the rows it cut joined back: a row whose text reaches the pane's right edge (the
    pane's full width, at most one space of padding before its right border) goes on in the next row, with nothing
    between them."""
    width = max((len(r.rstrip()) for r in raw.values()), default=0)

    def cut(i: int) -> bool:
        row = raw.get(i, "").rstrip()
        inner = row[:-1] if row.endswith(("│", "┃", "║")) else row
        return len(row) == width and len(inner) - len(inner.rstrip()) <= 1

    out: list[tuple[int, str]] = []
    joining = False
    for i, text in segments:
        if joining and out and text.strip():
            out[-1] = (out[-1][0], out[-1][1].rstrip() + text.rstrip())
        else:
            out.append((i, text.rstrip()))
        joining = cut(i)
    return out


def body_of(text: str) -> tuple[str, str | None, str | None, str | None]:
    """(body, level, module, source) of one line: its engine prefix elements removed one after another (at most 8).
    Never raises."""
    if text.startswith("time="):
        m = _LOGFMT.match(text)
        if m:
            msg = m.group("msg")
            msg = msg[1:-1].replace('\\"', '"') if msg.startswith('"') else msg
            return msg.strip(), _LEVELS.get(m.group("level").upper()), m.group("m"), None
    level = module = source = None
    pos = 0
    n = len(text)
    while pos < n and text[pos] == " " and pos < 4:
        pos += 1
    for _ in range(8):
        for kind, rx in _ELEMENTS:
            m = rx.match(text, pos)
            if m is None or m.end() == pos:
                continue
            if kind == "label":
                word = m.group("v").strip()
                if word.upper() in _LEVELS:
                    level = level or _LEVELS[word.upper()]
                elif not (word.upper().startswith(("TENSORRT", "TRT", "RANK ", "NCCL"))
                          or (word.isalpha() and word.isupper() and len(word) <= 12)):
                    continue  # a bracketed word that is the message itself (`[Errno 98]`), not a label
            elif kind in ("level", "pylog"):
                level = level or _LEVELS.get(m.group("v").upper())
                if kind == "pylog":
                    source = source or m.group("s")
            elif kind in ("span", "target", "component"):
                if level is None:  # only after a level: before one, these words are the message
                    continue
                if kind in ("component", "target"):
                    source = source or m.group("v")
            elif kind == "glog":
                level = level or _LEVELS.get(m.group("v"))
                module = module or m.group("m")
            elif kind == "module":
                module = module or m.group("m")
            elif kind == "source":
                source = source or m.group("v")
            elif kind == "nccl":
                source = source or f"rank {m.group('v')}"
                level = level or _LEVELS.get(m.group("l"))
                module = module or m.group("m")
            pos = m.end()
            break
        else:
            break
    # the prefix's last element took the spaces after it: more than one of them is the message's own indentation
    # (a traceback's frames and code lines under a prefix)
    pad = 0
    while pad < pos and text[pos - 1 - pad] == " ":
        pad += 1
    return (" " * (pad - 1) + text[pos:] if pad > 1 and pos < n else text[pos:]), level, module, source


@functools.lru_cache(maxsize=1 << 15)
def _parsed(text: str) -> tuple[str, str | None, str | None, str | None, tuple[str, float] | None]:
    """(body, level, module, source, timestamp) of one line (cached: a full look's tail is mostly the last one's)."""
    body, level, module, source = body_of(text)
    return body, level, module, source, stamp(text)


#: How many outer prefixes are taken off, one inside the other.
OUTER_LAYERS = 2


def _stripped(segments: list[tuple[int, str]], outer: tuple[str, re.Pattern[str]],
              sources: dict[int, str]) -> list[tuple[int, str]]:
    """`segments` with the outer prefix `outer` off the lines that carry it; each one's source (a compose service, a
    pod, a unit) recorded in `sources` by input line, the outermost kept."""
    name, rx = outer
    out: list[tuple[int, str]] = []
    for i, t in segments:
        m = rx.match(t)
        if m is None:
            out.append((i, t))
            continue
        rest = _unpasted(t[m.end():])  # colour codes a paste left bare, after the prefix too
        out.append((i, _PANE_RIGHT.sub("", rest) if name == "pane" else rest))
        if m.group("src"):
            sources.setdefault(i, m.group("src"))
    return out


def normalise(lines: Iterable[object] | None, parsed: dict[str, tuple] | None = None) -> list[LogLine]:
    """The logical lines of a log (see the module docstring). Pure; never raises for any input. `parsed`: a caller's
    memo of each line's parsed prefix (a launch's lines seen at its last check), read and added to."""
    segments = _split_cr(lines or ())
    outer = _outer([t for _, t in segments])
    raw_rows = dict(segments)  # a pane row as it was, its borders included
    layers: list[str] = []
    sources: dict[int, str] = {}
    while outer is not None and len(layers) < OUTER_LAYERS:  # compose around journald, kubectl around a stamp
        layers.append(outer[0])
        segments = _stripped(segments, outer, sources)
        if outer[0] == "pane":
            segments = _pane_rows(segments, raw_rows)
        # a second layer only of the listed shapes (a label repeated inside one is the message's own words)
        outer = _outer([t for _, t in segments], label=False)
    out: list[LogLine] = []
    for phys, text in _joined(segments, raw_rows if layers else None):
        if parsed is None:
            body, level, module, source, ts = _parsed(text)
        else:
            got = parsed.get(text)
            if got is None:
                got = parsed[text] = _parsed(text)
            body, level, module, source, ts = got
        src = sources.get(phys[0]) or source
        if "stamped" in layers:  # one clock for every line: the stamp the tool put on each, not the engine's own
            ts = stamp(raw_rows.get(phys[0], "")) or ts
        out.append(LogLine(text=text, body=body, source=src, level=level, module=module,
                           ts=ts[1] if ts else None, ts_kind=ts[0] if ts else None, physical=phys))
    return out
