"""The honest split of the case corpus: the shared bundles, the rule-writing part, and the held-out third.

Fixed BEFORE the first new bundle (issue 13) existed and before any rule was written against them:

- the 21 shared bundles (ids 00-29) are the original corpus, always asserted;
- of the bundles added for issue 13 (ids 30 and up), the third whose sha256(directory name) sorts first is
  held out: no rule is written against them, they are measured once (`benchmarks/case_corpus.py --held-out`)
  and never asserted by the tests, so no test failure could push a rule towards them;
- the rest is the rule-writing part, asserted like the shared bundles;
- bundles numbered SECOND_HELD_OUT_FROM (76) and up are a second held-out set, whole: fixed (this paragraph,
  committed) before any of them existed, after the first held-out third had been measured once, so the rule
  changes made after that measurement are measured once more on reports no rule saw;
- bundles numbered THIRD_SET_FROM (100) and up were added for issue 24 (phases by milestones): fixed (this
  paragraph and `third_set`, committed) before any of them existed. Of them, the third whose sha256(directory
  name) sorts first is held out (measured once, at the end of the issue, never asserted); the rest is rule-writing.
- bundles numbered FOURTH_SET_FROM (200) and up were added for issue 44, all rule-writing: that issue's held-out set
  is SEALED instead (tests/fixtures/sealed/: written by other helpers from other sources, packed unopened, scored only
  by benchmarks/sealed_corpus.py).
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

FIRST_NEW_ID = 30
"""Bundles numbered below this are the shared corpus; from this id on they were added for issue 13."""
SECOND_HELD_OUT_FROM = 76
"""Bundles numbered from this id on, up to THIRD_SET_FROM, are the second held-out set (all of them)."""
THIRD_SET_FROM = 100
"""Bundles numbered from this id on were added for issue 24: two thirds rule-writing, one third held out."""
FOURTH_SET_FROM = 200
"""Bundles numbered from this id on were added for issue 44: all rule-writing (its held-out set is sealed apart)."""


def bundle_id(directory: Path) -> int:
    """The bundle's number, the `NN` of `NN-short-name`. Raises ValueError for a name without one."""
    return int(directory.name.split("-", 1)[0])


def _key(directory: Path) -> str:
    return hashlib.sha256(directory.name.encode("utf-8")).hexdigest()


def split(bundles: list[Path]) -> tuple[list[Path], list[Path], list[Path]]:
    """(shared, rule_writing, held_out) bundle directories, each sorted by name.

    held_out is ceil(n / 3) of the n new bundles numbered 30..75: those whose sha256(name) is smallest. The
    second held-out set is `second_held_out`.
    """
    shared = sorted(b for b in bundles if bundle_id(b) < FIRST_NEW_ID)
    new = [b for b in bundles if FIRST_NEW_ID <= bundle_id(b) < SECOND_HELD_OUT_FROM]
    held = set(sorted(new, key=_key)[: math.ceil(len(new) / 3)])
    return shared, sorted(b for b in new if b not in held), sorted(held)


def second_held_out(bundles: list[Path]) -> list[Path]:
    """The second held-out set: every bundle numbered SECOND_HELD_OUT_FROM..THIRD_SET_FROM-1, sorted by name."""
    return sorted(b for b in bundles if SECOND_HELD_OUT_FROM <= bundle_id(b) < THIRD_SET_FROM)


def third_set(bundles: list[Path]) -> tuple[list[Path], list[Path]]:
    """(rule_writing, held_out) of the bundles numbered THIRD_SET_FROM and up, each sorted by name.

    held_out is ceil(n / 3) of them: those whose sha256(name) is smallest (the same rule as `split`).
    """
    new = [b for b in bundles if THIRD_SET_FROM <= bundle_id(b) < FOURTH_SET_FROM]
    held = set(sorted(new, key=_key)[: math.ceil(len(new) / 3)])
    return sorted(b for b in new if b not in held), sorted(held)


def fourth_set(bundles: list[Path]) -> list[Path]:
    """The bundles numbered FOURTH_SET_FROM and up (issue 44), all rule-writing, sorted by name."""
    return sorted(b for b in bundles if bundle_id(b) >= FOURTH_SET_FROM)


def miss_key(directory: Path) -> str:
    """The key of a bundle in KNOWN_MISSES: its number as written in the directory name (`36`, `104`)."""
    return directory.name.split("-", 1)[0]


#: Rule-writing bundles not yet fully right (verdict, phase and quotes), each with what is missing. They are
#: strict xfails: one that becomes right fails the run until it is taken off this list.
KNOWN_MISSES = {
    "36": "the bare `AssertionError` that ends TP7's traceback is interleaved with TP6's lines: not quoted",
    "58": "Ray Serve's 'taken more than 30s to be scheduled' is not quoted as the reason",
    "61": "a weight-loading bar stalled for 600 s is within the 1800 s weight_loading grace: loading, not a hang",
    "63": "phase: a Ray memory-monitor kill hours into serving: no serving line in the excerpt",
    "75": "the evidence is in kubectl.txt, which is not a bundle file",
    "106": "ROCm evidence (fuser.txt, rocm-smi.txt) is not read",
    "133": "a streamed request whose `POST ... 200` access line came at its start reads as answered (a non-streamed "
           "one gets it when answered, and an idle server must not be called hung): ready",
    "147": "LlamaEdge's `[ASSISTANT]:` answer lines are not quoted as what the user saw (the verdict is right)",
    "215": "a traceback cut before its exception line, repeated across the Ray cluster: read as a crash, not unknown",
    "232": "phase: a device-side assert in run_batch after start-up is placed in serving; the writer leaves it open",
    "233": "phase: a lone CUDA OOM line (a request's, by the report's words) has nothing that places it in serving",
    "244": "phase: a Dynamo request that hangs without a serving line in the excerpt: phase not known",
    "247": "phase: TensorRT-LLM's mempool error in a Triton table wrapped by hand is not tied to the model's load",
    "249": "a defunct Python stub behind a Triton that still answers health 200 reads as ready",
    "255": "phase and quote: an MPI/PRTE parameter error before `Initializing Executor.` is not placed in comm_init",
    "257": "phase: silence after TensorRT-LLM's KV-cache set-up is placed in kv_cache_alloc; MPI size line not quoted",
    "261": "phase: a systemd OOM kill of Ollama's runner while it loads: the load step is not read from the journal",
    "253": "the client's answers are the report's own `DATE: 200` lines, no JSON body nor HTTP status line: not quoted",
    "264": "Ollama's slow `| 200 | 3m24s |` access lines are not quoted as answered requests",
    "265": "LocalAI's watchdog kills a backend whose process survives holding GPU memory: not read as orphans",
    "269": "phase: TGI's router spinning on two long prompts: no serving line in the excerpt",
    "270": "llama-bench ran to its end (a results table): no completion line is known for it, unknown",
    "271": "phase: LMDeploy's start-up stuck in the attention forward of its warm-up: no warm-up milestone matched",
    "276": "phase: llama.cpp's HIP launch failure at a prompt checkpoint is not placed in serving",
    "281": "phase: an Xid 62/154 from dmesg alone (the report says during inference) has nothing that places it",
    "288": "the torch distributed debug `Running collective: CollectiveFingerPrint` line is not quoted",
    "289": "phase: Ray Serve's interleaved replica log prefixes hide the shards' loading bar from the phase reader",
    "291": "phase and quote: torchrun's SIGKILL of rank 0 before Megatron's `> initializing pipeline` is not placed",
    "302": "vLLM-Omni's `OmniServer stopping...` line is not quoted among the shutdown lines",
    "305": "phase: Ollama's cudaMalloc OOM in ggml_gallocr_reserve (KV and compute buffers) is not kv_cache_alloc",
    "306": "phase: vLLM's torch.compile of the eagle head after KV-cache sizing is placed in warmup, and not quoted",
    "307": "vLLM's `Memory profiling takes 34.26 seconds` line is not quoted (the verdict is right)",
    "309": "SGLang's `Decode batch` line is not quoted as the proof that it serves (the verdict is right)",
    "310": "phase and quote: the dummy request of vLLM-Omni's warm-up that fails is not read as warm-up",
    "317": "EngineCore exiting at the start of torch.compile with its traceback cut: read as a stop in order",
    "401": "phase: the request warning just before the kernel's fault lines is in the server log, the faults in dmesg",
    "405": "the retractions are read as outlived (no alarm) but nothing says the server still serves: unknown",
    "406": "phase: a watchdog timeout at NCCL work 9301 (long past start-up) with no request line is not serving",
    "407": "phase: a UCX segfault on a KV-cache transfer is not read as serving (no request line before it)",
    "409": "phase: a disaggregated worker's missing NIXL connector is not read as communicator set-up",
    "424": "the idle-slots line after the last request is not quoted",
    "433": "verdict: 'alloc_req_slots runs out of memory' with the KV cache at 1 % is request slots, not GPU memory",
    "438": "not quoted: 'line 142, in Warmup'",
    "439": "phase kv_cache_alloc, not weight_loading; not quoted: 'status=\"llm server loading model\"'",
    "440": "phase None, not serving",
    "442": "not quoted: 'torch.compile takes 93.19 s in total'",
    "443": "verdict unknown, not loading; phase None, not weight_loading (a 1.8 s excerpt: nothing says it goes on)",
    "444": "verdict loading, not silent_hang",
    "447": "phase kv_cache_alloc, not serving",
    "452": "phase None, not serving; not quoted: 'in forward_thread_func'",
    "454": "verdict unknown, not crashed; phase None, not warmup",
    "462": "phase None, not warmup; not quoted: '[Autotuner]: Autotuning process ends'",
    "464": "phase None, not serving; not quoted: 'Server error: transport error'",
    "465": "phase None, not weight_loading; not quoted: 'Waiting for shard to be ready... rank=3'",
    "471": "not quoted: 'in event_loop_normal'",
    "483": "not quoted: 'Model loading took 19.75 GiB memory' (the milestone of a healthy start-up)",
    "486": "not quoted: 'Engine iteration timed out. This should never happen!' (the first of two failure lines)",
    "489": "not quoted: 'Capture piecewise CUDA graph begin' (the step's newest begin, not its first)",
    "492": "crashed, not unknown: a traceback cut inside profile_run could be an OOM or another error",
    "494": "crashed with no phase, not silent_hang in serving: five minutes of shm_broadcast waits, then TimeoutError",
    "498": "not quoted: 'dynamo/trtllm/main.py\", line 373, in main' (the cut traceback's outer frame)",
    "499": "unknown, not crashed: only a benchmark harness's log says the pod crashed",
    "501": "phase None, not serving; not quoted: 'Started HTTPService at 0.0.0.0:8000' (a hang told by the report)",
    "502": "loading in weight_loading, not unknown: eight shards ready, the failure itself not in the log",
    "504": "not quoted: 'Process ApiServer_5:' (the cut traceback's header line)",
}
