"""Evidence building: quote what an Observation and a LogScan show, verbatim in backticks, into an `_Ev` list.

Also the shared text helpers (`_q` quotes, `_secs` durations, `_fmt_num`) and the interpretations the rules
rely on: a GPU reading's state (a spin, memory held while idle, computing), whether a process is an
engine's, and the status a raw curl probe shows. Pure.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Sequence

from bot.core.diagnose.logscan import _FRAME_RE, LogScan, _traceback_end
from bot.core.diagnose.observation import Observation
from bot.core.diagnose.signatures import Signatures
from bot.core.exits import describe_exit, exit_signal
from bot.core.models import GpuReading, ProcessInfo
from bot.core.text import counted

_QUOTE_MAX = 400  # longest quote in an evidence string, in characters
#: An HTTP request's access line in any common format (uvicorn, nginx, gin, Rust tracing): a method and a path.
_REQUEST_LIKE = re.compile(r'"(?:POST|GET|PUT|DELETE) /(?!(?:health\w*|metrics|ping|version)\b)\S* HTTP/[\d.]+"\s+\d{3}'
                           r'|\b(?:POST|GET) /v\d/\S+ \S* ?\d{3}\b')


def _q(text: str, limit: int = _QUOTE_MAX) -> str:
    """Text for a quote: stripped; an over-long line keeps its head and tail around " … "."""
    s = text.strip()
    if len(s) <= limit:
        return s
    head = (limit * 2) // 3
    return s[:head] + " … " + s[-(limit - head - 3) :]


def _q_at(text: str, start: int, limit: int = _QUOTE_MAX) -> str:
    """Text for a quote around position `start` of `text` (where a signature matched): an over-long line keeps
    its head and the part from just before `start`, so the words that decided are always quoted."""
    s = text.strip()
    offset = len(text) - len(text.lstrip())
    start = max(0, start - offset)
    if len(s) <= limit or start + 120 <= (limit * 2) // 3:
        return _q(s, limit)
    head = limit // 3
    begin = max(head, start - 40)
    return s[:head] + " … " + s[begin:begin + limit - head - 3] + (" …" if begin + limit - head - 3 < len(s) else "")


def _secs(s: float | None) -> str:
    """Human seconds: `900 s (15 min)`."""
    if s is None or not math.isfinite(s):
        return "unknown"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s:.0f} s ({s / 60:.0f} min)"
    if s < 172800:
        return f"{s:.0f} s ({s / 3600:.1f} h)"
    return f"{s:.0f} s ({s / 86400:.1f} days)"


def _fmt_num(x: float | None, unit: str) -> str:
    return "?" if x is None else f"{x:.0f} {unit}"


def _fmt_gib(mib: float | None) -> str:
    """MiB shown as GiB with one decimal (`16.8 GiB`), as everywhere in chat; `?` when unknown."""
    return "?" if mib is None else f"{mib / 1024:.1f} GiB"


class _Ev:
    """Ordered, de-duplicated evidence strings."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, text: str | None) -> None:
        if text and text not in self.items:
            self.items.append(text)

    def quotes(self, raw: str) -> bool:
        """Whether some evidence string already quotes `raw`."""
        needle = f"`{_q(raw, 300)}`"
        return any(needle in item or f"`{_q(raw)}`" in item for item in self.items)


def _is_engine_process(p: ProcessInfo, sig: Signatures) -> bool:
    return bool(p.args) and sig.processes.first(p.args) is not None


#: How a GPU at 100 % utilization, low power and little memory reads: an NCCL spin where NCCL is in play (a
#: collective that never completes), else a kernel that spins. `_is_spin` knows both.
NCCL_SPIN, KERNEL_SPIN = "NCCL spin", "a kernel spins at 100 %"


def nccl_in_play(obs: Observation) -> bool:
    """Whether NCCL can be what spins on the GPUs: the launch holds more than one GPU (its processes' GPUs when
    they are known, else the GPUs read that hold memory or spin), or the log (its last 500 lines) or a process's
    command line names NCCL as a word (`NCCL INFO`, `nccl==2.21`; not `NCCL_P2P_DISABLE` or `venv-nccl2`); a
    single-GPU server with no NCCL spins a kernel of its own. Reads the log only when called: call it for a GPU
    that may spin (95 % or more utilization)."""
    held = {gp.gpu_index for gp in obs.gpu_processes or []}
    if not held:  # no process list: the GPUs a launch is using are those that hold memory or spin
        held = {g.index for g in obs.gpus or []
                if (g.memory_used_mib or 0) > 1024 or (g.utilization_gpu_pct or 0) >= 95}
    if len(held) > 1:
        return True
    return any(_NCCL_WORD.search(line) for line in (obs.log_lines or [])[-500:]) or any(
        _NCCL_WORD.search(p.args or "") for p in obs.processes or [])


_NCCL_WORD = re.compile(r"(?i)\bnccl\b")


def _gpu_state(g: GpuReading, nccl: bool = True) -> str | None:
    """Interpretation of one GPU reading: spin (`NCCL_SPIN` where `nccl` is in play, else `KERNEL_SPIN`), idle with
    memory held, context only, working."""
    used, total, util = g.memory_used_mib, g.memory_total_mib, g.utilization_gpu_pct
    mem_frac = used / total if used is not None and total else None
    power_frac = g.power_draw_w / g.power_limit_w if g.power_draw_w is not None and g.power_limit_w else None
    if util is not None and util >= 50 and power_frac is not None and power_frac > 0.45:
        return f"computing: {util:.0f} % util at {g.power_draw_w:.0f} W of {g.power_limit_w:.0f} W"
    if util is not None and util >= 95:
        low = "low power" if power_frac is not None else "power unknown"
        if mem_frac is not None and mem_frac <= 0.2:
            if nccl:
                return f"{NCCL_SPIN}: {util:.0f} % util at {low} with little memory is a spinning kernel, not work"
            return f"{KERNEL_SPIN}: at {low} with little memory it is a busy-wait, not work"
        return f"spinning: {util:.0f} % util at {low} is a busy-wait, not compute"
    if util is not None and util <= 5:
        if mem_frac is not None and mem_frac >= 0.5:
            return "memory held while idle (weights on the GPU, nothing running)"
        if used is not None and used < 1:
            return "nothing on it"
        if used is not None and used <= 2048:
            return "only a CUDA context, nothing loaded and nothing running"
        return "idle"
    return None


def _is_spin(g: GpuReading) -> bool:
    state = _gpu_state(g)
    return state is not None and state.startswith((NCCL_SPIN, KERNEL_SPIN))


def _probe_status(lines: Sequence[str] | None) -> tuple[str | None, str | None]:
    """(status, quoted line) judged from the raw text of a curl probe; (None, None) when it says nothing."""
    for raw in lines or []:
        line = raw.strip()
        if not line or line.startswith("curl ") or line.startswith("$ curl"):
            continue
        low = line.lower()
        if "connection refused" in low or "couldn't connect" in low or "curl: (7)" in low:
            return "refused", line
        if "failed to connect" in low and "timed out" in low:
            return "connect_timeout", line
        if "empty reply" in low or "curl: (52)" in low:
            return "empty", line
        if "timed out" in low or "curl: (28)" in low:
            return "timeout", line
        if m := re.match(r"HTTP/[\d.]+ (\d{3})", line):
            return ("ok" if m.group(1).startswith("2") else f"http_{m.group(1)}"), line
        if line.startswith("{") or line.startswith("["):
            return "ok", line
    return None, None


def _traceback_summary(scan: LogScan, i: int, sig: Signatures) -> str | None:
    """`last frame → code line` of the traceback that starts at or right after line `i`, quoted."""
    start = None
    for j in range(i, min(len(scan.lines), i + 4)):
        if "Traceback (most recent call last)" in scan.lines[j]:
            start = j
            break
    if start is None:
        return None
    end = _traceback_end(scan, start, sig)
    stop = end if end is not None else min(len(scan.lines), start + 60)
    frame = None
    names: list[str] = []
    for j in range(start + 1, stop):
        if m := _FRAME_RE.search(scan.lines[j]):
            frame = j
            if m.group(3) and m.group(3) != "<module>":
                names.append(m.group(3))
    if frame is None:
        return None
    parts = [f"`{_q(scan.lines[frame])}`"]
    code = frame + 1
    if code < len(scan.lines) and code != end and scan.lines[code].strip() and not _FRAME_RE.search(scan.lines[code]):
        parts.append(f"`{_q(scan.lines[code])}`")
    if end is not None:
        parts.append(f"`{_q(scan.lines[end])}`")
    # a long chain keeps both ends: where the program entered (the outermost frames) and where it failed
    shown = names if len(names) <= 8 else [*names[:2], "…", *names[-5:]]
    chain = f" (frames, innermost last: {' → '.join(shown)})" if len(names) > 1 else ""
    return "traceback, last frame: " + " → ".join(parts) + chain


def _phase_evidence(ev: _Ev, scan: LogScan) -> None:
    """Quote the newest phase marker, the line where the launch entered that phase (when another) and the two
    newest progress lines, newest first (a short alert shows its first evidence lines: the newest is what
    counts)."""
    if scan.phase_index is not None:
        label = scan.phase or f"{scan.finished_phase} finished"
        if scan.finished_phase and scan.ranks:
            label += f" on all {len(scan.ranks)} ranks"
        ev.add(f"last start-up line ({label}): `{_q(scan.lines[scan.phase_index])}`")
        entered = scan.phase_entered
        if scan.phase and entered is not None and entered != scan.phase_index:
            ev.add(f"{scan.phase} began (log line {entered + 1}): `{_q(scan.lines[entered])}`")
    seen: list[str] = []
    for p in reversed(scan.progress):
        text = p.line.strip()
        if text in seen or p.index == scan.phase_index:
            continue
        seen.append(text)
        if len(seen) > 2:
            break
    for text in seen[:2]:
        ev.add(f"progress line: `{_q(text)}`")


def _repeated(scan: LogScan) -> tuple[int, int] | None:
    """(count, newest line) of the line that repeats most in the run's last 200 lines (numbers aside), when one repeats
    at least twice: a poll, a heartbeat, a retry; None otherwise."""
    seen: dict[str, list[int]] = {}
    for i in range(max(scan.start, len(scan.lines) - 200), len(scan.lines)):
        key = _numbers_aside(scan.norm[i].body if i < len(scan.norm) else scan.lines[i])
        if len(key) >= 12:
            seen.setdefault(key, []).append(i)
    best = max(seen.values(), key=len, default=[])
    return (len(best), best[-1]) if len(best) >= 2 else None


_NUMBERS = re.compile(r"\d+(?:\.\d+)?")


@functools.lru_cache(maxsize=1 << 14)
def _numbers_aside(body: str) -> str:
    """A line's message with its numbers as `#` (cached per line: a tail is mostly the last one's)."""
    return _NUMBERS.sub("#", body.strip())


def _not_failures(ev: _Ev, scan: LogScan) -> None:
    """Up to two lines at warning or error level that were NOT taken as failures (a warning, a survived error, a
    known-benign one), newest first: what a reader of the log would otherwise worry about."""
    hits = {h.index for h in scan.failures}
    shown = 0
    for i in range(len(scan.lines) - 1, scan.start - 1, -1):
        if i >= len(scan.norm) or i in hits:
            continue
        if scan.norm[i].level in ("WARNING", "ERROR", "CRITICAL") and not ev.quotes(scan.lines[i]):
            ev.add(f"{scan.norm[i].level.lower()}, not taken as the failure (log line {i + 1}): `{_q(scan.lines[i])}`")
            shown += 1
            if shown >= 2:
                return


def _log_tail_evidence(ev: _Ev, scan: LogScan) -> None:
    """Heartbeats, repeated lines, benign warnings and the last meaningful lines."""
    if scan.ready:
        ev.add(f"readiness line (log line {scan.ready[-1] + 1}): `{_q(scan.lines[scan.ready[-1]])}`")
    newest = next((i for i in range(len(scan.lines) - 1, max(scan.start, len(scan.lines) - 60) - 1, -1)
                   if scan.facts[i].request), None) if scan.facts else None
    if newest is not None:
        ev.add(f"newest request line (log line {newest + 1}): `{_q(scan.lines[newest])}`")
    if (rep := _repeated(scan)) is not None and not ev.quotes(scan.lines[rep[1]]):
        ev.add(f"repeated {rep[0]}× (numbers aside): `{_q(scan.lines[rep[1]])}`")
    _not_failures(ev, scan)
    if scan.heartbeats:
        last = scan.lines[scan.heartbeats[-1]]
        ev.add(f"heartbeat line repeated {len(scan.heartbeats)}× (a heartbeat is not progress): `{_q(last)}`")
    if scan.benign:
        ev.add(
            f"{counted(len(scan.benign), 'known-benign warning line')} ignored (not a failure, not progress), e.g. "
            f"`{_q(scan.lines[scan.benign[-1]])}`"
        )
    if scan.ending is not None:  # what it was doing when the stop came
        before = [i for i in scan.meaningful if i < scan.ending][-2:]
        if before:
            ev.add("before the stop: " + " / ".join(f"`{_q(scan.lines[i])}`" for i in before))
    tail = scan.meaningful[-3:]
    if tail:
        ev.add("log ends with: " + " / ".join(f"`{_q(scan.lines[i])}`" for i in tail))
    head = [i for i in scan.meaningful if i >= scan.start][:1]
    if head and head[0] not in tail:
        ev.add(f"log begins with: `{_q(scan.lines[head[0]])}`")


def _process_evidence(ev: _Ev, obs: Observation, sig: Signatures) -> None:
    if obs.process_alive is not None:
        ev.add(f"launch process alive: {'yes' if obs.process_alive else 'no'}")
    if obs.exit_code is not None:
        signalled = exit_signal(obs.exit_code) is not None
        ev.add(f"exit status: {obs.exit_code}" + (f" ({describe_exit(obs.exit_code)})" if signalled else ""))
    procs = obs.processes
    if not procs:
        return
    states = Counter(p.stat or "?" for p in procs)
    cpu = [p.pcpu for p in procs if p.pcpu is not None]
    state_text = ", ".join(f"{s}×{c}" for s, c in states.most_common())
    cpu_text = ""
    if cpu:
        cpu_text = f"; all at {cpu[0]:.1f} % CPU" if len(set(cpu)) == 1 else f"; CPU {min(cpu):.1f}-{max(cpu):.1f} %"
        cpu_text += " (ps: averaged over each process's life)"
    if obs.cpu_time_growing is False:
        cpu_text += "; CPU time not growing since the previous check"
    elif obs.cpu_time_growing is True:
        cpu_text += "; CPU time growing since the previous check"
    ev.add(f"{counted(len(procs), 'process')} listed, states {state_text}{cpu_text}")
    dead = [p for p in procs if p.state == "Z" or "<defunct>" in (p.args or "")]
    for p in dead[:3]:
        ev.add(f"defunct (zombie) process {p.pid}, its parent has not reaped it: "
               f"`{_q(obs.process_lines.get(p.pid) or p.args, 300)}`")
    engine = [_is_engine_process(p, sig) for p in procs]  # engine processes first, each group in table order
    shown = [*(p for p, e in zip(procs, engine, strict=True) if e),
             *(p for p, e in zip(procs, engine, strict=True) if not e)][:4]
    for p in shown:
        raw = obs.process_lines.get(p.pid)
        if raw:
            ev.add(f"process: `{_q(raw, 300)}`")
        else:
            ev.add(
                f"process {p.pid}: state `{p.stat or '?'}`, {p.pcpu if p.pcpu is not None else '?'} % CPU, "
                f"CPU time {_secs(p.cpu_time_s)}: `{_q(p.args, 200)}`"
            )
    stuck = [p for p in procs if p.state == "D"]
    if stuck:
        ev.add(f"{counted(len(stuck), 'process')} in state D (uninterruptible, often stuck in the driver)")


def _gpu_evidence(ev: _Ev, obs: Observation) -> None:
    for line in obs.gpu_error_lines or []:
        ev.add(f"nvidia-smi: `{_q(line)}`")
    gpus = obs.gpus or []
    # only a GPU at 95 % or more can be a spin: nothing else needs the (log-reading) NCCL test
    nccl = nccl_in_play(obs) if any((g.utilization_gpu_pct or 0) >= 95 for g in gpus) else True
    for g in gpus[:8]:
        raw = obs.gpu_lines.get(g.index)
        if raw and ev.quotes(raw):
            continue
        text = (
            f"`{_q(raw, 300)}`"
            if raw
            else f"{_fmt_gib(g.memory_used_mib)} / {_fmt_gib(g.memory_total_mib)}, "
            f"{_fmt_num(g.utilization_gpu_pct, '%')} util, {_fmt_num(g.power_draw_w, 'W')}"
        )
        state = _gpu_state(g, nccl)
        ev.add(f"GPU {g.index}: {text}" + (f" → {state}" if state else ""))
    if len(gpus) > 8:
        ev.add(f"... and {counted(len(gpus) - 8, 'more GPU')}")


#: The program of a socket's owner that can be an inference server (Python engines, llama.cpp, TGI, TensorRT-LLM,
#: Triton): what a netstat without a process table still tells about a launch.
_SERVER_PROGRAM = re.compile(r"(?i)python|vllm|sglang|text-generation|trtllm|tritonserver|llama|lmdeploy|torchrun|ray")


def _owner_program(owner: str | None) -> str:
    """The program of a socket's owner as netstat/ss print it (`1234/python3` -> `python3`), or ""."""
    return (owner or "").partition("/")[2]


def _owner_pid(owner: str | None) -> int | None:
    """The pid of a socket's owner as netstat/ss print it (`1234/python3`, `pid=1234`), or None."""
    m = re.search(r"(?:^|pid=)(\d{1,10})\b", owner or "")
    return int(m.group(1)) if m else None


def _port_evidence(ev: _Ev, obs: Observation) -> None:
    port = f"port {obs.port}" if obs.port is not None else "the server port"
    if obs.port_open is True:
        ev.add(f"{port} is listening")
    elif obs.port_open is False:
        ev.add(f"{port} is not listening")
    # the sockets that say something about this launch, its port's first: while its port is not listening, also
    # what its own processes listen on (a server on another port than the one configured, or alive on its
    # workers' ports but not yet on its own); without a process table, sockets whose owner is a server program
    # (a container's netstat alone). Never the host's other services.
    own = {p.pid for p in obs.processes or []}
    on_port = [s for s in obs.listening or [] if obs.port is not None and s.port == obs.port]
    others: list = []
    if obs.port_open is not True:
        for s in obs.listening or []:
            if s in on_port:
                continue
            if (_owner_pid(s.owner) in own) if own else bool(_SERVER_PROGRAM.search(_owner_program(s.owner))):
                others.append(s)
    for s in [*on_port, *others][:6]:
        text = s.line or f"{s.address}:{s.port} {s.owner or ''}"
        ev.add(f"listening socket: `{_q(text)}`")
    if obs.health is not None:
        ev.add(f"health probe: {obs.health}")
    status, line = _probe_status(obs.probe_lines)
    if line:
        ev.add(f"probe output: `{_q(line)}`" + (f" ({status})" if status else ""))
    for c in obs.containers or []:
        ev.add(f"container {c.name}: `{_q(c.status)}`" + (f" (`{_q(c.line, 300)}`)" if c.line else ""))


def _host_evidence(ev: _Ev, obs: Observation, sig: Signatures) -> None:
    for line in obs.dmesg_lines or []:
        if sig.failures["host_oom"].first(line) or sig.failures["gpu_lost"].first(line) or "Xid" in line:
            ev.add(f"dmesg: `{_q(line)}`")
    for line in (obs.stack_lines or [])[:6]:
        if line.strip():
            ev.add(f"kernel stack: `{_q(line)}`")
    for seg in obs.shm_segments or []:
        if "dest" in seg.status and (seg.nattch or 0) > 0 and not ev.quotes(seg.line):
            ev.add(f"shared memory segment marked for deletion but still attached: `{_q(seg.line)}`")
    for note in obs.notes:
        ev.add(f"note: {note}")


def _context_evidence(ev: _Ev, obs: Observation, scan: LogScan, sig: Signatures) -> None:
    _phase_evidence(ev, scan)
    _log_tail_evidence(ev, scan)
    _process_evidence(ev, obs, sig)
    _gpu_evidence(ev, obs)
    _port_evidence(ev, obs)
    _host_evidence(ev, obs, sig)
