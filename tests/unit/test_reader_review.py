"""What the issue-44 readers must not do (from an adversarial review): take a warning's dump at exit for a failure,
a CUDA OOM that mentions the node for the host's, an indented root cause for a code line, a retried step for a hang,
one odd process row for a reason to drop every column; nor spend seconds on a hostile line."""

from __future__ import annotations

import pytest

from bot.core.bundle import parse_ps_text
from bot.core.diagnose import Observation, diagnose

pytestmark = pytest.mark.timeout(30)


def _v(lines, **kw):
    return diagnose(Observation(log_lines=lines, **kw))


def test_a_c10_dump_under_an_exit_warning_is_no_failure():
    lines = ["Loading weights: 100%|##########| 16/16",
             "[rank3]:[W322 13:52:50.46 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=60): Failed to "
             "recv, got 0 bytes. Connection was likely closed.",
             "Exception raised from recvBytes at /pytorch/torch/csrc/distributed/c10d/Utils.hpp:682 (most recent call "
             "first):",
             "frame #5: c10d::ProcessGroupNCCL::HeartbeatMonitor::runLoop() + 0x3c8 (0x7f00 in libtorch_cuda.so)"]
    v = _v(lines, process_alive=False, exit_code=0)
    assert v.verdict not in ("nccl_error", "cuda_error", "crashed"), v


def test_a_cuda_oom_that_names_the_node_is_the_gpu_s():
    v = _v(["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. Check whether other jobs hold "
            "GPU memory on this node."], process_alive=False)
    assert v.verdict == "oom", v


def test_an_indented_root_cause_above_a_wrapper_error_is_the_cause():
    p = "ERROR 06-30 13:54:10 [core.py:2] "
    v = _v([p + "Worker 1 failed with:",
            p + "    torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            p + "RuntimeError: Worker failed with error 'see above', please check the stack trace above"],
           process_alive=False, exit_code=1)
    assert v.verdict == "oom", v


def test_a_step_that_timed_out_and_is_retried_is_no_hang():
    v = _v(["INFO:     Application startup complete.",
            "WARNING 06-30 13:54:10 [engine.py:1] Engine iteration timed out, retrying",
            'INFO:     10.0.0.5:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK'],
           process_alive=True, port_open=True, health="ok")
    assert v.verdict == "ready", v


def test_one_truncated_row_does_not_drop_every_column():
    text = ("user      4321    4300  0 10:00 ?        00:10:00 python3 -m vllm.entrypoints.openai.api_server\n"
            "user      4330    4321 99 10:00 ?        01:00:00 VLLM::EngineCore\n"
            "8192 --gpu-memory-utilization 0.9\n")  # `ps -ef` without its header; the last row a wrapped argument
    rows, _ = parse_ps_text(text)
    assert {r.pid: r.ppid for r in rows if r.pid in (4321, 4330)} == {4321: 4300, 4330: 4321}


@pytest.mark.parametrize("line", ["/" + "a(" * 1999 + "[0x1]", " 1 /" + "a(" * 1990 + " [0x1]", "a-" * 1995])
def test_a_hostile_line_is_read_in_no_time(line):
    # without a backtracking regex this is milliseconds; the per-test timeout fails it otherwise
    lines = ["fatal error: unexpected signal during runtime execution", "goroutine 1 [running]:", line] * 10
    assert _v(lines, process_alive=False).verdict
