"""The compiled signature model and its loader: `bot/core/diagnose/signatures.yaml` -> `Signatures`.

Every engine-specific string the engine knows (phase markers, progress bars, heartbeats, failure signatures,
known-benign warnings, readiness lines, next steps) is DATA in signatures.yaml; `load_signatures` compiles it
(and names the entry of any bad regex, unknown phase or verdict). The bundled set, `SIGNATURES`, is read with
importlib.resources and compiled once, when this module is imported: the only I/O in the package.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

try:  # libyaml's safe loader where PyYAML was built with it: about 10x faster, the same data out
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # pragma: no cover (PyYAML without libyaml)
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]

from bot.core.commands import markup
from bot.core.diagnose.observation import PHASES
from bot.core.literals import KeywordIndex

__all__ = ["SIGNATURES", "Signatures", "load_signatures"]

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
    """Several patterns searched as one. Only the patterns the signature set's keyword index (bot.core.literals:
    the literals each pattern's matches must contain, one Aho-Corasick pass per line, shared by every group) says
    can match a line are searched; `first` finds the first that does, `all` every one."""

    def __init__(self, pats: Sequence[_Pat]):
        self.pats = list(pats)
        self._index: KeywordIndex | None = None
        self._position: dict[int, int] = {}
        self._by_ids: dict[frozenset[int], list[_Pat]] = {}
        self._keys: frozenset[int] = frozenset()

    def indexed(self, index: KeywordIndex, keys: list[int]) -> None:
        """Use `index` (of the whole signature set), in which this group's patterns are `keys`."""
        self._index, self._position = index, {k: i for i, k in enumerate(keys)}
        self._keys = frozenset(keys)

    def _candidates(self, line: str) -> Sequence[_Pat]:
        """This group's patterns that can match `line`, in file order (worked out once per set of candidates: lines
        with the same keywords share it; most lines hold none of a group's keywords)."""
        if self._index is None:
            return self.pats
        ids = self._index.candidates(line)
        if self._keys.isdisjoint(ids):
            return ()
        done = self._by_ids.get(ids)
        if done is None:
            position = self._position
            done = [self.pats[i] for i in sorted(position[k] for k in ids if k in position)]
            if len(self._by_ids) >= 4096:
                self._by_ids.clear()
            self._by_ids[ids] = done
        return done

    def first(self, line: str) -> _Pat | None:
        """The first pattern (in file order) found in `line`, or None."""
        if not self.pats or (self._index is not None and self._keys.isdisjoint(self._index.candidates(line))):
            return None  # most lines hold none of the group's keywords: no search at all
        for p in self._candidates(line):
            if p.regex.search(line):
                return p
        return None

    def all(self, line: str) -> list[_Pat]:
        """Every pattern found in `line`, in file order."""
        if not self.pats or (self._index is not None and self._keys.isdisjoint(self._index.candidates(line))):
            return []
        return [p for p in self._candidates(line) if p.regex.search(line)]


def found_in(groups: Mapping[str, _Group], line: str) -> tuple[str, ...]:
    """The names of `groups` (a set's groups by engine or kind) one of whose patterns is found in `line`, in their
    order: the keyword index is asked once for all of them, and a group none of whose keywords the line holds is
    skipped without a search."""
    out: list[str] = []
    ids: frozenset[int] | None = None
    for name, g in groups.items():
        if g._index is not None:
            if ids is None:
                ids = g._index.candidates(line)
            if g._keys.isdisjoint(ids):
                continue
        if g.first(line) is not None:
            out.append(name)
    return tuple(out)


def all_in(groups: Mapping[str, _Group], line: str) -> list[_Pat]:
    """Every pattern of `groups` found in `line`, group by group (one keyword lookup, as found_in)."""
    out: list[_Pat] = []
    ids: frozenset[int] | None = None
    for g in groups.values():
        if g._index is not None:
            if ids is None:
                ids = g._index.candidates(line)
            if g._keys.isdisjoint(ids):
                continue
        out += g.all(line)
    return out


@dataclass(frozen=True)
class Cause:
    """A cause of a failure, recognised in its own words (`regex` on the decisive and first failure lines), for
    `verdicts` (empty: any), with the `steps` it adds and engine-specific ones (`engine_steps`, engine -> steps)."""

    name: str
    regex: re.Pattern[str]
    verdicts: tuple[str, ...]
    steps: tuple[str, ...]
    engine_steps: dict[str, tuple[str, ...]]


def _causes(specs: Any) -> list[Cause]:
    """causes: a list of {name, re, verdicts, steps, engines}; a bad regex or shape names the entry."""
    out: list[Cause] = []
    for i, c in enumerate(specs or []):
        where = f"causes[{i}]"
        if not isinstance(c, Mapping) or not c.get("name") or not c.get("steps"):
            raise ValueError(f"signatures: {where}: needs name, re and steps")
        pat = _compile(c.get("re"), where, "generic")
        engines = c.get("engines") or {}
        if not isinstance(engines, Mapping):
            raise ValueError(f"signatures: {where}.engines: expected a mapping")
        out.append(Cause(str(c["name"]), pat.regex, tuple(str(v) for v in c.get("verdicts") or ()),
                         tuple(markup(str(s)) for s in c["steps"]),
                         {str(k): tuple(markup(str(s)) for s in v or ()) for k, v in engines.items()}))
    return out


@dataclass(eq=False)
class Signatures:
    """signatures.yaml, compiled. Build it with `load_signatures`; the default set is `SIGNATURES`. Compared and
    hashed by identity (a scan remembers its set)."""

    phase_order: tuple[str, ...]
    default_grace_s: dict[str, float]
    silence_after_s: float
    engines: dict[str, str]  # name -> versions text
    detect: dict[str, _Group]
    processes: _Group
    run_start: _Group
    markers: dict[str, _Group]  # engine -> begin/progress/end markers of every phase
    ready: dict[str, _Group]
    engine_order: dict[str, tuple[str, ...]]  # engine -> its own start-up order, where it differs from phase_order
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
    phase_hints: list[_Pat]
    error_severity: re.Pattern[str]
    comm_init_start: _Group
    causes: list[Cause]
    serving_evidence: _Group
    error_tail: _Group
    completion: _Group
    host_allocation: _Group
    gpu_memory: _Group
    request_line: _Group
    stop_requested: _Group
    queued_requests: list[re.Pattern[str]]
    stalled_stats: list[re.Pattern[str]]
    request_received: _Group
    probe_line: _Group
    leftover_processes: _Group
    exit_events: _Group
    hang_report: _Group  # an engine's own stall detector firing (its scheduler's watchdog): a hang, not a crash
    lexicon: _Group  # the start-up steps in any engine's words (a phase marker of last resort)
    warning_severity: re.Pattern[str]
    exception_types: dict[str, frozenset[str]] = field(default_factory=dict)  # verdict -> exception type names
    echo_types: frozenset[str] = frozenset()  # exception types raised because something else failed first
    frame_phases: list[tuple[str, re.Pattern[str]]] = field(default_factory=list)  # (phase, function/file regex)
    frame_words: dict[str, str] = field(default_factory=dict)  # a word of a function's name -> the phase it says
    collective_words: frozenset[str] = frozenset()  # words of a function's name that say it runs a collective
    wait_frames: re.Pattern[str] = re.compile(r"(?!)")  # functions that only wait on other processes
    loop_frames: re.Pattern[str] = re.compile(r"(?!)")  # an engine's per-batch loops (warm-up requests run them too)
    xid: dict[int, str] = field(default_factory=dict)  # NVIDIA Xid code -> verdict (gpu_lost, cuda_error)
    stack_waits: re.Pattern[str] = re.compile(r"(?!)")  # frames of a busy-wait (synchronize, collectives, barriers)
    stack_work: re.Pattern[str] = re.compile(r"(?!)")  # frames of work (compiling, autotuning, loading)
    stack_compile: re.Pattern[str] = re.compile(r"(?!)")  # frames of a compile: a wait under one is its work
    stack_work_files: re.Pattern[str] = re.compile(r"(?!)")  # the compiler's modules: a frame there is work


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


def _hints(specs: Any, order: Sequence[str]) -> list[_Pat]:
    """phase_hints: a list of {re, phase}; every phase must be known."""
    pats = _pats(specs, "phase_hints", "generic")
    for i, p in enumerate(pats):
        if p.phase not in order:
            raise ValueError(f"signatures: phase_hints[{i}]: unknown phase {p.phase!r}")
    return pats


@dataclass
class _EngineParts:
    """The per-engine sections of signatures.yaml, compiled and gathered over every engine."""

    engines: dict[str, str] = field(default_factory=dict)
    detect: dict[str, _Group] = field(default_factory=dict)
    markers: dict[str, _Group] = field(default_factory=dict)
    ready: dict[str, _Group] = field(default_factory=dict)
    orders: dict[str, tuple[str, ...]] = field(default_factory=dict)
    processes: list[_Pat] = field(default_factory=list)
    run_start: list[_Pat] = field(default_factory=list)
    heartbeat: list[_Pat] = field(default_factory=list)
    benign: list[_Pat] = field(default_factory=list)
    failures: dict[str, list[_Pat]] = field(default_factory=lambda: {k: [] for k in _FAILURE_KINDS})


def _engine_parts(engines_data: Any, order: tuple[str, ...]) -> _EngineParts:
    """Compile the `engines:` section. Raises ValueError naming the entry for anything malformed."""
    if not isinstance(engines_data, Mapping) or not engines_data:
        raise ValueError("signatures: engines: expected a non-empty mapping")
    out = _EngineParts()
    for name, eng in engines_data.items():
        if not isinstance(eng, Mapping):
            raise ValueError(f"signatures: engines.{name}: expected a mapping")
        where = f"engines.{name}"
        out.engines[name] = str(eng.get("versions") or "")
        out.detect[name] = _Group(_pats(eng.get("detect"), f"{where}.detect", name))
        out.processes += _pats(eng.get("processes"), f"{where}.processes", name)
        out.run_start += _pats(eng.get("run_start"), f"{where}.run_start", name)
        out.heartbeat += _pats(eng.get("heartbeat"), f"{where}.heartbeat", name)
        out.benign += _pats(eng.get("benign"), f"{where}.benign", name)
        out.ready[name] = _Group(_pats(eng.get("ready"), f"{where}.ready", name))
        own = eng.get("phase_order")
        if own is not None:
            if not isinstance(own, list) or sorted(map(str, own)) != sorted(order):
                raise ValueError(f"signatures: {where}.phase_order: must list the phases {', '.join(order)}, each once")
            out.orders[name] = tuple(map(str, own))
        mk: list[_Pat] = []
        for phase, kinds in (eng.get("phases") or {}).items():
            if phase not in order:
                raise ValueError(f"signatures: {where}.phases: unknown phase {phase!r}")
            for kind, specs in (kinds or {}).items():
                if kind not in _MARKER_KINDS:
                    raise ValueError(f"signatures: {where}.phases.{phase}: unknown marker kind {kind!r}")
                mk += _pats(specs, f"{where}.phases.{phase}.{kind}", name, phase=phase, marker=kind)
        out.markers[name] = _Group(mk)
        for kind, specs in (eng.get("failures") or {}).items():
            if kind not in out.failures:
                raise ValueError(f"signatures: {where}.failures: unknown verdict {kind!r}")
            pats = _pats(specs, f"{where}.failures.{kind}", name)
            for p in pats:
                if p.phase is not None and p.phase not in order:
                    raise ValueError(f"signatures: {where}.failures.{kind}: unknown phase {p.phase!r}")
            out.failures[kind] += pats
    return out


#: The top-level keys of signatures.yaml that are one group of generic patterns each (`Signatures` fields).
_GENERIC_GROUPS = ("killed", "progress_generic", "benign_exceptions", "shutdown", "leftover_processes", "exit_events",
                   "hang_report",
                   "request_received", "probe_line", "serving_evidence", "error_tail", "completion", "host_allocation",
                   "gpu_memory", "request_line", "stop_requested", "comm_init_start")
#: The top-level keys that are plain lists of compiled patterns (their named groups are read).
_PATTERN_LISTS = ("ranks", "queued_requests", "stalled_stats")


def load_signatures(text: str | None = None) -> Signatures:
    """Compile signatures from YAML `text`, or from the bundled `bot/core/diagnose/signatures.yaml` when None.

    Raises ValueError naming the entry (`engines.vllm.phases.comm_init.begin[2]`) for a bad regex, an unknown
    phase or verdict, or a malformed section.
    """
    if text is None:
        text = resources.files("bot.core.diagnose").joinpath("signatures.yaml").read_text(encoding="utf-8")
    data = yaml.load(text, Loader=_SafeLoader)
    if not isinstance(data, Mapping):
        raise ValueError("signatures: top level must be a mapping")
    order = tuple(data.get("phase_order") or PHASES[:-1])
    for p in order:
        if p not in PHASES:
            raise ValueError(f"signatures: phase_order: unknown phase {p!r}")
    e = _engine_parts(data.get("engines") or {}, order)

    def generic(key: str) -> _Group:
        return _Group(_pats(data.get(key), key, "generic"))

    def regex(key: str, default: str) -> re.Pattern[str]:
        return re.compile(str(data.get(key) or default))

    return _indexed(Signatures(
        phase_order=order,
        default_grace_s={str(k): float(v) for k, v in (data.get("default_grace_s") or {}).items()},
        silence_after_s=float(data.get("silence_after_s") or 300.0),
        engines=e.engines,
        detect=e.detect,
        processes=_Group(e.processes),
        run_start=_Group(e.run_start),
        markers=e.markers,
        ready=e.ready,
        engine_order=e.orders,
        heartbeat=_Group(e.heartbeat),
        benign=_Group(e.benign),
        failures={k: _Group(v) for k, v in e.failures.items()},
        context={str(k): _Group(_pats(v, f"context.{k}", "generic")) for k, v in (data.get("context") or {}).items()},
        progress_counter=regex("progress_counter", r"(?P<done>\d+)/(?P<total>\d+) \["),
        exception_line=regex("exception_line", r"^(\w+Error): "),
        next_steps={str(k): [markup(str(s)) for s in (v or [])] for k, v in (data.get("next_steps") or {}).items()},
        phase_hints=_hints(data.get("phase_hints"), order),
        warning_severity=regex("warning_severity", r"\bWARN(?:ING)?\b"),
        causes=_causes(data.get("causes")),
        error_severity=regex("error_severity", r"\bERROR\b"),
        exception_types=_exception_types(data.get("exception_types")),
        lexicon=_Group([p for phase, specs in (data.get("lexicon") or {}).items() if phase in order
                        for p in _pats(specs, f"lexicon.{phase}", "lexicon", phase=phase, marker="begin")]),
        echo_types=frozenset(str(x) for x in data.get("echo_types") or ()),
        **_frame_tables(data, order),
        wait_frames=regex("wait_frames", r"(?!)"),
        loop_frames=regex("loop_frames", r"(?!)"),
        xid={int(code): str(kind) for kind, codes in (data.get("xid") or {}).items() for code in codes or []},
        stack_waits=regex("stack_waits", r"(?!)"),
        stack_work=regex("stack_work", r"(?!)"),
        stack_compile=regex("stack_compile", r"(?!)"),
        stack_work_files=regex("stack_work_files", r"(?!)"),
        **{k: generic(k) for k in _GENERIC_GROUPS},
        **{k: [p.regex for p in _pats(data.get(k), k, "generic")] for k in _PATTERN_LISTS},
    ))


def _exception_types(data: Any) -> dict[str, frozenset[str]]:
    """exception_types: verdict -> list of type names; every verdict must be a failure kind."""
    out: dict[str, frozenset[str]] = {}
    for kind, names in (data or {}).items():
        if kind not in _FAILURE_KINDS:
            raise ValueError(f"signatures: exception_types: unknown verdict {kind!r}")
        out[str(kind)] = frozenset(str(n) for n in names or [])
    return out


def _frame_phases(data: Any, order: Sequence[str]) -> list[tuple[str, re.Pattern[str]]]:
    """frame_phases: phase -> list of regexes (function or file names), in the phases' start-up order."""
    out: list[tuple[str, re.Pattern[str]]] = []
    for phase, specs in (data or {}).items():
        if phase not in order:
            raise ValueError(f"signatures: frame_phases: unknown phase {phase!r}")
        out += [(str(phase), p.regex) for p in _pats(specs, f"frame_phases.{phase}", "generic")]
    return out


def _frame_tables(data: Any, order: Sequence[str]) -> dict[str, Any]:
    """The tables frames are read by: `frame_phases`, `frame_words`, `collective_words` (see signatures.yaml)."""
    return {"frame_phases": _frame_phases(data.get("frame_phases"), order),
            "frame_words": _frame_words(data.get("frame_words"), order),
            "collective_words": frozenset(str(w).lower() for w in data.get("collective_words") or ())}


def _frame_words(data: Any, order: Sequence[str]) -> dict[str, str]:
    """frame_words: phase -> list of words (lower case; `a_b` for two words in a row). Raises ValueError for an
    unknown phase or a word listed under two phases."""
    out: dict[str, str] = {}
    for phase, words in (data or {}).items():
        if phase not in order:
            raise ValueError(f"signatures: frame_words: unknown phase {phase!r}")
        for w in words or []:
            w = str(w).lower()
            if out.setdefault(w, str(phase)) != phase:
                raise ValueError(f"signatures: frame_words: {w!r} is listed under {out[w]!r} and {phase!r}")
    return out


def _indexed(sig: Signatures) -> Signatures:
    """`sig` with one keyword index over the patterns of all its groups (see `_Group`)."""
    groups = [g for g in vars(sig).values() if isinstance(g, _Group)]
    groups += [g for v in vars(sig).values() if isinstance(v, dict) for g in v.values() if isinstance(g, _Group)]
    keyed: list[tuple[int, re.Pattern[str]]] = []
    keys_of: list[list[int]] = []
    for g in groups:
        keys = []
        for p in g.pats:
            keys.append(len(keyed))
            keyed.append((len(keyed), p.regex))
        keys_of.append(keys)
    index = KeywordIndex(keyed)
    for g, keys in zip(groups, keys_of, strict=True):
        g.indexed(index, keys)
    return sig


SIGNATURES: Signatures = load_signatures()
"""The bundled signature set (bot/core/diagnose/signatures.yaml), compiled once at import."""
