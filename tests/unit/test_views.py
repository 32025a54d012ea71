"""Tests for bot.present.views: Snapshot / HostFailure -> template contexts, built from parsed real fixtures."""

from __future__ import annotations

import pytest

from bot.core.models import (
    GpuProcess,
    GpuReading,
    GpuSection,
    GpuSource,
    HealthResult,
    HostFailure,
    LogInfo,
    ProcessInfo,
    Snapshot,
)
from bot.core.parse.nvidia_smi import assign_gpu_indexes, parse_query_apps, parse_query_gpu
from bot.core.parse.ps import parse_ps
from bot.present.views import COMMAND_WIDTH, gpu_view, probe_view, short_command, status_view
from tests.support.paths import FIXTURES, H200, case_dir  # noqa: F401

CASE00 = case_dir("00")
CASE00_FIELDS = ["index", "memory.used", "memory.total", "utilization.gpu"]


def hung_gpu() -> GpuSection:
    gpus = parse_query_gpu((H200 / "hung.query-gpu.csv").read_text())
    apps = assign_gpu_indexes(gpus, parse_query_apps((H200 / "hung.query-apps.csv").read_text()))
    return GpuSection(ok=True, gpus=gpus, processes=apps)


def hung_snapshot() -> Snapshot:
    procs = parse_ps((H200 / "hung.ps.txt").read_text())
    log_lines = (H200 / "hung.server.log").read_text().splitlines()
    return Snapshot(
        host="gpu-host-1",
        hostname="h200-box",
        clock=1_764_402_100.0,
        processes=procs,
        all_process_count=187,
        gpu=hung_gpu(),
        log=LogInfo(path="/data/logs/server.log", exists=True, size_bytes=8600, mtime=1_764_402_000.0, lines=41,
                    tail=log_lines),
        port=8000,
        port_listening=False,
        health=HealthResult(url="http://127.0.0.1:8000/health", status="refused", elapsed_s=0.0004,
                            detail="curl: (7) Failed to connect to 127.0.0.1 port 8000"),
        duration_s=0.8,
    )


def case00_snapshot() -> Snapshot:
    gpus = parse_query_gpu((CASE00 / "nvidia-smi.csv").read_text(), fields=CASE00_FIELDS)
    procs = parse_ps((CASE00 / "ps.txt").read_text())
    # TPk (pid 50435 + k) holds the memory of GPU k, as in the report
    holders = [GpuProcess(pid=50435 + g.index, used_memory_mib=g.memory_used_mib, gpu_index=g.index) for g in gpus]
    return Snapshot(host="tp8-box", processes=procs, all_process_count=len(procs),
                    gpu=GpuSection(ok=True, gpus=gpus, processes=holders))


# --- fixtures parse as expected (preconditions of the view tests) ---------------------------------


def test_fixture_preconditions():
    g = hung_gpu()
    assert [(x.index, x.name, x.memory_used_mib, x.memory_total_mib) for x in g.gpus] == [
        (0, "NVIDIA H200", 17235, 143771)
    ]
    assert [(p.pid, p.used_memory_mib, p.gpu_index) for p in g.processes] == [(569, 8610, 0), (570, 8610, 0)]
    c = case00_snapshot()
    assert len(c.gpu.gpus) == 8 and len(c.processes) == 10


# --- short_command --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "width", "expected"),
    [
        ("", 90, "?"),
        ("/opt/venv/bin/python3 -m sglang.launch_server", 90, "python3 -m sglang.launch_server"),
        ("python3 x.py", 90, "python3 x.py"),
        ("sglang::scheduler_TP0", 90, "sglang::scheduler_TP0"),
        ("/usr/bin/", 90, "/usr/bin/"),
        ("/opt/venv/bin/python3", 90, "python3"),
        ("abcdefghij", 5, "abcd…"),
        ("/x/y/prog " + "a" * 200, 20, "prog " + "a" * 14 + "…"),
    ],
)
def test_short_command(args, width, expected):
    out = short_command(args, width)
    assert out == expected
    assert len(out) <= max(width, 1)


def test_short_command_redacts_secrets():
    out = short_command("/v/bin/vllm serve m --api-key sk-abcdefghijklmnopqrstuvwxyz --port 8000", 200)
    assert "sk-abcdefghijklmnop" not in out
    assert out.startswith("vllm serve m --api-key ")
    assert "--port 8000" in out


# --- gpu_view -------------------------------------------------------------------------------------


def test_gpu_view_hung_capture():
    snap = hung_snapshot()
    by_pid = {p.pid: p for p in snap.processes}
    v = gpu_view(snap.gpu, by_pid)
    assert v["ok"] is True and v["error"] is None and v["source"] == "nvidia-smi"
    assert v["holder_count"] == 2 and v["unassigned"] == []
    (row,) = v["gpus"]
    assert row["index"] == 0
    assert row["name"] == "H200"
    assert (row["used_mib"], row["total_mib"]) == (17235, 143771)
    assert (row["util_pct"], row["temp_c"], row["power_w"]) == (0, 39, 122.56)
    assert [h["pid"] for h in row["holders"]] == [569, 570]
    for h in row["holders"]:
        assert h["mib"] == 8610 and h["gpu"] == 0 and h["alive"] is True
        assert h["name"] == "python3 -B -c from multiprocessing.spawn import spawn_main; spa…"
        assert len(h["name"]) == 64


def test_gpu_view_holder_not_in_process_table():
    gpu = GpuSection(ok=True, gpus=[GpuReading(index=0)],
                     processes=[GpuProcess(pid=77, used_memory_mib=100, gpu_index=0, process_name="/usr/bin/python3")])
    v = gpu_view(gpu, {})
    (h,) = v["gpus"][0]["holders"]
    assert h == {"pid": 77, "name": "/usr/bin/python3", "mib": 100, "gpu": 0, "alive": False, "owner": None}
    assert v["gpus"][0]["name"] == "?"


def test_gpu_view_unassigned_holders():
    gpu = GpuSection(ok=True, gpus=[GpuReading(index=0, name="NVIDIA A100-SXM4-80GB")],
                     processes=[GpuProcess(pid=1, gpu_index=None), GpuProcess(pid=2, gpu_index=5),
                                GpuProcess(pid=3, gpu_index=0)])
    v = gpu_view(gpu, {})
    assert v["gpus"][0]["name"] == "A100-SXM4-80GB"
    assert [h["pid"] for h in v["gpus"][0]["holders"]] == [3]
    assert sorted(h["pid"] for h in v["unassigned"]) == [1, 2]
    assert v["unassigned"][0]["name"] == "?"
    assert v["holder_count"] == 3


def test_gpu_view_error_and_note():
    gpu = GpuSection(ok=False, error="nvidia-smi did not answer in 10 s (killed by timeout)", note="replayed",
                     processes_error="nvidia-smi failed (exit 2)", source=GpuSource.NVML)
    v = gpu_view(gpu, {})
    assert v["ok"] is False and v["gpus"] == []
    assert v["error"] == "nvidia-smi did not answer in 10 s (killed by timeout)"
    assert v["note"] == "replayed" and v["source"] == "nvml"
    assert v["processes_error"] == "nvidia-smi failed (exit 2)"


def test_gpu_view_case00_eight_gpus():
    snap = case00_snapshot()
    v = gpu_view(snap.gpu, {p.pid: p for p in snap.processes})
    assert [r["index"] for r in v["gpus"]] == list(range(8))
    assert [r["used_mib"] for r in v["gpus"]] == [76015, 76017, 76017, 76015, 76017, 76015, 76015, 76017]
    assert all(r["total_mib"] == 97887 and r["util_pct"] == 0 for r in v["gpus"])
    assert all(r["name"] == "?" and r["temp_c"] is None and r["power_w"] is None for r in v["gpus"])
    for r in v["gpus"]:
        (h,) = r["holders"]
        assert h["pid"] == 50435 + r["index"]
        assert h["name"] == f"sglang::scheduler_TP{r['index']}"
        assert h["alive"] is True


# --- status_view ----------------------------------------------------------------------------------


def test_status_view():
    results = [hung_snapshot(), case00_snapshot(), HostFailure("gpu-host-3", "host key rejected")]
    v = status_view(results)
    assert v["failed"] == 1
    names = [h["name"] for h in v["hosts"]]
    assert names == ["gpu-host-1", "tp8-box", "gpu-host-3"]
    h1, h2, h3 = v["hosts"]
    assert h1["failed"] is False and h1["hostname"] == "h200-box" and h1["errors"] == []
    assert h1["gpu"]["gpus"][0]["used_mib"] == 17235
    assert len(h2["gpu"]["gpus"]) == 8
    assert h3 == {"name": "gpu-host-3", "failed": True, "reason": "host key rejected"}


def test_status_view_empty_and_all_failed():
    assert status_view([]) == {"hosts": [], "failed": 0}
    v = status_view([HostFailure("a", "x"), HostFailure("b", "y")])
    assert v["failed"] == 2 and [h["reason"] for h in v["hosts"]] == ["x", "y"]


def test_status_view_redacts_failure_reason():
    v = status_view([HostFailure("a", "auth failed for https://bot:hunter2secret@git.example.com/x")])
    assert "hunter2secret" not in v["hosts"][0]["reason"]


# --- probe_view -----------------------------------------------------------------------------------


def test_probe_view_hung_capture():
    v = probe_view(hung_snapshot(), "pgid=566")
    assert (v["host"], v["hostname"], v["selector"]) == ("gpu-host-1", "h200-box", "pgid=566")
    assert v["process_count"] == 4 and v["all_process_count"] == 187
    rows = v["rows"]
    assert [r["pid"] for r in rows] == [566, 568, 569, 570]
    # depth indentation: the parent at depth 0, its children indented by two spaces
    assert rows[0]["command"] == "python3 fake_server.py 2"
    assert rows[1]["command"].startswith("  python3 -B -c from multiprocessing.resource_tracker")
    assert all(len(r["command"]) <= COMMAND_WIDTH for r in rows)
    r569 = rows[2]
    assert (r569["ppid"], r569["pgid"], r569["stat"], r569["pcpu"]) == (566, 566, "Sl", 20.2)
    assert r569["rss_mib"] == pytest.approx(628504 / 1024)
    assert (r569["elapsed_s"], r569["cpu_time_s"], r569["wchan"]) == (20, 4, "hrtimer_nanosleep")
    log = v["log"]
    assert log["path"] == "/data/logs/server.log" and log["exists"] is True and log["error"] is None
    assert (log["lines"], log["size_bytes"]) == (41, 8600)
    assert log["since_write_s"] == 100.0
    assert log["tail"][-1] == "[TP0] Load weight end. type=Fake, avail mem=131.19 GB"
    assert v["port"] == 8000 and v["port_listening"] is False
    assert v["health"] == {"url": "http://127.0.0.1:8000/health", "status": "refused", "code": None,
                           "elapsed_s": 0.0004, "detail": "curl: (7) Failed to connect to 127.0.0.1 port 8000"}
    assert v["gpu"]["gpus"][0]["holders"][0]["pid"] == 569
    assert v["errors"] == [] and v["duration_s"] == 0.8


def test_probe_view_deep_tree_indent_is_bounded():
    procs = [ProcessInfo(pid=1, ppid=0, args="/sbin/init")]
    procs += [ProcessInfo(pid=i, ppid=i - 1, args=f"/bin/child{i} " + "x" * 200) for i in range(2, 15)]
    v = probe_view(Snapshot(host="h", processes=procs), "pid=1")
    assert [r["pid"] for r in v["rows"]] == list(range(1, 15))
    assert v["rows"][0]["command"] == "init"
    assert v["rows"][1]["command"].startswith("  child2 ")
    deepest = v["rows"][-1]["command"]
    assert deepest.startswith(" " * 12 + "child14 ") and not deepest.startswith(" " * 13)
    assert all(len(r["command"]) <= COMMAND_WIDTH for r in v["rows"])


def test_probe_view_missing_values():
    v = probe_view(Snapshot(host="h", processes=[ProcessInfo(pid=9, args="")]), "GPU holders")
    (row,) = v["rows"]
    assert row["command"] == "?" and row["stat"] == "?" and row["rss_mib"] is None and row["ppid"] is None
    assert v["log"] is None and v["health"] is None and v["port"] is None and v["port_listening"] is None
    assert v["gpu"]["ok"] is False and v["gpu"]["error"] == "not probed"


def test_probe_view_log_error_and_unknown_clock():
    snap = Snapshot(host="h", clock=None, log=LogInfo(path="/x.log", error="no such file", mtime=5.0))
    v = probe_view(snap, "log=/x.log")
    assert v["log"]["error"] == "no such file" and v["log"]["exists"] is False
    assert v["log"]["since_write_s"] is None


def test_probe_view_clock_before_mtime_is_zero():
    snap = Snapshot(host="h", clock=100.0, log=LogInfo(path="/x", exists=True, mtime=160.0))
    assert probe_view(snap, "")["log"]["since_write_s"] == 0.0


def test_probe_view_redacts_log_tail():
    snap = Snapshot(host="h", log=LogInfo(path="/x", exists=True,
                                          tail=["export HF_TOKEN=hf_abcdefghijklmnopqrstuvwx", "ok line"]))
    tail = probe_view(snap, "")["log"]["tail"]
    assert tail[1] == "ok line"
    assert "hf_abcdefghijklmnop" not in tail[0] and tail[0].startswith("export HF_TOKEN=")
