"""How a launch ended, read from what the evidence is (issue 44's adversarial review): a stop in order ended by the
signal that asked for it is `exited`; an exit status means the process ended; an error caught before a clean end or
a request's error while the server answers is no crash; the wrapper's exit line counts only as the log's last line;
a rank's own OOM outranks the NCCL timeout another rank echoes it with; stacks read by their innermost telling
frame, whatever class a frame's function belongs to; hostile names and Slurm comments stay inert."""

from __future__ import annotations

import json

import pytest

from bot.core.bundle import node_bundles, observation_from_files
from bot.core.diagnose import Observation, diagnose
from bot.core.diagnose.stacks import stack_activity
from bot.core.ranks import weigh_bundle
from bot.core.slurm import parse_show_job
from bot.core.stackdump import Frame, ProcessDump, ThreadDump
from tests.support.paths import FIXTURES

SERVED = [
    "INFO 06-12 10:00:01 [api_server.py:1] vLLM API server version 0.9.1",
    "INFO 06-12 10:02:11 [launcher.py:29] Route: /v1/chat/completions, Methods: POST",
    "INFO:     Application startup complete.",
    'INFO:     10.0.0.5:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
]
STOPPED = [*SERVED, "INFO:     Shutting down", "INFO:     Waiting for application shutdown.",
           "INFO:     Application shutdown complete.", "INFO:     Finished server process [4242]"]
TRACEBACK = ["Traceback (most recent call last):",
             '  File "/opt/venv/lib/python3.12/site-packages/vllm/entrypoints/openai/serving_chat.py", line 100, in '
             "create_chat_completion",
             "    result = await handler(request)",
             "ValueError: This model's maximum context length is 8192 tokens. However, you requested 9000 tokens."]


@pytest.mark.parametrize("code", [143, -15, 130, -2])
def test_a_stop_in_order_ended_by_the_signal_that_asked_for_it_is_exited(code):
    v = diagnose(Observation(log_lines=STOPPED, process_alive=False, exit_code=code))
    assert (v.verdict, v.phase) == ("exited", "shutdown"), v.summary


def test_a_signal_without_a_stop_in_the_log_is_still_said_with_the_signal():
    v = diagnose(Observation(log_lines=SERVED, process_alive=False, exit_code=143))
    assert v.verdict == "crashed" and "killed by signal 15 (SIGTERM)" in v.summary


def test_an_exit_status_means_the_process_ended():
    v = diagnose(Observation(log_lines=SERVED[:2], exit_code=0))
    assert v.verdict == "exited", v.summary
    assert diagnose(Observation(log_lines=SERVED[:2], exit_code=1)).verdict == "crashed"


def test_an_error_caught_before_a_clean_end_is_no_crash():
    early = [SERVED[0], *TRACEBACK, *STOPPED[1:]]  # an import error it got past, then served and stopped in order
    assert diagnose(Observation(log_lines=early, process_alive=False)).verdict == "exited"
    batch = [*SERVED, *TRACEBACK]  # a batch job that logged a caught error and ended with status 0
    assert diagnose(Observation(log_lines=batch, process_alive=False, exit_code=0)).verdict == "exited"


def test_a_request_error_while_the_server_answers_is_no_crash():
    v = diagnose(Observation(log_lines=[*SERVED, *TRACEBACK], process_alive=True, port_open=True, health="ok"))
    assert v.verdict == "ready", v.summary
    # the same error ending a server that is gone is its crash
    assert diagnose(Observation(log_lines=[*SERVED, *TRACEBACK], process_alive=False, exit_code=1)).verdict \
        == "crashed"


def test_the_wrappers_exit_line_counts_only_as_the_logs_last_line():
    forged = "[gpubot] the server process exited with status 137"
    files = {"server.log": "\n".join([*SERVED[:3], forged, *SERVED[3:]]) + "\n",
             "observed.json": json.dumps({"port_open": True})}
    obs = observation_from_files(files)
    assert obs.exit_code is None and forged not in (obs.log_lines or [])
    assert diagnose(obs).verdict == "ready"
    last = {"server.log": "\n".join([*SERVED, forged]) + "\n", "observed.json": "{}"}
    obs = observation_from_files(last)
    assert obs.exit_code == 137 and forged not in (obs.log_lines or [])
    alive = {**last, "observed.json": json.dumps({"process_alive": True})}
    assert observation_from_files(alive).exit_code is None  # a process seen alive has no exit status


def _dump(*names: str) -> list[tuple[str, ProcessDump]]:
    frames = [Frame(name=n, file=f"{n.split('.')[0]}.py", line=1) for n in names]
    return [("TP0", ProcessDump(1, True, [ThreadDump("MainThread", 1, True, True, frames)]))]


def test_stacks_are_read_by_their_innermost_telling_frame_whatever_class_it_belongs_to():
    # a collective inside a weight load is a wait (py-spy 0.3's bare names)
    assert stack_activity(_dump("all_reduce", "get_available_gpu_memory", "load_model"))[0] == "waiting"
    # a synchronize inside Inductor's autotuning is its work (py-spy 0.4's qualified names)
    assert stack_activity(_dump("synchronize", "InductorBenchmarker.benchmark_gpu",
                                "CachingAutotuner.benchmark_all_configs", "compile_fx"))[0] == "working"
    assert stack_activity(_dump("_compile.<locals>._compile_inner", "worker"))[0] == "working"


def test_cpu_time_alone_for_many_graces_is_a_hang_and_spinning_gpus_make_it_a_wait():
    from bot.core.models import GpuReading

    base = ["[2026-12-06 10:00:09 TP0] Init torch distributed begin."]
    v = diagnose(Observation(log_lines=base, process_alive=True, log_silent_s=36000, cpu_time_growing=True))
    assert v.verdict == "silent_hang"
    spin = [GpuReading(index=i, memory_used_mib=2600, memory_total_mib=81559, utilization_gpu_pct=100,
                       power_draw_w=97, power_limit_w=700) for i in range(2)]
    v = diagnose(Observation(log_lines=base, process_alive=True, log_silent_s=600, cpu_time_growing=True, gpus=spin))
    assert v.verdict == "silent_hang", v.summary


def test_a_ranks_oom_outranks_the_nccl_timeout_another_rank_echoes_it_with():
    (line,) = (FIXTURES / "slurm" / "failed.txt").read_text().strip().splitlines()
    echo = Observation(log_lines=["[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught collective operation "
                                  "timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE) ran for 600059 milliseconds before "
                                  "timing out."], process_alive=False)
    oom = Observation(log_lines=["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB."],
                      process_alive=False)
    v = weigh_bundle(diagnose(echo), echo, "n1", [(1, "n2", oom)], line)
    assert v.verdict == "oom" and v.summary.startswith("Rank 1 on node n2"), v.summary


def test_hostile_node_names_and_slurm_comments_stay_inert():
    files = {"server.log": "x\n", "node-n3\x1b]0;pwned\x07\nverdict: ready/server.log": "y\n",
             "ranks.txt": "0 n1\x1b[31m\n"}
    nodes = node_bundles(files)
    names = [nodes.rank0, *(n for _, n, _ in nodes.ranks)]
    assert names[0].startswith("n1") and all("\x1b" not in n and "\n" not in n and "\x07" not in n for n in names)
    (job,) = parse_show_job("JobId=7 JobName=x Comment=" + " " * 40000 + "a JobState=FAILED ExitCode=1:0")
    assert (job.state, job.exit_code) == ("FAILED", 1)
