"""Fuzzing every parser (issue 5 point 7): each returns its documented type or raises only its documented
error, for arbitrary text, non-UTF-8 bytes, ANSI escapes, 1 MB lines, cut captures and odd fields.

One test per parser. The number of examples comes from GPUBOT_FUZZ_EXAMPLES (default 200, so `./dev test`
stays fast); `./dev fuzz` runs 10 000 per parser and prints hypothesis' statistics. The strategies are in
tests/support/strategies.py, with the unit tests' own (smaller) ones, which each reuses as one branch.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.config import Config, ConfigError, load_config
from bot.core.commands import strip_markers
from bot.core.grammar import CommandCall, CommandParseError
from bot.core.models import GpuProcess, GpuReading, GpuSection, HealthResult, ListenSocket, ProcessInfo, Snapshot
from bot.core.parse.health import parse_curl
from bot.core.parse.log import clean_log_lines, parse_log_stat, strip_control
from bot.core.parse.nvidia_smi import (
    describe_exit,
    gpu_section_from_outputs,
    parse_number,
    parse_nvidia_smi_table,
    parse_query_apps,
    parse_query_gpu,
)
from bot.core.parse.proc_net import is_listening, parse_proc_net_tcp
from bot.core.parse.ps import parse_cputime, parse_etime, parse_ps, process_tree, select_processes
from bot.core.probe import HostPolicy, ProbeRequest, Section, assemble_snapshot, split_sections
from handlers import grammar
from tests.support import strategies as S
from tests.support.typecheck import assert_type

EXAMPLES = int(os.environ.get("GPUBOT_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
# About 10 ms an example on a slow core, and a floor for the rare 1 MB ones.
pytestmark = pytest.mark.timeout(60 + EXAMPLES // 10)

#: A user-facing parse error is one short line or a few: never empty, never a dump of the input.
MAX_ERROR_CHARS = 500


def _clear_message(e: BaseException) -> str:
    msg = str(e)
    assert isinstance(msg, str) and msg.strip(), f"{type(e).__name__} with an empty message"
    assert len(msg) <= MAX_ERROR_CHARS, f"error message of {len(msg)} characters"
    return msg


# --- the command grammar --------------------------------------------------------------------------------

#: The real grammar: the vocabulary of the command table, with the default config's slash command names.
GRAMMAR = grammar(Config())
SLASH_COMMANDS = sorted(GRAMMAR.vocabulary.slash)

_REAL_COMMANDS = [
    "status", "status gpu-host-1", "all", "help", "probe gpu-host-1 pgid=123 log=/data/logs/x.log port=8000",
    "gpu-host-1 pid=1 lines=50 health=/health", 'match="sglang serve" port=30000', "launch base model=/m --yes",
    "kill 12", "relaunch base#12 mem_fraction=0.8", "<http://gpu1.example.com|gpu1.example.com> pid=1",
    "probe h match=&lt;@U1&gt;&amp;", "\u201cquoted words\u201d", "logs 40", "stack --native", "snooze 15",
]
COMMAND_TEXT = S.with_huge_line(st.one_of(
    S.UNIT_COMMAND_TEXTS,
    S.SLACK_TEXT,
    S.damaged(_REAL_COMMANDS, st.one_of(S.SLACK_TEXT, st.sampled_from(S.ANSI))),
    st.lists(st.one_of(st.sampled_from(_REAL_COMMANDS), st.sampled_from(S.ANSI), S.SLACK_TEXT), max_size=6).map(
        " ".join),
))


@FUZZ
@given(st.one_of(st.sampled_from([*SLASH_COMMANDS, "/GPU", " /probe ", "/nope", ""]), S.SLACK_TEXT), COMMAND_TEXT)
def test_fuzz_parse_slash(command: str, text: str) -> None:
    try:
        call = GRAMMAR.parse_slash(command, text)
    except CommandParseError as e:
        _clear_message(e)
        return
    assert_type(call, CommandCall)
    assert call.name and call.name == call.name.lower()


@FUZZ
@given(
    st.one_of(COMMAND_TEXT, COMMAND_TEXT.map(lambda t: "!" + t), COMMAND_TEXT.map(lambda t: "<@UBOT> " + t),
              COMMAND_TEXT.map(lambda t: "<@UBOT|gpubot>" + t), COMMAND_TEXT.map(lambda t: "  <@U0THER> " + t)),
    st.sampled_from(["UBOT", None, ""]),
    st.sampled_from(["!", "", "?", "gpu:", "!!", "\x1b"]),
)
def test_fuzz_parse_message(text: str, bot_user_id: str | None, prefix: str) -> None:
    try:
        call = GRAMMAR.parse_message(text, bot_user_id=bot_user_id, prefix=prefix)
    except CommandParseError as e:
        _clear_message(e)
        return
    assert_type(call, CommandCall | None)
    assert call is None or (call.name and call.name == call.name.lower())


# --- nvidia-smi -----------------------------------------------------------------------------------------


@FUZZ
@given(st.one_of(S.NVIDIA_CSV_TEXT, S.UNIT_NVIDIA_TEXT), S.QUERY_FIELDS)
def test_fuzz_parse_query_gpu(text: str, fields: list[str] | None) -> None:
    gpus = parse_query_gpu(text) if fields is None else parse_query_gpu(text, fields)
    assert_type(gpus, list[GpuReading])
    assert all(g.index >= 0 for g in gpus)


@FUZZ
@given(st.one_of(S.NVIDIA_CSV_TEXT, S.UNIT_NVIDIA_TEXT), S.QUERY_FIELDS)
def test_fuzz_parse_query_apps(text: str, fields: list[str] | None) -> None:
    procs = parse_query_apps(text) if fields is None else parse_query_apps(text, fields)
    assert_type(procs, list[GpuProcess])
    assert all(p.pid >= 0 and p.gpu_index is None for p in procs)


@FUZZ
@given(st.one_of(S.NVIDIA_TABLE_TEXT, S.UNIT_NVIDIA_TEXT))
def test_fuzz_parse_nvidia_smi_table(text: str) -> None:
    result = parse_nvidia_smi_table(text)
    assert_type(result, tuple[list[GpuReading], list[GpuProcess]])


@FUZZ
@given(S.EXIT_CODES, S.NVIDIA_CSV_TEXT, S.EXIT_CODES, S.NVIDIA_CSV_TEXT,
       st.one_of(st.floats(), st.sampled_from([10.0, 0.5, 3600.0])))
def test_fuzz_gpu_section_from_outputs(gpu_rc: int | None, gpu_out: str, apps_rc: int | None, apps_out: str,
                                       timeout_s: float) -> None:
    sec = gpu_section_from_outputs(gpu_rc, gpu_out, apps_rc, apps_out, timeout_s=timeout_s)
    assert_type(sec, GpuSection)
    assert sec.ok == bool(sec.gpus)
    if not sec.ok:
        assert sec.error and sec.error.strip()
    assert (sec.processes_error is None) == (apps_rc == 0)
    for rc, out in ((gpu_rc, gpu_out), (apps_rc, apps_out)):
        msg = describe_exit(rc, out, timeout_s)
        assert_type(msg, str | None)
        assert (msg is None) == (rc == 0) and (msg is None or "\n" not in msg)
    for cell in gpu_out.split(",")[:20]:
        assert_type(parse_number(cell), float | None)


# --- ps -------------------------------------------------------------------------------------------------


@FUZZ
@given(st.one_of(S.PS_TEXT, S.UNIT_PS_TEXT), S.PS_COLUMN_SPECS,
       st.one_of(st.sampled_from(S.DURATIONS + S.INTS), S.ARBITRARY_TEXT))
def test_fuzz_parse_ps(text: str, columns: list[str] | str | None, cell: str) -> None:
    rows = parse_ps(text, columns)
    assert_type(rows, list[ProcessInfo])
    assert all(r.pid >= 0 for r in rows)
    tree = process_tree(rows)
    assert sorted(id(p) for _, p in tree) == sorted(id(p) for p in rows)
    if rows:
        picked = select_processes(rows, pgid=rows[0].pgid, match=rows[-1].args[:8] or None, pid=rows[0].pid)
        assert rows[0] in picked
    for parse in (parse_cputime, parse_etime):
        seconds = parse(cell)
        assert seconds is None or (isinstance(seconds, int) and seconds >= 0)


# --- /proc/net/tcp, log, curl ---------------------------------------------------------------------------


@FUZZ
@given(S.PROC_NET_TEXT, st.booleans())
def test_fuzz_parse_proc_net_tcp(text: str, ipv6: bool) -> None:
    socks = parse_proc_net_tcp(text, ipv6=ipv6)
    assert_type(socks, list[ListenSocket])
    assert all(0 <= s.port <= 0xFFFF for s in socks)
    assert is_listening(socks, 8080) == any(s.port == 8080 for s in socks)


@FUZZ
@given(st.one_of(S.LOG_BYTES, S.LOG_BYTES.map(lambda b: b.decode("utf-8", "replace")), S.UNIT_LOG_TEXT),
       st.integers(-2, 600), st.integers(-2, 1000))
def test_fuzz_clean_log_lines(raw: bytes | str, max_lines: int, max_width: int) -> None:
    out = clean_log_lines(raw, max_lines=max_lines, max_width=max_width)
    assert_type(out, list[str])
    assert len(out) <= max(0, max_lines)
    assert all(len(line) <= max(1, max_width) and strip_control(line) == line for line in out)


@FUZZ
@given(S.LOG_STAT_TEXT)
def test_fuzz_parse_log_stat(text: str) -> None:
    size, mtime, lines = parse_log_stat(text)
    assert_type((size, mtime, lines), tuple[int | None, float | None, int | None])
    assert all(v is None or v >= 0 for v in (size, mtime, lines))


@FUZZ
@given(S.EXIT_CODES, S.CURL_OUTPUT)
def test_fuzz_parse_curl(rc: int | None, output: str) -> None:
    url = "http://127.0.0.1:8000/health"
    res = parse_curl(rc, output, url)
    assert_type(res, HealthResult)
    assert res.url == url
    assert res.status in {"ok", "refused", "timeout", "empty", "unavailable", "error"} or (
        res.status.startswith("http_") and res.http_code is not None)
    assert res.detail is None or (0 < len(res.detail) <= 300 and strip_control(res.detail) == res.detail)


# --- the probe's output -----------------------------------------------------------------------------------


@FUZZ
@given(S.probe_output(rich=False), st.sampled_from([S.NONCE, "fedcba9876543210", "00000000"]))
def test_fuzz_split_sections(output: bytes, nonce: str) -> None:
    secs = split_sections(output, nonce)
    assert_type(secs, dict[str, Section])
    assert all(s.complete or s.rc is None for s in secs.values())
    shown = strip_markers(output)  # what the host printed, less the characters of suggestion tokens
    for name, sec in secs.items():  # a section needs a BEGIN marker carrying this nonce: no other marker counts
        assert f"@@{nonce} BEGIN {name}".encode() in shown
        assert sec.body in shown and b"\xee\x80\x80" not in sec.body


PROBE_REQUESTS = st.builds(
    ProbeRequest,
    pid=st.one_of(st.none(), st.integers(1, 4_194_304)),
    pgid=st.one_of(st.none(), st.integers(1, 4_194_304)),
    sid=st.one_of(st.none(), st.integers(1, 4_194_304)),
    match=st.one_of(st.none(), st.text(min_size=1, max_size=200).filter(lambda m: "\x00" not in m)),
    log_path=st.one_of(st.none(), st.just("/data/logs/server.log")),
    port=st.one_of(st.none(), st.integers(1, 65535)),
    health_path=st.one_of(st.none(), st.just("/health")),
    tail_lines=st.integers(1, 500),
    gpu=st.booleans(),
    tags=st.booleans(),
    select_tag=st.one_of(st.none(), st.sampled_from(["12-abcdef", "x"])),
    shm=st.booleans(),
    own_log=st.booleans(),
)
#: What hosts allow: the log directory of PROBE_REQUESTS' log, odd tool timeouts.
HOST_POLICIES = st.builds(
    HostPolicy,
    log_dirs=st.sampled_from([("/data/logs",), ("/data/logs/", "/srv"), ("/",)]),
    nvidia_smi_timeout_s=st.one_of(st.sampled_from([10.0, 0.5, 3600.0]), st.floats(0.001, 1e6)),
    health_timeout_s=st.sampled_from([3.0, 0.1]),
)


@FUZZ
@given(S.probe_output(), PROBE_REQUESTS, HOST_POLICIES, st.one_of(st.none(), st.text(max_size=30)))
def test_fuzz_assemble_snapshot(output: bytes, req: ProbeRequest, policy: HostPolicy, gpu_note: str | None) -> None:
    policy.check(req)
    snap = assemble_snapshot("gpu-host-1", req, split_sections(output, S.NONCE), policy=policy, gpu_note=gpu_note)
    assert_type(snap, Snapshot)
    assert all(e.strip() for e in snap.errors)
    assert (snap.log is not None) == (req.log_path is not None)
    assert snap.health is None or (req.port is not None and req.health_path is not None)
    assert snap.gpu.ok or (snap.gpu.error and snap.gpu.error.strip())
    assert all(len(p.args) <= 4 * 400 + 1 for p in snap.table)


# --- config ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def config_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz-config") / "config.yaml"


@FUZZ
@given(data=S.CONFIG_BYTES)
def test_fuzz_load_config(config_path: Path, data: bytes) -> None:
    config_path.write_bytes(data)
    try:
        cfg = load_config(config_path, environ={"HF_TOKEN": "hf_fuzz"})
    except ConfigError as e:
        assert_type(e.errors, list[str])
        assert e.errors and all(m.strip() for m in e.errors)
        return
    assert isinstance(cfg, Config)
