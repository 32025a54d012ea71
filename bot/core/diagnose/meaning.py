"""What a structured error means (pure): its verdict family from its exception TYPE first and its message second,
whether it is an echo of an earlier failure, and the start-up step its FRAMES show.

The tables are data (signatures.yaml `exception_types`, `echo_types`, `frame_phases`, `wait_frames`); the signature
table's failure patterns are only the last layer, read on the exception's own message when its type says nothing
(`RuntimeError: CUDA error: an illegal memory access was encountered`). Never raises.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

from bot.core.diagnose.errors import ErrorBlock, TraceFrame
from bot.core.diagnose.signatures import _FAILURE_KINDS, Signatures

__all__ = ["block_family", "frame_phase", "in_collective", "is_crash_signal", "is_echo", "named_phase", "word_phase"]

#: Signal names that end a process by a fault of its own code or hardware (a crash), not a request to stop.
_CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGABRT", "SIGBUS", "SIGILL", "SIGFPE", "signal"})
#: Signals someone sends to stop a process (a stop asked for, not a fault of its own).
STOP_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP"})



def _message_family(text: str, sig: Signatures) -> str | None:
    """The failure kind the signature table gives an exception's own words, most specific first; None for none."""
    for kind in _FAILURE_KINDS:
        if kind == "crashed":
            continue
        if sig.failures[kind].first(text):
            return kind
    return None


def block_family(block: ErrorBlock, sig: Signatures) -> str:
    """The verdict an error block stands for: its type's family (`torch.OutOfMemoryError` -> `oom`,
    `DistBackendError` -> `nccl_error`), else what its message says (`CUDA error: ...` -> `cuda_error`), else
    `crashed`. A C++ exception's `what()` and a signal's line are read the same way."""
    own = block.short_type
    if own:
        for kind, names in sig.exception_types.items():
            if own in names:
                if kind == "cuda_error" and (m := _message_family(block.message, sig)) == "oom":
                    return m  # torch's AcceleratorError for `CUDA error: out of memory`
                return kind
    text = f"{block.exc_type or ''}: {block.message}" if block.exc_type else block.message
    family = _message_family(text, sig) or "crashed"
    if family == "crashed" and any((f.func or "").rsplit("::", 1)[-1] in CUDA_CHECK_FRAMES
                                   for f in block.frames):
        return "cuda_error"  # raised by the CUDA runtime's error check, wherever it ran (a collective's watchdog too)
    if family == "crashed" and in_collective(block.frames, sig):
        return "nccl_error"  # a fault inside a collective (NCCL's, MPI's, an all-reduce plugin's own code)
    if family == "crashed" and block.cut and block.frames and _C10D_FILES.search(block.frames[-1].file or ""):
        return "nccl_error"  # cut before its exception, inside torch.distributed's own code (a group being made)
    return family


#: torch.distributed's own modules (torch 2.x): a traceback cut inside one failed in the collective layer.
_C10D_FILES = re.compile(r"torch/distributed/(?:distributed_c10d|rendezvous|c10d_logger|elastic/rendezvous/\w+)\.py$")


#: The functions that raise a CUDA runtime error they checked (torch c10/cuda/CUDAException.cpp, C10_CUDA_CHECK).
CUDA_CHECK_FRAMES = frozenset({"c10_cuda_check_implementation"})
#: How many named frames, innermost first, are read for a collective a fault happened in.
COLLECTIVE_DEPTH = 4


def in_collective(frames: Sequence[TraceFrame], sig: Signatures) -> bool:
    """Whether one of the innermost named frames runs a collective or the communication library (signatures.yaml
    `collective_words`: `all_reduce`, `AllreducePlugin`, NCCL's `addCBDCollToPlan`, `ncclGroupEnd`, MPI)."""
    # a native frame's qualified name (`tensorrt_llm::plugins::AllreducePlugin::initialize`) says its class too
    named = [fr.file if "::" in fr.file else fr.func for fr in _funcs(frames) if fr.func][:COLLECTIVE_DEPTH]
    for name in named:
        words = [w.lower() for w in _WORD.findall(name)]
        if any(w in sig.collective_words for w in words) \
                or any(f"{a}_{b}" in sig.collective_words for a, b in itertools.pairwise(words)):
            return True
    return False


def _funcs(frames: Sequence[TraceFrame]) -> list[TraceFrame]:
    """Frames innermost first."""
    return list(reversed(frames))


def frame_phase(frames: Sequence[TraceFrame], sig: Signatures) -> tuple[str, TraceFrame, bool] | None:
    """The step a traceback's frames show, the frame that shows it, and whether it is sure: the innermost frame whose
    function names a start-up step (sure); else a frame of request work (`execute_model`; sure); else an engine's
    per-batch loop (`event_loop_overlap`: serving, but not sure: warm-up requests run it too); file names
    (`parallel_state.py`) only when no function says anything (not sure); then the words of the functions' names
    (`word_phase`; not sure). None when nothing does."""
    serving: TraceFrame | None = None
    loop: TraceFrame | None = None
    for fr in _funcs(frames):
        name = fr.func or ""
        if not name:
            continue
        for phase, rx in sig.frame_phases:
            if rx.pattern.endswith(("py$", "/")) or not rx.search(
                    f"{fr.file}:{name}" if "\\.py:" in rx.pattern else name):
                continue
            if phase == "serving":
                serving = serving or fr
                break
            return phase, fr, True
        else:
            if loop is None and sig.loop_frames.search(name):
                loop = fr
    if serving is not None:
        return "serving", serving, True
    if loop is not None:
        return "serving", loop, False
    # a collective's own frames (`all_reduce` in parallel_state.py) run in whatever step called them: not by file
    callers = [fr for fr in frames if not (fr.func and in_collective([fr], sig))]
    for fr in _funcs(callers):
        for phase, rx in sig.frame_phases:
            if fr.file and rx.search(fr.file):
                return phase, fr, False
    for fr in _funcs(callers):
        if fr.func and (phase := word_phase(fr.func, sig)) is not None:
            return phase, fr, False
    return None


#: The words of an identifier: snake_case parts, camelCase humps, runs of capitals (`gptq_marlin_repack` -> gptq,
#: marlin, repack; `forwardAsync` -> forward, async; `KVCacheManager` -> kv, cache, manager).
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


def word_phase(name: str, sig: Signatures) -> str | None:
    """The step a function's name says by its WORDS (signatures.yaml `frame_words`: `repack`, `checkpoint` ->
    weight_loading; `handshake` -> comm_init; `generate`, `prompt` -> serving), for names no `frame_phases` pattern
    knows: another engine's function for the same step. None when no word says one, or words say two steps
    (`common_prompt_checkpoint`: a prompt's cache, not the weights'): the name is then no evidence."""
    words = [w.lower() for w in _WORD.findall(name.rsplit("::", 1)[-1])]
    said = {sig.frame_words[w] for w in words if w in sig.frame_words}
    said |= {sig.frame_words[f"{a}_{b}"] for a, b in itertools.pairwise(words) if f"{a}_{b}" in sig.frame_words}
    return said.pop() if len(said) == 1 else None


#: A function's name in prose: snake_case or camelCase (`load_single_module`, `forwardAsync`), never a plain word
#: (`capture`, `step`: the words of an error message set no phase).
_IDENT = re.compile(r"\b(?:[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]+|[a-z]+[A-Z][A-Za-z0-9]*)\b")


def named_phase(text: str, sig: Signatures) -> str | None:
    """The step a function NAMED in an error's own words runs (`Encountered an error in forwardAsync function`,
    `Error executing load_single_module`, `while processing method init_device`), by the same table as frames
    (function names only); a start-up step before serving. None when no name in it is one of the table's."""
    found: str | None = None
    for name in _IDENT.findall(text or ""):
        for phase, rx in sig.frame_phases:
            if rx.pattern.startswith("^") and rx.search(name):
                if phase != "serving":
                    return phase
                found = found or phase
    return found


def is_echo(block: ErrorBlock, sig: Signatures) -> bool:
    """Whether an error was raised only because something else failed first: its type is one of `echo_types`
    (`EngineDeadError`), or its innermost frame only waits on other processes (`wait_for_engine_startup`, a join)."""
    if block.short_type in sig.echo_types:
        return True
    if block.frames:
        inner = block.frames[-1].func or ""
        return bool(inner) and sig.wait_frames.search(inner) is not None
    return False


def is_crash_signal(block: ErrorBlock) -> bool:
    """Whether a signal block is a process's own fault (SIGSEGV, SIGABRT, ...), not a stop someone asked for."""
    return block.kind == "signal" and (block.exc_type or "signal") in _CRASH_SIGNALS
