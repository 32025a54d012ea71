"""The diagnosis engine: one `Observation` of a launch in, one `Verdict` out. Pure: no I/O.

`diagnose(obs)` decides what state a GPU inference server launch is in (`loading`, `ready`, `silent_hang`,
`crashed`, `oom`, ...; the vocabulary of `tests/fixtures/cases/README.md` and DESIGN §6), in which start-up
phase, and quotes the evidence verbatim. Every engine-specific string it knows (phase markers, progress bars,
heartbeats, failure signatures, known-benign warnings, readiness lines, next steps) is DATA in
`bot/signatures.yaml`, loaded once when this module is imported; the rules here are engine-agnostic:

- the FIRST specific failure decides the verdict, and the first failure of any kind is quoted; a watchdog
  timeout is an echo of an earlier failure, so it only decides the verdict when nothing specific came first;
- a known-benign warning is never a failure; a traceback that ends in KeyboardInterrupt is not a crash;
- slow is not hung: an advancing progress bar, rising GPU memory, growing CPU time or a new non-heartbeat log
  line within the phase's grace period is progress; repeated heartbeat lines are not;
- 100 % GPU utilization at low power with little memory is an NCCL spin, not work;
- silence is judged against a per-phase grace period (`grace_s`), not one blanket timeout.

A watcher builds one `Observation` per tick (from a probe `Snapshot`) and may pass the earlier ones as
`history`: trends it has not set itself (GPU memory rising, CPU time growing, progress counter advancing)
are then derived from them.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

import yaml

from bot.core.models import GpuProcess, GpuReading, ProcessInfo
from bot.core.parse.log import strip_control

__all__ = [
    "HEALTH_STATES",
    "PHASES",
    "SIGNATURES",
    "VERDICTS",
    "ContainerObs",
    "ListenObs",
    "LogScan",
    "Observation",
    "ShmSegment",
    "Signatures",
    "Verdict",
    "diagnose",
    "format_verdict",
    "load_signatures",
    "scan_log",
]

VERDICTS: tuple[str, ...] = (
    "loading",
    "ready",
    "silent_hang",
    "crashed",
    "oom",
    "host_oom",
    "nccl_error",
    "port_in_use",
    "cuda_error",
    "gpu_lost",
    "orphans_hold_gpu",
    "exited",
    "unknown",
)
"""Every verdict `diagnose` can return (tests/fixtures/cases/README.md)."""

PHASES: tuple[str, ...] = (
    "comm_init",
    "weight_loading",
    "kv_cache_alloc",
    "cuda_graph_capture",
    "warmup",
    "serving",
    "shutdown",
)
"""Every phase `diagnose` can return besides None (start-up order, then `shutdown`)."""

HEALTH_STATES: tuple[str, ...] = ("ok", "http_503", "refused", "timeout", "empty", "connect_timeout")
"""Values of `Observation.health`: `http_NNN` for any other HTTP status; `connect_timeout` means the TCP
connect itself timed out (a client-side path problem when the port is known to listen)."""

_MAX_LINE = 4000  # longer log lines are cut before matching (bounds regex work per line)
_QUOTE_MAX = 400  # longest quote in an evidence string, in characters


# --- observation and verdict models ---------------------------------------------------------------------


@dataclass
class ListenObs:
    """One listening socket from `netstat -tlnp` / `ss -ltnp`: address, port, owner (`1/python3`), raw line."""

    address: str
    port: int
    owner: str | None = None
    line: str = ""


@dataclass
class ShmSegment:
    """One `ipcs -m` row. `status` holds flags such as `dest` (marked for deletion); `nattch` attached processes."""

    key: str
    shmid: int | None = None
    owner: str | None = None
    size_bytes: int | None = None
    nattch: int | None = None
    status: str = ""
    line: str = ""


@dataclass
class ContainerObs:
    """One `docker ps` row: name, status (`Up 26 minutes`, `Exited (137) 2 minutes ago`), ports, raw line."""

    name: str
    status: str
    ports: str = ""
    line: str = ""


@dataclass
class Observation:
    """What one look at a launch saw. Every field is optional: None means UNKNOWN, never "empty".

    Units: seconds for `*_s`, MiB for GPU memory (in `GpuReading`). Lists of raw text lines are kept so the
    verdict can quote them verbatim.

    - `log_lines`: the server log (or its tail), oldest first.
    - `log_silent_s`: seconds since the log last grew with a line that is not a heartbeat.
    - `log_growing`: whether the log file still grows (heartbeat lines included).
    - `elapsed_s`: seconds since the launch started.
    - `process_alive`: whether the launch's main process runs; `exit_code` its exit status when it ended
      (shell convention: 137 = killed by SIGKILL; negative = killed by that signal, as Python reports it).
    - `processes`: `ps` rows (GPU holders and the launch's tree); `process_lines` the raw row text per PID.
    - `launch_pids`: PIDs that belong to the launch (a watcher knows them; bundles do not).
    - `cpu_time_growing`: whether the launch's CPU time grew since the previous look.
    - `gpus`: per-GPU readings; `gpu_lines` the raw `nvidia-smi` text per GPU index; `gpu_processes` the
      compute processes; `gpu_error_lines` error text nvidia-smi printed instead of (or besides) readings.
    - `gpu_mem_rising`: whether GPU memory in use went up between samples.
    - `progress_advancing`: whether a progress counter (`74/163`) advanced since the previous look.
    - `port`: the server's HTTP port; `port_open` whether it listens; `listening` all listening sockets.
    - `health`: the result of a local probe of `/health` or `/v1/models` (see HEALTH_STATES);
      `probe_lines` the raw text of a probe (commands and what they printed), judged when `health` is None.
    - `dmesg_lines`, `stack_lines` (`/proc/PID/stack`), `shm_segments` (`ipcs -m`), `containers`
      (`docker ps`): host evidence.
    - `notes`: problems met while collecting (an unreadable file, bad JSON), shown with the evidence.
    """

    log_lines: list[str] | None = None
    log_silent_s: float | None = None
    log_growing: bool | None = None
    elapsed_s: float | None = None
    process_alive: bool | None = None
    exit_code: int | None = None
    processes: list[ProcessInfo] | None = None
    process_lines: dict[int, str] = field(default_factory=dict)
    launch_pids: set[int] | None = None
    cpu_time_growing: bool | None = None
    gpus: list[GpuReading] | None = None
    gpu_lines: dict[int, str] = field(default_factory=dict)
    gpu_processes: list[GpuProcess] | None = None
    gpu_error_lines: list[str] | None = None
    gpu_mem_rising: bool | None = None
    progress_advancing: bool | None = None
    port: int | None = None
    port_open: bool | None = None
    listening: list[ListenObs] | None = None
    health: str | None = None
    probe_lines: list[str] | None = None
    dmesg_lines: list[str] | None = None
    stack_lines: list[str] | None = None
    shm_segments: list[ShmSegment] | None = None
    containers: list[ContainerObs] | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    """The diagnosis: `verdict` (one of VERDICTS), `phase` (one of PHASES, or None when the evidence cannot
    pin it down), `evidence` (strings that quote log lines, GPU rows, process rows, port and probe results
    verbatim in backticks), `next_steps` (what to do) and a one-paragraph `summary`."""

    verdict: str
    phase: str | None
    evidence: list[str]
    next_steps: list[str]
    summary: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with keys verdict, phase, summary, evidence, next_steps."""
        return {
            "verdict": self.verdict,
            "phase": self.phase,
            "summary": self.summary,
            "evidence": list(self.evidence),
            "next_steps": list(self.next_steps),
        }


# --- signatures -------------------------------------------------------------------------------------------

_FAILURE_KINDS = ("gpu_lost", "host_oom", "oom", "nccl_error", "port_in_use", "cuda_error", "crashed")
_MARKER_KINDS = ("begin", "progress", "end")


@dataclass(frozen=True)
class _Pat:
    """One compiled signature with its attributes from signatures.yaml."""

    regex: re.Pattern[str]
    engine: str
    phase: str | None = None
    marker: str | None = None
    echo: bool = False
    grace_s: float | None = None
    next_re: re.Pattern[str] | None = None


class _Group:
    """Several patterns searched as one: a joined alternation answers "any match?" fast; `first` finds which."""

    def __init__(self, pats: Sequence[_Pat]):
        self.pats = list(pats)
        joinable = [p.regex.pattern for p in self.pats if not p.regex.groupindex]
        self._any = re.compile("|".join(f"(?:{s})" for s in joinable)) if len(joinable) == len(self.pats) else None

    def first(self, line: str) -> _Pat | None:
        """The first pattern (in file order) found in `line`, or None."""
        if not self.pats or (self._any is not None and not self._any.search(line)):
            return None
        for p in self.pats:
            if p.regex.search(line):
                return p
        return None

    def all(self, line: str) -> list[_Pat]:
        """Every pattern found in `line`, in file order."""
        if not self.pats or (self._any is not None and not self._any.search(line)):
            return []
        return [p for p in self.pats if p.regex.search(line)]


@dataclass
class Signatures:
    """signatures.yaml, compiled. Build it with `load_signatures`; the default set is `SIGNATURES`."""

    phase_order: tuple[str, ...]
    default_grace_s: dict[str, float]
    silence_after_s: float
    engines: dict[str, str]  # name -> versions text
    detect: dict[str, _Group]
    processes: _Group
    run_start: _Group
    markers: dict[str, _Group]  # engine -> begin/progress/end markers of every phase
    ready: dict[str, _Group]
    heartbeat: _Group
    benign: _Group
    failures: dict[str, _Group]  # kind -> patterns of every engine
    killed: _Group
    context: dict[str, _Group]
    ranks: list[re.Pattern[str]]
    progress_counter: re.Pattern[str]
    progress_generic: _Group
    benign_exceptions: _Group
    exception_line: re.Pattern[str]
    shutdown: _Group
    next_steps: dict[str, list[str]]


def _compile(spec: Any, where: str, engine: str, **attrs: Any) -> _Pat:
    """Compile one entry: a regex string, or a mapping {re, phase, echo, grace_s, next}."""
    extra: dict[str, Any] = {}
    if isinstance(spec, Mapping):
        text = spec.get("re")
        if "phase" in spec:
            extra["phase"] = spec["phase"]
        if spec.get("echo"):
            extra["echo"] = True
        if spec.get("grace_s") is not None:
            extra["grace_s"] = float(spec["grace_s"])
        if spec.get("next"):
            extra["next_re"] = re.compile(str(spec["next"]))
    else:
        text = spec
    if not isinstance(text, str) or not text:
        raise ValueError(f"signatures: {where}: expected a regex string, got {spec!r}")
    try:
        regex = re.compile(text)
    except re.error as e:
        raise ValueError(f"signatures: {where}: bad regex {text!r}: {e}") from e
    return _Pat(regex=regex, engine=engine, **{**attrs, **extra})


def _pats(specs: Any, where: str, engine: str, **attrs: Any) -> list[_Pat]:
    if specs is None:
        return []
    if not isinstance(specs, list):
        raise ValueError(f"signatures: {where}: expected a list")
    return [_compile(s, f"{where}[{i}]", engine, **attrs) for i, s in enumerate(specs)]


def load_signatures(text: str | None = None) -> Signatures:
    """Compile signatures from YAML `text`, or from the bundled `bot/signatures.yaml` when None.

    Raises ValueError naming the entry (`engines.vllm.phases.comm_init.begin[2]`) for a bad regex, an unknown
    phase or verdict, or a malformed section.
    """
    if text is None:
        text = resources.files("bot.core").joinpath("signatures.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, Mapping):
        raise ValueError("signatures: top level must be a mapping")
    order = tuple(data.get("phase_order") or PHASES[:-1])
    for p in order:
        if p not in PHASES:
            raise ValueError(f"signatures: phase_order: unknown phase {p!r}")
    engines_data = data.get("engines") or {}
    if not isinstance(engines_data, Mapping) or not engines_data:
        raise ValueError("signatures: engines: expected a non-empty mapping")
    engines: dict[str, str] = {}
    detect: dict[str, _Group] = {}
    markers: dict[str, _Group] = {}
    ready: dict[str, _Group] = {}
    processes: list[_Pat] = []
    run_start: list[_Pat] = []
    heartbeat: list[_Pat] = []
    benign: list[_Pat] = []
    failures: dict[str, list[_Pat]] = {k: [] for k in _FAILURE_KINDS}
    for name, eng in engines_data.items():
        if not isinstance(eng, Mapping):
            raise ValueError(f"signatures: engines.{name}: expected a mapping")
        where = f"engines.{name}"
        engines[name] = str(eng.get("versions") or "")
        detect[name] = _Group(_pats(eng.get("detect"), f"{where}.detect", name))
        processes += _pats(eng.get("processes"), f"{where}.processes", name)
        run_start += _pats(eng.get("run_start"), f"{where}.run_start", name)
        heartbeat += _pats(eng.get("heartbeat"), f"{where}.heartbeat", name)
        benign += _pats(eng.get("benign"), f"{where}.benign", name)
        ready[name] = _Group(_pats(eng.get("ready"), f"{where}.ready", name))
        mk: list[_Pat] = []
        for phase, kinds in (eng.get("phases") or {}).items():
            if phase not in order:
                raise ValueError(f"signatures: {where}.phases: unknown phase {phase!r}")
            for kind, specs in (kinds or {}).items():
                if kind not in _MARKER_KINDS:
                    raise ValueError(f"signatures: {where}.phases.{phase}: unknown marker kind {kind!r}")
                mk += _pats(specs, f"{where}.phases.{phase}.{kind}", name, phase=phase, marker=kind)
        markers[name] = _Group(mk)
        for kind, specs in (eng.get("failures") or {}).items():
            if kind not in failures:
                raise ValueError(f"signatures: {where}.failures: unknown verdict {kind!r}")
            pats = _pats(specs, f"{where}.failures.{kind}", name)
            for p in pats:
                if p.phase is not None and p.phase not in order:
                    raise ValueError(f"signatures: {where}.failures.{kind}: unknown phase {p.phase!r}")
            failures[kind] += pats
    grace = {str(k): float(v) for k, v in (data.get("default_grace_s") or {}).items()}
    context = {str(k): _Group(_pats(v, f"context.{k}", "generic")) for k, v in (data.get("context") or {}).items()}
    steps = {str(k): [str(s) for s in (v or [])] for k, v in (data.get("next_steps") or {}).items()}
    return Signatures(
        phase_order=order,
        default_grace_s=grace,
        silence_after_s=float(data.get("silence_after_s") or 300.0),
        engines=engines,
        detect=detect,
        processes=_Group(processes),
        run_start=_Group(run_start),
        markers=markers,
        ready=ready,
        heartbeat=_Group(heartbeat),
        benign=_Group(benign),
        failures={k: _Group(v) for k, v in failures.items()},
        killed=_Group(_pats(data.get("killed"), "killed", "generic")),
        context=context,
        ranks=[p.regex for p in _pats(data.get("ranks"), "ranks", "generic")],
        progress_counter=re.compile(str(data.get("progress_counter") or r"(?P<done>\d+)/(?P<total>\d+) \[")),
        progress_generic=_Group(_pats(data.get("progress_generic"), "progress_generic", "generic")),
        benign_exceptions=_Group(_pats(data.get("benign_exceptions"), "benign_exceptions", "generic")),
        exception_line=re.compile(str(data.get("exception_line") or r"^(\w+Error): ")),
        shutdown=_Group(_pats(data.get("shutdown"), "shutdown", "generic")),
        next_steps=steps,
    )


SIGNATURES: Signatures = load_signatures()
"""The bundled signature set (bot/signatures.yaml), compiled once at import."""


# --- log scan ---------------------------------------------------------------------------------------------


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


def scan_log(lines: Sequence[str] | None, sig: Signatures = SIGNATURES) -> LogScan:
    """Classify every line of a server log against the signatures. Pure; never raises for any text.

    Only the last run is judged: scanning starts at the last run-start line (`server_args=ServerArgs(`,
    `vLLM API server version`, ...) so a crash-loop's earlier attempts do not count.
    """
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
        if best is not None and best.phase is not None:
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
        if any(group.first(line) for group in ready_groups):
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
    for j in range(start + 1, stop):
        if _FRAME_RE.search(scan.lines[j]):
            frame = j
    if frame is None:
        return None
    parts = [f"`{_q(scan.lines[frame])}`"]
    code = frame + 1
    if code < len(scan.lines) and code != end and scan.lines[code].strip() and not _FRAME_RE.search(scan.lines[code]):
        parts.append(f"`{_q(scan.lines[code])}`")
    if end is not None:
        parts.append(f"`{_q(scan.lines[end])}`")
    return "traceback, last frame: " + " → ".join(parts)


# --- helpers ----------------------------------------------------------------------------------------------


def _q(text: str, limit: int = _QUOTE_MAX) -> str:
    """Text for a quote: stripped; an over-long line keeps its head and tail around " … "."""
    s = text.strip()
    if len(s) <= limit:
        return s
    head = (limit * 2) // 3
    return s[:head] + " … " + s[-(limit - head - 3) :]


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


def _gpu_state(g: GpuReading) -> str | None:
    """Interpretation of one GPU reading: spin, idle with memory held, context only, working."""
    used, total, util = g.memory_used_mib, g.memory_total_mib, g.utilization_gpu_pct
    mem_frac = used / total if used is not None and total else None
    power_frac = g.power_draw_w / g.power_limit_w if g.power_draw_w is not None and g.power_limit_w else None
    if util is not None and util >= 50 and power_frac is not None and power_frac > 0.45:
        return f"computing: {util:.0f} % util at {g.power_draw_w:.0f} W of {g.power_limit_w:.0f} W"
    if util is not None and util >= 95:
        low = "low power" if power_frac is not None else "power unknown"
        if mem_frac is not None and mem_frac <= 0.2:
            return f"NCCL spin: {util:.0f} % util at {low} with little memory is a spinning kernel, not work"
        return f"spinning: {util:.0f} % util at {low} is a busy-wait, not compute"
    if util is not None and util <= 5:
        if mem_frac is not None and mem_frac >= 0.5:
            return "memory held while idle (weights on the GPU, nothing running)"
        if used is not None and used <= 2048:
            return "only a CUDA context, nothing loaded and nothing running"
        return "idle"
    return None


def _is_spin(g: GpuReading) -> bool:
    state = _gpu_state(g)
    return state is not None and state.startswith("NCCL spin")


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


# --- trends from history ----------------------------------------------------------------------------------


def _finite(x: Any) -> float | None:
    """A finite, non-negative float, else None (NaN, inf, negative and non-numbers mean unknown)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) and x >= 0 else None


def _sanitized(obs: Observation) -> Observation:
    """The observation with unusable numbers (NaN, inf, negative durations) turned into None."""
    changes = {k: _finite(getattr(obs, k)) for k in ("log_silent_s", "elapsed_s") if getattr(obs, k) is not None}
    changes = {k: v for k, v in changes.items() if v != getattr(obs, k)}
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
        grew = [
            p.cpu_time_s > before_cpu[p.pid] for p in obs.processes if p.cpu_time_s is not None and p.pid in before_cpu
        ]
        if grew:
            changes["cpu_time_growing"] = any(grew)
    if obs.progress_advancing is None and obs.log_lines and prev.log_lines:
        now_p = [p for p in scan_log(obs.log_lines, sig).progress if p.done is not None]
        before_p = [p for p in scan_log(prev.log_lines, sig).progress if p.done is not None]
        if now_p and before_p:
            a, b = now_p[-1], before_p[-1]
            changes["progress_advancing"] = a.label != b.label or (a.done or 0) > (b.done or 0)
    return replace(obs, **changes) if changes else obs


# --- the diagnosis ----------------------------------------------------------------------------------------


def _steps(sig: Signatures, verdict: str, phase: str | None) -> list[str]:
    steps = list(sig.next_steps.get(verdict, []))
    if phase:
        steps += [s for s in sig.next_steps.get(f"{verdict}.{phase}", []) if s not in steps]
    return steps


def _phase_evidence(ev: _Ev, scan: LogScan) -> None:
    """Quote the newest phase marker and the newest progress lines."""
    if scan.phase_index is not None:
        label = scan.phase or f"{scan.finished_phase} finished"
        if scan.finished_phase and scan.ranks:
            label += f" on all {len(scan.ranks)} ranks"
        ev.add(f"last start-up line ({label}): `{_q(scan.lines[scan.phase_index])}`")
    seen: list[str] = []
    for p in reversed(scan.progress):
        text = p.line.strip()
        if text in seen or p.index == scan.phase_index:
            continue
        seen.append(text)
        if len(seen) > 2:
            break
    for text in reversed(seen[:2]):
        ev.add(f"progress line: `{_q(text)}`")


def _log_tail_evidence(ev: _Ev, scan: LogScan) -> None:
    """Heartbeats, benign warnings and the last meaningful lines."""
    if scan.heartbeats:
        last = scan.lines[scan.heartbeats[-1]]
        ev.add(f"heartbeat line repeated {len(scan.heartbeats)}× (a heartbeat is not progress): `{_q(last)}`")
    if scan.benign:
        ev.add(
            f"{len(scan.benign)} known-benign warning line(s) ignored (not a failure, not progress), e.g. "
            f"`{_q(scan.lines[scan.benign[-1]])}`"
        )
    tail = scan.meaningful[-3:]
    if tail:
        ev.add("log ends with: " + " / ".join(f"`{_q(scan.lines[i])}`" for i in tail))


def _process_evidence(ev: _Ev, obs: Observation, sig: Signatures) -> None:
    if obs.process_alive is not None:
        ev.add(f"launch process alive: {'yes' if obs.process_alive else 'no'}")
    if obs.exit_code is not None:
        ev.add(f"exit status: {obs.exit_code}")
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
    ev.add(f"{len(procs)} process(es) listed, states {state_text}{cpu_text}")
    shown = sorted(procs, key=lambda p: (not _is_engine_process(p, sig), procs.index(p)))[:4]
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
        ev.add(f"{len(stuck)} process(es) in state D (uninterruptible, often stuck in the driver)")


def _gpu_evidence(ev: _Ev, obs: Observation) -> None:
    for line in obs.gpu_error_lines or []:
        ev.add(f"nvidia-smi: `{_q(line)}`")
    gpus = obs.gpus or []
    for g in gpus[:8]:
        raw = obs.gpu_lines.get(g.index)
        if raw and ev.quotes(raw):
            continue
        text = (
            f"`{_q(raw, 300)}`"
            if raw
            else f"{_fmt_num(g.memory_used_mib, 'MiB')} / {_fmt_num(g.memory_total_mib, 'MiB')}, "
            f"{_fmt_num(g.utilization_gpu_pct, '%')} util, {_fmt_num(g.power_draw_w, 'W')}"
        )
        state = _gpu_state(g)
        ev.add(f"GPU {g.index}: {text}" + (f" → {state}" if state else ""))
    if len(gpus) > 8:
        ev.add(f"... and {len(gpus) - 8} more GPU(s)")


def _port_evidence(ev: _Ev, obs: Observation) -> None:
    port = f"port {obs.port}" if obs.port is not None else "the server port"
    if obs.port_open is True:
        ev.add(f"{port} is listening")
    elif obs.port_open is False:
        ev.add(f"{port} is not listening")
    shown = 0
    for s in obs.listening or []:
        if shown >= 6:
            break
        if obs.port is None or s.port == obs.port or obs.port_open is False:
            text = s.line or f"{s.address}:{s.port} {s.owner or ''}"
            ev.add(f"listening socket: `{_q(text)}`")
            shown += 1
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


def _verdict(
    sig: Signatures, verdict: str, phase: str | None, ev: _Ev, summary: str, obs: Observation, scan: LogScan
) -> Verdict:
    _context_evidence(ev, obs, scan, sig)
    steps = _steps(sig, verdict, phase)
    return Verdict(verdict=verdict, phase=phase, evidence=ev.items, next_steps=steps, summary=summary)


_KIND_LABEL = {
    "gpu_lost": "GPU lost",
    "host_oom": "host out of memory",
    "oom": "CUDA out of memory",
    "nccl_error": "NCCL error",
    "port_in_use": "address in use",
    "cuda_error": "CUDA error",
    "crashed": "error",
    "killed": "killed",
}


def _failure_verdict(obs: Observation, scan: LogScan, sig: Signatures) -> Verdict | None:
    """The verdict from failure signatures in the log (and OOM kills in dmesg), or None."""
    hits = list(scan.failures)
    alive = obs.process_alive
    dmesg_oom = (
        [line for line in (obs.dmesg_lines or []) if sig.failures["host_oom"].first(line)] if alive is not True else []
    )
    specific = [h for h in hits if h.kind != "crashed" and not h.echo and h.kind != "gpu_lost"]
    echoes = [h for h in hits if h.echo]
    generic = [h for h in hits if h.kind == "crashed"]
    if alive is True and not specific and not echoes and generic:
        # a survived error: the run went on (new phase, progress or readiness line after it)
        later = [i for i in [*scan.ready, *(p.index for p in scan.progress)] if i > generic[-1].index]
        if scan.phase_index is not None and scan.phase_index > generic[-1].index:
            later.append(scan.phase_index)
        if later:
            generic = []
    root: _Hit | None = None
    kind: str | None = None
    if specific:
        root = specific[0]
        kind = root.kind
    elif dmesg_oom:
        kind = "host_oom"
    elif echoes:
        root = echoes[0]
        kind = root.kind
    elif generic:
        root = generic[0]
        kind = "crashed"
    elif obs.exit_code is not None and obs.exit_code not in (0,) and alive is not True:
        kind = "killed" if obs.exit_code in (137, -9) else "crashed"
    if kind is None:
        return None
    ev = _Ev()
    how = ""
    if kind == "killed":
        if dmesg_oom or obs.dmesg_lines is None:
            kind = "host_oom"
            how = (
                " (confirmed by dmesg)"
                if dmesg_oom
                else " (killed by SIGKILL, the kernel OOM killer's signal; no dmesg to confirm)"
            )
        else:
            kind = "crashed"
            how = " (killed by SIGKILL, but dmesg shows no OOM kill: someone or something else killed it)"
    first = hits[0] if hits else None
    if first is not None and root is not None and first.index < root.index:
        ev.add(f"first failure (log line {first.index + 1}): `{_q(first.line)}`")
    if root is not None:
        ev.add(f"{_KIND_LABEL.get(root.kind, root.kind)} (log line {root.index + 1}): `{_q(root.line)}`")
    same = [
        h
        for h in hits
        if h.kind == (root.kind if root else kind)
        and h is not root
        and h is not first
        and (root is None or h.echo == root.echo)
        and "Traceback (most recent call last)" not in h.line
    ]
    shown: set[str] = {root.line.strip()} if root else set()
    for h in same:
        if len(shown) >= 3:
            break
        if h.line.strip() not in shown:
            shown.add(h.line.strip())
            ev.add(f"also (log line {h.index + 1}): `{_q(h.line)}`")
    for anchor in [h for h in (first, root) if h is not None]:
        ev.add(_traceback_summary(scan, anchor.index, sig))
    if root is not None and not root.echo:
        later_echo = [h for h in echoes if h.index > root.index]
        if later_echo:
            ev.add(f"later echo of it (not the cause): `{_q(later_echo[0].line)}`")
    elif root is not None and root.echo and first is not None and first is not root:
        ev.add("the watchdog timeout is an echo: the first failure above is the likely cause")
    for i in [i for i in scan.context.get(kind, []) if not ev.quotes(scan.lines[i])][:2]:
        ev.add(f"context: `{_q(scan.lines[i])}`")
    for line in dmesg_oom[:2]:
        ev.add(f"dmesg: `{_q(line)}`")
    killed_hits = [h for h in hits if h.kind == "killed"]
    if killed_hits and kind in ("host_oom", "crashed"):
        ev.add(f"killed (log line {killed_hits[0].index + 1}): `{_q(killed_hits[0].line)}`")
    phase = scan.phase
    if phase is None and scan.phase_index is None:
        implied = [h.phase for h in hits if h.phase and (h.kind == kind or root is None)]
        phase = implied[0] if implied else None
    where = f" during {phase}" if phase else ""
    label = {
        "host_oom": "Killed by the kernel OOM killer (host RAM)",
        "oom": "GPU memory exhausted (CUDA out of memory)",
        "nccl_error": "NCCL / collective failure",
        "port_in_use": "A bind failed: the address is already in use",
        "cuda_error": "CUDA runtime error",
        "crashed": "Crashed with an error",
    }[kind]
    quote = root.line.strip() if root else (dmesg_oom[0].strip() if dmesg_oom else "")
    summary = f"{label}{where}{how}."
    if quote:
        summary += f" {'First' if root is first or first is None else 'Decisive'} failure: `{_q(quote, 200)}`."
    if root is not None and root.echo and first is not None and first is not root:
        summary += f" It follows an earlier failure: `{_q(first.line, 200)}`."
    return _verdict(sig, kind, phase, ev, summary, obs, scan)


def _orphans(obs: Observation, scan: LogScan, sig: Signatures, orphan_age_s: float, gpu_free_mib: float) -> _Ev:
    """Evidence that GPUs are held by processes no live launch owns (empty when there is none)."""
    ev = _Ev()
    dead = obs.process_alive is False
    if obs.launch_pids is not None and obs.gpu_processes:
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
                    f"({gp.process_name or '?'}, {_fmt_num(gp.used_memory_mib, 'MiB')}), not part of this launch"
                )
    if dead:
        for g in obs.gpus or []:
            if g.memory_used_mib is not None and g.memory_used_mib > gpu_free_mib:
                raw = obs.gpu_lines.get(g.index)
                state = _gpu_state(g)
                ev.add(
                    f"GPU {g.index} still holds {g.memory_used_mib:.0f} MiB although the launch's process is gone: "
                    + (f"`{_q(raw, 300)}`" if raw else f"{_fmt_num(g.utilization_gpu_pct, '%')} util")
                    + (f" → {state}" if state else "")
                )
        for seg in obs.shm_segments or []:
            if "dest" in seg.status and (seg.nattch or 0) > 0:
                ev.add(
                    f"shared memory segment deleted by its owner but still attached by {seg.nattch} process(es) "
                    f"(leftover workers still alive): `{_q(seg.line)}`"
                )
    procs = obs.processes or []
    host_only = obs.log_lines is None and obs.process_alive is None
    for p in procs:
        if not _is_engine_process(p, sig) or p.state in ("Z", "X"):
            continue
        age = p.elapsed_s
        stale = False
        why = ""
        if dead:
            stale, why = True, "still running although the launch ended"
        elif age is not None and obs.elapsed_s is not None and age > obs.elapsed_s + 120:
            stale, why = True, f"running for {_secs(age)}, longer than the launch ({_secs(obs.elapsed_s)})"
        elif age is not None and host_only and age > orphan_age_s:
            stale, why = True, f"running for {_secs(age)}, far longer than any launch"
        if stale:
            raw = obs.process_lines.get(p.pid)
            parent = f", parent {p.ppid}" if p.ppid is not None else ""
            ev.add(
                f"engine process {p.pid}{parent}, state `{p.stat or '?'}`, "
                f"{p.pcpu if p.pcpu is not None else '?'} % CPU, {why}: `{_q(raw or p.args, 300)}`"
            )
    return ev


def diagnose(
    obs: Observation,
    *,
    history: Sequence[Observation] = (),
    grace_s: Mapping[str, float] | None = None,
    silence_after_s: float | None = None,
    orphan_age_s: float = 86400.0,
    gpu_free_mib: float = 1024.0,
    signatures: Signatures | None = None,
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

    Returns a Verdict whose evidence quotes what it relied on.
    """
    sig = signatures or SIGNATURES
    obs = _sanitized(obs)
    obs = _with_trends(obs, history, sig)
    grace = dict(sig.default_grace_s)
    grace.update({k: float(v) for k, v in (grace_s or {}).items()})
    silence_default = float(silence_after_s if silence_after_s is not None else sig.silence_after_s)
    scan = scan_log(obs.log_lines, sig)

    # 1. a lost GPU explains everything that follows
    lost = [f"nvidia-smi: `{_q(line)}`" for line in obs.gpu_error_lines or [] if sig.failures["gpu_lost"].first(line)]
    lost += [f"dmesg: `{_q(line)}`" for line in obs.dmesg_lines or [] if sig.failures["gpu_lost"].first(line)]
    lost += [f"log line {h.index + 1}: `{_q(h.line)}`" for h in scan.failures if h.kind == "gpu_lost"]
    if lost:
        ev = _Ev()
        for item in lost[:4]:
            ev.add(item)
        summary = (
            f"A GPU or NVML is unreachable: {lost[0]}. The engine cannot recover from this; "
            "the host needs a GPU reset or reboot."
        )
        return _verdict(sig, "gpu_lost", scan.phase, ev, summary, obs, scan)

    # 2. failure signatures: the first specific one decides
    failed = _failure_verdict(obs, scan, sig)
    if failed is not None:
        return failed

    # 3. GPUs held by processes no live launch owns
    orphan_ev = _orphans(obs, scan, sig, orphan_age_s, gpu_free_mib)
    if orphan_ev.items:
        phase = "shutdown" if obs.process_alive is False else None
        n = len(orphan_ev.items)
        summary = (
            f"GPU resources are held by processes that no live launch owns ({n} finding(s))"
            + (", left over from stopping the launch" if phase == "shutdown" else "")
            + f": {orphan_ev.items[0]}"
        )
        return _verdict(sig, "orphans_hold_gpu", phase, orphan_ev, summary, obs, scan)

    # 4. the launch has ended without a failure signature
    if obs.process_alive is False:
        ev = _Ev()
        if obs.exit_code == 0 or scan.shutdown:
            if scan.shutdown:
                ev.add(f"shutdown line: `{_q(scan.lines[scan.shutdown[-1]])}`")
            summary = "The launch ended without an error: " + (
                "it exited with status 0." if obs.exit_code == 0 else "the log shows it shutting down."
            )
            return _verdict(sig, "exited", "shutdown", ev, summary, obs, scan)
        summary = (
            "The launch's process is gone, but neither the log nor the host evidence says why "
            "(no error, no shutdown line, no exit status)."
        )
        return _verdict(sig, "unknown", scan.phase, ev, summary, obs, scan)

    # 5. serving?
    health = obs.health
    health_line = None
    if health is None:
        health, health_line = _probe_status(obs.probe_lines)
    ready_line = scan.lines[scan.ready[-1]] if scan.ready else None
    if health == "ok" or (
        health in (None, "connect_timeout")
        and (obs.port_open is True or (ready_line is not None and obs.port_open is not False))
    ):
        ev = _Ev()
        if ready_line:
            ev.add(f"readiness line: `{_q(ready_line)}`")
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
        return _verdict(sig, "ready", "serving", ev, summary, obs, scan)
    if obs.port_open is True and health in ("timeout", "empty"):
        ev = _Ev()
        summary = f"The port listens but the API does not answer (health probe: {health}): the API process is wedged."
        return _verdict(sig, "silent_hang", "serving", ev, summary, obs, scan)

    # 6. still starting: progress or silence, judged against the phase's grace period
    ev = _Ev()
    phase = scan.phase
    spin = [g for g in obs.gpus or [] if _is_spin(g)]
    if phase is None and scan.finished_phase is None and scan.phase_index is None and spin:
        phase = "comm_init"
        ev.add(f"{len(spin)} GPU(s) spin at 100 % with little memory: a collective that never completes (NCCL init)")
    if obs.port_open is True and health is not None and health.startswith("http_5"):
        phase = phase or "warmup"
    threshold = grace.get(phase, silence_default) if phase else silence_default
    if scan.phase_grace_s is not None and scan.phase == phase:
        threshold = max(threshold, scan.phase_grace_s)
    silence = obs.log_silent_s
    if silence is None and obs.log_growing is not False and scan.heartbeat_run and scan.heartbeat_span_s is not None:
        silence = scan.heartbeat_span_s
        ev.add(f"the log ends with {scan.heartbeat_run} heartbeat line(s) spanning {_secs(silence)} with no other line")
    progress: list[str] = []
    if obs.gpu_mem_rising:
        progress.append("GPU memory in use is rising between samples")
    if obs.progress_advancing:
        progress.append("a progress counter advanced since the previous look")
    if obs.cpu_time_growing:
        progress.append("the launch's CPU time is growing")
    computing = [g for g in obs.gpus or [] if (_gpu_state(g) or "").startswith("computing")]
    if computing:
        progress.append(f"{len(computing)} GPU(s) are computing (high utilization at high power draw)")
    if silence is None and obs.log_growing and scan.heartbeat_run == 0:
        progress.append("the log is still growing with lines that are not heartbeats")
    if scan.progress_advancing and (silence is None or silence <= threshold) and obs.log_growing is not False:
        progress.append("a progress bar advances in the log")
    if phase:
        where = f"in {phase}"
    elif scan.finished_phase:
        on = f" on all {len(scan.ranks)} ranks" if scan.ranks else ""
        where = f"after {scan.finished_phase} finished{on}; the next step is not known"
    else:
        where = "in a phase the evidence does not show"
    grace_text = f"{_secs(threshold)} grace for {phase}" if phase else f"{_secs(threshold)} grace (phase unknown)"
    if progress:
        for p in progress:
            ev.add(p)
        if silence is not None:
            ev.add(f"no new non-heartbeat log line for {_secs(silence)} ({grace_text})")
        summary = f"Still starting ({where}) and making progress: {'; '.join(progress)}. Slow is not hung."
        return _verdict(sig, "loading", phase, ev, summary, obs, scan)
    if silence is not None and silence > threshold:
        ev.add(f"no log progress for {_secs(silence)}, beyond the {grace_text}")
        if obs.log_growing and scan.heartbeats:
            ev.add("the log still grows, but only with heartbeat lines")
        parts = [f"Alive but no progress for {_secs(silence)} {where} (allowed: {grace_text})"]
        if spin:
            parts.append("GPUs spin at 100 % at low power, which is an NCCL spin, not work")
        held = [g for g in obs.gpus or [] if (_gpu_state(g) or "").startswith("memory held")]
        if held:
            parts.append(f"{len(held)} GPU(s) hold memory at ~0 % utilization")
        if obs.port_open is False:
            parts.append("the port never opened")
        if obs.process_alive is None:
            parts.append("whether the process is still alive is not known")
        return _verdict(sig, "silent_hang", phase, ev, "; ".join(parts) + ".", obs, scan)
    if silence is not None:
        ev.add(f"last non-heartbeat log line {_secs(silence)} ago, within the {grace_text}")
        summary = f"Still starting ({where}); the log moved within the grace period."
        return _verdict(sig, "loading", phase, ev, summary, obs, scan)
    summary = (
        "Not enough evidence to decide: nothing says whether start-up is still moving (no silence duration, no trend)."
    )
    if spin:
        summary += " GPUs spin at 100 % at low power (NCCL spin); look again to see whether it lasts."
    return _verdict(sig, "unknown", phase, ev, summary, obs, scan)


def format_verdict(v: Verdict) -> str:
    """Human text for a terminal: verdict and phase, summary, evidence bullets, next steps."""
    lines = [f"verdict: {v.verdict}", f"phase:   {v.phase or '-'}", "", v.summary, ""]
    if v.evidence:
        lines.append("evidence:")
        lines += [f"  - {e}" for e in v.evidence]
        lines.append("")
    if v.next_steps:
        lines.append("next steps:")
        lines += [f"  - {s}" for s in v.next_steps]
    return "\n".join(lines).rstrip() + "\n"
