"""Tests for bot.present.render and templates/*.j2: exact values from real fixtures, mrkdwn escaping, Block Kit
limits (checked with slack_sdk's own validators), fit_blocks, and a property test over random Snapshots."""

from __future__ import annotations

import json
import os
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from slack_sdk.models.blocks import Block

from bot.core.models import (
    GpuProcess,
    GpuReading,
    GpuSection,
    HealthResult,
    HostFailure,
    LogInfo,
    ProcessInfo,
    Snapshot,
)
from bot.core.parse.nvidia_smi import assign_gpu_indexes, parse_query_apps, parse_query_gpu
from bot.core.parse.ps import parse_ps
from bot.core.probe import ProbeRequest, Section, assemble_snapshot
from bot.present.render import (
    MAX_BLOCKS,
    MAX_HEADER_TEXT,
    MAX_MESSAGE_TEXT,
    MAX_SECTION_TEXT,
    TRUNCATED,
    Message,
    Renderer,
    chunk_lines,
    cut,
    fit_blocks,
    fmt_bytes,
    fmt_duration,
    fmt_gib,
    fmt_num,
    mrkdwn_escape,
)
from bot.present.views import probe_view, status_view
from tests.support.names import renderer, said
from tests.support.paths import FIXTURES, H200, case_dir  # noqa: F401

CASE00 = case_dir("00")
EVIL = "<!channel> <@U123> & <http://evil|x>"
EVIL_ESCAPED = "&lt;!channel&gt; &lt;@U123&gt; &amp; &lt;http://evil|x&gt;"
#: A renderer with the built-in redaction rules only (no configured patterns).
RENDERER = renderer()
render = RENDERER.render


# --- helpers --------------------------------------------------------------------------------------


def strings(obj: Any) -> list[str]:
    """Every string value inside a Block Kit structure."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, list):
        return [s for x in obj for s in strings(x)]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in strings(v)]
    return []


def mrkdwn_texts(obj: Any) -> list[str]:
    """The text of every mrkdwn text object (Slack parses mentions and links only there)."""
    if isinstance(obj, list):
        return [s for x in obj for s in mrkdwn_texts(x)]
    if isinstance(obj, dict):
        own = [obj["text"]] if obj.get("type") == "mrkdwn" and isinstance(obj.get("text"), str) else []
        return own + [s for v in obj.values() if isinstance(v, dict | list) for s in mrkdwn_texts(v)]
    return []


def block_texts(blocks: list[dict]) -> list[str]:
    """The user-visible texts of section / header / context blocks."""
    out = []
    for b in blocks:
        if isinstance(b.get("text"), dict):
            out.append(b["text"]["text"])
        for f in b.get("fields", []) or []:
            out.append(f["text"])
        for el in b.get("elements", []) or []:
            if "text" in el:
                out.append(el["text"])
    return out


def all_block_text(m: Message) -> str:
    return "\n".join(block_texts(m.blocks or []))


def assert_slack_valid(m: Message) -> None:
    """Slack's limits and slack_sdk's validators, for one rendered Message."""
    assert isinstance(m.text, str) and m.text.strip()
    assert len(m.text) <= MAX_MESSAGE_TEXT
    assert isinstance(m.blocks, list) and m.blocks
    assert len(m.blocks) <= MAX_BLOCKS
    assert json.loads(json.dumps(m.blocks)) == m.blocks
    for b in m.blocks:
        assert isinstance(b, dict) and b["type"] in ("header", "section", "context", "divider")
        if b["type"] == "header":
            assert b["text"]["type"] == "plain_text"
            assert 0 < len(b["text"]["text"]) <= MAX_HEADER_TEXT
        if b["type"] == "section":
            assert 0 < len(b["text"]["text"]) <= MAX_SECTION_TEXT
            assert b["text"]["type"] == "mrkdwn"
        if b["type"] == "context":
            assert 1 <= len(b["elements"]) <= 10
            assert all(len(el["text"]) <= MAX_SECTION_TEXT for el in b["elements"])
        Block.parse(b).validate_json()


def hung_snapshot(tail: list[str] | None = None) -> Snapshot:
    gpus = parse_query_gpu((H200 / "hung.query-gpu.csv").read_text())
    apps = assign_gpu_indexes(gpus, parse_query_apps((H200 / "hung.query-apps.csv").read_text()))
    procs = parse_ps((H200 / "hung.ps.txt").read_text())
    if tail is None:
        tail = (H200 / "hung.server.log").read_text().splitlines()
    return Snapshot(
        host="gpu-host-1",
        hostname="h200-box",
        clock=1_764_402_100.0,
        processes=procs,
        all_process_count=187,
        gpu=GpuSection(ok=True, gpus=gpus, processes=apps),
        log=LogInfo(path="/data/logs/server.log", exists=True, size_bytes=8600, mtime=1_764_402_000.0, lines=41,
                    tail=tail),
        port=8000,
        port_listening=False,
        health=HealthResult(url="http://127.0.0.1:8000/health", status="refused",
                            detail="curl: (7) Failed to connect to 127.0.0.1 port 8000"),
    )


def case00_snapshot() -> Snapshot:
    gpus = parse_query_gpu((CASE00 / "nvidia-smi.csv").read_text(),
                           fields=["index", "memory.used", "memory.total", "utilization.gpu"])
    return Snapshot(host="tp8-box", gpu=GpuSection(ok=True, gpus=gpus))


# --- status ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def status_msg() -> Message:
    results = [hung_snapshot(), case00_snapshot(), HostFailure("gpu-host-3", "ssh: connect timed out after 10 s")]
    return render("status", **status_view(results))


def test_status_exact_values_in_text(status_msg):
    t = status_msg.text
    assert t.startswith("GPU status: 3 hosts, 1 failed")
    assert "== gpu-host-1 (h200-box) ==" in t
    assert "16.8 / 140.4" in t  # 17235 / 143771 MiB
    assert "  0 H200 " in t and "39C" in t and "123W" in t
    assert "      pid 569         8.4 GiB  python3 -B -c from multiprocessing.spawn import spawn_main; spa…" in t
    assert "      pid 570         8.4 GiB  " in t
    assert t.count("74.2 / 95.6") == 8  # 76015 and 76017 MiB of 97887 MiB
    for i in range(8):
        assert f"\n  {i} ?" in t
    assert "no process holds GPU memory" in t
    assert "== gpu-host-3 ==\nFAILED: ssh: connect timed out after 10 s" in t


def test_status_blocks(status_msg):
    assert_slack_valid(status_msg)
    b = status_msg.blocks
    assert b[0] == {"type": "header", "text": {"type": "plain_text", "text": "GPU status: 3 hosts, 1 failed"}}
    text = all_block_text(status_msg)
    assert ":white_check_mark: *gpu-host-1* (h200-box)" in text
    assert "16.8 / 140.4" in text and "pid 569" in text and "pid 570" in text and "8.4 GiB" in text
    assert text.count("74.2 / 95.6") == 8
    assert ":x: *gpu-host-3*: failed: ssh: connect timed out after 10 s" in text
    codes = [x for x in block_texts(b) if x.startswith("```")]
    assert codes and all(x.endswith("```") for x in codes)


def test_status_single_host_header():
    m = render("status", **status_view([case00_snapshot()]))
    assert m.blocks[0]["text"]["text"] == "GPU status: 1 host"
    assert m.text.startswith("GPU status: 1 host\n")


def test_status_failure_only():
    m = render("status", **status_view([HostFailure("h", "host key for h does not match known_hosts")]))
    assert_slack_valid(m)
    assert "FAILED: host key for h does not match known_hosts" in m.text
    assert "failed: host key for h does not match known_hosts" in all_block_text(m)
    assert m.blocks[0]["text"]["text"] == "GPU status: 1 host, 1 failed"


def test_status_gpu_error_and_note():
    gpu = GpuSection(ok=False, error="nvidia-smi not found on the host", note="replayed <data>")
    snap = Snapshot(host="h", gpu=gpu)
    m = render("status", **status_view([snap]))
    assert_slack_valid(m)
    assert "GPU readings unavailable: nvidia-smi not found on the host" in m.text
    assert "[replayed <data>]" in m.text
    assert "_replayed &lt;data&gt;_" in all_block_text(m)


# --- probe ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def probe_msg() -> Message:
    snap = hung_snapshot(tail=[*(H200 / "hung.server.log").read_text().splitlines(), EVIL])
    return render("probe", **probe_view(snap, "pgid=566"))


def test_probe_exact_values_in_text(probe_msg):
    t = probe_msg.text
    assert t.startswith("Probe of gpu-host-1 (h200-box): pgid=566")
    assert "Processes (4 shown of 187 on the host):" in t
    assert "    566     561 Ss     0.2       0s      16      20s  python3 fake_server.py 2" in t
    assert "    569     566 Sl    20.2       4s     614      20s    python3 -B -c from multiprocessing.spawn" in t
    assert "41 lines, 8.4 KiB, last write 1m40s ago" in t
    assert "  | [TP0] Load weight end. type=Fake, avail mem=131.19 GB" in t
    assert "16.8 / 140.4" in t and "8.4 GiB" in t
    assert "Port 8000: not listening" in t
    assert "Health http://127.0.0.1:8000/health: refused: curl: (7) Failed to connect to 127.0.0.1 port 8000" in t


def test_probe_blocks(probe_msg):
    assert_slack_valid(probe_msg)
    b = probe_msg.blocks
    assert b[0]["type"] == "header" and b[0]["text"]["text"] == "Probe of gpu-host-1: pgid=566"
    text = all_block_text(probe_msg)
    assert "*Processes* (4 shown of 187 on h200-box)" in text
    assert "*Log* `/data/logs/server.log`: 41 lines, 8.4 KiB, last write 1m40s ago" in text
    assert "pid 569" in text and "pid 570" in text and "16.8 / 140.4" in text and "8.4 GiB" in text
    assert "*Port 8000*: not listening · health `http://127.0.0.1:8000/health`: *refused*" in text


def test_probe_log_line_escaped_in_blocks_raw_in_text(probe_msg):
    for s in strings(probe_msg.blocks):
        assert "<" not in s and ">" not in s, s
        assert EVIL not in s
    assert EVIL_ESCAPED in all_block_text(probe_msg)
    assert EVIL in probe_msg.text


def test_everything_remote_is_escaped_in_blocks():
    evil = "<!here|x>&<@W1>"
    snap = Snapshot(
        host="gpu-host-1",
        hostname=evil,
        processes=[ProcessInfo(pid=5, ppid=1, args=f"/bin/python {evil}")],
        gpu=GpuSection(ok=True, gpus=[GpuReading(index=0, name=evil)],
                       processes=[GpuProcess(pid=6, gpu_index=0, process_name=evil), GpuProcess(pid=7)],
                       note=evil, processes_error=None),
        log=LogInfo(path=f"/logs/{evil}", exists=True, tail=[evil]),
        port=8000,
        port_listening=True,
        health=HealthResult(url=f"http://127.0.0.1:8000/{evil}", status="error", detail=evil),
        errors=[evil, "second"],
    )
    for m in (render("probe", **probe_view(snap, "pid=5")),
              render("status", **status_view([snap, HostFailure(evil, evil)]))):
        assert_slack_valid(m)
        for s in mrkdwn_texts(m.blocks):
            assert "<" not in s and ">" not in s, s
        assert "&lt;!here|x&gt;&amp;&lt;@W1&gt;" in all_block_text(m)
        assert evil in m.text


def test_probe_log_error_and_no_rows():
    snap = Snapshot(host="h", log=LogInfo(path="/data/x.log", error="permission denied"), port=9000,
                    port_listening=None)
    m = render("probe", **probe_view(snap, "log=/data/x.log"))
    assert_slack_valid(m)
    assert "no matching process" in m.text
    assert "unreadable: permission denied" in m.text
    assert "Port 9000: unknown" in m.text
    assert "_no matching process_" in all_block_text(m)
    assert "*Log* `/data/x.log`: unreadable: permission denied" in all_block_text(m)


def test_probe_health_ok_with_code():
    snap = Snapshot(host="h", port=8000, port_listening=True,
                    health=HealthResult(url="http://127.0.0.1:8000/health", status="ok", http_code=200, elapsed_s=0.01))
    m = render("probe", **probe_view(snap, "port=8000"))
    assert "Port 8000: listening" in m.text
    assert "Health http://127.0.0.1:8000/health: ok (HTTP 200)" in m.text
    assert "*ok* (HTTP 200)" in all_block_text(m)


def test_probe_empty_log_and_errors():
    snap = Snapshot(host="h", log=LogInfo(path="/x", exists=True, lines=0, size_bytes=0, mtime=1.0), clock=61.0,
                    errors=["process table unavailable (ps failed or printed nothing)"])
    m = render("probe", **probe_view(snap, "GPU holders"))
    assert "0 lines, 0 B, last write 1m00s ago" in m.text and "(empty)" in m.text
    assert "note: process table unavailable (ps failed or printed nothing)" in m.text
    contexts = [b for b in m.blocks if b["type"] == "context"]
    assert contexts and "process table unavailable" in contexts[0]["elements"][0]["text"]


def test_render_redacts_secrets():
    secret = "hf_abcdefghijklmnopqrstuvwxyz"
    snap = Snapshot(host="h", processes=[ProcessInfo(pid=5, args=f"/bin/vllm serve --hf-token {secret} --port 1")],
                    log=LogInfo(path="/x", exists=True, tail=[f"HF_TOKEN={secret}"]))
    m = render("probe", **probe_view(snap, "pid=5"))
    assert secret not in m.text
    assert all(secret not in s for s in strings(m.blocks))
    assert "[REDACTED]" in m.text


def test_redaction_does_not_cross_lines():
    snap = Snapshot(host="h", log=LogInfo(path="/x", exists=True,
                                          tail=["HF hub: reading token:", "[TP0] Load weight end."]))
    m = render("probe", **probe_view(snap, ""))
    assert "[TP0] Load weight end." in m.text
    assert "[TP0] Load weight end." in all_block_text(m)


def test_escaping_does_not_drop_log_lines():
    tail = [f"[rank{i}] TypeError: expected <class 'torch.Tensor'> but got <class 'NoneType'> at step {i}."
            for i in range(60)]
    m = render("probe", **probe_view(Snapshot(host="h", log=LogInfo(path="/x", exists=True, tail=tail)), "x"))
    assert len(m.blocks) < MAX_BLOCKS
    text = all_block_text(m)
    missing = [i for i in range(60) if f"at step {i}." not in text]
    assert missing == []


def test_nonfinite_clock_does_not_break_render():
    req = ProbeRequest(gpu=False, log_path="/x.log")
    secs = {"clock": Section(b"inf\n", 0, True), "log_stat": Section(b"10 1700000000 1\n", 0, True),
            "log_tail": Section(b"one\n", 0, True)}
    snap = assemble_snapshot("h", req, secs)
    m = render("probe", **probe_view(snap, "log=/x.log"))
    assert "one" in m.text


# --- help and error -------------------------------------------------------------------------------


def test_render_help_with_real_command_table():
    from handlers import COMMANDS

    commands = [{"usage": c.usage, "summary": c.summary} for c in COMMANDS]
    m = render("help", intro="Unknown command 'x<y>'. Here is what I can do:", commands=commands,
               hosts=["gpu-host-1", "gpu-host-2"], bot_name="gpubot", prefix="!")
    assert_slack_valid(m)
    assert m.text.startswith("Unknown command 'x<y>'. Here is what I can do:")
    assert "@gpubot CMD / !CMD" in m.text
    for c in COMMANDS:
        assert said(c.usage) in m.text and c.summary in m.text
    assert "Hosts: gpu-host-1, gpu-host-2" in m.text
    text = all_block_text(m)
    assert "Unknown command 'x&lt;y&gt;'" in text
    assert "`/gpu status [HOST...|all] [group=GROUP] [detail=yes]`  GPU table per host and who holds each GPU" in text
    assert "Hosts: gpu-host-1, gpu-host-2" in text


def test_render_help_minimal():
    m = render("help", intro=None, commands=[{"usage": "/gpu help", "summary": "this list"}], hosts=[],
               bot_name="gpubot", prefix="!")
    assert_slack_valid(m)
    assert len(m.blocks) == 1
    assert "Hosts:" not in m.text


def test_render_error_with_and_without_hint():
    m = render("error", title="Unknown host", detail="'gpu-9'", hint="Known hosts: a, <b>")
    assert_slack_valid(m)
    assert m.text == "Unknown host: 'gpu-9'\nKnown hosts: a, <b>"
    assert m.blocks[0]["text"]["text"] == ":warning: *Unknown host*: 'gpu-9'"
    assert m.blocks[1] == {"type": "context", "elements": [{"type": "mrkdwn", "text": "Known hosts: a, &lt;b&gt;"}]}
    m2 = render("error", title="Bad arguments", detail="pid= must be a positive integer", hint=None)
    assert m2.text == "Bad arguments: pid= must be a positive integer"
    assert len(m2.blocks) == 1


def test_render_error_long_detail_is_cut():
    m = render("error", title="Internal error", detail="x" * 10_000, hint="h" * 10_000)
    assert_slack_valid(m)
    assert len(m.blocks[0]["text"]["text"]) <= 2950


def test_render_text_matches_message_text():
    ctx = status_view([case00_snapshot()])
    assert RENDERER.text("status", **ctx) == render("status", **ctx).text


def test_error_is_the_error_template():
    assert RENDERER.error("Unknown host", "'gpu-9'", "Known hosts: a") == render(
        "error", title="Unknown host", detail="'gpu-9'", hint="Known hosts: a")
    assert RENDERER.error("Bad arguments", "x").text == "Bad arguments: x"


def test_renderers_are_independent():
    # each renderer has its own Jinja environment and redactor: nothing is shared through module state
    other = Renderer()
    assert other.env is not RENDERER.env and other.redactor is not RENDERER.redactor
    assert other.env.globals["actions"].KILL == "gpubot_kill"
    ctx = status_view([case00_snapshot()])
    assert other.render("status", **ctx) == render("status", **ctx)


def test_message_then_concatenates_text_blocks_and_files():
    a = Message(text="killed 7", blocks=[section("a")], files=[("a.txt", b"A")])
    b = Message(text="launched 8", blocks=[section("b"), section("c")], files=[("b.txt", b"B")])
    both = a.then(b)
    assert both.text == "killed 7\nlaunched 8"
    assert both.blocks == [section("a"), section("b"), section("c")]
    assert both.files == [("a.txt", b"A"), ("b.txt", b"B")]
    assert (a.text, a.blocks, a.files) == ("killed 7", [section("a")], [("a.txt", b"A")])  # a and b untouched
    assert Message(text="x").then(Message(text="y")) == Message(text="x\ny", blocks=None)
    assert Message(text="x").then(b).blocks == b.blocks
    assert Message(text="x", blocks=[section("a")]).then(Message(text="y")).blocks == [section("a")]


def test_unknown_template_raises():
    import jinja2

    with pytest.raises(jinja2.TemplateNotFound):
        render("no-such-template")
    with pytest.raises(jinja2.UndefinedError):
        render("error", title="x")  # StrictUndefined: a missing variable is an error


# --- helpers and limits ---------------------------------------------------------------------------


def test_mrkdwn_escape():
    assert mrkdwn_escape(EVIL) == EVIL_ESCAPED
    assert mrkdwn_escape("&lt;") == "&amp;lt;"  # & first: no double meaning
    assert mrkdwn_escape(None) == ""
    assert mrkdwn_escape(42) == "42"


@pytest.mark.parametrize(
    ("fn", "value", "expected"),
    [
        (fmt_gib, 76015, "74.2"),
        (fmt_gib, 17235, "16.8"),
        (fmt_gib, 143771, "140.4"),
        (fmt_gib, 8610, "8.4"),
        (fmt_gib, None, "-"),
        (fmt_duration, 42, "42s"),
        (fmt_duration, 192, "3m12s"),
        (fmt_duration, 7260, "2h01m"),
        (fmt_duration, 90000, "1d01h"),
        (fmt_duration, None, "-"),
        (fmt_duration, float("nan"), "-"),
        (fmt_bytes, 812, "812 B"),
        (fmt_bytes, 4300, "4.2 KiB"),
        (fmt_bytes, 1363149, "1.3 MiB"),
        (fmt_bytes, 2 * 1024**3, "2.0 GiB"),
        (fmt_bytes, 5 * 1024**5, "5120.0 TiB"),
        (fmt_bytes, None, "-"),
        (fmt_num, None, "-"),
        (fmt_num, float("nan"), "-"),
        (fmt_num, 122.56, "123"),
        (fmt_num, "abc", "-"),
    ],
)
def test_formatters(fn, value, expected):
    assert fn(value) == expected


def test_cut_and_chunk_lines():
    assert cut("abcdef", 6) == "abcdef"
    assert cut("abcdefg", 6) == "abcde…"
    assert cut(None, 3) == ""
    chunks = chunk_lines(["a" * 10] * 10, limit=35)
    assert all(len(c) <= 35 for c in chunks)
    assert "\n".join(chunks).split("\n") == ["a" * 10] * 10
    assert chunk_lines(["x" * 100], limit=20) == ["x" * 19 + "…"]
    assert chunk_lines([]) == []


def section(text: str) -> dict:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def test_fit_blocks_keeps_50_with_note():
    blocks = [section(f"block {i}") for i in range(80)]
    out = fit_blocks(blocks)
    assert len(out) == MAX_BLOCKS
    assert [b["text"]["text"] for b in out[:49]] == [f"block {i}" for i in range(49)]
    assert out[-1] == {"type": "context", "elements": [{"type": "mrkdwn", "text": f"{TRUNCATED}: 31 more blocks"}]}
    assert len(blocks) == 80 and blocks[0] == section("block 0")  # input untouched
    for b in out:
        Block.parse(b).validate_json()


def test_fit_blocks_exactly_50_untouched():
    blocks = [section(f"b{i}") for i in range(50)]
    assert fit_blocks(blocks) == blocks


def test_fit_blocks_cuts_texts():
    long_code = "```" + "a\n" * 3000 + "```"
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "text": "H" * 400}},
        section("x" * 5000),
        section(long_code),
        {"type": "section", "fields": [{"type": "mrkdwn", "text": "f" * 2500}]},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": "c" * 4000}]},
    ]
    out = fit_blocks(blocks)
    assert len(out[0]["text"]["text"]) <= MAX_HEADER_TEXT
    assert out[0]["text"]["text"].endswith(TRUNCATED)
    assert len(out[1]["text"]["text"]) == MAX_SECTION_TEXT and out[1]["text"]["text"].endswith("\n" + TRUNCATED)
    code = out[2]["text"]["text"]
    assert len(code) <= MAX_SECTION_TEXT
    assert code.endswith("\n```\n" + TRUNCATED)  # the code block is closed before the note
    assert code.count("```") == 2
    assert len(out[3]["fields"][0]["text"]) <= 2000
    assert len(out[4]["elements"][0]["text"]) <= MAX_SECTION_TEXT
    for b in out:
        Block.parse(b).validate_json()


def test_render_caps_top_level_text():
    tail = [f"{i:05d} " + "y" * 390 for i in range(500)]
    snap = Snapshot(host="h", log=LogInfo(path="/x", exists=True, lines=500, tail=tail))
    m = render("probe", **probe_view(snap, "log=/x"))
    assert len(m.text) <= MAX_MESSAGE_TEXT
    assert m.text.endswith(TRUNCATED)
    assert_slack_valid(m)
    assert m.blocks[-1]["elements"][0]["text"].startswith(TRUNCATED)


# --- property test over random snapshots ----------------------------------------------------------

_ALPHABET = [*"abcXYZ019 -_./:=*~`'\"|&<>@!#$%", "```", "\u2603", "é", "\u200b", "日本", "\U0001f600", "&amp;",
             "<!channel>", "\t", "\n"]


def _rand_text(r: random.Random, n: int) -> str:
    out: list[str] = []
    size = 0
    while size < n:
        piece = r.choice(_ALPHABET)
        out.append(piece)
        size += len(piece)
    return "".join(out)[:n]


def _maybe(r: random.Random, value, p_none: float = 0.2):
    return None if r.random() < p_none else value


def _random_snapshot(r: random.Random, n_gpus: int, n_procs: int, n_lines: int, long_p: float) -> Snapshot:
    def length(short: int, long: int) -> int:
        return r.randint(0, long) if r.random() < long_p else r.randint(0, short)

    gpus = [
        GpuReading(
            index=i if r.random() < 0.9 else r.randint(0, 300),
            uuid=_maybe(r, f"GPU-{i}"),
            name=_maybe(r, _rand_text(r, length(30, 300))),
            memory_used_mib=_maybe(r, r.uniform(0, 200_000)),
            memory_total_mib=_maybe(r, r.choice([81559.0, 97887.0, 143771.0])),
            utilization_gpu_pct=_maybe(r, r.uniform(0, 100)),
            temperature_c=_maybe(r, r.uniform(20, 95)),
            power_draw_w=_maybe(r, r.uniform(50, 1000)),
        )
        for i in range(n_gpus)
    ]
    procs = [
        ProcessInfo(
            pid=r.randint(1, 4_194_304),
            ppid=_maybe(r, r.randint(0, 4_194_304)),
            pgid=_maybe(r, r.randint(1, 100)),
            sid=_maybe(r, r.randint(1, 100)),
            stat=r.choice(["", "S", "Sl", "D", "Z+", "R<"]),
            pcpu=_maybe(r, r.uniform(0, 3200)),
            rss_kib=_maybe(r, r.randint(0, 10**9)),
            elapsed_s=_maybe(r, r.randint(0, 10**8)),
            cpu_time_s=_maybe(r, r.randint(0, 10**8)),
            wchan=_maybe(r, _rand_text(r, 32)),
            args=_rand_text(r, length(120, 5000)),
        )
        for _ in range(n_procs)
    ]
    # make some of them a tree
    for i in range(1, len(procs)):
        if r.random() < 0.5:
            procs[i].ppid = procs[r.randrange(i)].pid
    holders = [
        GpuProcess(
            pid=r.choice(procs).pid if procs and r.random() < 0.7 else r.randint(1, 10**6),
            used_memory_mib=_maybe(r, r.uniform(0, 200_000)),
            gpu_index=_maybe(r, r.randint(0, max(0, n_gpus))),
            process_name=_maybe(r, _rand_text(r, length(40, 3000))),
        )
        for _ in range(r.randint(0, min(64, n_procs + 4)))
    ]
    ok = r.random() < 0.8
    gpu = GpuSection(
        ok=ok,
        gpus=gpus if ok else [],
        processes=holders,
        error=None if ok else _rand_text(r, length(80, 4000)),
        note=_maybe(r, _rand_text(r, length(60, 4000)), 0.7),
        processes_error=_maybe(r, _rand_text(r, length(80, 500)), 0.8),
    )
    log = None
    if r.random() < 0.8:
        log = LogInfo(
            path="/" + _rand_text(r, length(40, 4000)),
            exists=r.random() < 0.8,
            size_bytes=_maybe(r, r.randint(0, 10**13)),
            mtime=_maybe(r, r.uniform(0, 2e9)),
            lines=_maybe(r, r.randint(0, 10**9)),
            tail=[_rand_text(r, length(120, 2000)) for _ in range(n_lines)],
            error=_maybe(r, _rand_text(r, length(40, 4000)), 0.8),
        )
    port = _maybe(r, r.randint(1, 65535), 0.3)
    health = None
    if port and r.random() < 0.7:
        health = HealthResult(url=f"http://127.0.0.1:{port}/health", status=r.choice(["ok", "refused", "timeout",
                                                                                       "http_503", "error"]),
                              http_code=_maybe(r, r.choice([200, 503])), elapsed_s=_maybe(r, r.uniform(0, 5)),
                              detail=_maybe(r, _rand_text(r, length(100, 4000))))
    return Snapshot(
        host=_rand_text(r, r.randint(1, 63)) if r.random() < 0.2 else f"gpu-host-{r.randint(1, 99)}",
        clock=_maybe(r, r.uniform(0, 2e9)),
        hostname=_maybe(r, _rand_text(r, length(20, 255))),
        processes=procs,
        all_process_count=r.randint(len(procs), len(procs) + 10_000),
        gpu=gpu,
        log=log,
        port=port,
        port_listening=_maybe(r, r.random() < 0.5, 0.3),
        health=health,
        errors=[_rand_text(r, length(100, 3000)) for _ in range(r.randint(0, 6))],
        duration_s=_maybe(r, r.uniform(0, 60)),
    )


@pytest.mark.timeout(300)
@settings(max_examples=max(40, int(os.environ.get("GPUBOT_FUZZ_EXAMPLES", "40")) // 5), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n_gpus=st.integers(0, 16),
    n_procs=st.one_of(st.integers(0, 20), st.integers(0, 300)),
    n_lines=st.one_of(st.integers(0, 20), st.integers(0, 500)),
    long_p=st.sampled_from([0.0, 0.01, 0.05, 0.3]),
    n_hosts=st.integers(1, 4),
)
@example(seed=1, n_gpus=16, n_procs=300, n_lines=500, long_p=0.3, n_hosts=4)  # always exercise the caps
def test_random_snapshots_always_fit_slack(seed, n_gpus, n_procs, n_lines, long_p, n_hosts):
    r = random.Random(seed)
    snap = _random_snapshot(r, n_gpus, n_procs, n_lines, long_p)
    others: list[Snapshot | HostFailure] = []
    for _ in range(n_hosts - 1):
        if r.random() < 0.4:
            others.append(HostFailure(f"h{r.randint(1, 9)}", _rand_text(r, r.choice([50, 5000]))))
        else:
            others.append(_random_snapshot(r, r.randint(0, 16), r.randint(0, 20), 0, long_p))
    selector = _rand_text(r, r.choice([10, 300]))
    for m in (render("status", **status_view([snap, *others])), render("probe", **probe_view(snap, selector))):
        assert_slack_valid(m)
        texts = mrkdwn_texts(m.blocks)
        assert texts
        for s in texts:
            assert "<" not in s and ">" not in s, s


def test_a_notice_is_a_success_with_its_icon_not_a_warning() -> None:
    from bot.present.render import Renderer

    msg = Renderer().notice("Kill cancelled", "kill of base#1: nothing was stopped <@U1>", icon=":no_entry_sign:")
    assert msg.text == "Kill cancelled: kill of base#1: nothing was stopped <@U1>"
    shown = msg.blocks[0]["text"]["text"]
    assert shown.startswith(":no_entry_sign: Kill cancelled:") and ":warning:" not in shown
    assert "&lt;@U1&gt;" in shown  # host or user text is escaped, never a mention


@pytest.mark.parametrize("n", [64, 256])
def test_a_fleet_of_64_or_256_hosts_is_one_message_within_slack_s_limits(n):
    from bot.core.fleet import HostLine, summarize
    from bot.present.views import fleet_view

    groups = ["h200", "h100", None]
    lines = [HostLine(name=f"gpu-{i:03d}", group=groups[i % 3], gpus=8, free=tuple(range(i % 9)),
                      util_pct=float(i % 100), used_mib=1000.0 * i, total_mib=8 * 143771.0,
                      launches=(f"base#{i}", f"eagle#{i + 1000}") if i % 5 == 0 else (), foreign=i % 2)
             if i % 17 else HostLine(name=f"gpu-{i:03d}", group=groups[i % 3], failed=True,
                                     reason="ssh: connection refused (port 22)")
             for i in range(n)]
    m = render("fleet", **fleet_view(summarize(lines), title="GPU fleet", hint="details: /gpu status HOST"))
    assert_slack_valid(m)
    assert not m.files  # nothing cut, nothing attached
    shown = "\n".join(b["text"]["text"] for b in m.blocks if b["type"] == "section")
    assert [line.split()[0] for line in shown.replace("```", "\n").splitlines() if line.startswith("gpu-")] == \
        [h.name for g in ("h200", "h100", None) for h in lines if h.group == g]
    assert f"{n} hosts ({n - len([h for h in lines if h.failed])} up, {len([h for h in lines if h.failed])} down)" \
        in m.text
