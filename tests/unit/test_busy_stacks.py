"""CPU time spent waiting is no progress; CPU time spent working is (issue 44), on stacks recorded on real GPUs
(tests/fixtures/pyspy: a kernel spinning under `torch.cuda.synchronize()` during graph capture and a torch.compile,
on an H100; a rank waiting in a gloo `all_reduce`, on an H200). A start-up silent past its grace whose processes
still gain CPU time is a hang when its ranks' stacks wait, and still loading when they work; the rank that runs in
a thread of its own is the one read, not the main thread that waits for it."""

from __future__ import annotations

import pytest

from bot.core.diagnose import Observation, diagnose
from bot.core.diagnose.stacks import stack_activity
from bot.core.models import GpuReading
from bot.core.stackdump import Frame, ProcessDump, ThreadDump, parse_stack_json, telling_thread
from bot.core.stackgroups import rank_place
from tests.support.paths import FIXTURES

PYSPY = FIXTURES / "pyspy"

CAPTURE = [
    "[2026-12-07 00:10:26 TP0] Load weight end. type=TorchFakeForCausalLM, dtype=torch.bfloat16, avail mem=77.57 GB, "
    "mem usage=1.00 GB.",
    "[2026-12-07 00:10:26 TP0] KV Cache is allocated. #tokens: 2048, K size: 0.25 GB, V size: 0.25 GB",
    "[2026-12-07 00:10:26 TP0] Memory pool end. avail mem=77.07 GB",
    "[2026-12-07 00:10:26 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=77.07 GB",
    "Capturing batches (bs=160 avail_mem=77.07 GB):   0%|          | 0/23 [00:00<?, ?it/s]",
]


def _dump(name: str) -> list[tuple[str, ProcessDump]]:
    threads = parse_stack_json((PYSPY / name).read_text())
    assert threads, name
    return [("TP0", ProcessDump(1, True, threads))]


def _silent_but_busy(stacks, *, util: float) -> Observation:
    """Past the 300 s graph-capture grace, its CPU time growing, the port closed: only the stacks can tell."""
    return Observation(log_lines=CAPTURE, log_silent_s=400.0, process_alive=True, cpu_time_growing=True,
                       port_open=False, rank_stacks=stacks,
                       gpus=[GpuReading(index=0, memory_used_mib=2150.0, memory_total_mib=81559.0,
                                        utilization_gpu_pct=util, power_draw_w=121.0, power_limit_w=700.0)])


def test_the_thread_that_runs_is_read_not_the_main_thread_that_waits_for_it():
    (_, dump), = _dump("h100/capture_spin-rank0.json")
    t = telling_thread(dump.threads)
    assert t is not None and t.name.startswith("Thread-1") and t.frames[0].name == "synchronize"
    assert stack_activity(_dump("h100/capture_spin-rank0.json")) == (
        "waiting", next(f"{f.name} ({f.file}:{f.line})" for f in t.frames if f.name == "synchronize"))


@pytest.mark.parametrize(("name", "util"), [("h100/capture_spin-rank0.json", 100.0),
                                            ("h200/allreduce_skipped-rank0.json", 0.0)])
def test_cpu_time_in_a_synchronize_or_a_collective_is_a_hang(name, util):
    v = diagnose(_silent_but_busy(_dump(name), util=util))
    assert (v.verdict, v.phase) == ("silent_hang", "cuda_graph_capture"), v.summary
    assert any("busy-wait" in e for e in v.evidence), v.evidence


def test_cpu_time_in_a_compile_with_the_gpu_idle_is_progress():
    stacks = _dump("h100/compile_silent-rank0.json")
    activity = stack_activity(stacks)
    assert activity is not None and activity[0] == "working", activity  # Inductor's compile_fx, further out
    v = diagnose(_silent_but_busy(stacks, util=0.0))
    assert (v.verdict, v.phase) == ("loading", "cuda_graph_capture"), v.summary
    # the same silence without CPU time is a hang, stacks or not: the compile's CPU time is what keeps it loading
    still = diagnose(Observation(**{**_silent_but_busy(stacks, util=0.0).__dict__, "cpu_time_growing": False}))
    assert still.verdict == "silent_hang"


def test_cpu_time_alone_past_the_grace_and_no_stacks_is_a_low_confidence_guess_that_names_what_would_decide():
    v = diagnose(_silent_but_busy(None, util=0.0))
    assert (v.verdict, v.confidence) == ("loading", "low"), v.summary
    assert v.runner_up == "silent_hang in cuda_graph_capture" and "busy-wait" in (v.missing or "")
    assert v.next_steps[0].startswith("Dump every rank's Python stack") and not any(
        s.startswith("Nothing to do") for s in v.next_steps)


def test_a_compile_in_inductors_lowering_of_broadcast_tensors_is_work_not_a_collective():
    """The H100 run of 2026-12-08: the watcher's dump caught the compile in `broadcast_tensors
    (torch/_inductor/lowering.py)`, a collective's name in the compiler's own module; the alert called it a wait on
    a collective and the launch a hang. A frame of the compiler's modules is its work, whatever its name."""
    stacks = _dump("h100/compile_lowering-rank0.json")
    assert stack_activity(stacks) == ("working", next(
        f"{f.name} ({f.file}:{f.line})" for f in telling_thread(stacks[0][1].threads).frames))
    place = rank_place("TP0", stacks[0][1])
    assert place.rule is None or not place.rule.waiting, place
    v = diagnose(_silent_but_busy(stacks, util=0.0))
    assert (v.verdict, v.phase) == ("loading", "cuda_graph_capture"), v.summary
    assert "collective" not in " ".join(v.evidence), v.evidence


@pytest.mark.parametrize(("file", "waits"), [
    ("/usr/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", True),
    ("/usr/lib/python3.12/site-packages/vllm/distributed/device_communicators/pynccl.py", True),
    ("libnccl.so.2", True),
    ("/usr/lib/python3.12/site-packages/torch/_inductor/lowering.py", False),
    ("/data/model/modeling_llama.py", False),
])
def test_a_broadcast_is_a_collective_only_in_communication_code(file, waits):
    frame = Frame("broadcast", file, 10)
    dump = ProcessDump(1, True, [ThreadDump("MainThread", 1, True, True, [frame])])
    place = rank_place("TP0", dump)
    assert (place.rule is not None and place.rule.waiting) is waits, place


@pytest.mark.parametrize(("file", "waits"), [
    ("/data/app/parallel_utils.py", True),  # a collective's own name in the user's code: a collective
    ("/usr/lib/python3.12/site-packages/torch/_inductor/lowering.py", False),  # the compiler lowering one: not
])
def test_all_reduce_is_a_collective_anywhere_but_in_the_compiler(file, waits):
    dump = ProcessDump(1, True, [ThreadDump("MainThread", 1, True, True, [Frame("all_reduce", file, 10)])])
    place = rank_place("TP0", dump)
    assert (place.rule is not None and place.rule.waiting) is waits, place


def test_with_no_thread_running_the_deep_worker_tells_more_than_the_main_thread_that_waits_for_it():
    """H100, 2026-12-08: the compile thread waited on Triton's `ptxas` (subprocess.Popen.wait), so no thread was
    active; the main thread (3 frames) only waits for it. The worker's stack says it compiles."""
    stacks = _dump("h100/compile_ptxas-rank0.json")
    t = telling_thread(stacks[0][1].threads)
    assert t is not None and t.name.startswith("Thread-1") and not t.active
    activity = stack_activity(stacks)
    assert activity is not None and activity[0] == "working" and "make_cubin" in activity[1], activity


def test_a_compiled_model_running_is_not_compile_work():
    """A compiled model's own frames when it runs (Inductor's kernel launcher, Dynamo's `_fn`) lie in the compiler's
    modules too; without a compile frame in the stack they are no work (the adversarial review of 2026-12-08)."""
    frames = [Frame("run", "torch/_inductor/runtime/triton_heuristics.py", 1200),
              Frame("call", "/tmp/torchinductor_root/ab/cabc.py", 300),
              Frame("_fn", "torch/_dynamo/eval_frame.py", 838),
              Frame("profile_run", "vllm/worker/model_runner.py", 1300)]
    dump = ProcessDump(1, True, [ThreadDump("MainThread", 1, True, True, frames)])
    activity = stack_activity([("TP0", dump)])
    assert activity is None or activity[0] != "working", activity


def test_a_socket_recv_in_libc_is_no_collective():
    dump = ProcessDump(1, True, [ThreadDump("MainThread", 1, True, True, [Frame("recv", "libc.so.6", 0)])])
    place = rank_place("TP0", dump)
    assert place.rule is None or not place.rule.waiting, place
