"""Python stack dumps of server processes with py-spy, taken over the host's executor in one round trip.

Pure parts: `dump_script` builds the POSIX sh script the host runs (`sh -s`, script on stdin),
`parse_dump_output` turns its output into `ProcessDump`s (never raises), `summarize` and `full_text` turn
those into lines for Slack and into the full text to attach; `finish_dumps` turns the whole command's result
into one `ProcessDump` per pid. Running the script is `bot.services.stacks`; rendering is
`bot.present.stackdump`.

The script prints, per pid:

    @@PYSPY START timeout=20 pids=123,456      (once, first)
    @@PYSPY MISSING                            (once, then exit 127, when py-spy is not on PATH)
    @@PYSPY 123 BEGIN
    <py-spy dump --json output>
    @@PYSPY 123 STDERR                         (only when py-spy wrote to stderr)
    | <each stderr line, prefixed so it can never look like a marker>
    @@PYSPY 123 END rc=0

Only validated integers and `shlex.quote`d values reach the shell.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bot.core.commands import strip_markers
from bot.core.shell import KILL_AFTER_S, MAX_PID, quote

#: At most this many processes per dump request (each dump pauses its target briefly).
MAX_PIDS = 64
#: Frames shown per thread in the summary.
TOP_FRAMES = 3
#: Seconds the executor waits beyond the per-pid budgets for the whole script.
SCRIPT_MARGIN_S = 10

MISSING_MSG = "py-spy is not installed on the host (pip install py-spy, or put its static binary on PATH)"
PTRACE_MSG = ("py-spy needs ptrace permission: run the bot's SSH user with sudo -n py-spy (sudoers entry) "
              "or give the container SYS_PTRACE")
SUDO_REFUSED_MSG = "sudo -n refused: add a NOPASSWD sudoers entry for py-spy dump"
SUDO_MISSING_MSG = "sudo is not installed on the host: install it, or dump without sudo (needs ptrace permission)"
CUT_SHORT_MSG = "no complete py-spy output for this process: the dump command was cut short"


@dataclass
class Frame:
    """One Python (or, with --native, C) frame: function `name`, `file` as py-spy shortens it
    (package-relative), `line` (0 when unknown), `path` the full file name when py-spy gave one."""

    name: str
    file: str
    line: int
    path: str | None = None


@dataclass
class ThreadDump:
    """One thread: `name` (may be empty), OS thread id, py-spy's `active` and `owns_gil` flags, and its
    `frames`, innermost first."""

    name: str
    os_thread_id: int | None
    active: bool
    owns_gil: bool
    frames: list[Frame] = field(default_factory=list)

    @property
    def state(self) -> str:
        """'active', 'idle', with '+gil' when the thread holds the GIL (py-spy's own wording)."""
        return ("active" if self.active else "idle") + ("+gil" if self.owns_gil else "")


#: How many frames deeper than the main thread an idle thread's stack must be to tell more than it, when no thread
#: runs (`telling_thread`).
DEEPER_BY = 10


def telling_thread(threads: Sequence[ThreadDump]) -> ThreadDump | None:
    """The thread that shows what a process does: its main thread while that one runs (py-spy's `active`), else the
    first thread that runs (an engine whose model runs in a worker thread, its main thread joined on it). When none
    runs (the work waits on a child process, a compiler's `ptxas`, or on the GPU): the deepest stack when it is at
    least DEEPER_BY frames deeper than the main thread's (the worker under a main thread that only waits for it),
    else the main thread, else the first; None for no threads."""
    main = next((t for t in threads if t.name == "MainThread"), None)
    if main is not None and main.active:
        return main
    running = next((t for t in threads if t.active), None)
    if running is not None:
        return running
    deepest = max(threads, key=lambda t: len(t.frames), default=None)
    if main is not None and deepest is not None and len(deepest.frames) >= len(main.frames) + DEEPER_BY:
        return deepest
    return main or (threads[0] if threads else None)


@dataclass
class ProcessDump:
    """The dump of one process: `ok` with its `threads` (sorted by OS thread id, like py-spy's text dump),
    or `ok=False` with a user-facing `error` that says what to do."""

    pid: int
    ok: bool
    threads: list[ThreadDump] = field(default_factory=list)
    error: str | None = None


# --------------------------------------------------------------------------------------------- script


def _check_pids(pids: Any) -> list[int]:
    if isinstance(pids, (str, bytes)) or not hasattr(pids, "__iter__"):
        raise ValueError("pids must be a list of process ids")
    out: list[int] = []
    for p in pids:
        if isinstance(p, bool) or not isinstance(p, int):
            raise ValueError(f"pid {p!r} is not an integer")
        if not 0 < p <= MAX_PID:
            raise ValueError(f"pid {p} is out of range (1..{MAX_PID})")
        if p not in out:
            out.append(p)
    if not out:
        raise ValueError("no pid to dump")
    if len(out) > MAX_PIDS:
        raise ValueError(f"too many pids ({len(out)}); at most {MAX_PIDS} per dump")
    return out


def dump_script(pids: list[int], *, sudo: bool = False, native: bool = False, timeout_s: int = 20,
                py_spy: str = "py-spy") -> str:
    """Return a POSIX sh script (run it with `sh -s`, script on stdin) that dumps every pid AT ONCE with
    `timeout -k 5 TIMEOUT [sudo -n] PYSPY dump --pid PID --json [--native]` (one background job per pid, its
    output in a private temporary directory), then prints each pid's output between markers, in pid order. So
    a hung py-spy costs the whole dump at most one timeout, whatever the number of ranks.

    `py_spy` is the command name or absolute path looked up with `command -v` (with sudo, the resolved
    absolute path is run, which is what a sudoers entry names). Raises ValueError for a pid that is not a
    positive int, an empty or too long pid list, or a bad timeout.
    """
    pid_list = _check_pids(pids)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or not 1 <= timeout_s <= 600:
        raise ValueError(f"timeout_s must be an integer number of seconds in 1..600, not {timeout_s!r}")
    if not isinstance(py_spy, str) or not py_spy or "\n" in py_spy or "\0" in py_spy:
        raise ValueError("py_spy must be a command name or path")
    cmd = f"timeout -k {KILL_AFTER_S} {timeout_s} " + ("sudo -n " if sudo else "") + '"$PYSPY" dump --pid "$pid" --json'
    if native:
        cmd += " --native"
    pids_text = ",".join(str(p) for p in pid_list)
    pids_words = " ".join(str(p) for p in pid_list)
    lines = [
        "RUST_BACKTRACE=0; export RUST_BACKTRACE",
        f"echo '@@PYSPY START timeout={timeout_s} pids={pids_text}'",
        f"PYSPY=$(command -v {quote(py_spy)} 2>/dev/null) || PYSPY=",
        'if [ -z "$PYSPY" ]; then echo "@@PYSPY MISSING"; exit 127; fi',
        'd=$(mktemp -d "${TMPDIR:-/tmp}/gpubot-pyspy.XXXXXX") || exit 1',
        "trap 'rm -rf \"$d\"' EXIT",
        f"for pid in {pids_words}; do",
        f'  ( {cmd} </dev/null >"$d/$pid.out" 2>"$d/$pid.err"; echo $? >"$d/$pid.rc" ) &',
        "done",
        "wait",
        f"for pid in {pids_words}; do",
        '  echo "@@PYSPY $pid BEGIN"',
        '  cat "$d/$pid.out" 2>/dev/null',
        '  if [ -s "$d/$pid.err" ]; then echo "@@PYSPY $pid STDERR"; sed \'s/^/| /\' "$d/$pid.err"; fi',
        '  echo "@@PYSPY $pid END rc=$(cat "$d/$pid.rc" 2>/dev/null || echo 1)"',
        "done",
        "exit 0",
    ]
    return "\n".join(lines) + "\n"


def script_budget_s(n_pids: int, timeout_s: int) -> int:
    """Seconds the whole script may take: the dumps run at once, so one timeout plus the kill grace, plus a
    margin (and a second per 8 pids for starting them)."""
    return timeout_s + KILL_AFTER_S + 1 + SCRIPT_MARGIN_S + max(1, n_pids) // 8


# --------------------------------------------------------------------------------------------- parsing

_START = re.compile(r"@@PYSPY START timeout=(\d{1,6}) pids=([\d,]{0,2000})")
_MISSING = "@@PYSPY MISSING"
_BEGIN = re.compile(r"@@PYSPY (\d{1,10}) BEGIN")
_STDERR = re.compile(r"@@PYSPY (\d{1,10}) STDERR")
_END = re.compile(r"@@PYSPY (\d{1,10}) END rc=(\d{1,10})?")


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ("" if v is None else str(v))


def _parse_json(out: str) -> list[ThreadDump] | None:
    """py-spy --json output -> threads, or None when it is not the expected JSON list of threads."""
    try:
        data = json.loads(out)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, list):
        return None
    threads: list[ThreadDump] = []
    for t in data:
        if not isinstance(t, dict):
            return None
        frames: list[Frame] = []
        raw_frames = t.get("frames")
        for f in raw_frames if isinstance(raw_frames, list) else []:
            if not isinstance(f, dict):
                continue
            path = f.get("filename")
            short = f.get("short_filename") or path
            line = _int(f.get("line"))
            frames.append(Frame(name=_str(f.get("name")) or "?", file=_str(short) or "?",
                                line=line if line is not None and line >= 0 else 0,
                                path=path if isinstance(path, str) and path else None))
        threads.append(ThreadDump(name=_str(t.get("thread_name")), os_thread_id=_int(t.get("os_thread_id")),
                                  active=t.get("active") is True, owns_gil=t.get("owns_gil") is True,
                                  frames=frames))
    threads.sort(key=lambda th: (th.os_thread_id is None, th.os_thread_id or 0))
    return threads


def _error_line(err: str) -> str:
    """The most telling line of py-spy's stderr: its `Error: ...` line, else the first non-blank line."""
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("Error:"):
            return ln.removeprefix("Error:").strip()
    return lines[0] if lines else ""


def classify_error(pid: int, rc: int | None, err: str, timeout_s: int | None = None) -> str:
    """A user-facing message for a failed dump of `pid` (exit status `rc`, py-spy/sudo/timeout stderr)."""
    low = err.lower()
    if rc in (124, 137):
        budget = f"{timeout_s} s" if timeout_s else "its time limit"
        return (f"py-spy did not finish within {budget} and was killed: the process may be stuck in the kernel "
                "(state D) or py-spy hung; try again, or without --native")
    if any(s in low for s in ("a password is required", "a terminal is required", "no tty present",
                              "not allowed to execute", "not in the sudoers", "may not run sudo")):
        return SUDO_REFUSED_MSG
    if rc == 127 and "sudo" in low:
        return SUDO_MISSING_MSG
    if "failed to run command" in low:
        return "could not run py-spy on the host: " + _error_line(err)[:300]
    if "permission denied" in low or "operation not permitted" in low:
        return PTRACE_MSG
    if any(s in low for s in ("no such process", "os error 2", "no such file or directory",
                              "check that the process is running", "os error 3")):
        return "no such process: it is not running on the host"
    if "python version" in low or "python interpreter" in low:
        return "not a Python process (py-spy found no Python interpreter in it)"
    detail = _error_line(err)[:300]
    status = "no exit status" if rc is None else f"exit status {rc}"
    return f"py-spy failed ({status})" + (f": {detail}" if detail else "")


def _finish(pid: int, out: list[str], err: list[str], rc: int | None, timeout_s: int | None) -> ProcessDump:
    if rc is None:
        return ProcessDump(pid, False, error=CUT_SHORT_MSG)
    err_text = "\n".join(err)
    if rc == 0:
        text = "\n".join(out).strip()
        threads = _parse_json(text) if text else None
        if threads is None:
            snippet = " ".join(text.split())[:200]
            return ProcessDump(pid, False, error="py-spy printed something that is not its JSON thread list "
                               "(py-spy older than 0.3, or not py-spy?)" + (f": {snippet}" if snippet else ""))
        return ProcessDump(pid, True, threads=threads)
    return ProcessDump(pid, False, error=classify_error(pid, rc, err_text, timeout_s))


def parse_dump_output(text: str) -> list[ProcessDump]:
    """Parse the output of `dump_script` into one ProcessDump per pid, in the order the script listed them.

    Pure and total: garbage gives an empty list or error entries, never an exception. A pid listed in the
    START line without a complete section gets `CUT_SHORT_MSG`, or `MISSING_MSG` when py-spy was missing.
    `@@PYSPY MISSING` without a START line gives one entry with pid 0.
    """
    if not isinstance(text, str):
        return []
    expected: list[int] = []
    timeout_s: int | None = None
    missing = False
    done: dict[int, ProcessDump] = {}
    cur: int | None = None
    mode = "out"
    out: list[str] = []
    err: list[str] = []
    for raw in text.splitlines():
        line = raw.rstrip("\r")
        if line.startswith("@@PYSPY "):
            if m := _START.fullmatch(line):
                if not expected:
                    timeout_s = int(m.group(1))
                    expected = [int(p) for p in m.group(2).split(",") if p.isascii() and p.isdigit() and len(p) <= 10]
                continue
            if line == _MISSING:
                missing = True
                continue
            if m := _BEGIN.fullmatch(line):
                if cur is not None:
                    done.setdefault(cur, _finish(cur, out, err, None, timeout_s))
                cur, mode, out, err = int(m.group(1)), "out", [], []
                continue
            if cur is not None and (m := _STDERR.fullmatch(line)) and int(m.group(1)) == cur:
                mode = "err"
                continue
            if cur is not None and (m := _END.fullmatch(line)) and int(m.group(1)) == cur:
                rc = int(m.group(2)) if m.group(2) is not None else None
                done.setdefault(cur, _finish(cur, out, err, rc, timeout_s))
                cur = None
                continue
        if cur is None:
            continue
        if mode == "err":
            err.append(line[2:] if line.startswith("| ") else line.removeprefix("|"))
        else:
            out.append(line)
    if cur is not None:
        done.setdefault(cur, _finish(cur, out, err, None, timeout_s))
    result: list[ProcessDump] = []
    for pid in expected:
        if pid in done:
            result.append(done.pop(pid))
        elif all(r.pid != pid for r in result):
            result.append(ProcessDump(pid, False, error=MISSING_MSG if missing else CUT_SHORT_MSG))
    result.extend(done.values())
    if missing and not result:
        result.append(ProcessDump(0, False, error=MISSING_MSG))
    return result


# --------------------------------------------------------------------------------------------- text


def frame_text(f: Frame, *, full_path: bool = False) -> str:
    """`function (file:line)`, py-spy's own wording; the full path when asked and known."""
    where = (f.path if full_path and f.path else f.file) or "?"
    return f"{f.name} ({where}:{f.line})" if f.line else f"{f.name} ({where})"


def thread_title(t: ThreadDump) -> str:
    """`Thread 8184 "worker" (idle)`: id, name and state."""
    tid = "?" if t.os_thread_id is None else str(t.os_thread_id)
    return f"Thread {tid}" + (f' "{t.name}"' if t.name else "") + f" ({t.state})"


def process_detail(d: ProcessDump) -> str:
    """What one process's headline says after `pid N: `: thread counts, or the error."""
    if not d.ok:
        return d.error or "failed"
    n = len(d.threads)
    active = sum(t.active for t in d.threads)
    gil = [t for t in d.threads if t.owns_gil]
    gil_text = (f"thread {gil[0].os_thread_id} holds the GIL" if gil else "no thread holds the GIL")
    return f"{n} thread{'' if n == 1 else 's'}, {active} active, {gil_text}"


def process_headline(d: ProcessDump) -> str:
    """One line per process: `pid N: ` and thread counts, or the error."""
    return f"pid {d.pid}: {process_detail(d)}"


def summarize_process(d: ProcessDump, top: int = TOP_FRAMES) -> list[str]:
    """Lines for one process: headline, then per thread its title and top `top` frames (innermost first)."""
    lines = [process_headline(d)]
    for t in d.threads:
        lines.append("  " + thread_title(t))
        lines.extend("    " + frame_text(f) for f in t.frames[:top])
        if len(t.frames) > top:
            more = len(t.frames) - top
            lines.append(f"    … {more} more frame{'' if more == 1 else 's'}")
        if not t.frames:
            lines.append("    (no Python frames)")
    return lines


def summarize(dumps: list[ProcessDump], top: int = TOP_FRAMES) -> list[str]:
    """Summary lines for all processes: per thread its name, state (active/idle, +gil) and top frames."""
    lines: list[str] = []
    for d in dumps:
        lines.extend(summarize_process(d, top))
    return lines


def full_text(dumps: list[ProcessDump]) -> str:
    """The whole dump as text (every frame, full file paths), for a file attached in Slack. NOT redacted: the
    caller redacts it once, with the bot's configured redactor (bot.present.stackdump)."""
    parts: list[str] = []
    for d in dumps:
        if not d.ok:
            parts.append(f"Process {d.pid}: ERROR: {d.error}")
            continue
        lines = [f"Process {d.pid}: {len(d.threads)} thread(s)"]
        for t in d.threads:
            lines.append(thread_title(t))
            lines.extend("    " + frame_text(f, full_path=True) for f in t.frames)
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


# --------------------------------------------------------------------------------------------- result


_TEXT_PROCESS = re.compile(r"^Process (?P<pid>\d{1,9}):")
_TEXT_THREAD = re.compile(r"^Thread (?P<tid>(?:0x)?[0-9a-fA-F]{1,16}) \((?P<state>[\w+]{1,30})\)"
                          r"(?:: \"(?P<name>.*)\")?")
_TEXT_FRAME = re.compile(r"^\s+(?P<name>[^\s()][^()]{0,200}?) \((?P<file>[^():]{1,300}):(?P<line>\d{1,7})\)\s*$")


def parse_stack_text(text: str) -> list[ProcessDump]:
    """`py-spy dump`'s text output (py-spy 0.3 and 0.4; as a user pastes it, one or more processes) -> one ProcessDump
    per process: `Process 2403: CMD`, `Thread 2403 (active+gil): "MainThread"`, frames `    func (file.py:12)`
    innermost first; `Arguments:` / `Locals:` sections are skipped. Text with no thread line gives []. Never raises."""
    dumps: list[ProcessDump] = []
    cur: ProcessDump | None = None
    thread: ThreadDump | None = None
    for raw in (text or "").splitlines():
        line = raw.rstrip()
        if m := _TEXT_PROCESS.match(line.strip()):
            cur = ProcessDump(int(m.group("pid")), True, [])
            dumps.append(cur)
            thread = None
            continue
        if m := _TEXT_THREAD.match(line.strip()):
            if cur is None:
                cur = ProcessDump(0, True, [])
                dumps.append(cur)
            tid = m.group("tid")
            state = m.group("state")
            thread = ThreadDump(name=m.group("name") or "", os_thread_id=int(tid, 0) if tid.startswith("0x")
                                else int(tid), active="active" in state, owns_gil="gil" in state)
            cur.threads.append(thread)
            continue
        if thread is not None and (m := _TEXT_FRAME.match(line)):
            thread.frames.append(Frame(name=m.group("name").strip(), file=m.group("file"), line=int(m.group("line"))))
    return [d for d in dumps if d.threads]


def parse_stack_json(text: str) -> list[ThreadDump] | None:
    """`py-spy dump --json` output (py-spy 0.3/0.4: a list of threads with thread_name, os_thread_id, active,
    owns_gil and frames of name / filename / short_filename / line) -> threads sorted by OS thread id; None when
    the text is not that JSON. Never raises."""
    return _parse_json(text)


def check_pids(pids: Any) -> list[int]:
    """The distinct pids of `pids` in order. Raises ValueError for a pid that is not an int in 1..MAX_PID,
    an empty list, or more than MAX_PIDS pids."""
    return _check_pids(pids)


def finish_dumps(pid_list: list[int], stdout: bytes, stderr: bytes, exit_status: int | None,
                 exit_signal: str | None) -> list[ProcessDump]:
    """One ProcessDump per pid of `pid_list`, in order, from the output of `dump_script` (stdout/stderr
    bytes, the command's exit status or signal name). A pid without complete output says the dump was cut
    short, with how the whole command ended when it did not exit 0."""
    dumps = parse_dump_output(strip_markers(stdout).decode("utf-8", "replace"))
    by_pid = {d.pid: d for d in dumps}
    if exit_status != 0 or exit_signal:
        err = _error_line(stderr.decode("utf-8", "replace"))[:200]
        how = f"signal {exit_signal}" if exit_signal else f"exit status {exit_status}"
        detail = f" (the dump command ended with {how}" + (f": {err}" if err else "") + ")"
    else:
        detail = ""
    out: list[ProcessDump] = []
    for pid in pid_list:
        d = by_pid.get(pid) or ProcessDump(pid, False, error=CUT_SHORT_MSG)
        if d.error == CUT_SHORT_MSG and detail:
            d.error += detail
        out.append(d)
    return out
