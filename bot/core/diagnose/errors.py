"""Errors as structures (pure): the tracebacks and native crashes of a log, each with its exception type, message,
frames, where it starts and ends, and whether its last line was cut off.

`error_blocks(lines)` reads normalised lines (bot.core.diagnose.lines) and returns one `ErrorBlock` per error:
- a Python traceback (`Traceback (most recent call last):`, frames `File "PATH", line N, in FUNC` with their code
  and caret lines, the exception line `package.Type: message`; CPython 3.8-3.13's format, chained tracebacks
  included). One cut before its exception line (an excerpt, a paste, a process killed while printing) is still an
  error: `cut` is set and its last frame stands for it. Interleaved ranks are kept apart by each line's source
  (`[rank1]:`, `(VllmWorker rank=1 pid=..)`, a compose service): each rank's traceback is read from its own lines.
- faulthandler's dump (`Fatal Python error: Segmentation fault`, `Current thread 0x... (most recent call first):`,
  frames `File "PATH", line N in FUNC`).
- a C++ exception that ended the process (`terminate called after throwing an instance of 'c10::Error'` with its
  `what():` message; libstdc++'s wording), with c10's `Exception raised from ... frame #N:` native frames.
- a fatal signal (`*** SIGSEGV received at time=...` (absl), `Segmentation fault (core dumped)`, `Aborted (core
  dumped)`, `Bus error`, `!!!!!!! Segfault encountered !!!!!!!` (TensorRT-LLM), a shell's `zsh: abort`, a crash
  handler's `Caught signal 11 (Segmentation fault: ...)`).
- a failed assertion that aborts (glibc's `Assertion `x' failed.`, ggml's `GGML_ASSERT(x) failed`, TensorRT-LLM's
  `Assertion failed: x`).
- a native backtrace (`3   0x7f4a46a29091 ns::Class::method(args) + 140`: TensorRT-LLM, glog, boost) under an error
  line: its frames (function and qualified name) added to that line's error.
- a Rust panic (`thread 'main' panicked at ...`, Rust 1.0-1.8x, both the old one-line and the newer two-line form)
  and a Go panic (`panic: ...` with `goroutine N [running]:`) or runtime crash (`fatal error: ...`, `SIGSEGV:
  segmentation violation` over `PC=0x...`), with its first goroutine's frames.

What an error MEANS (its verdict, its phase) is decided elsewhere (bot.core.diagnose.taxonomy, .frames); this module
only reads the shape. Never raises.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from bot.core.diagnose.lines import LogLine

__all__ = ["ErrorBlock", "TraceFrame", "error_blocks", "exception_line"]


@dataclass(frozen=True, slots=True)
class TraceFrame:
    """One frame of a traceback: the file (as printed), the function (None when not printed), the line number."""

    file: str
    func: str | None
    line: int | None = None


@dataclass
class ErrorBlock:
    """One error read from a log (see the module docstring). Indexes point into the normalised lines.

    - `kind`: `python`, `faulthandler`, `cpp`, `signal`, `assert`, `panic`, `native` (an error line with a native
      backtrace under it).
    - `exc_type`: the exception's type as printed (`torch.OutOfMemoryError`, `c10::DistBackendError`,
      `SIGSEGV`), None when the block was cut before it.
    - `message`: the exception's message (may be empty).
    - `frames`: outermost first (Python's order), native frames (c10's `frame #N`) after them.
    - `start`: its first line; `line`: the line that says what failed (the exception line; the last frame when
      `cut`); `end`: its last line.
    - `cut`: it ended without its exception line. `chained`: another traceback follows it as its consequence
      ("During handling of the above exception ...", "The above exception was the direct cause ...").
    - `source`: the rank, process or container that printed it (None when the log has one source).
    - `intro`: the line that introduced a traceback printed without its `Traceback (most recent call last):` header
      (a line ending in a colon just above its first frame), or None.
    """

    kind: str
    exc_type: str | None
    message: str
    start: int
    line: int
    end: int
    frames: list[TraceFrame] = field(default_factory=list)
    intro: int | None = None  # the line that introduced a traceback printed without its header (`... Error:`)
    cut: bool = False
    chained: bool = False
    source: str | None = None

    @property
    def short_type(self) -> str | None:
        """The type's own name: `OutOfMemoryError` of `torch.cuda.OutOfMemoryError`, `Error` of `c10::Error`; for
        a wrapped error (`RayTaskError(ValueError)`) the inner one."""
        t = self.exc_type
        if not t:
            return None
        if m := re.search(r"\(([\w.]+)\)$", t):
            t = m.group(1)
        return re.split(r"\.|::", t)[-1]


_TB_HEAD = "Traceback (most recent call last)"
#: What a line outside a traceback needs to begin one (or continue a dump): a header, a frame, a chain, faulthandler.
_MAY_START = re.compile(r'Traceback|File "|Fatal Python error|During handling|The above exception')
_FRAME = re.compile(r'File "(?P<file>[^"]{1,400})", line (?P<line>\d{1,7})(?:,? in (?P<func>[^\s,]{1,200}))?')
_CHAIN = re.compile(r"During handling of the above exception|The above exception was the direct cause")
#: An exception line: `Type`, `pkg.mod.Type: message`, `ray.exceptions.RayTaskError(ValueError): ...`,
#: `c10::Error: ...`. The type's own name must read as an exception's (ends in Error, Exception, ...), or be one of
#: Python's few others.
_EXC = re.compile(r"^(?P<type>(?:[A-Za-z_]\w{0,80}(?:\.|::)){0,8}[A-Z]\w{0,80}(?:\([\w.]{1,120}\))?)"
                  r"(?::(?:\s(?P<msg>.*)|$)|$)")
_EXC_NAME = re.compile(r"(?:Error|Exception|Exit|Interrupt|Failure|Fault|Abort(?:ed)?|Timeout|Warning|Iteration|"
                       r"Cancelled|Exhausted)$")
_PLAIN_EXC = frozenset({"KeyboardInterrupt", "SystemExit", "StopIteration", "GeneratorExit", "Exception"})
_FAULT = re.compile(r"^Fatal Python error: (?P<msg>.+)")
_FAULT_FRAME = re.compile(r'File "(?P<file>[^"]{1,400})", line (?P<line>\d{1,7}) in (?P<func>\S{1,200})')
_TERMINATE = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']{1,200})'")
_WHAT = re.compile(r"^\s*what\(\):\s*(?P<msg>.*)")
#: c10's exception dump (torch c10/util/Exception.cpp): `Exception raised from FUNC at FILE:LINE (most recent call
#: first):`, then `frame #N:` lines.
_RAISED_FROM = re.compile(r"^Exception raised from (?P<func>[\w:~<>]+) at \S+")
_NATIVE_FRAME = re.compile(r"^frame #\d+: (?:0x[0-9a-f]+ \(?)?(?P<func>[^\s(+]{1,200})")
_SIGNAL = re.compile(r"\*\*\* (?P<sig>SIG[A-Z]{2,6}) received|^Signal Received: (?P<g3num>\d{1,2})\b|"
                     r"^(?P<word>Segmentation fault|Aborted|Bus error|"
                     r"Illegal instruction|Floating point exception)(?: \(core dumped\))?\s*$|"
                     r"(?P<trt>Segfault) encountered|Received signal (?P<num>\d{1,2}) \((?P<name>SIG[A-Z]+)\)|"
                     r"^(?:zsh|bash|sh|fish|dash): (?P<shell>abort|segmentation fault|bus error|illegal hardware "
                     r"instruction|floating point exception)\b|"
                     r"[Cc]aught signal (?P<caught>\d{1,2}) \((?P<cname>[A-Z][\w ]+?)(?::|\))")
#: glibc's assert(3) (`prog: file.c:12: func: Assertion `x' failed.`), ggml's `file.c:12: GGML_ASSERT(x) failed`,
#: and TensorRT-LLM's `Assertion failed: x (file.cpp:12)`: an assertion that aborted the process.
_ASSERT = re.compile(r"Assertion [`'](?P<a>.{0,300})' failed\.|\bGGML_ASSERT\((?P<g>.{0,300})\) failed|"
                     r"(?:^|\] )Assertion failed: (?P<t>.{1,300})")
_SIGNAL_NAMES = MappingProxyType({"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
                 "Illegal instruction": "SIGILL", "Floating point exception": "SIGFPE", "Segfault": "SIGSEGV",
                 "abort": "SIGABRT", "segmentation fault": "SIGSEGV", "bus error": "SIGBUS",
                 "illegal hardware instruction": "SIGILL", "floating point exception": "SIGFPE"})
_SIGNAL_NUMBERS = MappingProxyType({"11": "SIGSEGV", "6": "SIGABRT", "7": "SIGBUS", "4": "SIGILL", "8": "SIGFPE",
                                    "9": "SIGKILL", "15": "SIGTERM", "2": "SIGINT", "3": "SIGQUIT"})
_RUST = re.compile(r"thread '(?P<thread>[^']{0,80})' panicked at (?:'(?P<msg>.*)', )?(?P<where>\S+?):?$")
_GO = re.compile(r"^panic: (?P<msg>.+)")
#: The Go runtime's own crashes (runtime/panic.go, runtime/signal_unix.go, Go 1.x): `fatal error: MSG`, and a signal
#: in cgo or the runtime as `SIGSEGV: segmentation violation` over `PC=0x... m=N sigcode=N`; each before its
#: goroutine dump.
_GO_FATAL = re.compile(r"^fatal error: (?P<msg>.+)")
_GO_SIGNAL = re.compile(r"^(?P<sig>SIG[A-Z]{2,6}): (?P<msg>[a-z][a-z -]{2,60})$")
_GO_PC = re.compile(r"^PC=0x[0-9a-f]+ m=\d+")
#: A goroutine dump's header and its frames: `pkg/path.(*Type).method(args)` over `\t/path/file.go:N +0x1b4`
#: (innermost first); cgo calls as `pkg._Cfunc_name(...)`.
_GOROUTINE = re.compile(r"^goroutine \d+(?: gp=\S+)?(?: m=\S+)?(?: mp=\S+)? \[[^\]]{1,80}\]:$")
_GO_FRAME = re.compile(r"^(?P<q>[^\s(]+(?:\(\*?\w{1,200}\)[^\s(]*)?)\([^\n]*\)$")
_GO_CLOSURE = re.compile(r"(?:\.func\d+)+(?:\.\d+)*$")
_GO_FILE = re.compile(r"^\s+(?P<file>\S+\.(?:go|s|c)):(?P<line>\d{1,7})(?: \+0x[0-9a-f]+)?(?: \w+=\S+)*$")
#: Lines after a frame that belong to it: code, carets (`^^^^`, `~~~~`), and the `...` of an elided chain.
_CARET = re.compile(r"^[\s~^]+$")
#: Python 3.13's elision of a multi-line call's middle: `...<2 lines>...`.
_ELIDED = re.compile(r"^\.\.\.<\d+ lines?>\.\.\.$")


def exception_line(body: str) -> tuple[str, str] | None:
    """(type, message) when `body` (a line's message, stripped) is an exception line, else None."""
    m = _EXC.match(body)
    if m is None:
        return None
    t = m.group("type")
    own = re.split(r"\.|::", re.sub(r"\([\w.]*\)$", "", t))[-1]
    if not (_EXC_NAME.search(own) or own in _PLAIN_EXC or "Error" in own or "Exception" in own
            or ("::" in t and m.group("msg") is not None)):
        return None
    return t, (m.group("msg") or "").strip()


def _streams(lines: Sequence[LogLine]) -> dict[str | None, list[int]]:
    """Line indexes per source. Lines without a source go with every stream (a traceback printed by `logging` has its
    header on a prefixed line and its frames bare); a log with one source or none is one stream."""
    sources = {ln.source for ln in lines if ln.source is not None}
    if len(sources) <= 1:
        return {None: list(range(len(lines)))}
    out: dict[str | None, list[int]] = {s: [] for s in sources}
    for i, ln in enumerate(lines):
        if ln.source is None:
            for s in out:
                out[s].append(i)
        else:
            out[ln.source].append(i)
    return out


#: Lines above a headless traceback's first frame searched for the line that introduced it.
INTRO_LINES = 3


class _PyReader:
    """Reads one stream's Python tracebacks and faulthandler dumps, line by line (`take`), into `out`."""

    def __init__(self, lines: Sequence[LogLine], source: str | None):
        self.lines, self.source = lines, source
        self.out: list[ErrorBlock] = []
        self.cur: ErrorBlock | None = None
        self.after_frame = 0  # lines since the last frame that were not frames (code, carets)
        self.chain_next = False

    def close(self, cut: bool) -> None:
        """End the traceback being read; `cut`: before its exception line (the line that introduced it stands for
        it, else its last frame)."""
        block, self.cur = self.cur, None
        if block is None:
            return
        if cut:
            block.cut, block.line = True, block.intro if block.intro is not None else block.end
        self.out.append(block)

    def start(self, i: int) -> None:
        """A traceback's header at line `i`."""
        if self.cur is not None:  # a new traceback before the last one said what it was
            self.close(cut=True)
        self.cur = ErrorBlock("python", None, "", start=i, line=i, end=i, source=self.source)
        if self.chain_next and self.out:
            self.out[-1].chained = True
        self.chain_next, self.after_frame = False, 0

    def special(self, i: int, body: str) -> bool:
        """Faulthandler's dump and chained-traceback lines; True when line `i` was one of them."""
        if m := _FAULT.match(body):
            self.close(cut=True)
            self.out.append(ErrorBlock("faulthandler", "Fatal Python error", m.group("msg").strip(), start=i, line=i,
                                       end=i, source=self.source))
            return True
        last = self.out[-1] if self.out else None
        if last is not None and last.kind == "faulthandler" and self.cur is None and i - last.end <= 3 \
                and (fm := _FAULT_FRAME.search(body)):
            last.frames.append(TraceFrame(fm.group("file"), fm.group("func"), int(fm.group("line"))))
            last.end = i
            return True
        if _CHAIN.search(body):
            self.close(cut=True)
            self.chain_next = True
            return True
        return False

    def _intro(self, i: int) -> int | None:
        """The line that introduces a headless traceback whose first frame is line `i`: one of the INTRO_LINES lines
        above it that ends in a colon (what follows is its detail), else None."""
        for j in range(i - 1, max(-1, i - 1 - INTRO_LINES), -1):
            body = self.lines[j].body.strip()
            if body.endswith(":") and not _FRAME.search(body):
                return j
        return None

    def take(self, i: int) -> None:
        """Read line `i`."""
        body = self.lines[i].body.strip()
        if not body:
            return
        if self.cur is None and not _MAY_START.search(body):
            if ("Error" in body or "Exception" in body) and (exc := exception_line(body)) is not None:
                self._tail(i, exc)
            return  # no traceback open and nothing that could begin or continue one: most lines
        if _TB_HEAD in body:
            self.start(i)
            return
        if self.special(i, body):
            return
        fm = _FRAME.search(body)
        if self.cur is None:
            last = self.out[-1] if self.out else None
            if fm is None or (last is not None and last.end >= i - 1 and not last.cut):
                return
            # a traceback printed or pasted without its header: read from its first frame, and from the line that
            # introduced it when one does (`... failed to start with exception. Error:` ending in a colon)
            intro = self._intro(i)
            self.cur = ErrorBlock("python", None, "", start=intro if intro is not None else i, line=i, end=i,
                                  source=self.source, intro=intro)
            self.after_frame = 0
        cur = self.cur
        if fm is not None:
            cur.frames.append(TraceFrame(fm.group("file"), fm.group("func"), int(fm.group("line"))))
            cur.end, self.after_frame = i, 0
            return
        exc = exception_line(body)
        if exc is not None and (cur.frames or self.after_frame == 0):
            cur.exc_type, cur.message = exc
            cur.line = cur.end = i
            self.close(cut=False)
            return
        if _CARET.match(body) or body.startswith("...") or _ELIDED.match(body):
            cur.end = i
            return
        self.after_frame += 1
        raw = self.lines[i].body
        indented = len(raw) - len(raw.lstrip(" ")) >= 4  # code under a frame is indented deeper than the frame
        if cur.frames and (self.after_frame <= 2 or (indented and self.after_frame <= 12)):
            cur.end = i  # a frame's code line (one, sometimes wrapped; Python 3.13 shows whole multi-line calls)
            return
        self.close(cut=True)  # something else began: the traceback was cut before its exception line

    def _tail(self, i: int, exc: tuple[str, str]) -> None:
        """An exception line `i` right under a frame's code line (indented, or carets) with no traceback open: the
        tail of a traceback whose head a paste or an excerpt cut off. Read as a traceback with no frames."""
        j = i - 1
        while j >= 0 and not self.lines[j].body.strip():
            j -= 1
        if j < 0 or (self.lines[j].source != self.lines[i].source and self.lines[j].source is not None):
            return
        raw = self.lines[j].body
        if not (_CARET.match(raw.strip()) or len(raw) - len(raw.lstrip(" ")) >= 3) \
                or exception_line(raw.strip()) is not None:  # an indented error of its own is no code line
            return
        last = self.out[-1] if self.out else None
        if last is not None and last.end >= j:  # the code line closed a traceback already read
            return
        self.out.append(ErrorBlock("python", exc[0], exc[1], start=j, line=i, end=i, source=self.source))

    def finish(self) -> list[ErrorBlock]:
        """The blocks read; a traceback still open at the end was cut."""
        if self.cur is not None and (self.cur.frames or self.cur.start == self.cur.end):
            self.close(cut=True)
        return self.out


def _python(lines: Sequence[LogLine], idx: list[int], source: str | None) -> list[ErrorBlock]:
    """The Python tracebacks (and faulthandler dumps) in one stream of line indexes."""
    reader = _PyReader(lines, source)
    for i in idx:
        reader.take(i)
    return reader.finish()


#: A native backtrace frame as TensorRT-LLM, glog and many C++ programs print it: `3   0x7f4a46a29091
#: tensorrt_llm::batch_manager::PromptTuningBuffers::fill(std::vector<...>) + 140`, or unresolved `lib.so(+0x745b36)`.
_BACKTRACE = re.compile(r"^\s*\d{1,3}\s+0x[0-9a-fA-F]{6,16}\s+(?P<sym>\S.*)$"
                        r"|^(?:\[[\w.-]{1,64}:\d{1,9}\] )?\[\s?\d{1,3}\] (?P<lib>[^\s(]+)"
                        r"\((?P<gsym>[^)+]*)(?:\+0x[0-9a-f]+)?\)"
                        r"\[0x[0-9a-f]+\]$"
                        # UCX's `ucs_handle_error` backtrace: ` 6  /path/libuct.so(uct_tcp_ep_am_bcopy+0x8a) [0x7a..]`
                        r"|^\s*\d{1,3}\s+(?P<ulib>/[^\s(]+)\((?P<usym>[^)+]*)(?:\+0x[0-9a-f]+)?\)\s+\[0x[0-9a-f]+\]$"
                        # absl's FailureSignalHandler (Ray, gRPC): `PC: @ 0x7f.. (unknown) func()`, `@ 0x7f.. 80 func`
                        r"|^(?:PC: )?@\s+0x[0-9a-f]{1,16}\s+(?:\d+|\(unknown\))\s+(?P<asym>\S.*)$"
                        # glibc's backtrace_symbols(_fd) (execinfo.h; ggml_print_backtrace): `/x.so(sym+0x1b)[0x7f..]`
                        r"|^(?P<blib>/[^\s(]+|[\w.-]+\.so[\w.]*)\((?P<bsym>[^)+\s]*)(?:\+0x[0-9a-f]+)?\) ?"
                        r"\[0x[0-9a-f]+\]$")


#: An Itanium C++ ABI mangled name (GCC, Clang): `_ZN` nested-name `E` or `_Z` one name, then the parameters.
_MANGLED = re.compile(r"^_Z(?P<nested>N(?:[rVKRO]*))?(?P<rest>\d.*)$")


def demangled(sym: str) -> str | None:
    """The qualified name of an Itanium-mangled symbol's nested or plain name (`_ZN24common_prompt_checkpoint10update
    _tgtEv` -> `common_prompt_checkpoint::update_tgt`; `_Z14ggml_abortPKci` -> `ggml_abort`), the parameters left
    out; None when it is not one this reads (templates, substitutions, operators are not followed). Source: the
    Itanium C++ ABI, "External Names (a.k.a. Mangling)", <nested-name> and <source-name>."""
    m = _MANGLED.match(sym)
    if m is None:
        return None
    rest, parts = m.group("rest"), []
    while rest[:1].isdigit():
        n = 0
        k = 0
        while k < len(rest) and rest[k].isdigit() and k < 4:
            n, k = n * 10 + int(rest[k]), k + 1
        name = rest[k:k + n]
        if len(name) < n or not n:
            return None
        parts.append(name)
        rest = rest[k + n:]
        if not m.group("nested"):
            break
    if not parts or (m.group("nested") and not rest.startswith(("E", "C", "D", "I"))):
        return None
    return "::".join(parts)


def native_function(sym: str) -> tuple[str, str] | None:
    """(function, qualified name) of a native frame's symbol (`ns::Class::method(args) + 140` -> (`method`,
    `ns::Class::method`); a mangled one is read as its `demangled` name); None for an unresolved address
    (`lib.so(+0x745b36) [0x7f..]`)."""
    sym = sym.strip()
    if sym.startswith("_Z"):
        sym = demangled(sym.split("+", 1)[0].split(" ", 1)[0]) or sym
    if sym.startswith("virtual thunk to "):
        sym = sym[len("virtual thunk to "):]
    depth = 0
    for k, ch in enumerate(sym):  # the name ends at the first parenthesis outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0:
            sym = sym[:k]
            break
    name = re.sub(r"<[^<>]*>", "", sym).strip()
    if not name or "/" in name or name.endswith(".so") or " " in name:
        return None
    return name.split("::")[-1], name


def _backtraces(lines: Sequence[LogLine], out: list[ErrorBlock]) -> None:
    """Runs of native backtrace frames: attached to the error block of the line just above them, or to a new `native`
    block on the error line above the run (its message that line's words)."""
    i = 0
    while i < len(lines):
        if not _BACKTRACE.match(lines[i].body):
            i += 1
            continue
        j = i
        frames: list[TraceFrame] = []
        while j < len(lines):
            m = _BACKTRACE.match(lines[j].body)
            if m is None:  # a blank line inside the run, or a symbol continued on the next line, is still the run
                if j + 1 < len(lines) and _BACKTRACE.match(lines[j + 1].body):
                    j += 1
                    continue
                break
            sym = next((g for g in (m.group("sym"), m.group("gsym"), m.group("usym"), m.group("asym"), m.group("bsym"))
                        if g), None)
            if sym and (fn := native_function(sym)) is not None:
                frames.append(TraceFrame(fn[1], fn[0]))
            j += 1
        head = i - 1
        while head >= 0 and not lines[head].body.strip():
            head -= 1
        owner = next((b for b in out if head >= 0 and b.start <= head <= b.end), None)
        if owner is None and head >= 0:
            said = lines[head].body.strip()
            exc = exception_line(said)  # `tensorrt_llm::common::TllmException: [TensorRT-LLM][ERROR] Assertion ...`
            owner = ErrorBlock("native", exc[0] if exc else None, exc[1] if exc else said, start=head, line=head,
                               end=head, source=lines[head].source)
            out.append(owner)
        if owner is not None:
            owner.frames.extend(reversed(frames))  # a backtrace lists the innermost first: store outermost first
            owner.end = max(owner.end, j - 1)
        i = j


#: Words one of the native error shapes below needs: a line with none of them is not read further (most are not).
_NATIVE_WORDS = re.compile(r"terminate|what\(\)|frame #|Exception raised|SIG|[Ss]egment|Abort|abort|Bus error|Illegal|"
                           r"[Ii]llegal|Floating|[Ff]loating|[Ss]egfault|[Ss]ignal|Assert|GGML_ASSERT|panic|"
                           r"^fatal error: ")


@functools.lru_cache(maxsize=1 << 15)
def _native_words(body: str) -> bool:
    """Whether a line holds one of the words a native error shape needs (cached per line)."""
    return _NATIVE_WORDS.search(body) is not None


def _native(lines: Sequence[LogLine]) -> list[ErrorBlock]:
    """C++ exceptions that ended a process, fatal signals, Rust and Go panics (each from its own line)."""
    out: list[ErrorBlock] = []
    cpp: ErrorBlock | None = None
    for i, ln in enumerate(lines):
        body = ln.body.strip()
        if not body or not _native_words(body):
            continue
        if m := _TERMINATE.search(body):
            run = []  # the error-level lines right before it: the first of them says what went wrong
            for j in range(i - 1, max(-1, i - 6), -1):
                if lines[j].level not in ("ERROR", "CRITICAL"):
                    break
                run.append(lines[j].body.strip())
            before = run[-1] if run else ""
            cpp = ErrorBlock("cpp", m.group("type"), before, start=i, line=i, end=i, source=ln.source)
            out.append(cpp)
            continue
        if (cpp is None or i - cpp.end > 3) and (m := _RAISED_FROM.match(body)) and not _under_warning(lines, i):
            # c10's dump of an exception whose `terminate called` / `what()` head the excerpt does not hold
            cpp = ErrorBlock("cpp", "c10::Error", f"raised from {m.group('func')}", start=i, line=i, end=i,
                             source=ln.source)
            out.append(cpp)
            continue
        if cpp is not None and i - cpp.end <= 3:
            if m := _WHAT.match(body):
                cpp.message, cpp.line, cpp.end = m.group("msg").strip(), i, i
                continue
            if m := _NATIVE_FRAME.match(body):
                cpp.frames.append(TraceFrame("", m.group("func")))
                cpp.end = i
                continue
            if body.startswith("Exception raised from"):
                cpp.end = i
                continue
        if m := _ASSERT.search(body):
            what = m.group("a") or m.group("g") or m.group("t") or ""
            exc = exception_line(body)  # `tensorrt_llm::common::TllmException: ... Assertion failed: ...`: its type
            out.append(ErrorBlock("assert", exc[0] if exc else "assertion", exc[1] if exc else what.strip(), start=i,
                                  line=i, end=i, source=ln.source))
            continue
        if m := _SIGNAL.search(body):
            number = m.group("caught") or m.group("g3num") or ""
            name = (m.group("sig") or m.group("name") or _SIGNAL_NUMBERS.get(number)
                    or _SIGNAL_NAMES.get(m.group("word") or m.group("trt") or m.group("shell") or ""))
            out.append(ErrorBlock("signal", name or "signal", body, start=i, line=i, end=i, source=ln.source))
            continue
        if m := _RUST.search(body):
            msg = m.group("msg") or ""
            if not msg and i + 1 < len(lines):
                msg = lines[i + 1].body.strip()
            out.append(ErrorBlock("panic", "panic", msg, start=i, line=i, end=i, source=ln.source))
            continue
        if (go := _go_crash(lines, i, body)) is not None:
            out.append(go)
    return out


def _under_warning(lines: Sequence[LogLine], i: int) -> bool:
    """Whether line `i` comes right under a warning (torch prints a c10 dump under `[W...] recvValue failed` at
    exit): within the 3 non-blank lines above it."""
    seen = 0
    for j in range(i - 1, -1, -1):
        if not lines[j].body.strip():
            continue
        if lines[j].level == "WARNING" or "Warning" in lines[j].body:
            return True
        seen += 1
        if seen >= 3:
            break
    return False


def _go_crash(lines: Sequence[LogLine], i: int, body: str) -> ErrorBlock | None:
    """A Go panic or runtime crash whose report starts at line `i` (with its first goroutine's frames), or None."""
    if (m := _GO.match(body)) and any("goroutine " in lines[j].body for j in range(i + 1, min(len(lines), i + 4))):
        return _go_frames(ErrorBlock("panic", "panic", m.group("msg"), start=i, line=i, end=i,
                                     source=lines[i].source), lines)
    if (m := _GO_FATAL.match(body) or _GO_SIGNAL.match(body)) and _go_dump_follows(lines, i):
        return _go_frames(ErrorBlock("panic", m.groupdict().get("sig") or "fatal error", m.group("msg"), start=i,
                                     line=i, end=i, source=lines[i].source), lines)
    return None


def _go_func(qualified: str) -> str | None:
    """A goroutine frame's function (`pkg/path.(*Server).processBatch` -> `processBatch`; a closure's
    `Decode.func1` -> `Decode`; a cgo call `_Cfunc_llama_decode` -> `llama_decode`), or None."""
    name = _GO_CLOSURE.sub("", qualified).rsplit(".", 1)[-1].removeprefix("_Cfunc_")
    return name if name.isidentifier() else None


def _go_dump_follows(lines: Sequence[LogLine], i: int) -> bool:
    """Whether the Go runtime's crash report goes on after line `i`: its `PC=` line, a `[signal ...]` line or a
    goroutine header within the next few lines."""
    for j in range(i + 1, min(len(lines), i + 6)):
        body = lines[j].body.strip()
        if _GO_PC.match(body) or body.startswith("[signal SIG") or _GOROUTINE.match(body):
            return True
    return False


def _go_frames(block: ErrorBlock, lines: Sequence[LogLine], limit: int = 200) -> ErrorBlock:
    """`block` with the frames of the first goroutine dump after it (outermost first, as Python's), its `end` moved
    to the dump's last frame. The dump is read until a line that is neither a frame, its file line nor blank."""
    i = block.start + 1
    end = min(len(lines), block.start + limit)
    while i < end and not _GOROUTINE.match(lines[i].body.strip()):
        i += 1
    frames: list[TraceFrame] = []
    for j in range(i + 1, end):
        body = lines[j].body.rstrip()
        if (m := _GO_FRAME.match(body.strip())) and (func := _go_func(m.group("q"))):
            frames.append(TraceFrame("", func))
            block.end = j
        elif (f := _GO_FILE.match(body)) and frames and not frames[-1].file:
            frames[-1] = TraceFrame(f.group("file"), frames[-1].func, int(f.group("line")))
            block.end = j
        elif body.strip() or _GOROUTINE.match(body.strip()):
            break
    block.frames.extend(reversed(frames))
    return block


def error_blocks(lines: Sequence[LogLine]) -> list[ErrorBlock]:
    """Every error block of a log (see the module docstring), in the order they start. Never raises."""
    found: list[ErrorBlock] = []
    for source, idx in _streams(lines).items():
        found += _python(lines, idx, source)
    # a block read in several streams (its lines had no source) is one block
    seen: set[tuple[int, int]] = set()
    unique = []
    for b in sorted(found, key=lambda b: (b.start, b.line)):
        if (b.start, b.line) not in seen:
            seen.add((b.start, b.line))
            unique.append(b)
    unique += _native(lines)
    _backtraces(lines, unique)
    return sorted(unique, key=lambda b: (b.line, b.start))
