"""Rule tests for bot.core.diagnose (pure) and the bundle parsers in bot.core.bundle, plus fuzzing.

Log lines are in the real formats of SGLang, vLLM, NCCL and torch (see bot/core/diagnose/signatures.yaml for sources).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.core.bundle import (
    BUNDLE_FILES,
    detect_ps_layout,
    observation_from_texts,
    parse_docker_ps,
    parse_gpu_csv,
    parse_gpu_table,
    parse_ipcs_m,
    parse_listening,
    parse_ps_text,
)
from bot.core.diagnose import (
    PHASES,
    SIGNATURES,
    VERDICTS,
    Observation,
    diagnose,
    format_verdict,
    load_signatures,
    scan_log,
)
from bot.core.models import GpuProcess, GpuReading, ProcessInfo


def _joined(v) -> str:
    return "\n".join(v.evidence)


def _sglang_loaded(ranks: int = 8) -> list[str]:
    lines = ["[2026-02-22 22:53:04] server_args=ServerArgs(model_path='/m', tp_size=8, port=8000)"]
    lines += [f"[2026-02-22 22:53:12 TP{r}] Load weight begin. avail mem=94.11 GB" for r in range(ranks)]
    lines += [
        f"[2026-02-22 22:53:26 TP{r}] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
        "avail mem=21.34 GB, mem usage=72.77 GB."
        for r in range(ranks)
    ]
    return lines


IMPORT_WARNINGS = [
    f"[2026-02-22 22:53:28 TP{r}] Ignore import error when loading sglang.srt.models.glm_ocr: "
    "No module named 'transformers.models.glm_ocr'"
    for r in range(8)
]

HEARTBEAT = (
    "(APIServer pid=1) DEBUG 08-09 {h:02d}:{m:02d}:{s:02d} [v1/engine/utils.py:1262] "
    "Waiting for 1 local, 0 remote core engine proc(s) to start."
)


def _heartbeats(n: int, start_min: int = 55) -> list[str]:
    out = []
    for k in range(n):
        t = 20 * 3600 + start_min * 60 + k * 10  # every 10 s from 20:55:00, past the hour as a clock goes
        out.append(HEARTBEAT.format(h=t // 3600, m=t // 60 % 60, s=t % 60))
    return out


VLLM_NCCL = [
    "(VllmWorker rank=1 pid=242) DEBUG 08-09 20:54:50 [parallel_state.py:820] world_size=2 rank=1 local_rank=1 "
    "distributed_init_method=tcp://127.0.0.1:53913 backend=nccl",
    "(VllmWorker rank=1 pid=242) INFO 08-09 20:54:55 [utils.py:990] Found nccl from library libnccl.so.2",
]

WATCHDOG = (
    "[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, "
    "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600059 milliseconds before timing out."
)


# --- the rules the diagnose package lists (bot/core/diagnose/__init__.py) ------------------------------


def test_benign_import_errors_are_not_crashes():
    obs = Observation(log_lines=_sglang_loaded() + IMPORT_WARNINGS, process_alive=True, log_silent_s=60)
    v = diagnose(obs)
    assert v.verdict == "loading"
    assert "known-benign" in _joined(v)
    v = diagnose(Observation(log_lines=_sglang_loaded() + IMPORT_WARNINGS, process_alive=True, log_silent_s=900))
    assert v.verdict == "silent_hang"
    assert v.phase is None  # weight loading finished on every rank; the next step is not known
    assert "Load weight end" in _joined(v)


def test_heartbeat_only_is_silent_hang_from_timestamps():
    """The log still grows, but only with the vLLM heartbeat: 40 lines over 390 s, no silence figure given."""
    obs = Observation(log_lines=VLLM_NCCL + _heartbeats(40), process_alive=True, log_growing=True)
    v = diagnose(obs)
    assert (v.verdict, v.phase) == ("silent_hang", "comm_init")
    assert "Waiting for 1 local, 0 remote core engine proc(s) to start" in _joined(v)
    assert "not progress" in _joined(v)


def test_heartbeat_only_is_silent_hang_with_observed_silence():
    obs = Observation(log_lines=VLLM_NCCL + _heartbeats(5), process_alive=True, log_growing=True, log_silent_s=600)
    assert diagnose(obs).verdict == "silent_hang"


def test_a_short_heartbeat_run_is_still_loading():
    obs = Observation(log_lines=VLLM_NCCL + _heartbeats(3), process_alive=True, log_growing=True)
    v = diagnose(obs)
    assert v.verdict != "silent_hang"


def test_advancing_progress_bar_with_long_silence_elsewhere_is_loading():
    """0 % GPU, 0 % CPU, 66 min since launch, no new phase line: but the shard bar moves."""
    bar = "Loading safetensors checkpoint shards:  {p}% Completed | {k}/163 [{m:02d}:00<50:00, 26.68s/it]"
    lines = [*_sglang_loaded(0)[:1], "[2025-02-01 06:00:00 TP0] Load weight begin. avail mem=94.11 GB"]
    lines += [bar.format(p=k * 100 // 163, k=k, m=k // 2) for k in range(140, 150)]
    gpus = [
        GpuReading(
            index=i,
            memory_used_mib=30000,
            memory_total_mib=143771,
            utilization_gpu_pct=0,
            power_draw_w=120,
            power_limit_w=700,
        )
        for i in range(8)
    ]
    procs = [ProcessInfo(pid=100 + i, stat="Sl", pcpu=0.0, args=f"sglang::scheduler_TP{i}") for i in range(8)]
    obs = Observation(
        log_lines=lines,
        process_alive=True,
        log_silent_s=25,
        elapsed_s=4000,
        gpus=gpus,
        processes=procs,
        port_open=False,
        gpu_mem_rising=False,
    )
    v = diagnose(obs)
    assert (v.verdict, v.phase) == ("loading", "weight_loading")
    assert "149/163" in _joined(v)


def test_progress_counter_advancing_beats_silence():
    lines = ["Loading safetensors checkpoint shards:  40% Completed | 65/163 [30:00<45:00, 26.68s/it]"]
    obs = Observation(log_lines=lines, process_alive=True, log_silent_s=2400, progress_advancing=True)
    v = diagnose(obs)
    assert (v.verdict, v.phase) == ("loading", "weight_loading")


def test_history_derives_progress_between_observations():
    bar = "Loading safetensors checkpoint shards:  {p}% Completed | {k}/163 [10:00<45:00, 26.68s/it]"
    before = Observation(log_lines=[bar.format(p=6, k=10)], process_alive=True)
    now = Observation(log_lines=[bar.format(p=7, k=12)], process_alive=True)
    v = diagnose(now, history=[before])
    assert v.verdict == "loading"
    assert "progress counter advanced" in _joined(v)
    # the same counter twice is no progress; with a known long silence that is a hang
    same = Observation(log_lines=[bar.format(p=6, k=10)], process_alive=True, log_silent_s=4000)
    assert diagnose(same, history=[before]).verdict == "silent_hang"


def test_history_derives_rising_gpu_memory_and_cpu_time():
    g0 = [GpuReading(index=0, memory_used_mib=1000, memory_total_mib=80000, utilization_gpu_pct=0)]
    g1 = [GpuReading(index=0, memory_used_mib=9000, memory_total_mib=80000, utilization_gpu_pct=0)]
    v = diagnose(Observation(process_alive=True, log_silent_s=4000, gpus=g1), history=[Observation(gpus=g0)])
    assert v.verdict == "loading"
    p0 = [ProcessInfo(pid=7, cpu_time_s=10)]
    p1 = [ProcessInfo(pid=7, cpu_time_s=90)]
    # CPU time alone, twice past the 300 s grace: a low-confidence loading (only stacks would tell work from a
    # busy-wait); 4 graces past it, a hang
    v = diagnose(Observation(process_alive=True, log_silent_s=600, processes=p1), history=[Observation(processes=p0)])
    assert (v.verdict, v.confidence) == ("loading", "low")
    v = diagnose(Observation(process_alive=True, log_silent_s=4000, processes=p1), history=[Observation(processes=p0)])
    assert v.verdict == "silent_hang"


def test_nccl_spin_is_not_work():
    gpus = [
        GpuReading(
            index=i,
            memory_used_mib=2627,
            memory_total_mib=46068,
            utilization_gpu_pct=100,
            power_draw_w=97,
            power_limit_w=350,
        )
        for i in range(8)
    ]
    v = diagnose(Observation(process_alive=True, log_silent_s=600, gpus=gpus))
    assert (v.verdict, v.phase) == ("silent_hang", "comm_init")
    assert "NCCL spin" in _joined(v)


def test_one_gpu_without_nccl_spins_a_kernel_not_nccl():
    gpu = GpuReading(index=0, memory_used_mib=2627, memory_total_mib=46068, utilization_gpu_pct=100,
                     power_draw_w=97, power_limit_w=350)
    v = diagnose(Observation(process_alive=True, log_silent_s=600, gpus=[gpu],
                             log_lines=["Capture cuda graph begin. This can take up to several minutes."]))
    assert v.verdict == "silent_hang" and "NCCL" not in _joined(v), _joined(v)
    assert "a kernel spins at 100 %" in _joined(v)
    # one GPU, but the log shows NCCL at work (a rank of a multi-host launch): an NCCL spin
    nccl = diagnose(Observation(process_alive=True, log_silent_s=600, gpus=[gpu],
                                log_lines=["NCCL INFO Channel 00/02 : 0[0] -> 1[0] via NET/IB/0"]))
    assert "NCCL spin" in _joined(nccl)


def test_a_single_gpu_server_on_a_host_with_more_gpus_read_spins_a_kernel_not_nccl():
    """Every GPU of the host is read (a variant naming none), but the launch holds one; words that only contain
    NCCL (an environment variable's name, a path) are no sign of it."""
    spin = GpuReading(index=0, memory_used_mib=2627, memory_total_mib=46068, utilization_gpu_pct=100,
                      power_draw_w=97, power_limit_w=350)
    idle = GpuReading(index=1, memory_used_mib=0, memory_total_mib=46068, utilization_gpu_pct=0,
                      power_draw_w=60, power_limit_w=350)
    obs = Observation(process_alive=True, log_silent_s=600, gpus=[spin, idle],
                      gpu_processes=[GpuProcess(pid=7, gpu_index=0, used_memory_mib=2600)],
                      processes=[ProcessInfo(pid=7, args="/opt/venv-nccl2.21/bin/python serve.py")],
                      log_lines=["NCCL_P2P_DISABLE is set", "Capture cuda graph begin."])
    v = diagnose(obs)
    assert v.verdict == "silent_hang" and "NCCL spin" not in _joined(v), _joined(v)
    assert "a kernel spins at 100 %" in _joined(v)
    # the same launch holding both GPUs: NCCL is in play
    both = replace(obs, gpus=[spin, replace(spin, index=1)],
                   gpu_processes=[GpuProcess(pid=7, gpu_index=0, used_memory_mib=2600),
                                  GpuProcess(pid=8, gpu_index=1, used_memory_mib=2600)])
    assert "NCCL spin" in _joined(diagnose(both))


def test_full_utilization_at_high_power_is_work():
    gpus = [
        GpuReading(
            index=0,
            memory_used_mib=70000,
            memory_total_mib=143771,
            utilization_gpu_pct=100,
            power_draw_w=650,
            power_limit_w=700,
        )
    ]
    v = diagnose(Observation(process_alive=True, log_silent_s=600, gpus=gpus))
    assert v.verdict == "loading"
    assert "computing" in _joined(v)


def test_first_failure_is_quoted_over_the_watchdog_echo():
    lines = [
        "(Worker_TP1 pid=77) ERROR 07-01 13:44:40 [gpu_model_runner.py:88] RuntimeError: CUDA error: an illegal "
        "memory access was encountered",
        "INFO 07-01 13:44:41 multiproc_worker_utils.py:123] Killing local vLLM worker processes",
        WATCHDOG,
        WATCHDOG,
    ]
    v = diagnose(Observation(log_lines=lines, process_alive=False))
    assert v.verdict == "cuda_error"
    assert "illegal memory access" in v.evidence[0]
    assert "illegal memory access" in v.summary
    assert "echo" in _joined(v)


def test_watchdog_alone_is_nccl_error_and_points_to_the_earlier_death():
    lines = [
        "ERROR 07-01 13:54:43 multiproc_worker_utils.py:120] Worker VllmWorkerProcess pid 1159 died, exit code: -6",
        WATCHDOG,
    ]
    v = diagnose(Observation(log_lines=lines, process_alive=False))
    assert v.verdict == "nccl_error"
    assert v.evidence[0].startswith("first failure") and "exit code: -6" in v.evidence[0]


def test_nccl_ras_bind_warning_is_not_port_in_use():
    for ras in (
        "[2025-08-22 17:44:36] A800:6801:6839 [1] ras/client_support.cc:159 NCCL WARN Call to bind failed: "
        "Address already in use",
        "A800:6801:6839 [1] NCCL WARN Call to bind failed : Address already in use",
    ):
        lines = [
            *VLLM_NCCL,
            ras,
            "A800:6801:6839 [1] NCCL INFO RAS failed to establish a client listening socket at localhost:28028",
            "A800:6801:6839 [1] NCCL INFO Connected all rings",
        ]
        v = diagnose(Observation(log_lines=lines, process_alive=True, log_silent_s=10))
        assert v.verdict == "loading", v.summary
        assert v.phase == "comm_init"
        assert "known-benign" in _joined(v)


def test_a_real_bind_failure_is_port_in_use():
    lines = [
        "Traceback (most recent call last):",
        '  File "/x/vllm/utils.py", line 572, in get_open_port',
        '    s.bind(("", 0))',
        "OSError: [Errno 98] Address already in use",
    ]
    v = diagnose(Observation(log_lines=lines, process_alive=False))
    assert v.verdict == "port_in_use"
    assert "Address already in use" in _joined(v)


# --- more rules ---------------------------------------------------------------------------------------


def test_grace_is_per_phase_and_overridable():
    obs = Observation(log_lines=VLLM_NCCL, process_alive=True, log_silent_s=400)
    assert diagnose(obs).verdict == "silent_hang"  # comm_init grace 300 s
    assert diagnose(obs, grace_s={"comm_init": 600}).verdict == "loading"
    loading = Observation(
        log_lines=["(Worker_TP0 pid=9) INFO 08-09 21:00:00 [gpu_model_runner.py:1] Starting to load model /m..."],
        process_alive=True,
        log_silent_s=400,
    )
    assert (diagnose(loading).verdict, diagnose(loading).phase) == ("loading", "weight_loading")


def test_phase_is_unfinished_until_every_rank_ends_it():
    done = [f"[2025-02-01 07:03:55 TP{r}] Memory pool end. avail mem=15.10 GB" for r in range(8)]
    some = _sglang_loaded() + done[:3]
    assert scan_log(some).phase == "kv_cache_alloc"
    scan = scan_log(_sglang_loaded() + done)
    assert (scan.phase, scan.finished_phase) == (None, "kv_cache_alloc")


def test_phase_never_moves_back():
    lines = [
        "[TP0] Capture cuda graph begin. This can take up to several minutes.",
        "host:1:1 [0] NCCL INFO Connected all trees",
    ]
    assert scan_log(lines).phase == "cuda_graph_capture"


def test_only_the_last_run_counts():
    old = [
        "[2026-01-01 10:00:00] server_args=ServerArgs(model_path='/m')",
        "[2026-01-01 10:00:05 TP0] Scheduler hit an exception: boom",
    ]
    new = [
        "[2026-01-01 10:05:00] server_args=ServerArgs(model_path='/m')",
        "[2026-01-01 10:05:10 TP0] Load weight begin. avail mem=94 GB",
    ]
    v = diagnose(Observation(log_lines=old + new, process_alive=True, log_silent_s=30))
    assert (v.verdict, v.phase) == ("loading", "weight_loading")


def test_ctrl_c_is_a_stop_not_a_crash():
    lines = [
        "[TP0] Load weight begin. avail mem=94 GB",
        "Traceback (most recent call last):",
        '  File "/x/launch_server.py", line 12, in <module>',
        "    main()",
        "KeyboardInterrupt",
    ]
    v = diagnose(Observation(log_lines=lines, process_alive=False))
    assert (v.verdict, v.phase) == ("exited", "shutdown")


def test_oom_inside_a_traceback():
    lines = [
        "[TP3] Capture cuda graph begin. This can take up to several minutes.",
        "Traceback (most recent call last):",
        '  File "/x/cuda_graph_runner.py", line 147, in __init__',
        "    self.capture()",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    ]
    v = diagnose(Observation(log_lines=lines, process_alive=False))
    assert (v.verdict, v.phase) == ("oom", "cuda_graph_capture")
    assert "self.capture()" in _joined(v)


def test_sigkill_is_a_host_oom_only_where_the_kernel_log_says_so():
    lines = ["Loading checkpoint shards:  75%|███ | 3/4 [00:08<00:02,  2.83s/it]Killed"]
    v = diagnose(Observation(log_lines=lines, process_alive=False))  # no kernel log: the cause is not named
    assert (v.verdict, v.phase) == ("unknown", "weight_loading")
    assert "no kernel log to say who sent it" in v.summary and "dmesg" in v.summary
    # how sure: low, the host OOM next in line, and the fact that would decide is the kernel log
    assert (v.confidence, v.runner_up) == ("low", "host_oom") and "dmesg" in (v.missing or "")
    v = diagnose(Observation(log_lines=lines, process_alive=False, dmesg_lines=["[1.0] usb 1-1: new device"]))
    assert v.verdict == "crashed" and "shows no OOM kill" in v.summary
    oom = ["[26002.1] Out of memory: Killed process 576419 (python) total-vm:78521468kB"]
    v = diagnose(Observation(log_lines=lines, process_alive=False, dmesg_lines=oom))
    assert (v.verdict, v.phase) == ("host_oom", "weight_loading")


def test_dmesg_oom_kill_of_a_dead_launch_is_host_oom():
    dmesg = ["[26002.109061] Out of memory: Killed process 576419 (python) total-vm:78521468kB"]
    v = diagnose(Observation(process_alive=False, dmesg_lines=dmesg))
    assert v.verdict == "host_oom"
    assert "Out of memory: Killed process 576419" in _joined(v)
    # an old OOM kill does not make a healthy, serving launch fail
    assert diagnose(Observation(process_alive=True, port_open=True, dmesg_lines=dmesg)).verdict == "ready"


def test_gpu_lost_wins():
    lost = "Unable to determine the device handle for GPU0000:17:00.0: GPU is lost"
    v = diagnose(Observation(gpu_error_lines=[lost]))
    assert (v.verdict, v.phase) == ("gpu_lost", None)
    xid = "NVRM: Xid (PCI:0000:17:00): 79, GPU has fallen off the bus."
    v = diagnose(Observation(process_alive=True, dmesg_lines=[xid]))
    assert v.verdict == "gpu_lost"


def test_readiness():
    uvicorn = "[2026-02-22 22:54:00] INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)"
    sglang = [*_sglang_loaded(), uvicorn]
    v = diagnose(Observation(log_lines=sglang, process_alive=True, log_silent_s=30))
    assert (v.verdict, v.phase) == ("loading", "warmup")  # SGLang: port up, warm-up not done yet
    fired = [*sglang, "[2026-02-22 22:54:09] The server is fired up and ready to roll!"]
    assert (diagnose(Observation(log_lines=fired, process_alive=True)).verdict) == "ready"
    vllm = ["(APIServer pid=1) INFO:     Application startup complete."]
    assert diagnose(Observation(log_lines=vllm, process_alive=True)).phase == "serving"
    assert diagnose(Observation(health="ok")).verdict == "ready"


def test_port_open_but_api_not_answering_is_a_hang():
    v = diagnose(Observation(process_alive=True, port_open=True, health="timeout", port=8000))
    assert (v.verdict, v.phase) == ("silent_hang", "serving")


def test_connect_timeout_from_a_client_on_a_listening_port_is_ready():
    probe = [
        "curl http://0.0.0.0:8000/v1/models",
        "curl: (28) Failed to connect to 0.0.0.0 port 8000 after 133149 ms: Connection timed out",
    ]
    v = diagnose(Observation(process_alive=True, port_open=True, probe_lines=probe))
    assert v.verdict == "ready"
    assert "client path" in v.summary


def test_orphans_by_launch_pids():
    holders = [
        GpuProcess(pid=4242, used_memory_mib=70000, gpu_index=0, process_name="python3"),
        GpuProcess(pid=100, used_memory_mib=1000, gpu_index=1, process_name="python3"),
    ]
    v = diagnose(Observation(process_alive=True, launch_pids={100}, gpu_processes=holders, log_silent_s=10))
    assert v.verdict == "orphans_hold_gpu"
    assert "PID 4242" in _joined(v) and "PID 100 " not in _joined(v)


def test_memory_held_after_the_launch_ended_is_orphans_in_shutdown():
    gpus = [
        GpuReading(
            index=0,
            memory_used_mib=46867,
            memory_total_mib=49140,
            utilization_gpu_pct=100,
            power_draw_w=90,
            power_limit_w=300,
        )
    ]
    v = diagnose(Observation(process_alive=False, gpus=gpus))
    assert (v.verdict, v.phase) == ("orphans_hold_gpu", "shutdown")
    free = [GpuReading(index=0, memory_used_mib=0, memory_total_mib=49140, utilization_gpu_pct=0)]
    assert diagnose(Observation(process_alive=False, gpus=free)).verdict == "unknown"


def test_unknown_without_evidence_and_vocabulary():
    v = diagnose(Observation())
    assert (v.verdict, v.phase) == ("unknown", None)
    assert v.next_steps
    assert v.verdict in VERDICTS
    assert "verdict: unknown" in format_verdict(v)


def test_non_finite_numbers_are_unknown():
    v = diagnose(Observation(process_alive=True, log_silent_s=math.nan, elapsed_s=math.inf))
    assert v.verdict == "unknown"


def test_signature_errors_name_the_entry():
    with pytest.raises(ValueError, match=r"engines\.x\.phases\.comm_init\.begin\[0\]"):
        load_signatures("engines: {x: {phases: {comm_init: {begin: ['(']}}}}")
    with pytest.raises(ValueError, match="unknown phase"):
        load_signatures("engines: {x: {phases: {booting: {begin: ['a']}}}}")
    with pytest.raises(ValueError, match="unknown verdict"):
        load_signatures("engines: {x: {failures: {sad: ['a']}}}")


def test_every_engine_names_its_versions():
    assert {"sglang", "vllm", "tgi", "trtllm", "generic"} <= set(SIGNATURES.engines)
    assert all(SIGNATURES.engines.values())
    assert set(SIGNATURES.default_grace_s) <= set(PHASES)


# --- bundle parsers ---------------------------------------------------------------------------------------


def test_headerless_ps_with_lstart_is_detected_by_shape():
    text = (
        "  824867  824670 root     Sl   Sat Jun  7 14:06:35 2025 4074589  0.0  0.1   71 "
        "/usr/bin/python3 /venv/bin/vllm serve /m --port 40047\n"
    )
    rows, raw = parse_ps_text(text)
    assert [(r.pid, r.ppid, r.stat, r.pcpu, r.elapsed_s) for r in rows] == [(824867, 824670, "Sl", 0.0, 4074589)]
    assert rows[0].args.startswith("/usr/bin/python3") and raw[824867].startswith("824867")


def test_headerless_ps_layouts():
    probe = "  569     1   566   566 Sl   10.7 26060292   37 00:00:04 hrtimer_nanosleep  /opt/venv/bin/python3 -B -c x"
    assert detect_ps_layout([probe])[:5] == ("pid", "ppid", "pgid", "sid", "stat")
    aux = "root 50299 0.0 0.2 55478556 1035232 ? Sl 22:53 0:16 /opt/venv/bin/python3 -m sglang.launch_server"
    rows, _ = parse_ps_text(aux)
    assert (rows[0].pid, rows[0].cpu_time_s, rows[0].stat) == (50299, 16, "Sl")


def test_headerless_gpu_csv_by_column_count_and_units():
    gpus, raw, errors = parse_gpu_csv("0, 76015 MiB, 97887 MiB, 0 %\n1, 76017 MiB, 97887 MiB, 0 %\n")
    assert [(g.index, g.memory_used_mib, g.memory_total_mib, g.utilization_gpu_pct) for g in gpus] == [
        (0, 76015, 97887, 0),
        (1, 76017, 97887, 0),
    ]
    assert raw[0] == "0, 76015 MiB, 97887 MiB, 0 %" and errors == []
    gpus, _, _ = parse_gpu_csv("0, 76015, 97887, 0\n")  # nounits: by column count
    assert gpus[0].memory_total_mib == 97887
    gpus, _, _ = parse_gpu_csv("index, memory.used [MiB], memory.total [MiB]\n0, 5 MiB, 10 MiB\n")
    assert gpus[0].memory_used_mib == 5


def test_gpu_table_keeps_raw_rows_and_errors():
    table = (
        "|   0  NVIDIA L40S                    Off |   00000000:1C:00.0 Off |                    0 |\n"
        "| N/A   40C    P0             97W /  350W |    2627MiB /  46068MiB |    100%      Default |\n"
    )
    gpus, _, raw, errors = parse_gpu_table(table)
    assert gpus[0].utilization_gpu_pct == 100 and "2627MiB" in raw[0] and errors == []
    _, _, _, errors = parse_gpu_table("Unable to determine the device handle for GPU0000:17:00.0: Unknown Error\n")
    assert errors == ["Unable to determine the device handle for GPU0000:17:00.0: Unknown Error"]


def test_listening_ipcs_docker():
    socks = parse_listening(
        "tcp   0  0 0.0.0.0:8000   0.0.0.0:*   LISTEN   11671/python   off (0.00/0/0)\n"
        "tcp6  0  0 :::34315       :::*        LISTEN   1/python3\n"
        'LISTEN 0 4096 127.0.0.1:30000 0.0.0.0:* users:(("python3",pid=55,fd=7))\n'
        "tcp   0  0 10.0.0.2:5555  10.0.0.3:41000 ESTABLISHED 1/python3\n"
    )
    assert [(s.port, s.owner) for s in socks] == [(8000, "11671/python"), (34315, "1/python3"), (30000, "55/python3")]
    segs = parse_ipcs_m("key shmid owner perms bytes nattch status\n0x00000000 7 user 600 524288 2 dest\n")
    assert (segs[0].nattch, segs[0].status) == (2, "dest")
    rows = parse_docker_ps(
        "CONTAINER ID   IMAGE   COMMAND   CREATED   STATUS          PORTS                    NAMES\n"
        '5d6972460ce0   img     "x"       2h ago    Up 26 minutes   0.0.0.0:8000->8000/tcp   vllm\n'
    )
    assert (rows[0].name, rows[0].status) == ("vllm", "Up 26 minutes")


def test_missing_files_stay_unknown():
    obs = observation_from_texts({"server.log": ""})
    assert obs.log_lines == [] and obs.processes is None and obs.gpus is None and obs.dmesg_lines is None
    obs = observation_from_texts({}, {"port_open": "yes", "log_silent_s": -5, "health": "great"})
    assert obs.port_open is None and obs.log_silent_s is None and obs.health is None
    assert len(obs.notes) == 3


# --- fuzz -----------------------------------------------------------------------------------------------

_LOG_ALPHABET = st.characters(blacklist_categories=("Cs",))
_PIECES = st.sampled_from(
    [
        "Load weight end. avail mem=1 GB",
        "[TP1] Memory pool end. avail mem=1 GB",
        "Traceback (most recent call last):",
        "KeyboardInterrupt",
        "CUDA out of memory",
        WATCHDOG,
        "NCCL WARN Call to bind failed: Address already in use",
        "Waiting for 1 local, 0 remote core engine proc(s) to start.",
        "Loading safetensors checkpoint shards:  3% Completed | 1/37 [00:02<01:39,  2.77s/it]",
        "  0%|          | 0/23 [00:00<?, ?it/s]\r 50%|#####     | 12/23",
        "Killed",
        "\x1b[31mERROR\x1b[0m 01-01 00:00:00 Worker x pid 1 died, exit code: -9",
        "",
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.text(_LOG_ALPHABET, max_size=200), _PIECES), max_size=40))
def test_fuzz_random_log_text_never_raises(lines):
    v = diagnose(Observation(log_lines=lines))
    assert v.verdict in VERDICTS and (v.phase is None or v.phase in PHASES)
    v = diagnose(Observation(log_lines=lines, process_alive=True, log_growing=True, port_open=False))
    assert v.verdict in VERDICTS


_MAYBE_FLOAT = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))
_MAYBE_BOOL = st.one_of(st.none(), st.booleans())


@settings(max_examples=200, deadline=None)
@given(
    silent=_MAYBE_FLOAT,
    elapsed=_MAYBE_FLOAT,
    alive=_MAYBE_BOOL,
    growing=_MAYBE_BOOL,
    port_open=_MAYBE_BOOL,
    rising=_MAYBE_BOOL,
    health=st.one_of(st.none(), st.sampled_from(["ok", "http_503", "refused", "timeout", "empty", "weird"])),
    exit_code=st.one_of(st.none(), st.integers(-300, 300)),
    mem=_MAYBE_FLOAT,
    util=_MAYBE_FLOAT,
    power=_MAYBE_FLOAT,
)
def test_fuzz_observation_fields_never_raise(
    silent, elapsed, alive, growing, port_open, rising, health, exit_code, mem, util, power
):
    gpus = [
        GpuReading(
            index=0,
            memory_used_mib=mem,
            memory_total_mib=mem,
            utilization_gpu_pct=util,
            power_draw_w=power,
            power_limit_w=power,
        )
    ]
    obs = Observation(
        log_silent_s=silent,
        elapsed_s=elapsed,
        process_alive=alive,
        log_growing=growing,
        port_open=port_open,
        gpu_mem_rising=rising,
        health=health,
        exit_code=exit_code,
        gpus=gpus,
    )
    v = diagnose(obs, history=[obs])
    assert v.verdict in VERDICTS


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(list(BUNDLE_FILES)),
        st.text(_LOG_ALPHABET, max_size=300),
    )
)
def test_fuzz_bundle_texts_never_raise(texts):
    obs = observation_from_texts(texts, {"process_alive": True})
    assert diagnose(obs).verdict in VERDICTS


# --- rules by meaning: the adversarial review's false positives -------------------------------------------

def test_tensorrt_tactic_memory_warnings_are_benign_and_never_outrank_a_real_failure():
    tactic = ["[12/01/2025-10:00:01] [TRT] [W] Tactic Device request: 4224MB Available: 2560MB. Device memory is "
              "insufficient to use tactic.",
              "[12/01/2025-10:00:01] [TRT] [W] Skipping tactic 3 due to insufficient memory on requested size of "
              "4429185024 detected for tactic 0x0000000000000004."]
    loading = diagnose(Observation(log_lines=tactic, process_alive=True, log_silent_s=10))
    assert loading.verdict == "loading", loading.summary
    crash = [*tactic, "[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
             "unhandled system error"]
    assert diagnose(Observation(log_lines=crash, process_alive=False)).verdict == "nccl_error"


def test_a_barrier_warning_naming_init_process_group_starts_no_communicator():
    lines = ["[2025-01-01 10:00:00 TP0] Load weight begin. avail mem=139.00 GB",
             "[W1201 10:00:05.1 ProcessGroupNCCL.cpp:4115] [PG ID 0 PG GUID 0 Rank 0]  using GPU 0 to perform "
             "barrier as devices used by this process are currently unknown. Specify device_ids in barrier() "
             "or call init_process_group() with a device_id."]
    assert scan_log(lines).phase == "weight_loading"
    real = [*lines[:1], "[2025-01-01 10:00:09 TP0] Init torch distributed begin."]
    assert scan_log(real).phase == "comm_init"  # the newest line starts a communicator: comm_init


def test_the_memory_budget_is_read_by_meaning_in_each_engine_s_words():
    for line in ("ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can "
                 "be stored in KV cache (86432).",
                 "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`.",
                 "ValueError: Free memory on device (31.44/47.38 GiB) on startup is less than desired GPU memory "
                 "utilization (0.95, 45.01 GiB).",
                 "E0306 16:40:07.708802 117 backend_model.cc:691] maxTokensInPagedKvCache (29184) must be large "
                 "enough to process at least 1 sequence",
                 "llama_kv_cache_init: failed to allocate buffer for kv cache"):
        v = diagnose(Observation(log_lines=[line], process_alive=False))
        assert v.verdict == "oom", (line, v.summary)
    for benign in ("INFO 05-01 10:00:00 [gpu_worker.py:1] GPU KV cache size: 1,048,576 tokens",
                   "INFO 05-01 10:00:00 [executor_base.py:1] # cuda blocks: 16384, # CPU blocks: 4096",
                   "[2025-01-01 10:00:00 TP0] KV Cache is allocated. #tokens: 1000000, K size: 10.00 GB"):
        assert diagnose(Observation(log_lines=[benign], process_alive=True, log_silent_s=5)).verdict == "loading"


def test_a_phase_hint_is_read_from_the_failure_s_own_traceback_innermost_first():
    lines = ["Traceback (most recent call last):",
             '  File "/x/model_runner.py", line 9, in init_cuda_graphs',
             '  File "/x/cuda_graph_runner.py", line 80, in capture',
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
             "",
             "INFO skipping warmup cache flush"]
    v = diagnose(Observation(log_lines=lines, process_alive=False))
    assert (v.verdict, v.phase) == ("oom", "cuda_graph_capture")
    assert any("init_cuda_graphs" in e or "capture" in e for e in v.evidence)


def test_queued_requests_and_a_silent_log_are_a_serving_hang_even_while_health_answers():
    stats = ("INFO 02-01 06:36:05 llm_engine.py:921] Avg prompt throughput: 382.6 tokens/s, Running: 35 reqs, "
             "Swapped: 0 reqs, Pending: 115 reqs, GPU KV cache usage: 99.0%")
    obs = Observation(log_lines=["INFO:     Application startup complete.", stats], process_alive=True,
                      port_open=True, health="ok", log_silent_s=600)
    v = diagnose(obs)
    assert (v.verdict, v.phase) == ("silent_hang", "serving"), v.summary
    assert "Pending: 115 reqs" in _joined(v)
    idle = stats.replace("Running: 35", "Running: 0").replace("Pending: 115", "Pending: 0")
    assert diagnose(replace(obs, log_lines=[obs.log_lines[0], idle])).verdict == "ready"  # idle and quiet: fine
    assert diagnose(replace(obs, log_silent_s=20)).verdict == "ready"  # within the serving grace


def test_a_failure_while_a_request_runs_is_in_serving_and_its_same_second_block_is_one_event():
    lines = ["2024-12-19 21:40:35 WARNING 56542 [model_runner_base.py:143] Failed to pickle inputs of failed "
             "execution: CUDA error: an illegal memory access was encountered",
             "2024-12-19 21:40:35 WARNING 56542 [model_runner_base.py:143] For debugging consider passing "
             "CUDA_LAUNCH_BLOCKING=1",
             "2024-12-19 21:40:35 ERROR 56542 [async_llm_engine.py:64] Engine background task failed",
             "2024-12-19 21:40:35 ERROR 56542 [async_llm_engine.py:64] Traceback (most recent call last):"]
    v = diagnose(Observation(log_lines=lines, process_alive=False))
    assert (v.verdict, v.phase) == ("cuda_error", "serving")
    assert "Engine background task failed" in _joined(v)  # the block's head line, quoted
    assert any("A kernel faulted" in s for s in v.next_steps)  # the cause's own steps first
    assert not any("compute_cap" in s for s in v.next_steps)  # not the wheel check of a missing kernel image


def test_leftovers_of_an_ended_launch_are_orphans_whatever_their_names():
    ps = ("  PID  PPID STAT %CPU COMMAND\n"
          " 4242     1 Sl   99.0 /usr/bin/python3 -c from multiprocessing.spawn import spawn_main; spawn_main(fd=7)\n"
          " 4300     1 Rl   99.0 pt_main_thread\n")
    smi = ("| Processes:                                                                              |\n"
           "|    0   N/A  N/A      4242      C   /usr/bin/python3                            70000MiB |\n"
           "|    1   N/A  N/A      4300      C   pt_main_thread                              70000MiB |\n")
    obs = observation_from_texts({"ps.txt": ps, "nvidia-smi.txt": smi}, {"process_alive": False})
    v = diagnose(obs)
    assert v.verdict == "orphans_hold_gpu", v.summary
    joined = _joined(v)
    assert "4242" in joined and "4300" in joined


# --- the second adversarial pass --------------------------------------------------------------------------

def test_an_idle_sglang_server_whose_last_stats_line_shows_a_running_request_is_ready():
    lines = ["[2025-09-09 08:32:09 TP0] The server is fired up and ready to roll!",
             "[2025-09-09 08:32:10 TP0] Decode batch. #running-req: 1, #token: 2625, token usage: 0.01, "
             "gen throughput (token/s): 40.49, #queue-req: 0, ",
             '[2025-09-09 08:32:11] INFO:     127.0.0.1:5000 - "POST /generate HTTP/1.1" 200 OK']
    v = diagnose(Observation(log_lines=lines, process_alive=True, port_open=True, health="ok", log_silent_s=1200))
    assert v.verdict == "ready", v.summary


def test_a_previous_run_s_queued_requests_do_not_make_a_fresh_run_hang():
    old = "INFO 02-01 06:36:05 llm_engine.py:921] Running: 4 reqs, Swapped: 0 reqs, Pending: 9 reqs"
    lines = [old, "INFO 02-01 07:00:00 api_server.py:1] vLLM API server version 0.6.0",
             "INFO 02-01 07:00:01 api_server.py:1] args: Namespace(model='m')",
             "INFO:     Application startup complete."]
    v = diagnose(Observation(log_lines=lines, process_alive=True, port_open=True, health="ok", log_silent_s=1200))
    assert scan_log(lines).start >= 1 and v.verdict == "ready", v.summary


def test_cause_steps_need_the_cause_s_own_words():
    watchdog = ("[rank0]:[E1201 10:00:00.1 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation "
                "timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, Timeout(ms)=600000) ran for 600010 ms")
    v = diagnose(Observation(log_lines=[watchdog], process_alive=False))
    assert v.verdict == "nccl_error" and not any("InfiniBand" in s for s in v.next_steps), v.next_steps
    assert "some rank never entered it" in v.next_steps[0]
    disk = ("OSError: [Errno 28] No space left on device: '/root/.cache/huggingface/hub/models--x/blobs/abc'")
    assert not any("/dev/shm" in s for s in diagnose(Observation(log_lines=[disk], process_alive=False)).next_steps)
    cpu = "Illegal instruction (core dumped)"
    steps = diagnose(Observation(log_lines=[cpu], process_alive=False)).next_steps
    assert not any("kernel faulted" in s for s in steps)


def test_a_gpu_service_of_its_own_is_no_leftover_of_an_ended_launch():
    ps = "  PID  PPID STAT %CPU COMMAND\n  900     1 Ssl   2.0 /usr/local/bin/ollama serve\n"
    smi = ("| Processes:                                                                              |\n"
           "|    1   N/A  N/A       900      C   /usr/local/bin/ollama                        4000MiB |\n")
    obs = observation_from_texts({"ps.txt": ps, "nvidia-smi.txt": smi, "server.log": "Shutting down (requested).\n"},
                                 {"process_alive": False})
    assert diagnose(replace(obs, exit_code=0)).verdict == "exited"


def test_an_unreadable_kernel_log_is_no_evidence_either_way():
    lines = ["Loading checkpoint shards:  75%|███ | 3/4 [00:08<00:02,  2.83s/it]Killed"]
    for dmesg in ([], ["dmesg: read kernel buffer failed: Operation not permitted"]):
        v = diagnose(Observation(log_lines=lines, process_alive=False, dmesg_lines=dmesg))
        assert v.verdict == "unknown" and "no kernel log to say who sent it" in v.summary, v.summary
        assert v.runner_up == "host_oom" and any("SIGKILL" in s for s in v.next_steps)


def test_port_evidence_names_the_launchs_sockets_not_the_hosts_other_services() -> None:
    from bot.core.diagnose import ListenObs
    from bot.core.models import ProcessInfo

    listening = [ListenObs("0.0.0.0", 22, "812/sshd", "tcp 0.0.0.0:22 LISTEN 812/sshd"),
                 ListenObs("127.0.0.1", 5432, "900/postgres", "tcp 127.0.0.1:5432 LISTEN 900/postgres"),
                 ListenObs("0.0.0.0", 29500, "4242/python3", "tcp 0.0.0.0:29500 LISTEN 4242/python3")]
    obs = Observation(log_lines=_sglang_loaded(), process_alive=True, port=30000, port_open=False,
                      listening=listening, processes=[ProcessInfo(pid=4242, ppid=1, args="python3 -m sglang")])
    evidence = "\n".join(diagnose(obs).evidence)
    assert "29500" in evidence and "4242/python3" in evidence
    assert "sshd" not in evidence and "postgres" not in evidence


def test_port_evidence_puts_the_ports_own_socket_first_and_without_ps_quotes_server_programs_only() -> None:
    from bot.core.diagnose import ListenObs
    from bot.core.models import ProcessInfo

    workers = [ListenObs("127.0.0.1", 40000 + i, "42/python3", f"tcp 127.0.0.1:{40000 + i} LISTEN 42/python3")
               for i in range(6)]
    port = ListenObs("0.0.0.0", 8000, "42/python3", "tcp 0.0.0.0:8000 LISTEN 42/python3")
    obs = Observation(log_lines=_sglang_loaded(), process_alive=True, port=8000, port_open=True, health="timeout",
                      listening=[*workers, port], processes=[ProcessInfo(pid=42, ppid=1, args="python3 -m sglang")])
    evidence = "\n".join(diagnose(obs).evidence)
    assert "0.0.0.0:8000" in evidence and "40000" not in evidence  # the port listens: its socket says enough
    host = [ListenObs("127.0.0.53", 53, "512/systemd-resolve", "tcp 127.0.0.53:53 LISTEN 512/systemd-resolve"),
            ListenObs("0.0.0.0", 22, "812/sshd", "tcp 0.0.0.0:22 LISTEN 812/sshd"),
            ListenObs("10.0.0.2", 37769, "1/python3", "tcp 10.0.0.2:37769 LISTEN 1/python3")]
    closed = Observation(log_lines=_sglang_loaded(), process_alive=True, port=30000, port_open=False, listening=host)
    evidence = "\n".join(diagnose(closed).evidence)
    assert "1/python3" in evidence and "sshd" not in evidence and "systemd-resolve" not in evidence


def test_a_crash_quotes_what_its_traceback_says_not_its_header():
    lines = ["[2026-12-05 05:42:04 TP0] Load weight end. mem usage=8.41 GB.",
             "Traceback (most recent call last):",
             '  File "/srv/fake_server.py", line 115, in worker',
             '    raise RuntimeError("fake scheduler failed during init")',
             "RuntimeError: fake scheduler failed during init",
             "[2026-12-05 05:42:04] Received sigquit from a child process. It usually means the child failed."]
    v = diagnose(Observation(process_alive=False, log_lines=lines, log_silent_s=1))
    assert v.verdict == "crashed"
    assert "failure: `RuntimeError: fake scheduler failed during init`" in v.summary, v.summary
    assert "Traceback (most recent call last)" not in v.summary
    assert any(e.startswith("error (log line 5): `RuntimeError") for e in v.evidence), v.evidence


def test_the_failing_rank_s_milestone_is_the_phase_not_the_furthest_rank_s():
    lines = ["[2025-02-01 07:00:00 TP0] Load weight begin", "[2025-02-01 07:00:00 TP1] Load weight begin",
             "[2025-02-01 07:01:00 TP0] Load weight end. mem usage=40 GB",
             "[2025-02-01 07:01:05 TP0] Capture cuda graph begin. This can take up to several minutes.",
             "[2025-02-01 07:01:06 TP1] RuntimeError: failed to read shard 7 of the checkpoint"]
    v = diagnose(Observation(log_lines=lines, process_alive=False))
    assert (v.verdict, v.phase) == ("crashed", "weight_loading"), v.summary


def test_words_inside_an_error_message_set_no_phase():
    v = diagnose(Observation(log_lines=["RuntimeError: cuda graph capture failed while loading weights"],
                             process_alive=False))
    assert v.verdict == "crashed" and v.phase is None, v.summary


def test_a_graceful_stop_in_the_engine_s_own_words_is_an_exit_in_shutdown_and_its_teardown_no_failure():
    lines = ["INFO 05-26 19:00:00 [api_server.py:1] Starting vLLM API server on http://0.0.0.0:8000",
             "INFO 05-26 19:19:56 [launcher.py:1] Received SIGTERM, shutting down the server",
             "ERROR 05-26 19:19:57 [core.py:1] RuntimeError: NCCL communicator was aborted on rank 1"]
    v = diagnose(Observation(log_lines=lines))
    assert (v.verdict, v.phase) == ("exited", "shutdown"), v.summary
    # the same error BEFORE the stop is the failure
    failed = diagnose(Observation(log_lines=[lines[0], lines[2], lines[1]]))
    assert failed.verdict != "exited"


def test_a_program_that_ran_to_its_end_exited_with_no_phase():
    lines = ["[rank0]:[W525 04:26:35.862790893 ProcessGroupNCCL.cpp:1575] Warning: WARNING: destroy_process_group() "
             "was not called before program exit, which can leak resources."]
    v = diagnose(Observation(log_lines=lines, process_alive=False))
    assert (v.verdict, v.phase) == ("exited", None), v.summary


# --- an error the same rank went past (issue 44, second round) ----------------------------------------------------

_SURVIVED = [
    "[2025-03-01 10:00:00 TP1] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/opt/sglang/srt/models/registry.py", line 12, in import_model_classes',
    "ValueError: No module named 'foo_kernels'",
    "[2025-03-01 10:00:05 TP1] Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:05<00:05,  5.0s/it]",
    "[2025-03-01 10:00:10 TP1] Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:10<00:00,  5.0s/it]",
]


def test_a_generic_error_the_same_rank_went_past_is_no_crash_even_without_process_state():
    v = diagnose(Observation(log_lines=_SURVIVED))
    assert (v.verdict, v.phase) == ("loading", "weight_loading"), v.summary


def test_another_rank_s_progress_does_not_outlive_a_rank_s_error_when_the_process_state_is_unknown():
    other = [line.replace("TP1", "TP0") if "Loading" in line else line for line in _SURVIVED]
    assert diagnose(Observation(log_lines=other)).verdict == "crashed"
    # with the launch known to run on, the run went on past it
    assert diagnose(Observation(log_lines=other, process_alive=True)).verdict == "loading"


def test_a_rank_s_own_exception_before_the_others_watchdog_timeouts_is_the_cause():
    lines = [
        "[rank3]: Traceback (most recent call last):",
        '[rank3]:   File "/opt/train.py", line 88, in <module>',
        "[rank3]:     loss = model(batch)",
        "[rank3]: ValueError: Expected input batch_size (8) to match target batch_size (4).",
        *(f"[rank{r}]:[E1206 10:10:00.123456 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation "
          "timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600003 "
          "milliseconds before timing out." for r in (0, 1)),
    ]
    v = diagnose(Observation(log_lines=lines))
    assert v.verdict == "crashed" and "ValueError: Expected input batch_size" in v.summary, v.summary
    assert any("echo" in e and "Watchdog caught" in e for e in v.evidence), v.evidence
    # the watchdog timeouts alone are the NCCL failure
    assert diagnose(Observation(log_lines=lines[4:])).verdict == "nccl_error"
