"""The decision rules: one `Observation` (and earlier ones) in, one `Verdict` out (`diagnose`), and its text.

The rules, in order: a lost GPU; the first specific failure signature (a watchdog timeout is an echo, deciding
only when nothing specific came first; failures all followed by a readiness line were survived; a SIGKILL is a
host OOM only with the kernel's word); GPUs held by processes no live launch owns (an ended launch's leftovers
whatever their names); a launch that ended; a serving server (unless requests are queued and the log went
silent: a serving hang the health endpoint does not see); else progress or silence judged against the
phase's grace period (silence that reaches it is silence). A failure's phase comes from the phase markers, else
from its own block (a running request means serving; then the words and frames, bot.core.diagnose.blocks).
Next steps come from the causes the failure's words show, then the verdict's. Trends the caller left unset are
derived from `history`; unusable numbers (NaN, inf, negative) are treated as unknown. Pure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from bot.core.diagnose.blocks import DECISIVE_QUOTE_MAX, block_heads, hinted_phase, quote_hit
from bot.core.diagnose.evidence import (
    _context_evidence,
    _Ev,
    _fmt_gib,
    _fmt_num,
    _gpu_state,
    _is_engine_process,
    _is_spin,
    _probe_status,
    _q,
    _q_at,
    _secs,
    _traceback_summary,
    nccl_in_play,
)
from bot.core.diagnose.logscan import _FRAME_RE, LineMemo, LogScan, _Hit, _traceback_end, scan_log
from bot.core.diagnose.meaning import in_collective, named_phase
from bot.core.diagnose.observation import Observation, Verdict, cpu_progress
from bot.core.diagnose.signatures import SIGNATURES, Signatures
from bot.core.diagnose.stacks import stack_activity, with_stacks
from bot.core.exits import describe_exit, exit_signal
from bot.core.models import ProcessInfo
from bot.core.text import counted

__all__ = ["diagnose", "format_verdict"]


#: Signals a server is asked to stop by (SIGHUP, SIGINT, SIGTERM): ended by one after a stop in order, it exited.
STOP_EXIT_SIGNALS = frozenset({1, 2, 15})


def _finite(x: Any) -> float | None:
    """A finite, non-negative float, else None (NaN, inf, negative and non-numbers mean unknown)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) and x >= 0 else None


def _sanitized(obs: Observation) -> Observation:
    """The observation with unusable numbers (NaN, inf, negative durations) turned into None, and a process with an
    exit status known to have ended."""
    changes = {k: _finite(getattr(obs, k)) for k in ("log_silent_s", "elapsed_s") if getattr(obs, k) is not None}
    changes = {k: v for k, v in changes.items() if v != getattr(obs, k)}
    if obs.exit_code is not None and obs.process_alive is None:
        changes["process_alive"] = False  # an exit status is known only once the process has ended
    return replace(obs, **changes) if changes else obs


def _with_trends(obs: Observation, history: Sequence[Observation], sig: Signatures) -> Observation:
    """Fill the trend fields the caller left None from the previous observation."""
    if not history:
        return obs
    prev = history[-1]
    changes: dict[str, Any] = {}
    if obs.gpu_mem_rising is None and obs.gpus and prev.gpus:
        now = sum(g.memory_used_mib or 0.0 for g in obs.gpus)
        before = sum(g.memory_used_mib or 0.0 for g in prev.gpus)
        changes["gpu_mem_rising"] = now > before + 64.0
    if obs.cpu_time_growing is None and obs.processes and prev.processes:
        before_cpu = {p.pid: p.cpu_time_s for p in prev.processes if p.cpu_time_s is not None}
        deltas = [p.cpu_time_s - before_cpu[p.pid] for p in obs.processes
                  if p.cpu_time_s is not None and p.pid in before_cpu]
        if deltas:
            changes["cpu_time_growing"] = cpu_progress(deltas, (obs.elapsed_s or 0.0) - (prev.elapsed_s or 0.0))
    if obs.progress_advancing is None and obs.log_lines and prev.log_lines:
        now_p = [p for p in scan_log(obs.log_lines, sig).progress if p.done is not None]
        before_p = [p for p in scan_log(prev.log_lines, sig).progress if p.done is not None]
        if now_p and before_p:
            a, b = now_p[-1], before_p[-1]
            changes["progress_advancing"] = a.label != b.label or (a.done or 0) > (b.done or 0)
    return replace(obs, **changes) if changes else obs


def _steps(sig: Signatures, verdict: str, phase: str | None, cause_text: str = "",
           engines: Sequence[str] = ()) -> list[str]:
    """Next steps: those of every cause (signatures.yaml `causes`) the failure's words show, with the engines'
    own, then the verdict's phase steps, then the verdict's."""
    steps: list[str] = []
    for c in sig.causes if cause_text else []:
        if (not c.verdicts or verdict in c.verdicts) and c.regex.search(cause_text):
            for s in [*c.steps, *(s for e in engines for s in c.engine_steps.get(e, ()))]:
                if s not in steps:
                    steps.append(s)
    if phase:
        steps += [s for s in sig.next_steps.get(f"{verdict}.{phase}", []) if s not in steps]
    steps += [s for s in sig.next_steps.get(verdict, []) if s not in steps]
    return steps


def _verdict(
    sig: Signatures, verdict: str, phase: str | None, ev: _Ev, summary: str, obs: Observation, scan: LogScan,
    cause_text: str = "", *, confidence: str = "medium", runner_up: str | None = None, missing: str | None = None,
) -> Verdict:
    _context_evidence(ev, obs, scan, sig)
    steps = _steps(sig, verdict, phase, cause_text, scan.engines)
    out = Verdict(verdict=verdict, phase=phase, evidence=ev.items, next_steps=steps, summary=summary,
                  confidence=confidence, runner_up=runner_up, missing=missing)
    return with_stacks(out, obs.rank_stacks, sig)[0] if obs.rank_stacks else out


_KIND_LABEL = MappingProxyType({
    "unknown": "killed",
    "gpu_lost": "GPU lost",
    "host_oom": "host out of memory",
    "oom": "CUDA out of memory",
    "nccl_error": "NCCL error",
    "port_in_use": "address in use",
    "cuda_error": "CUDA error",
    "crashed": "error",
    "killed": "killed",
})


@dataclass
class _Failure:
    """What the failure signatures decided: every hit, the decisive one (`root`; None for a dmesg OOM or an exit
    status alone), the first, the watchdog echoes, the dmesg OOM lines, the verdict kind and how it was killed."""

    hits: list[_Hit]
    root: _Hit | None
    first: _Hit | None
    echoes: list[_Hit]
    dmesg_oom: list[str]
    kind: str
    how: str = ""
    kernel_fault: list[str] = field(default_factory=list)  # the kernel's lines of a process that died of a fault


def _failure(obs: Observation, scan: LogScan, sig: Signatures) -> _Failure | None:
    """The decisive failure, or None (no failure, a survived error, or failures the engine served after)."""
    hits = list(scan.failures)
    alive = obs.process_alive
    if alive is True and (obs.port_open is True or obs.health == "ok"):
        # an allocation warning the engine logged while it went on serving (a pinned-memory fallback, a retried
        # allocation) is no failure while its process runs and its port answers; NCCL (whose errors are all
        # `NCCL WARN`) and CUDA faults torch reports as warnings stay failures
        hits = [h for h in hits if not (h.kind in ("oom", "crashed") and sig.warning_severity.search(h.line))]
    hits = _not_recurring(hits, scan, sig)
    dmesg_oom = (
        [line for line in (obs.dmesg_lines or []) if sig.failures["host_oom"].first(line)] if alive is not True else []
    )
    specific = [h for h in hits if h.kind != "crashed" and not h.echo and h.kind != "gpu_lost"]
    echoes = [h for h in hits if h.echo]
    generic = [h for h in hits if h.kind == "crashed"]
    if _survived(obs, scan, sig, hits, specific, echoes, generic, dmesg_oom):
        return None
    if alive is not False and not specific and not echoes and generic:
        # a survived error: the run went on (new phase, progress or readiness line after it; a process not known to
        # have ended: a log excerpt alone counts too)
        later = [i for i in [*scan.ready, *(p.index for p in scan.progress)] if i > generic[-1].index]
        if scan.phase_index is not None and scan.phase_index > generic[-1].index:
            later.append(scan.phase_index)
        if alive is None:  # no process state: only the same rank or process going on shows it outlived the error
            said_by = _source_of(generic[-1], scan)
            later = [i for i in later if _source_of(i, scan) == said_by]
        if later:
            generic = []
    root = _root_cause(specific, echoes, generic, dmesg_oom)
    if root is not None:
        kind: str | None = "crashed" if root in generic else root.kind
    elif dmesg_oom:
        kind = "host_oom"
    elif obs.exit_code is not None and obs.exit_code not in (0,) and alive is not True \
            and not (scan.ending is not None and exit_signal(obs.exit_code) in STOP_EXIT_SIGNALS):
        kind = "killed" if obs.exit_code in (137, -9) else "crashed"
    else:
        kind = None
    faults = [line for _, _, line in kernel_faults(obs.dmesg_lines)] if alive is not True else []
    if kind is None and faults:
        kind = "crashed"  # no error in the log, but the kernel saw the process die of its own fault
    if kind is None:
        return None
    found = _Failure(hits, root, hits[0] if hits else None, echoes, dmesg_oom, kind,
                     kernel_fault=faults if kind == "crashed" else [])
    if kind == "killed":
        # a dmesg capture without a kernel line (empty, or "read kernel buffer failed") is no kernel log
        kernel_log = obs.dmesg_lines is not None and any(_KERNEL_LINE.search(line) for line in obs.dmesg_lines)
        if dmesg_oom:
            found.kind, found.how = "host_oom", " (confirmed by dmesg)"
        elif not kernel_log:  # a cause is named only where evidence shows it: no kernel log, no verdict
            found.kind = "unknown"
            found.how = (": killed by SIGKILL, the kernel OOM killer's signal, but there is no kernel log to say who "
                         "sent it (`dmesg | grep -i 'killed process'` on the host tells)")
        else:
            found.kind = "crashed"
            found.how = " (killed by SIGKILL, but dmesg shows no OOM kill: someone or something else killed it)"
    return found


#: Seconds on the log's clock after which the same error line said again by the same process shows it outlived it.
RECUR_S = 5.0
_DIGITS = re.compile(r"\d+(?:\.\d+)?")


def _not_recurring(hits: list[_Hit], scan: LogScan, sig: Signatures) -> list[_Hit]:
    """`hits` less the errors the process outlived by its own account: a line said again, in the same words (numbers
    aside), by the same rank or source, RECUR_S or more later on the log's clock, without an error severity and
    outside any traceback (SGLang's `Decode out of memory happened ... retracted`, a retried allocation): a process
    that dies of an error does not log it again later. Once one rank shows that, the same words from the other ranks
    go too (the same event, survived there as well). A failure in other words still counts."""
    if len(hits) < 2 or not scan.times:
        return hits
    in_block = {i for b in scan.blocks for i in range(b.start, b.end + 1)}

    def words(h: _Hit) -> str:
        return _DIGITS.sub("0", scan.norm[h.index].body if h.index < len(scan.norm) else h.line)

    first: dict[tuple[str | None, str], float] = {}
    survived: set[str] = set()
    for h in hits:
        t = scan.times[h.index] if h.index < len(scan.times) else None
        if t is None or h.index in in_block or sig.error_severity.search(h.line):
            continue
        source = h.rank or (scan.norm[h.index].source if h.index < len(scan.norm) else None)
        key = (source, words(h))
        if t - first.setdefault(key, t) >= RECUR_S:
            survived.add(key[1])
    return [h for h in hits if words(h) not in survived] if survived else hits


def _root_cause(specific: list[_Hit], echoes: list[_Hit], generic: list[_Hit], dmesg_oom: list[str]) -> _Hit | None:
    """The root cause among the failures: the first specific one; else an exception that came before the echoes (a
    rank's own error before the others' watchdog timeouts); else the echo itself, else the generic error. None when
    only the kernel's OOM kill says it."""
    if specific:
        return specific[0]
    if dmesg_oom:
        return None
    before_echo = [h for h in generic if echoes and h.index < echoes[0].index
                   and h.block is not None and h.block.exc_type and not h.block.cut]
    return before_echo[0] if before_echo else echoes[0] if echoes else generic[0] if generic else None


def _source_of(line: _Hit | int, scan: LogScan) -> str | None:
    """The rank or process that printed a line (its prefix's label), None when the log does not say."""
    i = line.index if isinstance(line, _Hit) else line
    if isinstance(line, _Hit) and line.block is not None:  # a traceback's lines carry no prefix: its header's does
        i = line.block.start
    rank = scan.facts[i].rank if i < len(scan.facts) else None
    return rank or (scan.norm[i].source if i < len(scan.norm) else None)


def _survived(obs: Observation, scan: LogScan, sig: Signatures, hits: list[_Hit], specific: list[_Hit],
              echoes: list[_Hit], generic: list[_Hit], dmesg_oom: list[str]) -> bool:
    """Whether the launch went on past every failure its log shows: an error caught before a clean end (status 0),
    a request's error while it answers, a later start-up step after the failures with its port listening, a
    readiness line after them."""
    alive = obs.process_alive
    only_generic = not specific and not echoes and bool(generic) and not dmesg_oom
    if obs.exit_code == 0 and only_generic:
        return True  # an error it caught and logged: the program went on to end with status 0
    if alive is True and obs.health == "ok" and only_generic:
        # a request's error while the server runs and its health endpoint answers: it served on (the watcher
        # says the same: only OOM, CUDA, NCCL and lost-GPU errors are news while a server answers)
        return True
    if hits and alive is True and obs.port_open is True and not dmesg_oom and _went_on(hits, scan, sig):
        # the engine got past them: a later start-up step began after the last failure (an allocation retried
        # with a smaller setting), its process is alive and its port listens
        return True
    # every failure came before a readiness line: the engine survived them (a caught allocation failure retried
    # with a smaller setting, a failed warm-up probe) and went on to serve
    return bool(hits and (alive is not False or obs.exit_code == 0 or scan.ending is not None) and scan.ready
                and scan.ready[-1] > hits[-1].index and not dmesg_oom)


def _went_on(hits: list[_Hit], scan: LogScan, sig: Signatures) -> bool:
    """Whether the launch reached a later start-up step after the last failure than the one it was in then."""
    last = hits[-1]
    if scan.phase_index is None or scan.phase_index <= last.index or scan.phase is None:
        return False
    was = last.reached[0] if last.reached is not None else None
    return was is None or _later(scan.phase, was, scan)


def _later(phase: str, than: str, scan: LogScan) -> bool:
    """Whether start-up phase `phase` comes after `than` in the order the log was read in (its engine's own, or
    the common one; False when either is no start-up phase)."""
    order = scan.phase_order
    return phase in order and than in order and order.index(phase) > order.index(than)


def _said_index(hit: _Hit, scan: LogScan, sig: Signatures) -> int | None:
    """For a failure hit on a traceback's header (`Traceback (most recent call last):`), the index of the exception
    line that ends it (what the error says); None for any other hit, or a traceback cut off before its end."""
    if hit.block is not None:  # read as a structure: its own exception line, or (cut) the hit's own words
        b = hit.block
        return b.line if not b.cut and b.line != hit.index and b.exc_type else None
    if "Traceback (most recent call last)" not in hit.line:
        return None
    return _traceback_end(scan, hit.index, sig)


def _said(hit: _Hit, scan: LogScan, sig: Signatures) -> str:
    """The line that says what failure `hit` is: its traceback's exception line when it is a traceback header,
    else its own line."""
    j = _said_index(hit, scan, sig)
    return (scan.lines[j] if j is not None else hit.line).strip()


#: Lines after a failure within which another block of the same fault (its Python frames after a native trace) is read.
SAME_FAULT_LINES = 30


def _where_it_failed(ev: _Ev, f: _Failure, scan: LogScan, sig: Signatures) -> None:
    """Add where the failure happened beyond its own lines: the collective frame an NCCL failure came from, the
    kernel's line of a process killed by its own fault."""
    if f.root is not None and f.kind == "nccl_error":
        for j in _collective_frames(f.root, scan, sig):
            ev.add(f"in a collective (log line {j + 1}): `{_q(scan.lines[j])}`")
    for line in f.kernel_fault[:2]:
        ev.add(f"dmesg, a process killed by its own fault: `{_q(line)}`")


def _collective_frames(root: _Hit, scan: LogScan, sig: Signatures) -> list[int]:
    """The lines of the innermost collective frame (`in_collective`) of the failure's block and of the next block of
    the same fault (a native trace's Python frames after it): where in the communication it failed."""
    out: list[int] = []
    blocks = [b for b in scan.blocks if b is root.block
              or (root.block is not None and 0 < b.start - root.block.end <= SAME_FAULT_LINES)][:2]
    for b in blocks:
        fr = next((fr for fr in reversed(b.frames) if fr.func and in_collective([fr], sig)), None)
        if fr is None:
            continue
        j = next((j for j in range(b.start, min(b.end, len(scan.lines) - 1) + 1) if fr.func in scan.lines[j]), None)
        if j is not None:
            out.append(j)
    return out


def _failure_evidence(f: _Failure, scan: LogScan, sig: Signatures) -> _Ev:
    """The failure's evidence: the first failure, the decisive one, others like it, its error block and
    traceback, a later echo, context lines, dmesg's OOM kill and a `Killed` line."""
    ev = _Ev()
    root, first, hits = f.root, f.first, f.hits
    said = _said_index(root, scan, sig) if root is not None else None
    if first is not None and root is not None and first.index < root.index:
        j = _said_index(first, scan, sig)  # a traceback header is quoted by what it says
        if j is None:
            ev.add(f"first failure (log line {first.index + 1}): `{quote_hit(first, sig)}`")
        elif j not in (root.index, said):
            ev.add(f"first failure (log line {j + 1}): `{_q(scan.lines[j], DECISIVE_QUOTE_MAX)}`")
    if root is not None and said is not None:  # a traceback's header: what it says is its exception line
        ev.add(f"{_KIND_LABEL.get(root.kind, root.kind)} (log line {said + 1}): "
               f"`{_q(scan.lines[said], DECISIVE_QUOTE_MAX)}`")
    elif root is not None:
        ev.add(f"{_KIND_LABEL.get(root.kind, root.kind)} (log line {root.index + 1}): `{quote_hit(root, sig)}`")
    same = [
        h
        for h in hits
        if h.kind == (root.kind if root else f.kind)
        and h is not root
        and h is not first
        and (root is None or h.echo == root.echo)
        and "Traceback (most recent call last)" not in h.line
    ]
    shown: set[str] = {root.line.strip()} if root else set()
    if said is not None:
        shown.add(scan.lines[said].strip())
    for h in same:
        if len(shown) >= 3:
            break
        if h.line.strip() not in shown:
            shown.add(h.line.strip())
            ev.add(f"also (log line {h.index + 1}): `{_q(h.line)}`")
    if root is not None:
        for j in block_heads(scan, root.index, sig):
            ev.add(f"error block (log line {j + 1}): `{_q(scan.lines[j])}`")
    for anchor in [h for h in (first, root) if h is not None]:
        ev.add(_block_summary(anchor, scan) if anchor.block is not None
               else _traceback_summary(scan, anchor.index, sig))
    _where_it_failed(ev, f, scan, sig)
    if root is not None and not root.echo:
        later_echo = [h for h in f.echoes if h.index > root.index]
        if later_echo:
            ev.add(f"later echo of it (not the cause): `{_q(later_echo[0].line)}`")
    elif root is not None and root.echo and first is not None and first is not root:
        ev.add("the watchdog timeout is an echo: the first failure above is the likely cause")
    if root is not None:
        _consequences(ev, root, hits, scan)
    _message_context(ev, root, scan)
    for i in [i for i in scan.context.get(f.kind, []) if not ev.quotes(scan.lines[i])][:2]:
        ev.add(f"context: `{_q(scan.lines[i])}`")
    for line in f.dmesg_oom[:2]:
        ev.add(f"dmesg: `{_q(line)}`")
    killed_hits = [h for h in hits if h.kind == "killed"]
    if killed_hits and f.kind in ("host_oom", "crashed"):
        ev.add(f"killed (log line {killed_hits[0].index + 1}): `{_q(killed_hits[0].line)}`")
    return ev


_NUMBERS = re.compile(r"\d+(?:\.\d+)?")


def _consequences(ev: _Ev, root: _Hit, hits: list[_Hit], scan: LogScan) -> None:
    """What the decisive failure led to: the launcher's or the other ranks' error lines after it (failure hits and
    ERROR-level lines, neither frames nor headers nor its own words again), the first two and the last, as `then`."""
    errs = {h.index for h in hits} | {i for i in range(root.index + 1, len(scan.lines))
                                      if i < len(scan.norm) and scan.norm[i].level in ("ERROR", "CRITICAL")}
    said_root = _NUMBERS.sub("#", root.line.strip())
    after = [i for i in sorted(errs) if i > root.index and not ev.quotes(scan.lines[i])
             and not _FRAME_RE.search(scan.lines[i]) and "Traceback (most recent call last)" not in scan.lines[i]
             and len((scan.norm[i].body if i < len(scan.norm) else scan.lines[i]).strip()) > 12
             and _NUMBERS.sub("#", scan.lines[i].strip()) != said_root]
    seen: set[str] = set()
    distinct = []
    for i in after:
        key = _NUMBERS.sub("#", scan.norm[i].body.strip() if i < len(scan.norm) else scan.lines[i])
        if key not in seen:
            seen.add(key)
            distinct.append(i)
    for i in [*distinct[:2], *distinct[2:][-1:]]:
        ev.add(f"then (log line {i + 1}): `{_q(scan.lines[i])}`")



def _frame_quote(i: int, scan: LogScan) -> str:
    """A traceback frame line quoted with the code line under it (what it was doing), when there is one."""
    out = f"`{_q(scan.lines[i])}`"
    if i + 1 < len(scan.lines) and scan.lines[i + 1].strip() and not _FRAME_RE.search(scan.lines[i + 1]):
        body = scan.norm[i + 1].body.strip() if i + 1 < len(scan.norm) else scan.lines[i + 1].strip()
        if body and not body.startswith(("^", "~")) and len(body) < 300:
            out += f" → `{_q(scan.lines[i + 1])}`"
    return out


def _block_summary(hit: _Hit, scan: LogScan) -> str | None:
    """The frames of a hit's error block, outermost first, each as its function and the code line it was running
    (quoted), the middle of a long chain elided: the call path that failed, as a reader of the traceback sees it."""
    b = hit.block
    if b is None or not b.frames:
        return None
    steps: list[str] = []
    for j in range(b.start, b.end + 1):
        m = _FRAME_RE.search(scan.lines[j])
        if m is None:
            continue
        func = m.group(3) or "?"
        code = None
        tail = scan.lines[j][m.end():].strip()
        if tail:  # a paste that joined the code onto its frame line
            code = tail
        elif j + 1 <= b.end and not _FRAME_RE.search(scan.lines[j + 1]):
            body = scan.norm[j + 1].body.strip() if j + 1 < len(scan.norm) else scan.lines[j + 1].strip()
            if body and not body.startswith(("^", "~")) and (b.cut or j + 1 != b.line):
                code = body
        steps.append(f"{func}: `{_q(code, 200)}`" if code else func)
    order = "outermost first"
    if not steps:  # frames read from another shape (a goroutine dump, c10's frame list): their functions
        steps = [f"{f.func or '?'} ({f.file}:{f.line})" if f.file and f.line else (f.func or "?") for f in b.frames]
        order = "outermost first" if b.kind == "panic" else "as printed"
    shown = steps if len(steps) <= 8 else [*steps[:2], "…", *steps[-6:]]
    cut = ", cut before its exception line" if b.cut else ""
    return f"traceback ({len(b.frames)} frames{cut}), {order}: " + " → ".join(shown)


def _message_context(ev: _Ev, root: _Hit | None, scan: LogScan) -> None:
    """The words around what the decisive failure said: a traceback header line that carries the error's message
    (`Exception in worker ...: <message>, Traceback ...`), and the lines that go on with its message (a multi-line
    exception message, a blank line between allowed)."""
    if root is None:
        return
    b = root.block
    if b is not None and b.start != root.index:
        head = scan.lines[b.start]
        if "Traceback (most recent call last)" in head and len(head.split("Traceback")[0]) > 20:
            ev.add(f"error block (log line {b.start + 1}): `{_q(head, DECISIVE_QUOTE_MAX)}`")
    start = b.line if b is not None else root.index
    more: list[int] = []
    j = start + 1
    while j < len(scan.lines) and len(more) < 3 and j <= start + 5:
        if not scan.lines[j].strip() and not more and j == start + 1:
            j += 1  # one blank line between the message's first line and the rest of it
            continue
        if not _continues_message(j, scan):
            break
        more.append(j)
        j += 1
    if more:
        ev.add("its message goes on: " + " / ".join(f"`{_q(scan.lines[j])}`" for j in more))


def _continues_message(j: int, scan: LogScan) -> bool:
    """Whether line `j` continues the exception message above it: a line with no prefix of its own (no timestamp, level
    or source), not a frame or a new traceback, not blank."""
    if j >= len(scan.norm) or not scan.lines[j].strip():
        return False
    n = scan.norm[j]
    return (n.level is None and n.ts is None and n.body.strip() == scan.lines[j].strip()
            and not _FRAME_RE.search(n.body) and "Traceback (most recent call last)" not in n.body)


def _past_startup(hit: _Hit, scan: LogScan) -> bool:
    """Whether the log shows the launch past start-up before `hit`: a readiness line, or a serving milestone."""
    return any(i < hit.index for i in scan.ready) or (hit.reached is not None and hit.reached[0] == "serving")


def _event_frames(root: _Hit, scan: LogScan, sig: Signatures) -> tuple[str, int, _Hit] | None:
    """The step that the frames of another error block of the same event show (another rank's or process's traceback
    of the same fault: the same second on the log's clock, or within 40 lines when the log has no clock), with the
    line of the frame; None when none does. A per-batch loop's frame says nothing (warm-up runs it too)."""
    t = scan.times[root.index] if root.index < len(scan.times) else None
    for h in scan.failures:
        if h is root or h.frame_phase is None or h.frame is None:
            continue
        if not h.frame_sure and (root.frame_phase is not None or _in_loop_frame(h, scan, sig)):
            continue
        other = scan.times[h.index] if h.index < len(scan.times) else None
        same = abs(other - t) <= 1.0 if t is not None and other is not None else abs(h.index - root.index) <= 40
        if same:
            return h.frame_phase, h.frame, h
    return None


#: A model parameter's name quoted in an error (`KeyError: 'model.embed_tokens.weight'`): a checkpoint's key.
_PARAMETER_NAME = re.compile(r"['\"][\w.]+\.(?:weight|bias|qweight|qzeros|scales?|weight_scale\w*|g_idx)['\"]")
#: Lines before a failure within which a request line says the failure came while serving it.
REQUEST_CONTEXT_LINES = 30
#: Seconds after the last start-up line or readiness line beyond which a failure came while serving (the log's clock).
LATE_FAILURE_S = 1800.0


def _context_phase(f: _Failure, root: _Hit, scan: LogScan, alive: bool | None) -> tuple[str | None, int | None]:
    """The phase the failure's surroundings show when nothing else did: a request a few lines above it (serving); a
    failure long after the last start-up step on the log's own clock (serving); a GPU fault the process outlived
    (serving: a start-up step that fails ends the launch); an NCCL failure before any readiness (comm_init, where
    communicators are set up). (None, None) when none does."""
    if _PARAMETER_NAME.search(root.line):  # a parameter's name the error quotes: the weights were being read
        return "weight_loading", root.index
    lo = max(scan.start, root.index - REQUEST_CONTEXT_LINES)
    for j in range(root.index - 1, lo - 1, -1):
        if _REQUEST_CONTEXT.search(scan.lines[j]):
            return "serving", j
    t = scan.times[root.index] if root.index < len(scan.times) else None
    if t is not None:
        marks = [i for i in [*scan.ready, scan.phase_index] if i is not None and i < root.index]
        known = [scan.times[i] for i in marks if scan.times[i] is not None]
        if known and t - max(known) >= LATE_FAILURE_S:
            return "serving", None
    if alive is True and f.kind in ("oom", "cuda_error") and not scan.ready and scan.finished_phase is None:
        return "serving", None  # (not right after a start-up step ended: its next step failed, not a request)
    for h in f.hits:  # the native source files of the error's own lines (NCCL's `init.cc:1263 -> 2` return chain)
        module = scan.norm[h.index].module if h.index < len(scan.norm) else None
        if module and h.kind == f.kind and (fp := _file_phase(module)) is not None:
            return fp, h.index
    if (f.kind == "nccl_error" and not any(_TIMEOUT.search(h.line) for h in f.hits) and not scan.ready
            and scan.finished_phase in (None, "comm_init")):
        return "comm_init", None
    return None, None


_TIMEOUT = re.compile(r"(?i)time ?out|timed out|watchdog")
_FRAME_FUNC = re.compile(r"\bin (\w+)\s*$")


def _in_loop_frame(h: _Hit, scan: LogScan, sig: Signatures) -> bool:
    """Whether the frame that gave `h` its phase is an engine's per-batch loop (warm-up requests run it too)."""
    m = _FRAME_FUNC.search(scan.lines[h.frame]) if h.frame is not None else None
    return m is not None and sig.loop_frames.search(m.group(1)) is not None


def _file_phase(module: str) -> str | None:
    """The step a source file of an error line names (signatures.yaml frame_phases, file patterns), or None."""
    for phase, rx in SIGNATURES.frame_phases:
        if rx.pattern.endswith(("$", "/")) and "\\." in rx.pattern and rx.search(module):
            return phase
    return None


#: A line of a request being served: an HTTP access line for a generation endpoint, an engine's own request line.
_REQUEST_CONTEXT = re.compile(
    r'"(?:POST|GET) /(?:v\d/)?(?:chat/)?(?:completions|generate\w*|embeddings|infer\w*|predict)\S* HTTP/[\d.]+"'
    r"|\b(?:POST|GET) /(?:v\d/)?(?:chat/)?(?:completions|generate\w*)\b"
    r"|(?i:\b(?:Received|Added|Processing|Finished) request\b|\brequest_id[=:]|\breq_id[=:]|#running-req: [1-9]"
    r"|\bRunning: [1-9]\d* reqs)"
    # a request named by its id (`Request img_gen-8cd9b8f5a1ba8041 aborted`, `request cmpl-3f2a91c0`): an id with
    # digits, 8 characters or more
    r"|\b[Rr]equest\(?s?\)? \[?['\"]?(?=[\w-]*\d)[A-Za-z0-9][\w-]{7,}")


def _failure_phase(f: _Failure, scan: LogScan, sig: Signatures, ev: _Ev, obs_alive: bool | None = None) -> str | None:
    """The phase the failure happened in: the last milestone its rank reached before it (a line without a rank: the
    launch's furthest), else one its block's frames name, else where the launch got to, else one its hits imply; the
    frames may also name a phase after one that had finished there. The phase's line is added to `ev`."""
    root = f.root
    if root is not None and root.frame_phase is not None and (root.frame_sure or _past_startup(root, scan)):
        # the failing frames say where, before any milestone (a per-batch loop only once start-up is over)
        phase = root.frame_phase
        if f.kind == "port_in_use" and phase == "serving":
            return None
        if root.frame is not None and not ev.quotes(scan.lines[root.frame]):
            ev.add(f"{phase}, by its frames (log line {root.frame + 1}): {_frame_quote(root.frame, scan)}")
        return phase
    if root is not None and (named := named_phase(_said(root, scan, sig), sig)) is not None \
            and not (named == "serving" and f.kind == "port_in_use"):
        # the error's own words name the function that failed (`Encountered an error in forwardAsync function`)
        ev.add(f"{named}, by the function its message names (log line {root.index + 1})")
        return named
    if root is not None and (other := _event_frames(root, scan, sig)) is not None:
        # another rank's traceback of the same error event (the same second, a few lines away) shows the frames
        phase, line, hit = other
        if not ev.quotes(scan.lines[line]):
            ev.add(f"{phase}, by the frames of the same error (log line {line + 1}): {_frame_quote(line, scan)}")
        ev.add(_block_summary(hit, scan))
        return phase
    reached = root.reached if root is not None else None
    hinted, hint_line = hinted_phase(scan, root.index, sig) if root is not None else (None, None)
    if reached is not None:
        phase, phase_line, after = (None, None, reached[0]) if reached[1] else (reached[0], reached[2], None)
    elif hinted is not None:  # no milestone before it: its own frames say where
        phase, phase_line, after = hinted, hint_line, None
    else:  # a dmesg OOM or an exit status alone, or no milestone before the failure (an excerpt out of order, a
        # progress bar on the failure's own line): where the launch got to
        phase, phase_line, after = scan.phase, scan.phase_index, scan.finished_phase
    if phase is None and after is None and scan.phase_index is None:
        implied = [h.phase for h in f.hits if h.phase and (h.kind == f.kind or f.root is None)]
        # else the engine's own echo of it, after it ("Shard 0 failed to start" after the OOM that stopped it)
        implied += [h.phase for h in f.hits if h.phase and root is not None and h.index >= root.index and h is not root]
        phase = implied[0] if implied else None
    if phase is None and hinted is not None and (after is None or _later(hinted, after, scan)):
        phase, phase_line = hinted, hint_line
    if root is not None and root.frame_phase is not None and (phase or after) is not None \
            and _later(root.frame_phase, phase or after or "", scan):
        # frames (by their files alone) in a step after the last milestone: the launch got there without saying so
        phase, phase_line = root.frame_phase, None
        if root.frame is not None and not ev.quotes(scan.lines[root.frame]):
            ev.add(f"{phase}, by its frames (log line {root.frame + 1}): {_frame_quote(root.frame, scan)}")
    if phase is None and after is None and root is not None:
        phase, phase_line = _frames_alone(root, scan, sig, ev), None
    if phase is None and root is not None:
        phase, phase_line = _context_phase(f, root, scan, obs_alive)
    if f.kind == "port_in_use" and phase != "comm_init":
        # a failed bind is a rendezvous's (comm_init) or the server's own port, which it binds once start-up is
        # done: no start-up step failed, and it never listened there, whatever readiness line came first
        phase = None
    if phase is not None and phase_line is not None and not ev.quotes(scan.lines[phase_line]):
        ev.add(f"{phase} (log line {phase_line + 1}): `{_q(scan.lines[phase_line])}`")
    return phase


def _frames_alone(root: _Hit, scan: LogScan, sig: Signatures, ev: _Ev) -> str | None:
    """With no milestone anywhere before the failure, the step its frames show, even by their files or words alone
    (they are the only witness; an engine's per-batch loop says nothing), its frame quoted; else None."""
    if root.frame_phase is None or _in_loop_frame(root, scan, sig):
        return None
    if root.frame is not None and not ev.quotes(scan.lines[root.frame]):
        ev.add(f"{root.frame_phase}, by its frames (log line {root.frame + 1}): {_frame_quote(root.frame, scan)}")
    return root.frame_phase


_FAILURE_LABEL = MappingProxyType({
    "unknown": "Not known why it ended",
    "host_oom": "Killed by the kernel OOM killer (host RAM)",
    "oom": "GPU memory exhausted (CUDA out of memory)",
    "nccl_error": "NCCL / collective failure",
    "port_in_use": "A bind failed: the address is already in use",
    "cuda_error": "CUDA runtime error",
    "crashed": "Crashed with an error",
})


def _failure_verdict(obs: Observation, scan: LogScan, sig: Signatures) -> Verdict | None:
    """The verdict from failure signatures in the log (and OOM kills in dmesg), or None."""
    f = _failure(obs, scan, sig)
    if f is None:
        return None
    if f.kind in ("crashed", "unknown") and f.root is not None \
            and (hang := _stall_reported(f, scan, sig)) is not None:
        return _reported_hang(f, hang, obs, scan, sig)
    ev = _failure_evidence(f, scan, sig)
    phase = _failure_phase(f, scan, sig, ev, obs.process_alive)
    root, first = f.root, f.first
    where = f" during {phase}" if phase else ""
    quote = _said(root, scan, sig) if root else (f.dmesg_oom or f.kernel_fault or [""])[0].strip()
    summary = f"{_FAILURE_LABEL[f.kind]}{where}{f.how}."
    if root is None and obs.exit_code is not None:  # an exit status decided: it comes first
        if not f.dmesg_oom and f.kind == "crashed" and (torn := _torn_down(obs, scan, sig)) is not None:
            return torn
        ev = _led_by(ev, _exit_line(obs.exit_code))
        if not f.dmesg_oom and f.kind == "crashed":
            return _exit_only(obs, scan, sig, ev, phase, f.how)
    if quote:
        summary += f" {'First' if root is first or first is None else 'Decisive'} failure: `{_q(quote, 200)}`."
    if root is not None and root.echo and first is not None and first is not root:
        summary += f" It follows an earlier failure: `{_q(first.line, 200)}`."
    killed_hits = [h for h in f.hits if h.kind == "killed"]
    cause_text = "\n".join([*(h.line for h in (root, first) if h is not None), *(h.line for h in killed_hits[:1]),
                            quote])
    v = _verdict(sig, f.kind, phase, ev, summary, obs, scan, cause_text, **_failure_sureness(f, obs))
    if f.kind == "unknown":  # a SIGKILL nobody's log explains: the kernel log decides, so it is the first step
        v = replace(v, next_steps=["Check the kernel log on the host: `dmesg -T | grep -i -E 'killed process|oom'` "
                                   "(the OOM killer names the process it killed and why)", *v.next_steps])
    return v


#: Signals a program raises on itself when its teardown goes wrong (glibc's heap checks abort; a destructor faults).
TEARDOWN_SIGNALS = frozenset({6, 11})


def _torn_down(obs: Observation, scan: LogScan, sig: Signatures) -> Verdict | None:
    """`exited` in `shutdown`: a stop was asked for and the log shows it carried out, and the process then died of an
    abort or a fault with no error logged (glibc's `corrupted size vs. prev_size`, a destructor's segfault): the stop
    that was asked for happened; what went wrong at the very end is said, not alarmed on. None otherwise."""
    rc = obs.exit_code
    if rc is None or exit_signal(rc) not in TEARDOWN_SIGNALS or scan.stop_requested is None or scan.ending is None:
        return None
    ev = _Ev()
    _shutdown_evidence(ev, scan, scan.ending)
    ev.add(f"then, once stopped, {_exit_line(rc)}: an abort or fault during teardown, after the stop was carried out")
    summary = ("The launch was stopped on request and the log shows it stopping in order; the process then "
               f"ended, {describe_exit(rc)}, while tearing down.")
    return _verdict(sig, "exited", "shutdown", ev, summary, obs, scan, confidence="medium")


def _exit_line(rc: int) -> str:
    """`the process ended: killed by signal 9 (SIGKILL) (exit status 137)`, or `...: exit status 1`."""
    return f"the process ended: {describe_exit(rc)}" + (f" (exit status {rc})" if exit_signal(rc) is not None else "")


def _led_by(ev: _Ev, line: str) -> _Ev:
    """`ev` with `line` first."""
    out = _Ev()
    out.add(line)
    for item in ev.items:
        out.add(item)
    return out


def _exit_only(obs: Observation, scan: LogScan, sig: Signatures, ev: _Ev, phase: str | None,
               how_known: str = "") -> Verdict:
    """`crashed` by an exit status alone (no error in the log): the status said first; for a signal, who or what sent
    it is the question (the steps of a stop), else the steps of a crash without a traceback to read."""
    rc = obs.exit_code if obs.exit_code is not None else 1
    how = describe_exit(rc)
    where = f" during {phase}" if phase else ""
    summary = (f"The process was {how}{where}, and the log shows no error before it." if exit_signal(rc) is not None
               else f"The process ended with {how}{where}, and the log shows no error before it.")
    if how_known:  # what the kernel log said of it (a SIGKILL dmesg does not call an OOM kill)
        summary = f"{summary.removesuffix('.')}{how_known}."
    v = _verdict(sig, "crashed", phase, ev, summary, obs, scan, confidence="medium")
    steps = _steps(sig, "exited" if exit_signal(rc) is not None else "crashed", phase, "", scan.engines)
    return replace(v, next_steps=[x for x in steps if "traceback" not in x])


def _stall_reported(f: _Failure, scan: LogScan, sig: Signatures) -> int | None:
    """The first line, at or before the decisive failure, where the engine's own stall detector says it made no
    progress (signatures.yaml `hang_report`); None when none does."""
    for i in range(scan.start, min(len(scan.lines), f.root.index + 1 if f.root else 0)):
        if scan.facts[i].hang:
            return i
    return None


def _reported_hang(f: _Failure, hang: int, obs: Observation, scan: LogScan, sig: Signatures) -> Verdict:
    """`silent_hang`: the engine's own watchdog found it stuck (and then, as it is made to, ended it)."""
    ev = _Ev()
    ev.add(f"the engine's own watchdog says it made no progress (log line {hang + 1}): "
           f"`{_q(scan.lines[hang], DECISIVE_QUOTE_MAX)}`")
    if f.root is not None and f.root.index != hang:
        ev.add(f"then (log line {f.root.index + 1}): `{_q(_said(f.root, scan, sig))}`")
    served = bool(scan.ready) or scan.phase == "serving" or any(_REQUEST_CONTEXT.search(x) for x in scan.lines[:hang])
    phase = "serving" if served else scan.phase
    summary = ("Hung: the engine's own stall detector (a watchdog) found it making no progress, and ended it. The "
               "error that follows is the watchdog's doing, not the cause.")
    return _verdict(sig, "silent_hang", phase, ev, summary, obs, scan, confidence="medium", runner_up="crashed")


def _failure_sureness(f: _Failure, obs: Observation) -> dict[str, str | None]:
    """How sure a failure verdict is: high where an exception's type, a kernel line or a specific error line says it
    and the process is not known to run on; medium for a generic error, a cut traceback, an echo alone; low for a kill
    nobody's log explains. The runner-up: another kind the failure's lines show."""
    if f.kind == "unknown":
        return {"confidence": "low", "runner_up": "host_oom",
                "missing": "did the kernel's OOM killer send the SIGKILL? (`dmesg | grep -i 'killed process'`)"}
    root = f.root
    others = [h.kind for h in f.hits if h.kind not in (f.kind, "killed")]
    runner = others[0] if others else None
    if f.dmesg_oom or (root is None and f.kernel_fault) or (root is not None and not root.echo and f.kind != "crashed"
                       and (root.block is None or not root.block.cut) and obs.process_alive is not True):
        return {"confidence": "high", "runner_up": runner, "missing": None}
    if root is not None and root.echo:
        return {"confidence": "medium", "runner_up": runner or "silent_hang",
                "missing": "which rank failed or stopped first (its own log)"}
    return {"confidence": "medium", "runner_up": runner, "missing": None}


#: A kernel log line: dmesg's `[12345.678901]` / `-T` `[Tue Dec  1 ...]` prefix, or journalctl's `kernel:`.
_KERNEL_LINE = re.compile(r"^\s*\[\s*(?:\d+\.\d+|[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d)|\bkernel: ")


def _queued_but_silent(obs: Observation, scan: LogScan, sig: Signatures, grace_s: float) -> Verdict | None:
    """A serving hang the health endpoint does not see: the newest stats line shows requests running or
    waiting, and the log has been silent for the serving grace since. None otherwise."""
    silence = obs.log_silent_s
    if silence is None or silence < grace_s:
        return None
    for i in range(len(scan.lines) - 1, max(scan.start - 1, len(scan.lines) - 200), -1):  # this run only
        for rx in sig.queued_requests:
            if m := rx.search(scan.lines[i]):
                running, pending = int(m.group("running")), int(m.group("pending"))
                if pending == 0:  # running only: the stats line may predate the request's end (SGLang logs
                    return None   # every 40 decode steps); waiting requests are work the engine must take up
                ev = _Ev()
                quoted = _q_at(scan.lines[i], m.start())
                ev.add(f"requests queued at the newest stats line (log line {i + 1}): `{quoted}`")
                ev.add(f"no log line for {_secs(silence)} since, beyond the {_secs(grace_s)} serving grace")
                if obs.health == "ok":
                    ev.add("the health endpoint still answers: it does not go through the stuck engine")
                summary = (f"Serving hang: {running} request(s) running and {pending} waiting, and the log has been "
                           f"silent for {_secs(silence)}; a serving engine with queued work logs every few seconds.")
                return _verdict(sig, "silent_hang", "serving", ev, summary, obs, scan,
                                confidence="high", runner_up="ready")
    return None


#: Generation-check states that mean the engine made no token in time (SGLang's /health_generate answers 503 when
#: its detokenizer gave nothing within its own 20 s).
GENERATION_STUCK = frozenset({"timeout", "empty", "http_503", "http_504"})


def _generation_stuck(obs: Observation, scan: LogScan, sig: Signatures, grace_s: float) -> Verdict | None:
    """A serving hang a generation check saw (a bundle's `observed.json` "generate"): it got no token in time while
    the log has been silent for the serving grace. None otherwise."""
    silence = obs.log_silent_s
    if obs.generate not in GENERATION_STUCK or silence is None or silence < grace_s:
        return None
    ev = _Ev()
    ev.add(f"generation check: {obs.generate.replace('_', ' ')} (no token in time)")
    if obs.health == "ok":
        ev.add("the health endpoint still answers: it does not go through the stuck engine")
    ev.add(f"no log line for {_secs(silence)}, beyond the {_secs(grace_s)} serving grace")
    summary = ("Serving hang: " + ("the health endpoint answers, but " if obs.health == "ok" else "")
               + f"generation gets no token in time and the log has been silent for {_secs(silence)}.")
    return _verdict(sig, "silent_hang", "serving", ev, summary, obs, scan, confidence="high", runner_up="ready")


#: How many stats lines in a row with requests running and no token made make a stuck engine.
STALLED_STATS_LINES = 3


def _stalled_requests(obs: Observation, scan: LogScan, sig: Signatures, grace_s: float) -> Verdict | None:
    """A serving hang behind a live HTTP front, from the log alone: the newest STALLED_STATS_LINES stats lines all
    show requests running and no token made, or a request was taken in and nothing but probes (health, metrics)
    and access lines came after it for the serving grace. None otherwise."""
    lines = scan.lines
    low = max(scan.start, len(lines) - 200)  # this run, its newest lines
    stalled = stalled_stats(lines, sig, low)
    ev = _Ev()
    if len(stalled) >= STALLED_STATS_LINES:
        ev.add(f"{STALLED_STATS_LINES} stats lines in a row with requests running and no token made, the newest (log "
               f"line {stalled[0] + 1}): `{_q(lines[stalled[0]])}`")
        summary = ("Serving hang: requests are running but the engine makes no tokens (its stats lines say 0 tokens/s "
                   f"{STALLED_STATS_LINES} times in a row)")
    else:
        taken = _taken_and_silent(scan, sig, low)
        silence = obs.log_silent_s
        if taken is None or silence is None or silence < grace_s:
            return None
        ev.add(f"request taken in (log line {taken + 1}): `{_q(lines[taken])}`")
        ev.add(f"nothing but probes after it for {_secs(silence)}, beyond the {_secs(grace_s)} serving grace")
        summary = (f"Serving hang: a request was taken in and the engine has logged nothing for it in {_secs(silence)}"
                   "; only health probes followed")
    probe = next((i for i in range(len(lines) - 1, low - 1, -1) if sig.probe_line.first(lines[i])), None)
    if probe is not None:
        ev.add(f"the health endpoint still answers (log line {probe + 1}): `{_q(lines[probe])}`")
    if obs.health == "ok" or probe is not None:
        summary += ", while the health endpoint answers: it does not go through the stuck engine."
    else:
        summary += "."
    return _verdict(sig, "silent_hang", "serving", ev, summary, obs, scan, confidence="high", runner_up="ready")


def stalled_stats(lines: Sequence[str], sig: Signatures | None = None, low: int = 0) -> list[int]:
    """The indexes (newest first) of the newest run of engine stats lines (signatures' `stalled_stats`: vLLM's
    `Avg generation throughput: 0.0 tokens/s, Running: 1 reqs`, SGLang's `#running-req: 1 ... gen throughput
    (token/s): 0.00`) that show requests running and no token made, each the same as the next from the stats on (a
    growing KV-cache usage is work), looking no further back than `low` and stopping at STALLED_STATS_LINES; empty
    when the newest stats line shows work or no request."""
    sig = sig or SIGNATURES
    stalled: list[int] = []
    same: str | None = None
    for i in range(len(lines) - 1, low - 1, -1):
        m = next((m for rx in sig.stalled_stats if (m := rx.search(lines[i]))), None)
        if m is None:
            continue
        groups = m.groupdict()
        if int(groups["running"]) == 0 or float(groups["tokens"]) > 0 or float(groups.get("prompt") or 0) > 0:
            break  # the newest stats line that shows work (or no request) ends the run
        # the rest of the line too must not move: a KV-cache usage or token count that grows is a long prefill at
        # work (vLLM V1 counts prompt tokens only once a prefill completes)
        rest = lines[i][m.start():].strip()
        if same is not None and rest != same:
            break
        same = rest
        stalled.append(i)
        if len(stalled) >= STALLED_STATS_LINES:
            break
    return stalled


def _taken_and_silent(scan: LogScan, sig: Signatures, low: int) -> int | None:
    """The index of the newest request-received line when every line after it is a probe (health, metrics) or blank:
    nothing logged for it, not even the access line of its answer (which a non-streaming request gets when it is
    answered); None otherwise."""
    lines = scan.lines
    for i in range(len(lines) - 1, low - 1, -1):
        line = lines[i]
        if sig.request_received.first(line):
            return i
        if line.strip() and not sig.probe_line.first(line):
            return None  # the engine logged something for it, or an access line says it was answered
    return None


def _foreign_holders(obs: Observation, ev: _Ev) -> None:
    """GPU holders that are neither the launch's processes nor their descendants (added to `ev`)."""
    if obs.launch_pids is None or not obs.gpu_processes:
        return
    mine = set(obs.launch_pids)
    if obs.processes:
        children: dict[int, list[int]] = {}
        for p in obs.processes:
            if p.ppid is not None:
                children.setdefault(p.ppid, []).append(p.pid)
        stack = list(mine)
        while stack:
            for c in children.get(stack.pop(), []):
                if c not in mine:
                    mine.add(c)
                    stack.append(c)
    for gp in obs.gpu_processes:
        if gp.pid not in mine:
            ev.add(
                f"GPU {gp.gpu_index if gp.gpu_index is not None else '?'} held by PID {gp.pid} "
                f"({gp.process_name or '?'}, {_fmt_gib(gp.used_memory_mib)}), not part of this launch"
            )


def _held_after_the_end(obs: Observation, gpu_free_mib: float, ev: _Ev) -> None:
    """Once the launch's process is gone: GPUs still holding memory, and deleted shared memory still attached."""
    for g in obs.gpus or []:
        if g.memory_used_mib is not None and g.memory_used_mib > gpu_free_mib:
            raw = obs.gpu_lines.get(g.index)
            state = _gpu_state(g, nccl_in_play(obs))
            ev.add(
                f"GPU {g.index} still holds {g.memory_used_mib / 1024:.1f} GiB although the launch's process is "
                "gone: "
                + (f"`{_q(raw, 300)}`" if raw else f"{_fmt_num(g.utilization_gpu_pct, '%')} util")
                + (f" → {state}" if state else "")
            )
    for seg in obs.shm_segments or []:
        if "dest" in seg.status and (seg.nattch or 0) > 0:
            ev.add(
                "shared memory segment deleted by its owner but still attached by "
                f"{counted(seg.nattch or 0, 'process')} "
                f"(leftover workers still alive): `{_q(seg.line)}`"
            )


def _stale_engine(p: ProcessInfo, obs: Observation, sig: Signatures, holders: set[int],
                  orphan_age_s: float, dead: bool) -> str | None:
    """Why process `p` is an engine process that no live launch owns, or None: any engine process once the
    launch ended (or a child of it re-parented to init, still holding GPU memory: a multiprocessing, torchrun or
    Ray worker, whatever its name), one older than the launch, or, with no launch in view, one older than
    `orphan_age_s`. `dead`: the launch has ended (`_launch_ended`, worked out once for the table)."""
    if p.state in ("Z", "X"):
        return None
    started_after = p.elapsed_s is not None and obs.elapsed_s is not None and p.elapsed_s <= obs.elapsed_s + 120
    child_like = sig.leftover_processes.first(p.args) is not None
    holder = p.pid in holders
    # a worker re-parented to init once its launcher ended, named as engines name their workers (or holding GPU
    # memory), is a leftover whatever else is known: nobody will reap it
    leftover = dead and p.ppid == 1 and (child_like or (holder and started_after))
    if not _is_engine_process(p, sig) and not leftover:
        return None
    age = p.elapsed_s
    if dead:
        return "still running although the launch ended"
    if age is not None and obs.elapsed_s is not None and age > obs.elapsed_s + 120:
        return f"running for {_secs(age)}, longer than the launch ({_secs(obs.elapsed_s)})"
    if age is not None and obs.log_lines is None and obs.process_alive is None and age > orphan_age_s:
        return f"running for {_secs(age)}, far longer than any launch"
    return None


def _orphans(obs: Observation, scan: LogScan, sig: Signatures, orphan_age_s: float, gpu_free_mib: float) -> _Ev:
    """Evidence that GPUs are held by processes no live launch owns (empty when there is none)."""
    ev = _Ev()
    _foreign_holders(obs, ev)
    if obs.process_alive is False:
        _held_after_the_end(obs, gpu_free_mib, ev)
    holders = {gp.pid for gp in obs.gpu_processes or []}
    dead = obs.process_alive is False or launcher_gone(obs.processes, sig)  # once for the whole table
    for p in obs.processes or []:
        why = _stale_engine(p, obs, sig, holders, orphan_age_s, dead)
        if why is not None:
            raw = obs.process_lines.get(p.pid)
            parent = f", parent {p.ppid}" if p.ppid is not None else ""
            ev.add(
                f"engine process {p.pid}{parent}, state `{p.stat or '?'}`, "
                f"{p.pcpu if p.pcpu is not None else '?'} % CPU, {why}: `{_q(raw or p.args, 300)}`"
            )
    return ev


@dataclass(frozen=True)
class _Case:
    """What every rule looks at: the observation (sanitized, trends derived), its log scan, the signatures, the
    grace per phase (seconds) and without a phase, and the orphan thresholds."""

    obs: Observation
    scan: LogScan
    sig: Signatures
    grace: Mapping[str, float]
    silence_default: float
    orphan_age_s: float
    gpu_free_mib: float


def _gpu_lost_rule(c: _Case) -> Verdict | None:
    """1. A lost GPU explains everything that follows."""
    sig, obs, scan = c.sig, c.obs, c.scan
    lost = [f"nvidia-smi: `{_q(line)}`" for line in obs.gpu_error_lines or [] if sig.failures["gpu_lost"].first(line)]
    lost += [f"dmesg: `{_q(line)}`" for line in obs.dmesg_lines or [] if sig.failures["gpu_lost"].first(line)]
    lost += [f"dmesg, Xid {code} (the GPU must be reset): `{_q(text)}`" for code, text in xids(obs.dmesg_lines, sig)
             if sig.xid.get(code) == "gpu_lost"]
    lost += [f"log line {h.index + 1}: `{_q(h.line)}`" for h in scan.failures if h.kind == "gpu_lost"]
    if not lost:
        return None
    ev = _Ev()
    for item in lost[:4]:
        ev.add(item)
    for h in [h for h in scan.failures if h.kind == "gpu_lost" and h.block is not None][:1]:
        ev.add(_block_summary(h, scan))
    summary = (
        f"A GPU or NVML is unreachable: {lost[0]}. The engine cannot recover from this; "
        "the host needs a GPU reset or reboot."
    )
    return _verdict(sig, "gpu_lost", scan.phase, ev, summary, obs, scan, confidence="high")


#: The kernel's Xid line (`NVRM: Xid (PCI:0000:17:00): 79, pid=..., GPU has fallen off the bus.`).
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?[^)]{0,40}\): (?P<code>\d{1,3})\b")


#: The kernel's report of a user process killed by its own fault (Linux arch/x86/mm/fault.c `show_signal_msg`:
#: `COMM[PID]: segfault at ADDR ip ADDR sp ADDR error N in LIB[...]`; arch/x86/kernel/traps.c: `traps: COMM[PID]
#: general protection fault ip:... error:0 in LIB[...]`, `COMM[PID] trap invalid opcode ip:...`, `... trap divide
#: error ...`; arm64 `COMM[PID]: unhandled level 3 translation fault (11) at 0x..`).
_KERNEL_FAULT = re.compile(r"(?P<comm>[^\s\[\]:]{1,64})\[(?P<pid>\d{1,10})\]:? (?:segfault at [0-9a-fx]+"
                           r"|general protection(?: fault)?|trap [a-z][a-z ]{2,40}? ip:|unhandled [\w ]{0,40}fault)")


def kernel_faults(lines: Sequence[str] | None) -> list[tuple[str, int, str]]:
    """(process name, PID, line) of every user process the kernel log says died of its own fault (a segfault, a
    general protection fault, a trap), in order. Never raises."""
    out: list[tuple[str, int, str]] = []
    for line in lines or []:
        if (m := _KERNEL_FAULT.search(line)) is not None:
            out.append((m.group("comm"), int(m.group("pid")), line.strip()))
    return out


def xids(lines: Sequence[str] | None, sig: Signatures) -> list[tuple[int, str]]:
    """(code, text) of every Xid in a kernel log, the text being its line and the indented lines that continue it
    (`MMU Fault: ENGINE GRAPHICS ... faulted`) and the driver's next NVRM line that names the event."""
    out: list[tuple[int, str]] = []
    lines = list(lines or [])
    for i, line in enumerate(lines):
        if (m := _XID.search(line)) is None:
            continue
        parts = [line.strip()]
        for nxt in lines[i + 1:i + 3]:
            if (nxt[:1].isspace() and nxt.strip()) or ("NVRM:" in nxt and not _XID.search(nxt)):
                parts.append(nxt.strip())
            else:
                break
        out.append((int(m.group("code")), " ".join(parts)))
    return out


def _stall_rule(c: _Case) -> Verdict | None:
    """2c. No failure, but the engine's own stall detector (its scheduler's watchdog) reported it stuck: `silent_hang`
    (in serving once it had served, else where start-up got to)."""
    scan, sig = c.scan, c.sig
    hang = next((i for i in range(scan.start, len(scan.lines)) if scan.facts[i].hang), None)
    if hang is None:
        return None
    ev = _Ev()
    ev.add(f"the engine's own watchdog says it made no progress (log line {hang + 1}): "
           f"`{_q(scan.lines[hang], DECISIVE_QUOTE_MAX)}`")
    served = bool(scan.ready) or scan.phase == "serving" or any(_REQUEST_CONTEXT.search(x) for x in scan.lines[:hang])
    phase = "serving" if served else scan.phase
    summary = "Hung: the engine's own stall detector (a watchdog) found it making no progress."
    return _verdict(sig, "silent_hang", phase, ev, summary, c.obs, scan, confidence="medium", runner_up="loading")


def _kernel_rule(c: _Case) -> Verdict | None:
    """2b. A program's own fault the kernel saw on a working GPU (an Xid that means a fault, not a lost GPU), with no
    failure in the log: `cuda_error`."""
    faults = [(code, text) for code, text in xids(c.obs.dmesg_lines, c.sig) if c.sig.xid.get(code) == "cuda_error"]
    if not faults:
        return None
    ev = _Ev()
    for code, text in faults[:3]:
        ev.add(f"dmesg, Xid {code} (a fault of the program on the GPU): `{_q(text, DECISIVE_QUOTE_MAX)}`")
    summary = (f"CUDA error the kernel saw: Xid {faults[0][0]}, a fault of the program on the GPU (the GPU itself "
               "still works): `" + _q(faults[0][1], 200) + "`.")
    return _verdict(c.sig, "cuda_error", c.scan.phase, ev, summary, c.obs, c.scan, confidence="medium",
                    runner_up="gpu_lost", missing=None)


def _failure_rule(c: _Case) -> Verdict | None:
    """2. Failure signatures: the first specific one decides."""
    return _failure_verdict(c.obs, c.scan, c.sig)


def launcher_gone(procs: Sequence[ProcessInfo] | None, sig: Signatures) -> bool:
    """Whether a process table shows workers whose launcher is gone: processes named as engines name their workers
    (multiprocessing spawn children, `VLLM::EngineCore`, `sglang::scheduler`, Ray and torchrun workers) re-parented to
    init (PPID 1), and no launcher (an engine's process that is not such a worker) in the table."""
    if not procs:
        return False
    workers = [p for p in procs if p.ppid == 1 and p.state not in ("Z", "X") and sig.leftover_processes.first(p.args)]
    launchers = [p for p in procs if p.state not in ("Z", "X") and _is_engine_process(p, sig)
                 and not sig.leftover_processes.first(p.args)]
    return bool(workers) and not launchers


def _leftovers_rule(c: _Case) -> Verdict | None:
    """2a. The launcher is gone (by the observation, or by a process table whose workers were re-parented to init)
    while its workers still run: `orphans_hold_gpu` in shutdown, whatever error ended the launcher (said too)."""
    obs, scan, sig = c.obs, c.scan, c.sig
    gone = obs.process_alive is False or (obs.process_alive is None and launcher_gone(obs.processes, sig))
    if not gone or not obs.processes:
        return None
    ev = _Ev()
    holders = {gp.pid for gp in obs.gpu_processes or []}
    for p in obs.processes:
        if p.ppid == 1 and _stale_engine(p, replace(obs, process_alive=False), sig, holders, c.orphan_age_s, True):
            raw = obs.process_lines.get(p.pid)
            ev.add(f"worker {p.pid} re-parented to init (PPID 1), state `{p.stat or '?'}`, "
                   f"{p.pcpu if p.pcpu is not None else '?'} % CPU, still running although its launcher ended: "
                   f"`{_q(raw or p.args, 300)}`")
    if not ev.items:
        return None
    if obs.process_alive is False:
        _held_after_the_end(obs, c.gpu_free_mib, ev)
    f = _failure(replace(obs, process_alive=False), scan, sig)
    why = ""
    if f is not None and f.root is not None:
        ev.add(f"the launcher ended with (log line {f.root.index + 1}): `{_q(_said(f.root, scan, sig))}`")
        why = f"; the launcher ended with {_FAILURE_LABEL[f.kind].lower()}" if f.kind in _FAILURE_LABEL else ""
    elif scan.ending is not None:
        ev.add(f"the launcher stopped (log line {scan.ending + 1}): `{_q(scan.lines[scan.ending])}`")
    if obs.exit_code is not None:  # how the launcher ended, when its status is known
        ev = _led_by(ev, _exit_line(obs.exit_code).replace("the process ended", "the launcher ended"))
        why = why or (f"; the launcher was {describe_exit(obs.exit_code)}" if exit_signal(obs.exit_code)
                      else f"; the launcher ended with {describe_exit(obs.exit_code)}")
    summary = (f"Leftover workers of an ended launch still run ({counted(len(ev.items), 'finding')}){why}: they hold "
               "or can hold GPU memory, and nobody will reap them.")
    return _verdict(sig, "orphans_hold_gpu", "shutdown", ev, summary, obs, scan, confidence="high",
                    runner_up=f.kind if f is not None else None)


def _orphans_rule(c: _Case) -> Verdict | None:
    """3. GPUs held by processes no live launch owns."""
    orphan_ev = _orphans(c.obs, c.scan, c.sig, c.orphan_age_s, c.gpu_free_mib)
    if not orphan_ev.items:
        return None
    phase = "shutdown" if c.obs.process_alive is False else None
    summary = (
        f"GPU resources are held by processes that no live launch owns ({counted(len(orphan_ev.items), 'finding')})"
        + (", left over from stopping the launch" if phase == "shutdown" else "")
        + f": {orphan_ev.items[0]}"
    )
    return _verdict(c.sig, "orphans_hold_gpu", phase, orphan_ev, summary, c.obs, c.scan,
                    confidence="high" if c.obs.gpus or c.obs.gpu_processes else "medium")


def _ended_rule(c: _Case) -> Verdict | None:
    """4. The launch has ended without a failure signature."""
    obs, scan = c.obs, c.scan
    if obs.process_alive is not False:
        return None
    ev = _Ev()
    stopped_by = exit_signal(obs.exit_code) if obs.exit_code is not None else None
    if scan.ending is not None and (obs.exit_code in (None, 0) or stopped_by in STOP_EXIT_SIGNALS):
        # it was stopping in order when it ended (a SIGTERM or Ctrl-C it obeyed ends with that signal's status)
        _shutdown_evidence(ev, scan, scan.ending)
        summary = "The launch ended without an error: the log shows it stopping in order" + (
            ", after a stop was asked for (a signal or Ctrl-C)." if scan.stop_requested is not None else ".")
        return _verdict(c.sig, "exited", "shutdown", ev, summary, obs, scan, confidence="high")
    if scan.completed and not scan.shutdown and obs.exit_code in (None, 0):
        ev.add(f"end of the program (log line {scan.completed[-1] + 1}): `{_q(scan.lines[scan.completed[-1]])}`")
        summary = "The program ran to its end without an error: the log shows it finishing, not failing."
        return _verdict(c.sig, "exited", None, ev, summary, obs, scan, confidence="high")
    if obs.exit_code == 0 or scan.shutdown:
        if scan.shutdown:
            ev.add(f"shutdown line: `{_q(scan.lines[scan.shutdown[-1]])}`")
        summary = "The launch ended without an error: " + (
            "it exited with status 0." if obs.exit_code == 0 else "the log shows it shutting down."
        )
        return _verdict(c.sig, "exited", "shutdown", ev, summary, obs, scan, confidence="high")
    ev.add("the process is gone and no exit status was recorded (whatever started it was stopped too, or the host "
           "restarted)")
    summary = (
        "The launch's process is gone, but neither the log nor the host evidence says why "
        "(no error, no shutdown line, no exit status)."
    )
    return _verdict(c.sig, "unknown", scan.phase, ev, summary, obs, scan, confidence="low",
                    missing="how it ended: its exit status, or the kernel log (`dmesg | tail`)")


def _shutdown_evidence(ev: _Ev, scan: LogScan, first: int) -> None:
    """The lines of a stop in order: where it began, the next two lines of it, and its last line."""
    ends = sorted(i for i in {*scan.shutdown, *scan.exits} if i > first)
    lines = [first, *[i for i in range(first + 1, min(len(scan.lines), first + 6)) if scan.lines[i].strip()][:2],
             *ends[-1:]]
    for i in dict.fromkeys(lines):
        ev.add(f"shutdown (log line {i + 1}): `{_q(scan.lines[i])}`")


def _stopped_rule(c: _Case) -> Verdict | None:
    """4b. The run ends in order, in the log's own words: a stop was asked for (a signal, Ctrl-C), or exit events follow
    its last work line (exiting, shut down, replicas removed) with no failure before them, and nothing answers:
    `exited` in shutdown, though no process table says it is gone."""
    obs, scan = c.obs, c.scan
    first = scan.ending
    if first is None or obs.process_alive is True:  # a stop that has not ended the process (ignored, or under way)
        return None
    ends = {*scan.shutdown, *scan.exits}
    if sum(1 for i in scan.meaningful if i > first and i not in ends) > 3 and scan.stop_requested is None:
        return None  # the run went on after it
    ev = _Ev()
    _shutdown_evidence(ev, scan, first)
    summary = ("The launch was stopping without an error: the log ends in its shutdown"
               + (", after a stop was asked for (a signal or Ctrl-C)." if scan.stop_requested is not None else "."))
    return _verdict(c.sig, "exited", "shutdown", ev, summary, obs, scan, confidence="medium",
                    missing=None if obs.process_alive is not None else "is its process gone?")


def _completed_rule(c: _Case) -> Verdict | None:
    """4c. A program that ran to its end: the log ends in its completion (`destroy_process_group() was not called before
    program exit`, `job finished`) with no failure and no stop, and its process is not known to run."""
    obs, scan = c.obs, c.scan
    if obs.process_alive is True or not scan.completed or scan.failures:
        return None
    last = scan.completed[-1]
    work = [*(p.index for p in scan.progress), *([scan.phase_index] if scan.phase_index is not None else [])]
    if any(i > last for i in work) or obs.exit_code not in (None, 0):
        return None
    ev = _Ev()
    ev.add(f"end of the program (log line {last + 1}): `{_q(scan.lines[last])}`")
    summary = "The program ran to its end without an error: the log shows it finishing, not failing."
    return _verdict(c.sig, "exited", None, ev, summary, obs, scan, confidence="medium",
                    missing=None if obs.process_alive is not None else "is its process gone?")


def _health(obs: Observation) -> tuple[str | None, str | None]:
    """The health probe's status, and the client probe's line it came from (None when it came from the probe)."""
    return (obs.health, None) if obs.health is not None else _probe_status(obs.probe_lines)


def _serving_rule(c: _Case) -> Verdict | None:
    """5. Serving: the health probe answers, or the port listens (or the log says ready) with nothing failing;
    a listening port whose API does not answer is a wedged API."""
    obs, scan, sig = c.obs, c.scan, c.sig
    health, health_line = _health(obs)
    ready_line = scan.lines[scan.ready[-1]] if scan.ready else None
    serving_seen = scan.phase == "serving" and obs.process_alive is not False  # requests answered, tokens made
    if health == "ok" or (
        health in (None, "connect_timeout")
        and (obs.port_open is True or ((ready_line is not None or serving_seen) and obs.port_open is not False))
    ):
        grace = c.grace.get("serving", c.silence_default)
        stuck = (_queued_but_silent(obs, scan, sig, grace) or _generation_stuck(obs, scan, sig, grace)
                 or _stalled_requests(obs, scan, sig, grace))
        if stuck is not None:
            return stuck
        ev = _Ev()
        if ready_line:
            ev.add(f"readiness line: `{_q(ready_line)}`")
        _serving_work(ev, obs, scan)
        summary = "Serving: " + (
            "the health probe answered."
            if health == "ok"
            else ("the port is listening" if obs.port_open else "the log says it is ready")
            + (" and no failure followed." if ready_line else ", the process is alive and no failure was logged.")
        )
        if health == "connect_timeout" and health_line:
            summary += (
                f" A client probe failed with `{_q(health_line, 200)}`: a connect TIMEOUT to a listening port points"
                " at the client path (proxy, firewall, WSL/Docker networking), not at the server."
            )
        sure = health == "ok" or (obs.port_open is True and obs.process_alive is True)
        return _verdict(sig, "ready", "serving", ev, summary, obs, scan, confidence="high" if sure else "medium",
                        runner_up=None if sure else "silent_hang in serving",
                        missing=None if sure else "does it still answer now? (a probe of its health endpoint)")
    if obs.port_open is True and health in ("timeout", "empty"):
        summary = f"The port listens but the API does not answer (health probe: {health}): the API process is wedged."
        return _verdict(sig, "silent_hang", "serving", _Ev(), summary, obs, scan, confidence="medium",
                        runner_up="unhealthy")
    if obs.port_open is True and health is not None and health.startswith("http_5") and ready_line is not None \
            and obs.process_alive is not False:
        # it said it was ready; an error status since is no start-up any more (the watcher needs a few in a row)
        ev = _Ev()
        ev.add(f"readiness line: `{_q(ready_line)}`")
        summary = (f"It said it was ready, but its health endpoint now answers HTTP {health.removeprefix('http_')}: "
                   "the server runs and reports itself unhealthy.")
        return _verdict(sig, "unhealthy", "serving", ev, summary, obs, scan, confidence="medium",
                        runner_up="loading in warmup")
    return None


#: An HTTP status line with a success status (`HTTP/1.1 200 OK`), as curl -i prints it.
_HTTP_2XX = re.compile(r"HTTP/[\d.]+ 2\d\d\b")


def _serving_work(ev: _Ev, obs: Observation, scan: LogScan) -> None:
    """What shows it serves, beside its readiness line: the newest line of request work in the log (an answered
    request, a stats line), and what a client probe got back (its last line: the answer's body or status)."""
    if scan.phase == "serving" and scan.phase_index is not None and not ev.quotes(scan.lines[scan.phase_index]):
        ev.add(f"serving (log line {scan.phase_index + 1}): `{_q(scan.lines[scan.phase_index])}`")
    # the answer itself: a JSON body, or an HTTP status line with a 2xx status (not the command, not curl's chatter)
    answer = next((x.strip() for x in reversed(obs.probe_lines or [])
                   if x.strip().startswith("{") or _HTTP_2XX.match(x.strip())), None)
    if answer is not None and '"error"' not in answer:
        ev.add(f"a client probe got: `{_q(answer, 800)}`")


def _starting_phase(c: _Case, ev: _Ev) -> tuple[str | None, float]:
    """Where a launch that is still starting is, and the seconds of log silence its phase allows."""
    obs, scan = c.obs, c.scan
    phase = scan.phase
    spin = [g for g in obs.gpus or [] if _is_spin(g)]
    if phase is None and scan.finished_phase is None and scan.phase_index is None and spin and nccl_in_play(obs):
        phase = "comm_init"
        ev.add(f"{counted(len(spin), 'GPU')} {'spins' if len(spin) == 1 else 'spin'} at 100 % with little memory: "
               "a collective that never completes (NCCL init)")
    health, _ = _health(obs)
    if obs.port_open is True and health is not None and health.startswith("http_5"):
        phase = phase or "warmup"
    threshold = c.grace.get(phase, c.silence_default) if phase else c.silence_default
    if scan.phase_grace_s is not None and scan.phase == phase:
        threshold = max(threshold, scan.phase_grace_s)
    return phase, threshold


def _silence(c: _Case, ev: _Ev) -> float | None:
    """Seconds without a new non-heartbeat log line: the observation's, else the span of the log's closing
    heartbeat run (said in `ev`); None when unknown."""
    obs, scan = c.obs, c.scan
    silence = obs.log_silent_s
    if silence is None and obs.log_growing is not False and scan.heartbeat_run and scan.heartbeat_span_s is not None:
        silence = scan.heartbeat_span_s
        ev.add(f"the log ends with {counted(scan.heartbeat_run, 'heartbeat line')} spanning {_secs(silence)} "
               "with no other line")
    return silence


def _progress(c: _Case, silence: float | None, threshold: float) -> list[str]:
    """The signs of progress a start-up shows (slow is not hung)."""
    obs, scan = c.obs, c.scan
    progress: list[str] = []
    if obs.gpu_mem_rising:
        progress.append("GPU memory in use is rising between samples")
    if obs.progress_advancing:
        progress.append("a progress counter advanced since the previous look")
    if obs.cpu_time_growing:  # above a rate (the watcher's, or _with_trends'), never a tick of a polling thread
        activity = stack_activity(obs.rank_stacks, c.sig)
        if activity is None:
            if not any(_is_spin(g) for g in obs.gpus or []):
                # (GPUs spinning at 100 % at low power wait on something: the CPU time of that wait is no progress)
                progress.append(CPU_ONLY)
        elif activity[0] == "working":
            progress.append(f"the launch's CPU time is growing, and its stacks show it working: `{activity[1]}`")
        # a busy-wait (a synchronize, a collective) burns CPU without moving: no progress (said by the hang's evidence)
    computing = [g for g in obs.gpus or [] if (_gpu_state(g) or "").startswith("computing")]
    if computing:
        progress.append(f"{counted(len(computing), 'GPU')} {'is' if len(computing) == 1 else 'are'} computing "
                        "(high utilization at high power draw)")
    if silence is None and obs.log_growing and scan.heartbeat_run == 0:
        progress.append("the log is still growing with lines that are not heartbeats")
    if scan.progress_advancing and (silence is None or silence < threshold) and obs.log_growing is not False:
        progress.append("a progress bar advances in the log")
    return progress


#: The sign of progress CPU time alone gives (work or a busy-wait: only stacks tell).
CPU_ONLY = "the launch's CPU time is growing"
#: Past this many times its grace, a start-up whose only sign of life is CPU time, with no stacks to tell work from a
#: busy-wait, is hung (the watcher asks the stacks first: bot.services.watch).
CPU_ONLY_GRACES = 4


def _where(scan: LogScan, phase: str | None) -> str:
    """`in PHASE`, or after which phase, or that the evidence does not show it."""
    if phase:
        return f"in {phase}"
    if scan.finished_phase:
        on = f" on all {len(scan.ranks)} ranks" if scan.ranks else ""
        return f"after {scan.finished_phase} finished{on}; the next step is not known"
    return "in a phase the evidence does not show"


def _hang_summary(c: _Case, silence: float, where: str, grace_text: str) -> str:
    """The summary of a start-up that stopped moving: how long, where, and what the GPUs, port and process say."""
    obs = c.obs
    lead = "Alive but no progress" if obs.process_alive else "No progress"
    parts = [f"{lead} for {_secs(silence)} {where} (allowed: {grace_text})"]
    if any(_is_spin(g) for g in obs.gpus or []):
        parts.append("GPUs spin at 100 % at low power, which is an NCCL spin, not work" if nccl_in_play(obs)
                     else "a kernel spins at 100 % at low power, which is a busy-wait, not work")
    held = [g for g in obs.gpus or [] if (_gpu_state(g) or "").startswith("memory held")]
    if held:
        parts.append(f"{counted(len(held), 'GPU')} {'holds' if len(held) == 1 else 'hold'} memory at ~0 % utilization")
    if obs.port_open is False:
        parts.append("the port never opened")
    if obs.process_alive is None:
        parts.append("whether the process is still alive is not known")
    return "; ".join(parts) + "."


def _cpu_only_guess(c: _Case, ev: _Ev, phase: str | None, where: str, silence: float) -> Verdict:
    """`loading`, low: past its grace, CPU time alone grows, which is work (a compile) or a busy-wait (a synchronize):
    only the ranks' stacks tell, so the first step is to take them."""
    summary = (f"Still starting ({where}): the log has been silent for {_secs(silence)}, past its grace, and only its "
               "CPU time grows, which is work (a compile, a load) or a busy-wait (a synchronize, a collective): its "
               "stacks tell which.")
    v = _verdict(c.sig, "loading", phase, ev, summary, c.obs, c.scan, confidence="low",
                 runner_up=f"silent_hang{f' in {phase}' if phase else ''}",
                 missing="is that CPU time work or a busy-wait? (`py-spy dump --pid PID` of each rank)")
    dump = ("Dump every rank's Python stack (`py-spy dump --pid PID` for each process): frames in a synchronize or a "
            "collective are a hang, frames in a compile or a weight load are progress.")
    return replace(v, next_steps=[dump, *(x for x in v.next_steps if not x.startswith("Nothing to do"))])


def _starting_rule(c: _Case) -> Verdict:
    """6. Still starting: progress or silence, judged against the phase's grace period."""
    obs, scan, sig = c.obs, c.scan, c.sig
    ev = _Ev()
    phase, threshold = _starting_phase(c, ev)
    silence = _silence(c, ev)
    progress = _progress(c, silence, threshold)
    if progress == [CPU_ONLY] and silence is not None and silence >= CPU_ONLY_GRACES * threshold:
        progress = []  # CPU time alone for this long is a busy-wait, whatever no stack can show
    where = _where(scan, phase)
    grace_text = f"{_secs(threshold)} grace for {phase}" if phase else f"{_secs(threshold)} grace (phase unknown)"
    if progress:
        for p in progress:
            ev.add(p)
        if silence is not None:
            ev.add(f"no new non-heartbeat log line for {_secs(silence)} ({grace_text})")
        summary = f"Still starting ({where}) and making progress: {'; '.join(progress)}. Slow is not hung."
        if progress == [CPU_ONLY] and silence is not None and silence >= threshold:
            return _cpu_only_guess(c, ev, phase, where, silence)
        return _verdict(sig, "loading", phase, ev, summary, obs, scan, confidence="high")
    if silence is not None and silence >= threshold:  # silence that reaches the grace period
        ev.add(f"no log progress for {_secs(silence)}, beyond the {grace_text}")
        activity = stack_activity(obs.rank_stacks, sig) if obs.cpu_time_growing else None
        if activity is not None and activity[0] == "waiting":
            ev.add(f"its CPU time grows, but its stacks show a busy-wait in `{activity[1]}`: spinning, not progress")
        if obs.log_growing and scan.heartbeats:
            ev.add("the log still grows, but only with heartbeat lines")
        return _verdict(sig, "silent_hang", phase, ev, _hang_summary(c, silence, where, grace_text), obs, scan,
                        confidence="high" if silence >= 2 * threshold else "medium",
                        runner_up=f"loading{f' in {phase}' if phase else ''} (slow, not hung)")
    if silence is not None:
        ev.add(f"last non-heartbeat log line {_secs(silence)} ago, within the {grace_text}")
        summary = f"Still starting ({where}); the log moved within the grace period."
        return _verdict(sig, "loading", phase, ev, summary, obs, scan, confidence="medium",
                        runner_up=f"silent_hang{f' in {phase}' if phase else ''}")
    if (phase or scan.finished_phase) and obs.log_growing is None and not scan.heartbeat_run:
        # the log's last line is a start-up step, after which nothing failed: a launch under way, as far as the log can
        # tell without a clock of its own (whether it still grows is the fact that would decide)
        last = scan.meaningful[-1] if scan.meaningful else scan.phase_index
        if last is not None:
            ev.add(f"the log ends in a start-up step, with no failure: `{_q(scan.lines[last])}`")
        ev.add("how long the log has been silent is not known: whether it still grows would tell a slow start-up "
               "from a hang")
        summary = f"Still starting ({where}), as far as the log shows: no failure, no heartbeat-only tail."
        at = phase or scan.finished_phase
        return _verdict(sig, "loading", at, ev, summary, obs, scan, confidence="low",
                        runner_up=f"silent_hang in {at}", missing="is the log still growing?")
    summary = (
        "Not enough evidence to decide: nothing says whether start-up is still moving (no silence duration, no trend)."
    )
    if any(_is_spin(g) for g in obs.gpus or []):
        summary += (" GPUs spin at 100 % at low power (NCCL spin)" if nccl_in_play(obs) else
                    " A kernel spins at 100 % at low power") + "; look again to see whether it lasts."
    return _verdict(sig, "unknown", phase, ev, summary, obs, scan, confidence="low",
                    runner_up=f"loading{f' in {phase}' if phase else ''}", missing="is the log still growing?")


#: The rules, in order: the first that gives a verdict decides (the last always does).
RULES: tuple[Callable[[_Case], Verdict | None], ...] = (
    _gpu_lost_rule, _leftovers_rule, _failure_rule, _stall_rule, _kernel_rule, _orphans_rule, _ended_rule,
    _stopped_rule, _completed_rule, _serving_rule, _starting_rule)


def diagnose(
    obs: Observation,
    *,
    history: Sequence[Observation] = (),
    grace_s: Mapping[str, float] | None = None,
    silence_after_s: float | None = None,
    orphan_age_s: float = 86400.0,
    gpu_free_mib: float = 1024.0,
    signatures: Signatures | None = None,
    memo: LineMemo | None = None,
) -> Verdict:
    """Diagnose one observation of a launch. Pure: no I/O, never raises for any Observation content.

    - `history`: earlier observations of the same launch, oldest first; trends the caller left None
      (`gpu_mem_rising`, `cpu_time_growing`, `progress_advancing`) are derived from the newest of them.
    - `grace_s`: per-phase seconds of log silence tolerated before `silent_hang` (merged over the defaults in
      signatures.yaml: comm_init 300, weight_loading 1800, kv_cache_alloc 600, cuda_graph_capture 300,
      warmup 600); `silence_after_s` the same when the phase is unknown (default 300).
    - `orphan_age_s`: with no launch to compare against, an engine process older than this (seconds) belongs
      to no current launch. `gpu_free_mib`: a GPU using at most this many MiB counts as free.
    - `signatures`: a compiled signature set (default: the bundled `SIGNATURES`).
    - `memo`: the launch's LineMemo (a watcher's): lines seen at its last check are not matched again. The verdict
      is the same with or without it.

    The RULES are tried in order (a lost GPU, failure signatures, orphans, an ended launch, serving, still
    starting); the first verdict wins. With `obs.rank_stacks`, a `silent_hang` also says where each rank waits
    (bot.core.diagnose.stacks). Returns a Verdict whose evidence quotes what it relied on.
    """
    sig = signatures or SIGNATURES
    obs = _with_trends(_sanitized(obs), history, sig)
    grace = dict(sig.default_grace_s)
    grace.update(obs.policy_grace_s or {})
    grace.update({k: float(v) for k, v in (grace_s or {}).items()})
    if silence_after_s is None:
        silence_after_s = obs.policy_silence_after_s
    silence_default = float(silence_after_s if silence_after_s is not None else sig.silence_after_s)
    case = _Case(obs, scan_log(obs.log_lines, sig, memo), sig, grace, silence_default, orphan_age_s, gpu_free_mib)
    for rule in RULES:
        verdict = rule(case)
        if verdict is not None:
            return verdict
    raise AssertionError("the last rule always decides")  # pragma: no cover


def format_verdict(v: Verdict) -> str:
    """Human text for a terminal: verdict and phase, summary, evidence bullets, next steps."""
    lines = [f"verdict: {v.verdict}", f"phase:   {v.phase or '-'}", f"how sure: {v.sureness}", "", v.summary, ""]
    if v.evidence:
        lines.append("evidence:")
        lines += [f"  - {e}" for e in v.evidence]
        lines.append("")
    if v.next_steps:
        lines.append("next steps:")
        lines += [f"  - {s}" for s in v.next_steps]
    return "\n".join(lines).rstrip() + "\n"
