"""Tests for bot.core.parse.ps against real `ps` captures, synthetic rows and fuzz input."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.core.models import ProcessInfo
from bot.core.parse.ps import PS_COLUMNS, parse_cputime, parse_etime, parse_ps, process_tree, select_processes
from tests.support.paths import CASES, FIXTURES, H200, case_file, read  # noqa: F401
from tests.support.strategies import PS_PROBE_OUTPUT as PROBE_OUTPUT
from tests.support.strategies import UNIT_PS_TEXT as fuzz_text

FIXTURE_COLUMNS = "pid,ppid,pgid,sid,stat,pcpu,pmem,rss,vsz,etimes,time,wchan:32,args"  # h200/README.md


# --- time formats ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("00:00:04", 4),
        ("00:00:00", 0),
        ("01:02:03", 3723),
        ("1-02:03:04", 93784),
        ("18:36", 18 * 60 + 36),
        ("0:16", 16),
        ("1234:56", 1234 * 60 + 56),  # ps aux minutes may exceed 59
        ("42", 42),
        (" 00:01:00 ", 60),
        ("", None),
        ("-", None),
        ("1:60", None),
        ("1:61:00", None),
        ("1-25:00:00", None),
        ("1-02:03", None),
        ("a:bc", None),
        ("١٢:٣٤", None),  # non-ASCII digits
        ("00:00:04.5", None),
    ],
)
def test_parse_cputime(text: str, seconds: int | None) -> None:
    assert parse_cputime(text) == seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("20", 20),
        ("05:07", 307),
        ("01:02:03", 3723),
        ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5),
        ("x", None),
    ],
)
def test_parse_etime(text: str, seconds: int | None) -> None:
    assert parse_etime(text) == seconds


# --- parse_ps: real captures -----------------------------------------------------------------------


def test_hung_fixture_header_with_pmem_vsz() -> None:
    rows = parse_ps(read(H200 / "hung.ps.txt"))
    assert [r.pid for r in rows] == [566, 568, 569, 570]
    r569 = rows[2]
    assert r569 == ProcessInfo(
        pid=569,
        ppid=566,
        pgid=566,
        sid=566,
        stat="Sl",
        pcpu=20.2,
        rss_kib=628504,  # RSS, not VSZ (26060292) — columns are header-driven
        elapsed_s=20,
        cpu_time_s=4,
        wchan="hrtimer_nanosleep",
        args="/opt/venv/bin/python3 -B -c from multiprocessing.spawn import spawn_main; "
        "spawn_main(tracker_fd=4, pipe_handle=6) --multiprocessing-fork",
    )
    assert "spawn_main(tracker_fd=4, pipe_handle=6) --multiprocessing-fork" in r569.args
    assert r569.state == "S"
    assert rows[0].wchan == "do_wait" and rows[0].args == "python3 /srv/fake_server.py 2"
    assert rows[1].args.endswith("import main;main(3)")


def test_orphans_fixture_reparented_to_init() -> None:
    rows = parse_ps(read(H200 / "orphans.ps.txt"))
    assert [r.pid for r in rows] == [568, 569, 570]
    assert all(r.ppid == 1 and r.pgid == 566 and r.sid == 566 for r in rows)
    assert rows[1].elapsed_s == 37


def test_busy_and_freed_fixtures() -> None:
    (busy,) = parse_ps(read(H200 / "busy.ps.txt"))
    assert (busy.pid, busy.stat, busy.pcpu, busy.cpu_time_s, busy.wchan) == (637, "Rsl", 137.0, 7, None)
    assert busy.args == "python3 /srv/busy.py 10"
    assert parse_ps(read(H200 / "freed.ps.txt")) == []


def test_headerless_grep_output_with_columns() -> None:
    text = read(H200 / "orphans.ps-grep.txt")
    rows = parse_ps(text, columns=FIXTURE_COLUMNS.split(","))
    assert rows == parse_ps(read(H200 / "orphans.ps.txt"))
    assert parse_ps(text, columns=FIXTURE_COLUMNS) == rows  # a comma-separated string also works


def test_case00_ps_aux() -> None:
    rows = parse_ps(case_file("00", "ps.txt"))
    assert len(rows) == 10  # 11 lines: the header + 10 processes
    by_pid = {r.pid: r for r in rows}
    r = by_pid[50435]
    assert r.args == "sglang::scheduler_TP0"
    assert r.cpu_time_s == 18 * 60 + 36
    assert (r.stat, r.pcpu, r.rss_kib) == ("Sl", 0.0, 426061196)
    assert (r.ppid, r.pgid, r.sid, r.elapsed_s, r.wchan) == (None, None, None, None, None)
    assert by_pid[50299].args.startswith("/opt/ml-env/bin/python3 -m sglang.launch_server --model-path")
    assert by_pid[50299].cpu_time_s == 16
    assert [r.args for r in rows[2:]] == [f"sglang::scheduler_TP{i}" for i in range(8)]


# --- parse_ps: the probe's own format (PROBE_OUTPUT: tests/support/strategies.py PS_PROBE_OUTPUT) ---------

def test_probe_header_format() -> None:
    rows = parse_ps(PROBE_OUTPUT)
    assert [r.pid for r in rows] == [1, 566, 569, 700, 701]
    assert rows[0].elapsed_s == 864000 and rows[0].cpu_time_s == 9
    assert rows[2].args == "/opt/venv/bin/python3 -B -c x  y"  # internal spaces kept
    assert rows[3].wchan is None and rows[3].state == "Z" and rows[3].args == "[python3] <defunct>"
    assert rows[4].elapsed_s == 93784  # etime format under ELAPSED
    assert rows[4].cpu_time_s == 86401
    assert rows[4].args == "busy   loop"


def test_probe_columns_without_header() -> None:
    body = "\n".join(PROBE_OUTPUT.splitlines()[1:])
    assert parse_ps(body, columns=PS_COLUMNS.split(",")) == parse_ps(PROBE_OUTPUT)
    assert parse_ps(body) == parse_ps(PROBE_OUTPUT)  # no header: PS_COLUMNS assumed
    # a header line inside headerless text is skipped, not parsed as a row
    assert parse_ps(PROBE_OUTPUT, columns=PS_COLUMNS) == parse_ps(PROBE_OUTPUT)


def test_bad_rows_are_skipped() -> None:
    text = (
        PROBE_OUTPUT.splitlines()[0]
        + "\n  abc 1 1 1 S 0.0 1 1 00:00:00 - root junk\n"
        + "  12 1\n"
        + "\x00\x1b[31m garbage \ufffd\n"
        + "  13 1 13 13 S 0.0 1 1 00:00:00 - root\n"  # empty command line is allowed
    )
    rows = parse_ps(text)
    assert [(r.pid, r.args) for r in rows] == [(13, "")]


def test_empty_inputs() -> None:
    assert parse_ps("") == []
    assert parse_ps("\n\n") == []
    assert parse_ps("1 2 3", columns=[]) == []
    assert parse_ps("1 S", columns=["pid", "stat"]) == [ProcessInfo(pid=1, stat="S")]


@pytest.mark.skipif(shutil.which("ps") is None, reason="needs ps (procps-ng)")
@pytest.mark.parametrize("columns", [PS_COLUMNS, PS_COLUMNS.replace("etimes", "etime")])
def test_live_ps_output_finds_this_process(columns: str) -> None:
    out = subprocess.run(
        ["ps", "-eww", "-o", columns], capture_output=True, text=True, check=False, timeout=20
    )
    if out.returncode != 0:
        pytest.skip(f"ps does not support -o {columns}: {out.stderr.strip()[:100]}")
    rows = parse_ps(out.stdout)
    assert len(rows) == len(out.stdout.strip().splitlines()) - 1  # every line but the header
    (me,) = [r for r in rows if r.pid == os.getpid()]
    assert (me.ppid, me.pgid, me.sid) == (os.getppid(), os.getpgid(0), os.getsid(0))
    assert me.state in "RS" and me.rss_kib and me.rss_kib > 0
    assert me.elapsed_s is not None and me.cpu_time_s is not None
    assert "python" in me.args or "pytest" in me.args
    assert [r.pid for r in select_processes(rows, pid=os.getpid(), include_descendants=False)] == [
        os.getpid()
    ]
    tree = process_tree(rows)
    assert len(tree) == len(rows)


# --- selection and tree ----------------------------------------------------------------------------


def _p(
    pid: int, ppid: int | None, pgid: int | None = None, sid: int | None = None, args: str = ""
) -> ProcessInfo:
    return ProcessInfo(pid=pid, ppid=ppid, pgid=pgid, sid=sid, args=args)


TREE = [
    _p(1, 0, 1, 1, "/sbin/init"),
    _p(100, 1, 100, 100, "bash"),
    _p(200, 100, 200, 100, "python -m vllm.entrypoints.openai.api_server --port 8000"),
    _p(201, 200, 200, 100, "python -c from multiprocessing.spawn import spawn_main"),
    _p(202, 200, 200, 100, "ray::worker"),
    _p(300, 202, 300, 100, "nvidia-smi"),
    _p(400, 1, 400, 400, "sshd: user"),
]


def test_select_by_pid_with_descendants_keeps_input_order() -> None:
    rows = select_processes(TREE, pid=200)
    assert [r.pid for r in rows] == [200, 201, 202, 300]
    assert [r.pid for r in select_processes(TREE, pid=200, include_descendants=False)] == [200]


def test_select_by_pids_pgid_sid_match() -> None:
    assert [r.pid for r in select_processes(TREE, pids=[202, 400], include_descendants=False)] == [202, 400]
    assert [r.pid for r in select_processes(TREE, pgid=200, include_descendants=False)] == [200, 201, 202]
    assert [r.pid for r in select_processes(TREE, pgid=200)] == [200, 201, 202, 300]
    assert [r.pid for r in select_processes(TREE, sid=100)] == [100, 200, 201, 202, 300]
    assert [r.pid for r in select_processes(TREE, match="vllm")] == [200, 201, 202, 300]


def test_select_match_is_plain_case_sensitive_substring() -> None:
    assert select_processes(TREE, match="VLLM") == []
    assert select_processes(TREE, match="ray::.*") == []
    assert [r.pid for r in select_processes(TREE, match="ray::", include_descendants=False)] == [202]
    assert [r.pid for r in select_processes(TREE, match="--port 8000", include_descendants=False)] == [200]
    assert select_processes(TREE, match="") == []


def test_select_no_criteria_and_duplicates() -> None:
    assert select_processes(TREE) == []
    dup = [*TREE, _p(200, 100, args="duplicate row")]
    rows = select_processes(dup, pids=[200], pid=200, pgid=200, match="python")
    assert [r.pid for r in rows] == [200, 201, 202, 300]
    assert rows[0].args.startswith("python -m vllm")


def test_select_on_real_fixture() -> None:
    rows = parse_ps(read(H200 / "hung.ps.txt"))
    assert [r.pid for r in select_processes(rows, pid=566)] == [566, 568, 569, 570]
    assert [r.pid for r in select_processes(rows, match="spawn_main")] == [569, 570]


def test_process_tree_depth_first() -> None:
    shuffled = [TREE[5], TREE[3], TREE[2], TREE[6], TREE[0], TREE[4], TREE[1]]
    tree = process_tree(shuffled)
    assert [(d, p.pid) for d, p in tree] == [
        (0, 1),
        (1, 400),
        (1, 100),
        (2, 200),
        (3, 201),
        (3, 202),
        (4, 300),
    ]


def test_process_tree_roots_cycles_and_duplicates() -> None:
    rows = [_p(10, 999), _p(11, 10), _p(20, 21), _p(21, 20), _p(30, None), _p(30, None), _p(40, 40)]
    tree = process_tree(rows)
    assert sorted(id(p) for _, p in tree) == sorted(id(p) for p in rows)
    assert [(d, p.pid) for d, p in tree][:2] == [(0, 10), (1, 11)]
    assert (0, 40) in [(d, p.pid) for d, p in tree]
    assert process_tree([]) == []


def test_process_tree_deep_chain() -> None:
    rows = [_p(i, i - 1) for i in range(1, 5001)]
    tree = process_tree(rows)
    assert tree[-1][0] == 4999 and len(tree) == 5000


def test_process_tree_real_fixture() -> None:
    tree = process_tree(parse_ps(read(H200 / "hung.ps.txt")))
    assert [(d, p.pid) for d, p in tree] == [(0, 566), (1, 568), (1, 569), (1, 570)]


# --- fuzz ------------------------------------------------------------------------------------------

FUZZ = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(fuzz_text, st.one_of(st.none(), st.just(PS_COLUMNS), st.lists(st.text(max_size=8), max_size=6)))
def test_fuzz_parse_ps_never_raises(text: str, columns: object) -> None:
    rows = parse_ps(text, columns)  # type: ignore[arg-type]
    for r in rows:
        assert isinstance(r.pid, int) and r.pid >= 0
        select_processes(rows, pid=r.pid, match=r.args[:5])
    assert len(process_tree(rows)) == len(rows)
    parse_cputime(text)
    parse_etime(text)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 30), st.one_of(st.none(), st.integers(0, 30))), max_size=40))
def test_fuzz_tree_and_selection_cover_every_row(pairs: list[tuple[int, int | None]]) -> None:
    rows = [_p(pid, ppid, pgid=pid % 3) for pid, ppid in pairs]
    tree = process_tree(rows)
    assert sorted(id(p) for _, p in tree) == sorted(id(p) for p in rows)
    selected = select_processes(rows, pgid=0)
    assert len({r.pid for r in selected}) == len(selected)


# --- the probe layout's fast path reads what the careful path reads -----------------------------------

_CELL = st.one_of(st.from_regex(r"\A[0-9]{1,20}\Z"), st.sampled_from(["-", "0.0", "12.5", "x", "1-02:03:04", "00:00:09",
                                                                       "99:59:59", "10:60:00", "1:02", "\ufffd"]))
_ROW = st.tuples(
    st.lists(_CELL, min_size=4, max_size=4),
    st.sampled_from(["S", "Ss", "Sl+", "Z", "-", "R<"]),
    st.one_of(_CELL, st.sampled_from(["0.0", "100.0", "1e3", "nan", "1.2345"])),
    _CELL, _CELL,
    st.one_of(_CELL, st.sampled_from(["00:00:00", "23:59:59", "100:00:00", "1-00:00:01"])),
    st.sampled_from(["-", "do_wait", "futex_wait_queue", ""]),
    st.sampled_from(["-", "root", "ubuntu", "1001"]),
    st.one_of(st.just(""), st.text(max_size=40).filter(lambda s: "\n" not in s and "\r" not in s)),
)


def _fields(info: ProcessInfo | None) -> tuple | None:
    return None if info is None else tuple(getattr(info, f) for f in ProcessInfo.FIELDS)


@FUZZ
@given(_ROW, st.sampled_from([" ", "  ", "\t", " \t "]))
def test_fuzz_probe_row_fast_path_equals_careful_path(row: tuple, gap: str) -> None:
    from bot.core.parse.ps import _probe_row, _probe_row_split

    ids, stat, pcpu, rss, etimes, cputime, wchan, user, args = row
    line = "  " + gap.join([*ids, stat, pcpu, rss, etimes, cputime, wchan or "-", user]) + (gap + args if args else "")
    assert _fields(_probe_row(line)) == _fields(_probe_row_split(line))


@FUZZ
@given(fuzz_text)
def test_fuzz_probe_row_fast_path_equals_careful_path_on_any_line(text: str) -> None:
    from bot.core.parse.ps import _probe_row, _probe_row_split

    for line in text.splitlines():
        assert _fields(_probe_row(line)) == _fields(_probe_row_split(line)), line


def test_a_last_row_cut_short_is_dropped_as_the_careful_path_drops_it():
    """`ps` killed while it wrote: its last row lacks cells. The fast path keeps no row the careful one drops."""
    full = "    1     0     1     1 Ss    0.0  1000     100 00:00:01 -  init\n"
    cut = "  1234  1 1234 1234 Sl 0.0 100"
    assert [p.pid for p in parse_ps(full + cut, PS_COLUMNS)] == [1]
    assert [p.pid for p in parse_ps(full + full, PS_COLUMNS)] == [1, 1]
