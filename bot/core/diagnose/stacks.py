"""What the ranks' stacks add to a hang verdict (pure): the cross-rank summary as one evidence line, the phase the
frames show, and next steps that fit it.

Both the watcher (dumps it takes itself on a `silent_hang`) and `gpubot diagnose` (the `py-spy/` dumps of a
bundle) call `with_stacks`, so a hang diagnosed live and its bundle diagnosed offline read the same.
"""

from __future__ import annotations

from dataclasses import replace

from bot.core.diagnose.errors import TraceFrame
from bot.core.diagnose.meaning import frame_phase
from bot.core.diagnose.observation import Verdict
from bot.core.diagnose.signatures import SIGNATURES, Signatures
from bot.core.stackdump import Frame, ProcessDump, ThreadDump, frame_text, telling_thread
from bot.core.stackgroups import CrossRankSummary, summarize_ranks

__all__ = ["STACK_EVIDENCE_PREFIX", "stack_activity", "stack_phase", "with_stacks"]

STACK_EVIDENCE_PREFIX = "stacks (py-spy"
"""How the stack evidence line starts: `stacks (py-spy, 2 ranks): TP1 is in ... while TP0 waits in ...`."""

#: Verdicts the stacks explain: the process is alive and not moving.
_STACK_VERDICTS = ("silent_hang",)


def _dump_error(ranks: list[tuple[str, ProcessDump]]) -> str:
    errors = sorted({d.error for _, d in ranks if not d.ok and d.error})
    return errors[0] if errors else "no process could be dumped"


def with_stacks(verdict: Verdict, ranks: list[tuple[str, ProcessDump]] | None,
                signatures: Signatures | None = None, *,
                unavailable: str | None = None) -> tuple[Verdict, CrossRankSummary | None]:
    """`verdict` with what the ranks' stack dumps show, and the summary (None when nothing was dumped).

    Only a `silent_hang` is changed. `ranks`: (label, dump) per rank, e.g. ("TP0", dump). With at least one
    rank dumped, the summary line becomes the second evidence line (after the silence itself), the summary
    gains one sentence, and the frames' phase replaces the log's when they show one: live stacks outrank old log
    lines (a rank inside init_process_group is in comm_init, whatever the last log line said). The next steps
    are those of the new phase, without the "dump the stacks" step. With no rank dumped, one evidence line says
    why (py-spy missing, ptrace refused); so does `unavailable`, the reason no dump could be taken at all (the
    host unreachable). Never raises."""
    if verdict.verdict not in _STACK_VERDICTS or not (ranks or unavailable):
        return verdict, None
    if not any(d.ok for _, d in ranks or []):
        line = f"{STACK_EVIDENCE_PREFIX}): not taken: {unavailable or _dump_error(ranks or [])}"
        return replace(verdict, evidence=[*verdict.evidence[:1], line, *verdict.evidence[1:]]), None
    summary = summarize_ranks(ranks)
    dumped = sum(1 for _, d in ranks if d.ok)
    line = f"{STACK_EVIDENCE_PREFIX}, {dumped} rank{'s' if dumped != 1 else ''}): {summary.line}"
    sig = signatures or SIGNATURES
    phase = summary.phase or stack_phase(ranks, sig) or verdict.phase
    steps = [s for s in sig.next_steps.get(f"silent_hang.{phase}", []) if phase] if phase != verdict.phase else []
    steps += [s for s in verdict.next_steps if "py-spy" not in s and s not in steps]
    moved = f" (so the phase is {phase}, not {verdict.phase or 'unknown'})" if phase != verdict.phase else ""
    text = f"{verdict.summary.rstrip()} Stacks: {summary.line}{moved}."
    # the silence, the stacks' summary, the hang's own next line (where start-up stopped), then the frames
    evidence = [*verdict.evidence[:1], line, *verdict.evidence[1:2], *main_frames(ranks, sig=sig),
                *verdict.evidence[2:]]
    return replace(verdict, phase=phase, evidence=evidence, next_steps=steps, summary=text), summary


def _main_thread(dump: ProcessDump) -> ThreadDump | None:
    """The thread that shows what a process does (bot.core.stackdump.telling_thread)."""
    return telling_thread(dump.threads)


def _bare(name: str) -> str:
    """A frame's function name without its class or enclosing functions (py-spy 0.4 on Python 3.11+ prints
    `CachingAutotuner.benchmark_all_configs`, `_compile.<locals>._compile_inner`)."""
    return name.rsplit(".", 1)[-1]


def _works(frame: Frame, sig: Signatures, compiling: bool) -> bool:
    """Whether `frame` is work: a function of work by its name, or, in a stack that compiles (`compiling`: a frame of
    Dynamo's or Inductor's compile further out), any function of the compiler's modules. A compiled model's own
    frames when it runs (Dynamo's `_fn`, Inductor's kernel launcher `run`) are no compile."""
    return bool(sig.stack_work.search(_bare(frame.name))
                or (compiling and sig.stack_work_files.search(frame.file or "")))


def _telling(frame: Frame, sig: Signatures, compiling: bool) -> bool:
    return _works(frame, sig, compiling) or bool(sig.stack_waits.search(_bare(frame.name)))


def stack_activity(ranks: list[tuple[str, ProcessDump]] | None,
                   sig: Signatures | None = None) -> tuple[str, str] | None:
    """What the ranks' main threads do, by their innermost telling frame: ("waiting", frame) when every dumped rank is
    in a busy-wait (a synchronize, a collective, a barrier: CPU time there is no progress), ("working", frame) when
    one compiles, autotunes or loads (CPU time there is progress); None when no rank was dumped or none says
    (signatures.yaml `stack_waits`, `stack_work`)."""
    sig = sig or SIGNATURES
    seen: list[tuple[str, str]] = []
    for _, d in ranks or []:
        t = _main_thread(d) if d.ok else None
        if t is None:
            continue
        # the innermost frame that tells decides; a wait inside a compile (autotuning times kernels, and a
        # synchronize that does) is the compile's work; a collective inside a weight load is a wait all the same
        compiling = any(sig.stack_compile.search(_bare(f.name)) for f in t.frames)
        told = next((f for f in t.frames if _telling(f, sig, compiling)), None)
        if told is None:
            continue
        if _works(told, sig, compiling):
            seen.append(("working", frame_text(told)))
        elif compiling := next((f for f in t.frames if sig.stack_compile.search(_bare(f.name))), None):
            seen.append(("working", frame_text(compiling)))
        else:
            seen.append(("waiting", frame_text(told)))
    if not seen:
        return None
    working = [x for x in seen if x[0] == "working"]
    return working[0] if working else seen[0]


def stack_phase(ranks: list[tuple[str, ProcessDump]], sig: Signatures) -> str | None:
    """The start-up step the ranks' main threads are in, read through the same table of frames as a traceback's
    (signatures.yaml `frame_phases`; bot.core.diagnose.meaning.frame_phase), the first rank that shows one."""
    for _, d in ranks:
        t = _main_thread(d) if d.ok else None
        if t is None:
            continue
        frames = [TraceFrame(f.file, f.name, f.line) for f in reversed(t.frames)]  # outermost first, as a traceback
        if (fp := frame_phase(frames, sig)) is not None and fp[2]:
            return fp[0]
    return None


def main_frames(ranks: list[tuple[str, ProcessDump]], top: int = 6, sig: Signatures | None = None) -> list[str]:
    """One evidence line per dumped rank (at most 3): its main thread's innermost frames in py-spy's own wording, and
    the frame that names its start-up step when that one is further out."""
    out = []
    for label, d in ranks[:3]:
        t = _main_thread(d) if d.ok else None
        if t is None or not t.frames:
            continue
        shown = [f"`{frame_text(f)}`" for f in t.frames[:top]]
        fp = frame_phase([TraceFrame(f.file, f.name, f.line) for f in reversed(t.frames)], sig or SIGNATURES)
        if fp is not None:
            named = next((f for f in t.frames if f.name == fp[1].func and f.file == fp[1].file), None)
            if named is not None and named not in t.frames[:top]:
                shown += ["…", f"`{frame_text(named)}` ({fp[0]})"]
        out.append(f"{label} main thread, innermost first: {' ← '.join(shown)}")
    return out
