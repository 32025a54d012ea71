"""Live and offline, one judgement (issue 44): the same two recorded checks of a launch, fed to the watcher's path
(observation_from_snapshot, judge) and, as the bundle `!bundle` makes of them, to `diagnose`, give the same verdict
and phase, for every verdict class a host's checks can show; a job Slurm ended gets the same verdict from the
watcher's Slurm path (job_end_verdict) and from a bundle with its `scontrol.txt` (weigh_bundle).

The log lines are each engine's own (SGLang 0.5, vLLM V1, torch, uvicorn, Ray 2.x) as their reports print them;
the stacks are `py-spy dump` text."""

from __future__ import annotations

import pytest

from bot.core.diagnose import VERDICTS, Observation, Verdict, diagnose
from bot.core.models import GpuProcess, GpuReading, ProcessInfo
from bot.core.ranks import (
    RANK_FAILURES,
    NodeLook,
    job_end_verdict,
    most_specific_failure,
    weigh_bundle,
    weigh_nodes,
)
from bot.core.slurm import parse_show_job
from bot.core.stackdump import parse_stack_text
from tests.support.builders import launch_row
from tests.support.checks import Check, bundle_of, live_verdict, offline_verdict
from tests.support.paths import FIXTURES

T0 = 1_780_000_000.0  # the launch's start (epoch s)
PID, W0, W1 = 4242, 4250, 4251
LA = launch_row(id=7, host="gpu-host-1", pid=PID, pgid=PID, sid=PID, port=30000, gpus=[0], tag="7-abc",
                created_at=T0, log_path="/data/logs/base-7.log")
CMD = "python3 -m sglang.launch_server --model-path /data/models/Llama-3.1-70B-Instruct --tp 2 --port 30000"

START = [
    "[2026-12-06 10:00:01] server_args=ServerArgs(model_path='/data/models/Llama-3.1-70B-Instruct', tp_size=2, "
    "port=30000)",
    "[2026-12-06 10:00:09 TP0] Init torch distributed begin.",
    "[2026-12-06 10:00:09 TP1] Init torch distributed begin.",
    "[2026-12-06 10:00:11 TP0] Init torch distributed ends. mem usage=0.62 GB",
    "[2026-12-06 10:00:11 TP0] Load weight begin. avail mem=139.2 GB",
]
LOADED = [
    *START,
    "Loading safetensors checkpoint shards: 100% Completed | 30/30 [02:10<00:00,  4.33s/it]",
    "[2026-12-06 10:02:23 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=101.8 GB, "
    "mem usage=37.4 GB.",
    "[2026-12-06 10:02:24 TP0] KV Cache is allocated. #tokens: 1104224, K size: 33.7 GB, V size: 33.7 GB",
    "[2026-12-06 10:02:24 TP0] Memory pool end. avail mem=32.9 GB",
    "[2026-12-06 10:02:25 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=32.8 GB",
]


#: Rows of the host's process table that are no launch's.
HOST = [ProcessInfo(pid=1, ppid=0, pgid=1, sid=1, stat="Ss", pcpu=0.0, rss_kib=12_000, elapsed_s=900_000,
                    cpu_time_s=300, args="/sbin/init"),
        ProcessInfo(pid=812, ppid=1, pgid=812, sid=812, stat="Ss", pcpu=0.0, rss_kib=8_000, elapsed_s=900_000,
                    cpu_time_s=2, args="sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups")]


def _procs(*, launcher: bool = True, cpu: int = 10, orphaned: bool = False, age: int = 600) -> list[ProcessInfo]:
    rows = [ProcessInfo(pid=PID, ppid=1000, pgid=PID, sid=PID, stat="Sl", pcpu=2.0, rss_kib=3_000_000,
                        elapsed_s=age, cpu_time_s=cpu, args=CMD)] if launcher else []
    ppid = 1 if orphaned else PID
    rows += [ProcessInfo(pid=w, ppid=ppid, pgid=PID, sid=PID, stat="Rl" if cpu > 60 else "Sl", pcpu=50.0,
                         rss_kib=9_000_000, elapsed_s=age - 5, cpu_time_s=cpu, args=f"sglang::scheduler_TP{i}")
             for i, w in enumerate((W0, W1))]
    return [*HOST, *rows]


def _gpu(mib: float, util: float = 0.0) -> list[GpuReading]:
    return [GpuReading(index=0, name="NVIDIA H200", memory_used_mib=mib, memory_total_mib=143771.0,
                       utilization_gpu_pct=util, power_draw_w=120.0)]


def _held(mib: float) -> list[GpuProcess]:
    return [GpuProcess(pid=w, used_memory_mib=mib / 2, gpu_index=0, process_name="sglang::scheduler") for w in (W0, W1)]


def _checks(lines: list[str], *, silent_s: float, elapsed: float = 600.0, alive: bool = True, exit: int | None = None,
            mib: tuple[float, float] = (80_000.0, 80_000.0), util: float = 0.0, port: bool = False,
            health: str | None = "refused", cpu: tuple[int, int] = (100, 100), orphaned: bool = False,
            stacks: str = "", first_lines: list[str] | None = None, gpu_error: str | None = None
            ) -> tuple[Check, Check]:
    """Two checks 5 s apart, `elapsed` s after the launch, the log last written `silent_s` s before the second."""
    t2 = T0 + elapsed
    t1 = t2 - 5.0
    def procs(c: int) -> list[ProcessInfo]:
        return _procs(cpu=c, orphaned=orphaned, launcher=alive and not orphaned) if alive or orphaned else list(HOST)

    first = Check(t=t1, lines=first_lines if first_lines is not None else lines,
                  log_mtime=min(t1, t2 - silent_s), procs=_procs(cpu=cpu[0]), tagged=[PID, W0, W1],
                  gpus=_gpu(mib[0], util), gpu_procs=_held(mib[0]), port_open=port, health=health)
    p2 = procs(cpu[1])
    if not alive and not orphaned:  # a process that ended gave its GPU memory back
        mib = (mib[0], 500.0)
    second = Check(t=t2, lines=lines, log_mtime=t2 - silent_s, procs=p2, tagged=[p.pid for p in p2 if p.pid >= PID],
                   gpus=_gpu(mib[1], util),
                   gpu_procs=_held(mib[1]) if len(p2) > len(HOST) else [], port_open=port if alive else False,
                   health=health if alive else "refused", exit=exit, gpu_error=gpu_error,
                   stacks=[(f"TP{i}", d) for i, d in enumerate(parse_stack_text(stacks))] if stacks else ())
    return first, second


SYNC_SPIN = """Process 4250: sglang::scheduler_TP0
Python v3.12.3 (/usr/bin/python3.12)

Thread 4250 (active): "MainThread"
    synchronize (torch/cuda/__init__.py:1040)
    capture_one_batch_size (sglang/srt/model_executor/cuda_graph_runner.py:498)
    capture (sglang/srt/model_executor/cuda_graph_runner.py:410)
    __init__ (sglang/srt/model_executor/cuda_graph_runner.py:330)
    init_device_graphs (sglang/srt/model_executor/model_runner.py:1412)
    run_scheduler_process (sglang/srt/managers/scheduler.py:2471)
"""
COMPILING = """Process 4250: sglang::scheduler_TP0
Python v3.12.3 (/usr/bin/python3.12)

Thread 4250 (active+gil): "MainThread"
    run_ptxas (triton/backends/nvidia/compiler.py:388)
    make_cubin (triton/backends/nvidia/compiler.py:421)
    compile (triton/compiler/compiler.py:300)
    precompile (torch/_inductor/runtime/triton_heuristics.py:260)
    compile_fx_inner (torch/_inductor/compile_fx.py:610)
    _compile (torch/_dynamo/convert_frame.py:1000)
    capture (sglang/srt/model_executor/cuda_graph_runner.py:410)
    init_device_graphs (sglang/srt/model_executor/model_runner.py:1412)
"""

TRACEBACK = "Traceback (most recent call last):"

#: (name, checks, the verdict and phase both ways must reach)
SCENARIOS: list[tuple[str, tuple[Check, Check], tuple[str, str | None]]] = [
    ("loading", _checks([*START, "Loading safetensors checkpoint shards:  40% Completed | 12/30 [00:52<01:18,  "
                                 "4.33s/it]"], silent_s=3.0, mib=(40_000.0, 52_000.0)),
     ("loading", "weight_loading")),
    ("ready", _checks([*LOADED, "[2026-12-06 10:02:41 TP0] Capture cuda graph end. Time elapsed: 16.02 s.",
                       "[2026-12-06 10:02:43] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to "
                       "quit)",
                       "[2026-12-06 10:02:45] The server is fired up and ready to roll!"],
                      silent_s=20.0, port=True, health="ok"),
     ("ready", "serving")),
    ("silent_hang", _checks(LOADED, silent_s=400.0), ("silent_hang", "cuda_graph_capture")),
    ("silent_hang: CPU time of a busy-wait", _checks(LOADED, silent_s=400.0, cpu=(300, 305), util=100.0,
                                                     stacks=SYNC_SPIN),
     ("silent_hang", "cuda_graph_capture")),
    ("loading: CPU time of a compile", _checks(LOADED, silent_s=400.0, cpu=(300, 305), stacks=COMPILING),
     ("loading", "cuda_graph_capture")),
    ("unhealthy", _checks([*LOADED, "[2026-12-06 10:02:41 TP0] Capture cuda graph end. Time elapsed: 16.02 s.",
                           "[2026-12-06 10:02:45] The server is fired up and ready to roll!"],
                          silent_s=20.0, port=True, health="http_503"),
     ("unhealthy", "serving")),
    ("crashed", _checks([*START, TRACEBACK,
                         '  File "/opt/venv/lib/python3.12/site-packages/sglang/srt/model_loader/loader.py", '
                         'line 381, in load_model',
                         "    model.load_weights(self._get_all_weights(model_config, model))",
                         '  File "/opt/venv/lib/python3.12/site-packages/sglang/srt/models/llama.py", line 512, in '
                         "load_weights",
                         "    param = params_dict[name]",
                         "KeyError: 'model.layers.0.mlp.gate_up_proj.weight_scale'"],
                        silent_s=30.0, alive=False, exit=1),
     ("crashed", "weight_loading")),
    ("oom", _checks([*LOADED[:7], TRACEBACK,
                     '  File "/opt/venv/lib/python3.12/site-packages/sglang/srt/mem_cache/memory_pool.py", line 310, '
                     "in _create_buffers",
                     "    torch.zeros((self.size + self.page_size, self.head_num, self.head_dim), dtype=self.dtype,",
                     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 33.70 GiB. GPU 0 has a total "
                     "capacity of 139.81 GiB of which 20.10 GiB is free. Including non-PyTorch memory, this process "
                     "has 119.70 GiB memory in use."],
                    silent_s=30.0, alive=False, exit=1),
     ("oom", "kv_cache_alloc")),
    ("host_oom", _checks([*START, "(raylet) [2026-12-06 10:01:40,112 E 811 811] (raylet) node_manager.cc:3069: 1 "
                                  "Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed "
                                  "due to other reasons at node (ID: 5f2a, IP: 10.0.0.1) over the last time period.",
                          "Memory on the node (IP: 10.0.0.1, ID: 5f2a) where the task (actor ID: 9a1c, name="
                          "RayWorkerWrapper.__init__, pid=4250) was running was 250.11GB / 256.00GB (0.977), which "
                          "exceeds the memory usage threshold of 0.95. Ray killed this worker because it was the "
                          "most recently scheduled task."],
                         silent_s=30.0, alive=False, exit=1),
     ("host_oom", "weight_loading")),
    ("nccl_error", _checks([*START[:3], TRACEBACK,
                            '  File "/opt/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", '
                            "line 2806, in all_reduce",
                            "    work = group.allreduce([tensor], opts)",
                            "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/"
                            "c10d/ProcessGroupNCCL.cpp:3356, unhandled system error (run with NCCL_DEBUG=INFO for "
                            "details), NCCL version 2.27.3",
                            "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
                            "device error."],
                           silent_s=30.0, alive=False, exit=1, elapsed=60.0),
     ("nccl_error", "comm_init")),
    ("port_in_use", _checks([*LOADED[:9], "[2026-12-06 10:02:41 TP0] Capture cuda graph end. Time elapsed: 16.02 s.",
                             "[2026-12-06 10:02:43] ERROR:    [Errno 98] error while attempting to bind on address "
                             "('0.0.0.0', 30000): address already in use"],
                            silent_s=30.0, alive=False, exit=1),
     ("port_in_use", None)),
    ("cuda_error", _checks([*LOADED, TRACEBACK,
                            '  File "/opt/venv/lib/python3.12/site-packages/sglang/srt/model_executor/'
                            'cuda_graph_runner.py", line 498, in capture_one_batch_size',
                            "    torch.cuda.synchronize()",
                            "RuntimeError: CUDA error: an illegal memory access was encountered"],
                           silent_s=30.0, alive=False, exit=1),
     ("cuda_error", "cuda_graph_capture")),
    ("orphans_hold_gpu", _checks([*LOADED[:7], "[2026-12-06 10:02:30] Received sigquit from a child process. It "
                                               "usually means the child failed.", "Killed"],
                                 silent_s=30.0, alive=False, orphaned=True, exit=137),
     ("orphans_hold_gpu", "shutdown")),
    ("gpu_lost", _checks(LOADED, silent_s=200.0, gpu_error="Unable to determine the device handle for "
                         "GPU0000:00:06.0: GPU is lost.  Reboot the system to recover this GPU"),
     ("gpu_lost", "cuda_graph_capture")),
    ("exited", _checks([*LOADED[:9], "[2026-12-06 10:02:41 TP0] Capture cuda graph end. Time elapsed: 16.02 s.",
                        "[2026-12-06 10:02:45] The server is fired up and ready to roll!",
                        "INFO:     Shutting down", "INFO:     Waiting for application shutdown.",
                        "INFO:     Application shutdown complete.", "INFO:     Finished server process [4242]"],
                       silent_s=30.0, alive=False, exit=0),
     ("exited", "shutdown")),
    ("unknown: gone without an exit status", _checks(LOADED[:7], silent_s=30.0, alive=False),
     ("unknown", "weight_loading")),
    ("unknown: SIGKILL, no kernel log", _checks(LOADED[:7], silent_s=30.0, alive=False, exit=137),
     ("unknown", "weight_loading")),
]

#: Verdicts a host's checks cannot show: Slurm's own ends (the Slurm test below).
SLURM_ONLY = {"time_limit", "node_fail", "preempted", "cancelled", "boot_fail", "deadline"}


def test_the_scenarios_cover_every_verdict_class():
    shown = {want[0] for _, _, want in SCENARIOS}
    assert shown | SLURM_ONLY == set(VERDICTS), set(VERDICTS) - shown - SLURM_ONLY


@pytest.mark.parametrize(("name", "checks", "want"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_live_and_offline_agree_on_the_same_checks(name, checks, want):
    first, second = checks
    live = live_verdict(LA, first, second)
    offline = offline_verdict(LA, first, second)
    assert (live.verdict, live.phase) == (offline.verdict, offline.phase), (
        f"live {live.verdict} in {live.phase}: {live.summary}\noffline {offline.verdict} in {offline.phase}: "
        f"{offline.summary}\n" + "\n".join(offline.evidence))
    assert (live.verdict, live.phase) == want, f"{live.summary}\n" + "\n".join(live.evidence)
    assert live.confidence == offline.confidence and live.runner_up == offline.runner_up


def test_the_bundle_carries_what_only_watching_gives():
    first, second = SCENARIOS[3][1]  # the busy-wait: CPU time grows, the stacks wait in synchronize
    files = bundle_of(LA, first, second)
    assert '"cpu_time_growing": true' in files["observed.json"] and any(n.startswith("py-spy/") for n in files)
    ended = bundle_of(LA, *SCENARIOS[6][1])  # crashed: the wrapper's exit status travels
    assert '"exit_code": 1' in ended["observed.json"] and '"process_alive": false' in ended["observed.json"]


# --- Slurm's own ends: the watcher's path and a bundle's scontrol.txt ----------------------------------------------

_FAILED = (FIXTURES / "slurm" / "failed.txt").read_text().strip()


def _scontrol(state: str, reason: str, exit_code: str = "0:15") -> str:
    """A real `scontrol show job -o` line (tests/fixtures/slurm/failed.txt) with Slurm's state, reason and exit."""
    fields = []
    for item in _FAILED.split(" "):
        key = item.split("=", 1)[0]
        fields.append({"JobState": f"JobState={state}", "Reason": f"Reason={reason}",
                       "ExitCode": f"ExitCode={exit_code}"}.get(key, item))
    return " ".join(fields)


SLURM_ENDS = [("TIMEOUT", "TimeLimit", "time_limit"), ("NODE_FAIL", "NodeDown", "node_fail"),
              ("PREEMPTED", "None", "preempted"), ("CANCELLED", "None", "cancelled"),
              ("BOOT_FAIL", "None", "boot_fail"), ("DEADLINE", "None", "deadline"),
              ("OUT_OF_MEMORY", "None", "host_oom"), ("FAILED", "NonZeroExitCode", "crashed")]


@pytest.mark.parametrize(("state", "reason", "want"), SLURM_ENDS, ids=[s[0] for s in SLURM_ENDS])
def test_a_job_slurm_ended_is_judged_the_same_live_and_offline(state, reason, want):
    line = _scontrol(state, reason, "1:0" if state == "FAILED" else "0:15")
    (job,) = parse_show_job(line)
    quiet = Observation(log_lines=LOADED[:7], process_alive=False, log_silent_s=30.0)
    rank0 = diagnose(quiet)
    looks = [NodeLook(0, "n1", False, silent_s=30.0, last_line=LOADED[6], verdict=rank0.verdict),
             NodeLook(1, "n2", False, silent_s=30.0, last_line=LOADED[6])]
    live = job_end_verdict(job, job.job_id, looks, (0, "n1", rank0))
    offline = weigh_bundle(rank0, quiet, "n1", [(1, "n2", quiet)], line)
    assert (live.verdict, live.phase) == (offline.verdict, offline.phase) and live.verdict == want, live.summary


def test_a_rank_s_cuda_oom_outranks_the_exit_slurm_records_for_the_ranks_it_ended():
    oom_log = [*LOADED[:7], TRACEBACK,
               '  File "/opt/venv/lib/python3.12/site-packages/sglang/srt/mem_cache/memory_pool.py", line 310, in '
               "_create_buffers",
               "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 33.70 GiB. GPU 0 has a total capacity "
               "of 139.81 GiB of which 20.10 GiB is free."]
    rank0_obs = Observation(log_lines=oom_log, process_alive=False, log_silent_s=30.0)
    rank1_obs = Observation(log_lines=[*LOADED[:7], "slurmstepd: error: *** STEP 12.0 ON n2 CANCELLED AT "
                                                    "2026-12-06T10:02:31 ***"], process_alive=False)
    rank0 = diagnose(rank0_obs)
    assert rank0.verdict == "oom"
    for state, reason, code in (("FAILED", "NonZeroExitCode", "143:0"), ("FAILED", "NonZeroExitCode", "1:0"),
                                ("COMPLETED", "None", "0:0")):
        line = _scontrol(state, reason, code)
        (job,) = parse_show_job(line)
        looks = [NodeLook(0, "n1", False, verdict="oom"), NodeLook(1, "n2", False)]
        live = job_end_verdict(job, job.job_id, looks, (0, "n1", rank0))
        offline = weigh_bundle(rank0, rank0_obs, "n1", [(1, "n2", rank1_obs)], line)
        for v in (live, offline):
            assert (v.verdict, v.phase) == ("oom", "kv_cache_alloc"), v.summary
            assert v.summary.startswith("Rank 0 on node n1: GPU memory exhausted"), v.summary
            assert any(f"JobState={state}" in e for e in v.evidence), v.evidence
    # Slurm's own end stays Slurm's: a time limit explains what the ranks logged then
    (job,) = parse_show_job(_scontrol("TIMEOUT", "TimeLimit"))
    assert job_end_verdict(job, job.job_id, [], (0, "n1", rank0)).verdict == "time_limit"


def _oom_log() -> list[str]:
    return [*LOADED[:7], TRACEBACK,
            '  File "/opt/venv/lib/python3.12/site-packages/sglang/srt/mem_cache/memory_pool.py", line 310, in '
            "_create_buffers",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 33.70 GiB. GPU 0 has a total capacity "
            "of 139.81 GiB of which 20.10 GiB is free."]


def test_a_rank_gone_of_its_own_oom_while_rank_0_runs_is_that_rank_s_oom_live_and_offline():
    """Rank 1 ran out of GPU memory and is gone; rank 0 still loads: rank 1's OOM with its phase, named with its
    node, not a bare `crashed` (the watcher's weigh_nodes with rank 1's own verdict, and a bundle of the same)."""
    rank0_obs = Observation(log_lines=LOADED[:7], process_alive=True, log_silent_s=3.0)
    rank1_obs = Observation(log_lines=_oom_log(), process_alive=False, log_silent_s=3.0)
    rank0, rank1 = diagnose(rank0_obs), diagnose(rank1_obs)
    assert rank0.verdict not in RANK_FAILURES and rank1.verdict == "oom"
    looks = [NodeLook(0, "n1", True, verdict=rank0.verdict), NodeLook(1, "n2", False)]
    live = weigh_nodes(rank0, looks, (1, "n2", rank1))
    offline = weigh_bundle(rank0, rank0_obs, "n1", [(1, "n2", rank1_obs)])
    for v in (live, offline):
        assert (v.verdict, v.phase) == ("oom", "kv_cache_alloc"), v.summary
        assert v.summary.startswith("Rank 1 on node n2: GPU memory exhausted"), v.summary
        assert v.evidence[0].startswith("rank 0 on n1: running") and v.evidence[1].startswith("rank 1 on n2: no "), \
            v.evidence
    # a gone rank whose log says nothing of why stays a crash of that rank; a rank that is not gone is no cause
    quiet = diagnose(Observation(log_lines=LOADED[:7], process_alive=False))
    assert weigh_nodes(rank0, looks, (1, "n2", quiet)).verdict == "crashed"
    alive = [NodeLook(0, "n1", True, verdict=rank0.verdict), NodeLook(1, "n2", True)]
    assert weigh_nodes(rank0, alive, (1, "n2", rank1)).verdict == rank0.verdict


def test_the_rank_that_says_most_is_chosen_for_a_job_that_ended():
    """Of every rank's own verdict, the most specific failure (an OOM before the NCCL timeout and the crash it
    caused on the other ranks), the lowest rank among equals; no failure anywhere: rank 0's verdict."""
    oom = diagnose(Observation(log_lines=_oom_log(), process_alive=False))
    crash = diagnose(Observation(log_lines=[*LOADED[:7], TRACEBACK, '  File "x.py", line 1, in f',
                                            "RuntimeError: peer gone"], process_alive=False))
    quiet = diagnose(Observation(log_lines=LOADED[:7], process_alive=False))
    assert crash.verdict == "crashed" and quiet.verdict not in RANK_FAILURES
    assert most_specific_failure([(0, "n1", crash), None, (2, "n3", oom)]) == (2, "n3", oom)
    assert most_specific_failure([(0, "n1", quiet), (1, "n2", crash), (2, "n3", crash)]) == (1, "n2", crash)
    assert most_specific_failure([(0, "n1", quiet), (1, "n2", quiet)]) == (0, "n1", quiet)
    assert most_specific_failure([None, None]) is None


_NCCL = [*START[:3], TRACEBACK,
         '  File "/opt/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", line 2806, in '
         "all_reduce",
         "    work = group.allreduce([tensor], opts)",
         "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
         "ProcessGroupNCCL.cpp:3356, unhandled system error (run with NCCL_DEBUG=INFO for details), "
         "NCCL version 2.27.3",
         "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error."]


def test_of_two_gone_ranks_the_oom_beats_the_nccl_echo_live_and_offline():
    """Rank 1 died of an NCCL error (the echo), rank 2 of its OOM (the cause), rank 0 still loads: the watcher (the
    most specific failure of every gone rank's own verdict, as it passes them) and a bundle of the same say rank 2's
    OOM."""
    rank0_obs = Observation(log_lines=LOADED[:7], process_alive=True, log_silent_s=3.0)
    r1 = Observation(log_lines=_NCCL, process_alive=False, log_silent_s=3.0)
    r2 = Observation(log_lines=_oom_log(), process_alive=False, log_silent_s=3.0)
    rank0, v1, v2 = diagnose(rank0_obs), diagnose(r1), diagnose(r2)
    assert (v1.verdict, v2.verdict) == ("nccl_error", "oom")
    looks = [NodeLook(0, "n1", True, verdict=rank0.verdict), NodeLook(1, "n2", False), NodeLook(2, "n3", False)]
    live = weigh_nodes(rank0, looks, most_specific_failure([(1, "n2", v1), (2, "n3", v2)]))
    offline = weigh_bundle(rank0, rank0_obs, "n1", [(1, "n2", r1), (2, "n3", r2)])
    for v in (live, offline):
        assert v.verdict == "oom" and v.summary.startswith("Rank 2 on node n3"), v.summary


def test_a_gone_rank_s_own_oom_is_why_rank_0_hangs():
    """Rank 0 blocked in a collective for the rank that died goes silent_hang: the dead rank's own OOM is the
    verdict, not rank 0's hang."""
    hang = Verdict("silent_hang", "kv_cache_alloc", ["log silent 400 s"], [], summary="Silent for 400 s.")
    v2 = diagnose(Observation(log_lines=_oom_log(), process_alive=False, log_silent_s=3.0))
    looks = [NodeLook(0, "n1", True, verdict="silent_hang"), NodeLook(1, "n2", False)]
    out = weigh_nodes(hang, looks, (1, "n2", v2))
    assert out.verdict == "oom" and out.summary.startswith("Rank 1 on node n2"), out.summary
