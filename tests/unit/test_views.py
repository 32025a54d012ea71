"""Tests for bot.present.views: Snapshot / HostFailure -> template contexts, built from parsed real fixtures; a
launch, its alert and a kill confirmation -> contexts and the buttons their templates carry."""

from __future__ import annotations

import dataclasses

import pytest

from bot.core.diagnose import Verdict
from bot.core.lifecycle import KillOutcome, KillPreview
from bot.core.models import (
    GpuProcess,
    GpuReading,
    GpuSection,
    GpuSource,
    HealthResult,
    HostFailure,
    Launch,
    LaunchState,
    LogInfo,
    ProcessInfo,
    Snapshot,
)
from bot.core.parse.nvidia_smi import assign_gpu_indexes, parse_query_apps, parse_query_gpu
from bot.core.parse.ps import parse_ps
from bot.present.actions import SNOOZE_BUTTON_MIN, ActionId, click_command
from bot.present.views import (
    COMMAND_WIDTH,
    STATE_EMOJI,
    TABLE_HEADER,
    alert_view,
    gpu_view,
    kill_confirm_view,
    kill_view,
    launch_view,
    probe_view,
    process_rows,
    short_command,
    status_view,
    user_mention,
)
from tests.support.names import renderer
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
    rows = process_rows(hung_snapshot().processes)
    assert [p.pid for p, _ in rows] == [566, 568, 569, 570]
    # depth indentation: the parent at depth 0, its children indented by two spaces
    assert rows[0][1] == "python3 fake_server.py 2"
    assert rows[1][1].startswith("  python3 -B -c from multiprocessing.resource_tracker")
    assert all(len(c) <= COMMAND_WIDTH for _, c in rows)
    # the table: a header, then one line per row in the same order, every column in its place
    assert v["table"][0] == TABLE_HEADER and len(v["table"]) == 5
    assert v["table"][3].split() == ["569", "566", "Sl", "20.2", "4s", "614", "20s", *rows[2][1].split()]
    assert [int(line.split()[0]) for line in v["table"][1:]] == [566, 568, 569, 570]
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
    rows = process_rows(procs)
    assert [p.pid for p, _ in rows] == list(range(1, 15))
    assert rows[0][1] == "init"
    assert rows[1][1].startswith("  child2 ")
    deepest = rows[-1][1]
    assert deepest.startswith(" " * 12 + "child14 ") and not deepest.startswith(" " * 13)
    assert all(len(c) <= COMMAND_WIDTH for _, c in rows)
    assert [int(line.split()[0]) for line in v["table"][1:]] == list(range(1, 15))


def test_probe_view_missing_values():
    v = probe_view(Snapshot(host="h", processes=[ProcessInfo(pid=9, args="")]), "GPU holders")
    _, line = v["table"]
    assert line.split() == ["9", "-", "?", "-", "-", "-", "-", "?"]
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


# --- launches, alerts, kill confirmations ------------------------------------------------------------

RENDERER = renderer()


def a_launch(**overrides) -> Launch:
    fields = dict(id=12, host="gpu-host-1", variant="base", params={"tp": 8, "api_key": "sk-abcdefghijklmnopqrstuvwx"},
                  command="/opt/venv/bin/python3 -m sglang.launch_server --api-key sk-abcdefghijklmnopqrstuvwx",
                  log_path="/data/logs/base-12.log", port=30000, gpus=[0, 1], pid=4242, pgid=4242, sid=4242,
                  state=LaunchState.RUNNING, state_detail="healthy", created_by="U0LAUNCHER", created_at=1_000.0,
                  ended_at=None, channel="C1", thread_ts="1.2")
    fields.update(overrides)
    return Launch(**fields)


def buttons(blocks: list[dict]) -> list[tuple[str, str]]:
    """(action_id, value) of every button in the blocks."""
    return [(el["action_id"], el["value"]) for b in blocks if b["type"] == "actions" for el in b["elements"]]


@pytest.mark.parametrize(("user", "fallback", "expected"), [
    ("U0LAUNCHER", None, "<@U0LAUNCHER>"), ("W123", None, "<@W123>"), ("U0LAUNCHER", "", "<@U0LAUNCHER>"),
    ("console", None, "console"), ("", None, "?"), ("console", "", ""), ("u123", None, "u123"),
    ("<@U1>", None, "&lt;@U1&gt;"), ("<!channel>", None, "&lt;!channel&gt;"), ("U1 x", "someone", "someone"),
])
def test_user_mention(user, fallback, expected):
    assert user_mention(user, fallback) == expected


def test_launch_view():
    v = launch_view(a_launch())
    assert (v["name"], v["id"], v["variant"], v["host"]) == ("base#12", 12, "base", "gpu-host-1")
    assert v["state"] == "running" and type(v["state"]) is str and v["state_emoji"] == ":large_green_circle:"
    assert v["state_detail"] == "healthy" and v["who"] == "<@U0LAUNCHER>"
    assert v["params"] == "api_key=[REDACTED], tp=8"  # secrets in params and the command are masked
    assert v["command"].startswith("python3 -m sglang.launch_server --api-key ") and "sk-abc" not in v["command"]
    assert (v["pid"], v["port"], v["gpus"], v["log"], v["relaunch_of"]) == (4242, 30000, "0,1",
                                                                             "/data/logs/base-12.log", None)
    bare = launch_view(a_launch(params={}, gpus=[], command="", state_detail=None, created_by="console",
                                state=LaunchState.STOPPING, relaunch_of=7))
    assert (bare["params"], bare["gpus"], bare["command"], bare["state_detail"]) == ("(defaults)", "all", "", "")
    assert (bare["who"], bare["state"], bare["relaunch_of"]) == ("console", "stopping", 7)
    assert set(STATE_EMOJI) == set(LaunchState)  # every state has its emoji


def test_launch_view_with_a_verdict_says_the_verdict_and_phase():
    hang = Verdict("silent_hang", "weight_loading", ["`no log line for 300 s`"], ["stack dump"], "stuck")
    assert launch_view(a_launch(), hang)["state_detail"] == "silent_hang in weight_loading"
    crashed = dataclasses.replace(hang, verdict="crashed", phase=None)
    assert launch_view(a_launch(), crashed)["state_detail"] == "crashed"
    msg = RENDERER.render("launch_root", **launch_view(a_launch(), hang))
    assert msg.text.startswith("base#12 on gpu-host-1: running (silent_hang in weight_loading)")
    assert "sk-abc" not in msg.text and "sk-abc" not in str(msg.blocks)


def test_alert_view_and_its_buttons():
    hang = Verdict("silent_hang", "weight_loading", [f"`line {i}`" for i in range(40)],
                   [f"step {i}" for i in range(9)], "No log line for 300 s while loading weights.")
    v = alert_view(a_launch(), hang, elapsed_s=420.0, phases=[("start", 5.0)])
    assert (v["name"], v["host"], v["verdict"], v["phase"], v["launch_id"]) == ("base#12", "gpu-host-1",
                                                                                "silent_hang", "weight_loading", 12)
    # short: 5 key evidence lines in the alert, all 40 for the attached file; 4 next steps
    assert len(v["evidence"]) == 5 and len(v["all_evidence"]) == 40 and v["more_evidence"] == 35
    assert len(v["next_steps"]) == 4
    assert v["who_mention"] == "<@U0LAUNCHER>" and v["elapsed_s"] == 420.0
    assert v["phases"] == [] and v["buttons"] is True and v["snooze_min"] == SNOOZE_BUTTON_MIN
    assert alert_view(a_launch(created_by="console"), hang, elapsed_s=1, phases=[])["who_mention"] == ""
    console = RENDERER.render("alert", **alert_view(a_launch(created_by="console"), hang, elapsed_s=1, phases=[]))
    assert console.text.splitlines()[0].endswith("(after 1s)")  # no trailing space without a mention
    msg = RENDERER.render("alert", **v)
    # the buttons' action ids come from ActionId, each carrying the launch id; a click is the command it names
    assert buttons(msg.blocks) == [(ActionId.PROBE, "12"), (ActionId.STACK, "12"), (ActionId.KILL, "12"),
                                   (ActionId.RELAUNCH, "12"), (ActionId.SNOOZE, "12")]
    assert [a for a, _ in buttons(msg.blocks)] == ["gpubot_probe", "gpubot_stack", "gpubot_kill", "gpubot_relaunch",
                                                   "gpubot_snooze"]
    assert [click_command(a, val) for a, val in buttons(msg.blocks)] == [
        "probe #12", "stack #12", "kill #12 --yes", "relaunch #12", f"snooze #12 {SNOOZE_BUTTON_MIN}"]
    assert msg.text.startswith("base#12 on gpu-host-1: silent_hang in weight_loading (after 7m00s) <@U0LAUNCHER>")
    assert msg.text.splitlines()[1] == "No log line for 300 s while loading weights."  # its own line
    assert "`line 4`" in msg.text and "`line 5`" not in msg.text and "+35 more evidence" in msg.text
    # action first: the buttons come right after the key evidence, the next steps after the buttons
    kinds = [b["type"] for b in msg.blocks]
    assert kinds.index("actions") < len(kinds) - 1 and "Next:" in str(msg.blocks[kinds.index("actions") + 1])
    # the confirm dialogs name the launch, its process group and the host
    confirms = [el["confirm"]["text"]["text"] for b in msg.blocks if b["type"] == "actions"
                for el in b["elements"] if "confirm" in el]
    assert confirms and all("base#12" in c and "process group 4242" in c and "gpu-host-1" in c for c in confirms)
    full = RENDERER.text("alert_evidence", **v)
    assert all(f"`line {i}`" in full for i in range(40))


def test_alert_steps_the_bot_can_take_are_buttons():
    hang = Verdict("silent_hang", "serving", ["`x`"],
                   ["Dump every rank's Python stack: `py-spy dump --pid PID` for each process.", "Relaunch it."],
                   "Serving hang.")
    v = alert_view(a_launch(), hang, elapsed_s=1.0, phases=[])
    assert not any("py-spy dump --pid" in s for s in v["next_steps"])
    assert any("*Stack dump*" in s for s in v["next_steps"]) and "Relaunch it." in v["next_steps"]


def test_an_alert_says_how_sure_it_is_and_what_would_decide():
    guess = Verdict("loading", "weight_loading", ["`Loading safetensors checkpoint shards:  40%`"], [],
                    "Loading weights.", confidence="low", runner_up="silent_hang in weight_loading",
                    missing="is the log still growing?")
    msg = RENDERER.render("alert", **alert_view(a_launch(), guess, elapsed_s=60.0, phases=[]))
    line = "How sure: confidence low; runner-up silent_hang in weight_loading; would decide: is the log still growing?"
    assert msg.text.splitlines()[2] == line, msg.text
    assert any(b["type"] == "context" and "runner-up silent_hang in weight_loading" in str(b) for b in msg.blocks)
    sure = dataclasses.replace(guess, confidence="high", runner_up=None, missing=None)
    text = RENDERER.render("alert", **alert_view(a_launch(), sure, elapsed_s=60.0, phases=[])).text
    assert "How sure: confidence high\n" in text and "runner-up" not in text
    ready = Verdict("ready", "ready", ["`GET /health 200`"], [], "Serving.", confidence="high")
    assert "How sure" not in RENDERER.render("alert", **alert_view(a_launch(), ready, elapsed_s=9, phases=[])).text


def test_ready_alert_has_phases_and_no_buttons():
    ready = Verdict("ready", "ready", ["`GET /health 200`"], [], "Serving.")
    v = alert_view(a_launch(), ready, elapsed_s=95.0, phases=[("weight_loading", 60.0), ("warmup", 30.0)])
    assert v["buttons"] is False and v["phases"] == [("weight_loading", 60.0), ("warmup", 30.0)]
    msg = RENDERER.render("alert", **v)
    assert buttons(msg.blocks) == []
    assert "Phases: weight_loading 1m00s, warmup 30s" in msg.text


def test_next_steps_fit_a_ready_launch_and_name_its_own_port_and_pid():
    from bot.core.diagnose import SIGNATURES

    ready = Verdict("ready", "ready", ["`GET /health 200`"], SIGNATURES.next_steps["ready"], "Serving.")
    steps = alert_view(a_launch(), ready, elapsed_s=95.0, phases=[])["next_steps"]
    assert steps[0].startswith("Nothing to do: gpubot keeps checking it while it serves")
    assert steps[1:] == ['Probe it from the host itself, bypassing proxies: '
                         '`curl --noproxy "*" http://127.0.0.1:30000/health`.']
    hang = Verdict("silent_hang", "serving", ["`x`"], SIGNATURES.next_steps["silent_hang"], "Serving hang.")
    hang_steps = alert_view(a_launch(), hang, elapsed_s=1.0, phases=[])["next_steps"]
    assert any("`cat /proc/4242/stack`" in s for s in hang_steps), hang_steps
    port = Verdict("port_in_use", None, ["`x`"], ["Set a free `MASTER_PORT`, or `lsof -i :PORT`."], "Port.")
    assert alert_view(a_launch(port=None), port, elapsed_s=1.0, phases=[])["next_steps"] == [
        "Set a free `MASTER_PORT`, or `lsof -i :PORT`."]  # no port known: the placeholder stays


def test_kill_confirm_view_and_its_buttons():
    pv = KillPreview(target="base#12", host="gpu-host-1", launch_id=12, pgid=4242,
                     processes=[ProcessInfo(pid=4242 + i, stat="Sl", args=f"/opt/venv/bin/python3 -m sglang rank{i}")
                                for i in range(10)],
                     gpus=[0, 1], gpu_mib=2048.0, error="ps: HF_TOKEN=hf_abcdefghijklmnopqrstuvwx")
    v = kill_confirm_view(pv, confirm_command="kill base#12 --yes", value="31", action_id=ActionId.KILL_CONFIRM)
    assert v["action_id"] == "gpubot_kill_confirm" and type(v["action_id"]) is str
    assert (v["target"], v["host"], v["pgid"], v["count"], v["more"], v["gpus"], v["gib"]) == (
        "base#12", "gpu-host-1", 4242, 10, 2, "0,1", 2.0)
    assert [p["pid"] for p in v["processes"]] == list(range(4242, 4250))
    assert v["processes"][0] == {"pid": 4242, "stat": "Sl", "command": "python3 -m sglang rank0"}
    assert "hf_abc" not in v["error"]
    msg = RENDERER.render("kill_confirm", decided=None, **v)
    assert buttons(msg.blocks) == [("gpubot_kill_confirm", "31"), ("gpubot_kill_cancel", "31")]
    assert [click_command(a, val) for a, val in buttons(msg.blocks)] == ["confirm 31", "cancel 31"]
    pid_kill = kill_confirm_view(dataclasses.replace(pv, pgid=None, gpus=[], gpu_mib=None, error=None),
                                 confirm_command="kill pid=4242 --yes", value="32", action_id=ActionId.KILLPID_CONFIRM)
    assert (pid_kill["action_id"], pid_kill["gpus"], pid_kill["gib"], pid_kill["error"]) == (
        "gpubot_killpid_confirm", "-", None, None)
    assert buttons(RENDERER.render("kill_confirm", decided=None, **pid_kill).blocks)[0] == (
        "gpubot_killpid_confirm", "32")


def test_the_leftovers_of_an_ended_launch_are_said_after_its_detail_in_one_sentence() -> None:
    from bot.core.lifecycle import KillOutcome, kill_end

    out = KillOutcome(target="base#1", released=True)
    state, detail, result = kill_end(out, LaunchState.FAILED, "exited 0.4 s after it was started, before it.")
    assert state == LaunchState.FAILED and result == "released"
    assert detail.startswith("exited 0.4 s after it was started, before it; its leftovers were stopped: ")
    assert ".;" not in detail
    state, detail, _ = kill_end(out, LaunchState.EXITED, None)
    assert detail.startswith("exited; its leftovers were stopped: ")


def test_a_kill_that_stopped_some_ranks_and_could_not_reach_another_is_kill_failed_never_still_running() -> None:
    from bot.core.lifecycle import kill_end

    rank0 = ProcessInfo(pid=10, ppid=1, pgid=10, sid=10, stat="S", args="python -m sglang.launch_server")
    out = KillOutcome(target="two#1", signalled=[rank0], error="gpu-b: host unreachable (connection refused)",
                      partial=True)
    state, detail, result = kill_end(out, LaunchState.RUNNING, "ready")
    assert (state, result) == (LaunchState.KILL_FAILED, "incomplete")
    assert detail == "kill incomplete: 1 process stopped, but gpu-b: host unreachable (connection refused)", detail
    cancelled = KillOutcome(target="two#1", cancelled_job="7", error="n2: srun could not reach it", partial=True)
    assert kill_end(cancelled, LaunchState.RUNNING, None)[0] == LaunchState.KILL_FAILED
    # processes listed but the host dropped before any signal went: nothing was stopped, the state stays
    dropped = KillOutcome(target="base#1", signalled=[rank0], error="ssh: connection lost")
    assert kill_end(dropped, LaunchState.RUNNING, "ready")[:1] == (LaunchState.RUNNING,)
    assert renderer().render("kill_result", **kill_view(dropped, [0])).text.startswith("Kill of base#1 failed")
    # nothing stopped: the launch is as it was (the kill can be tried again), and an ended one stays ended
    untouched = KillOutcome(target="two#1", error="gpu-a: host unreachable")
    assert kill_end(untouched, LaunchState.RUNNING, "ready")[:1] == (LaunchState.RUNNING,)
    assert kill_end(out, LaunchState.FAILED, "crashed")[0] == LaunchState.FAILED
    said = renderer().render("kill_result", **kill_view(out, [0]))
    assert said.text.startswith("Kill of two#1 incomplete: 1 process stopped, but gpu-b: host unreachable"), said.text
    assert "incomplete" in str(said.blocks) and "failed*" not in str(said.blocks)


def test_counts_take_their_number() -> None:
    from bot.core.text import counted

    assert [counted(1, "process"), counted(2, "process"), counted(0, "GPU"), counted(1, "GPU")] == [
        "1 process", "2 processes", "0 GPUs", "1 GPU"]
    assert counted(3, "index", "indexes") == "3 indexes"


def test_a_slurm_kill_says_the_job_was_cancelled_not_zero_processes_signalled():
    r = renderer()
    done = KillOutcome(target="two#1", cancelled_job="4711", released=True)
    msg = r.render("kill_result", **kill_view(done, [0]))
    blocks = str(msg.blocks)
    assert "Killed two#1: Slurm job 4711 cancelled (scancel) and ended." in msg.text, msg.text
    assert "Slurm job 4711 cancelled (scancel) and ended" in blocks and "0 processes" not in blocks + msg.text
    left = KillOutcome(target="two#1", cancelled_job="4711", released=True,
                       signalled=[ProcessInfo(pid=9, ppid=1, pgid=9, sid=9, stat="S", args="python")])
    assert "; 1 process left on its nodes signalled." in r.render("kill_result", **kill_view(left, [0])).text
    # still running after scancel: the error says so, never "cancelled"
    stuck = KillOutcome(target="two#1", error="Slurm job 4711 is still COMPLETING after scancel")
    text = r.render("kill_result", **kill_view(stuck, [0])).text
    assert "failed" in text and "cancelled (scancel)" not in text, text
