"""The bundle writer (bot.core.collect) and the reader's edges: the extras script run for real by sh (a hung
nvidia-smi cannot cost the kernel log or the sockets), the host's env exported, ps.txt and py-spy JSON read
back, and hostile bundle contents (a FIFO, /dev/zero, huge numbers) that must neither hang nor crash."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.cli import main
from bot.core.bundle import observation_from_files, parse_ps_text
from bot.core.collect import extras_budget_s, extras_script, observed_from_probes, parse_extras, ps_text, stack_json
from bot.core.models import GpuReading, GpuSection, HealthResult, LogInfo, ProcessInfo, Snapshot
from bot.core.stackdump import ProcessDump, parse_stack_json
from tests.support.paths import FIXTURES

pytestmark = pytest.mark.timeout(60)


def _run(script: str, timeout_s: int) -> dict:
    out = subprocess.run(["sh", "-s"], input=script.encode(), capture_output=True, timeout=timeout_s)
    return parse_extras(out.stdout.decode())


def test_a_hung_nvidia_smi_is_cut_and_runs_after_the_sockets_and_the_kernel_log(tmp_path: Path):
    smi = tmp_path / "hung-smi"
    smi.write_text("#!/bin/sh\nsleep 60\n")
    smi.chmod(0o755)
    got = _run(extras_script(str(smi), timeout_s=1), extras_budget_s(1))
    assert list(got) == ["listen", "dmesg", "nvidia-smi", "nvidia-smi-csv"]
    assert got["nvidia-smi"][1] == 124 and got["nvidia-smi-csv"][1] == 124  # timeout's status: cut, not hung
    assert got["listen"][1] is not None and got["dmesg"][1] is not None


def test_the_host_env_is_exported_and_odd_names_or_values_never_reach_the_shell(tmp_path: Path):
    smi = tmp_path / "bin" / "my-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho \"smi saw $GPUBOT_X\"\n")
    smi.chmod(0o755)
    env = [("PATH", f"{smi.parent}:{os.environ['PATH']}"), ("GPUBOT_X", "a'b; touch pwned"), ("BAD NAME", "x")]
    got = _run(extras_script("my-smi", timeout_s=5, env=env), 30)
    assert got["nvidia-smi"] == ("smi saw a'b; touch pwned\n", 0)
    assert not (Path.cwd() / "pwned").exists()


def test_ps_text_and_stack_json_read_back_as_they_were():
    rows = [ProcessInfo(pid=12, ppid=1, pgid=12, sid=12, stat="Sl", pcpu=0.0, rss_kib=1024, elapsed_s=3700,
                        cpu_time_s=90061, wchan="futex_wait_queue", args="sglang::scheduler_TP0"),
            ProcessInfo(pid=7, stat="S", args="python -m sglang.launch_server --tp 2")]
    back, raw = parse_ps_text(ps_text(rows))
    by_pid = {p.pid: p for p in back}
    assert by_pid[12].args == "sglang::scheduler_TP0" and by_pid[12].cpu_time_s == 90061
    assert by_pid[12].elapsed_s == 3700 and by_pid[7].args.endswith("--tp 2") and set(raw) == {7, 12}
    real = (FIXTURES / "pyspy" / "h200" / "init_missing_rank-rank0.json").read_text()
    threads = parse_stack_json(real)
    again = parse_stack_json(stack_json(ProcessDump(1, True, threads)))
    assert [[f.name for f in t.frames] for t in again] == [[f.name for f in t.frames] for t in threads]


def test_hostile_observed_json_values_are_notes_not_crashes():
    for observed in ('{"log_silent_s": 1e400}', '{"elapsed_s": ' + "9" * 400 + "}",
                     '{"grace_s": {"comm_init": ' + "9" * 400 + '}, "silence_after_s": -1}',
                     '{"log_silent_s": "600"}', "[1, 2]", '{"grace_s": [1]}'):
        obs = observation_from_files({"server.log": "x\n", "observed.json": observed})
        assert obs.log_silent_s is None and obs.elapsed_s is None and obs.policy_grace_s is None


def test_a_fifo_or_a_device_in_a_bundle_neither_hangs_nor_crashes_diagnose(tmp_path: Path):
    d = tmp_path / "b"
    (d / "py-spy").mkdir(parents=True)
    (d / "server.log").write_text("[2025-01-01 10:00:00 TP0] Init torch distributed begin.\n")
    (d / "observed.json").write_text(json.dumps({"log_silent_s": 900, "process_alive": True}))
    os.mkfifo(d / "py-spy" / "TP0-pid-1.json")
    os.symlink("/dev/zero", d / "py-spy" / "TP1-pid-2.json")
    (d / "py-spy" / "dir.json").mkdir()
    result = CliRunner().invoke(main, ["diagnose", str(d), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["verdict"] == "silent_hang"
    os.mkfifo(d / "dmesg.txt")  # a bundle file that is no regular file: a clear error, exit 2
    result = CliRunner().invoke(main, ["diagnose", str(d)])
    assert result.exit_code == 2 and "not a regular file" in result.output


def test_observed_json_from_two_probes():
    def snap(clock, size, lines, tail, mib, pids):
        return Snapshot(host="h", clock=clock, local_clock=clock,
                        log=LogInfo(path="/l", exists=True, size_bytes=size, mtime=1000.0, lines=lines, tail=tail),
                        gpu=GpuSection(ok=True, gpus=[GpuReading(index=0, memory_used_mib=mib)]),
                        table=[ProcessInfo(pid=p) for p in pids], port_listening=False,
                        health=HealthResult(url="http://127.0.0.1:1/health", status="refused"))

    a = snap(1900.0, 500, 10, ["Load weight end"], 1000.0, [7])
    b = snap(1903.0, 500, 10, ["Load weight end"], 9000.0, [7])
    assert observed_from_probes(a, b, pid=7, started_at=1800.0) == {
        "elapsed_s": 103.0, "log_silent_s": 903.0, "log_growing": False, "process_alive": True,
        "port_open": False, "health": "refused", "gpu_mem_rising": True}
    beat = "(APIServer pid=1) DEBUG Waiting for 1 local, 0 remote core engine proc(s) to start."
    c = snap(1903.0, 600, 11, ["Load weight end", beat], 1000.0, [99])
    got = observed_from_probes(a, c, pid=7, heartbeat=lambda line: "Waiting for" in line)
    assert got["log_growing"] is True and got["process_alive"] is False and got["gpu_mem_rising"] is False
    assert "log_silent_s" not in got  # the log moved for a heartbeat only: its mtime says nothing of progress
