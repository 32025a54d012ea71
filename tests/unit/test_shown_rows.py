"""The shortcuts that make a shown process row cheap give what the row-by-row ways give (issue 21).

Each shortcut is compared with the slow way it replaces: a whole text with no keyword passed through unchanged
(Redactor._untouched) against `Redactor.lines` line by line; the one-pass code escaping of a table against escaping
line by line; the table formatted with one `%` against one line per row; the tree's one-pass case against the
general walk; block fitting that copies only what it cuts; the shown-command memo emptied when secret values are
learnt.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.models import ProcessInfo
from bot.core.parse.ps import process_tree
from bot.core.probe import shown_command
from bot.core.redact import MASK, Redactor
from bot.present.render import MAX_SECTION_TEXT, chunk_lines, code_chunks, code_escape, fit_blocks
from bot.present.views import TABLE_FORMAT, TABLE_HEADER, process_table

_B64 = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWZnaGlqa2xtbm9wcXJzdHV2d3h5ejAxMjM0NTY3ODkrLw=="


def _line_by_line(r: Redactor, text: str) -> str:
    parts = text.splitlines(keepends=True)
    bodies = [p.splitlines()[0] for p in parts]
    return "".join(x + p[len(b):] for x, p, b in zip(r.lines(bodies), parts, bodies, strict=True))


@pytest.mark.parametrize("text", [
    "  PID COMMAND\n    1 sleep 100000\n    2 sleep 100000\n",
    "a\nserver --api-key sk-abcdefghijklmnopqrstuvwx\nb",  # a keyword: the slow way
    "password:\n  hunter2-is-long\n",  # a name on one line, its value on the next
    f"x\n{_B64}\n{_B64}\n{_B64}\ny",  # key material with no marker at all
    "a\rb\nc --token\u2028secretvalue123\n",  # breaks other than \n
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n",
    "plain\nlines\nonly\n" * 2000,  # longer than the cache's texts
])
def test_a_whole_text_gives_what_line_by_line_gives(text: str) -> None:
    r = Redactor()
    assert r(text) == _line_by_line(Redactor(), text)


def test_a_text_with_no_keyword_comes_back_as_it_was_and_a_configured_pattern_still_applies() -> None:
    text = "\n".join(f"{i:7d} {i + 1:7d} S  0.0 sleep {i}" for i in range(3000))
    assert Redactor()(text) == text
    assert Redactor(patterns=[r"sleep 12\d\d\b"])(text).count(MASK) == 100


def test_a_known_value_is_masked_in_a_whole_text() -> None:
    r = Redactor()
    text = "a\nb value-of-the-secret-9f8e7d c\n" * 3
    assert r(text) == text
    r.add_values(["value-of-the-secret-9f8e7d"])
    assert "value-of-the-secret" not in r(text) and r(text).count(MASK) == 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab-_=:/ \t\rsk\u2028hftoknpw" + "QUJD", max_size=80), min_size=2, max_size=6))
def test_any_text_gives_what_line_by_line_gives(lines: list[str]) -> None:
    text = "\n".join(lines)
    assert Redactor()(text) == _line_by_line(Redactor(), text)


@pytest.mark.parametrize("lines", [
    ["  PID a<b & c>d", "```", "x``", "`y"],
    ["one", "two\nthree", "four"],  # a line with a break of its own
    ["é & ü", "", "x" * (MAX_SECTION_TEXT + 10)],
    [],
])
def test_code_chunks_of_a_table_equal_the_lines_escaped_one_by_one(lines: list[str]) -> None:
    assert code_chunks(lines, 100) == chunk_lines([code_escape(x) for x in lines], 100)


def test_code_chunks_take_what_is_not_text_as_before() -> None:
    assert code_chunks(["a", None, 3], 100) == chunk_lines([code_escape(x) for x in ["a", None, 3]], 100)  # type: ignore[list-item]


def _row(pid: int, ppid: int | None, args: str = "sleep 1", **kw: object) -> ProcessInfo:
    info = ProcessInfo(pid=pid, ppid=ppid, pgid=pid, sid=pid, stat="S", pcpu=0.5, rss_kib=2048, elapsed_s=75,
                       cpu_time_s=3, wchan=None, args=args)
    for k, v in kw.items():
        setattr(info, k, v)
    return info


def test_the_table_formatted_at_once_equals_one_line_per_row() -> None:
    rows = [_row(10, 1, "python3 /srv/x/server.py --port 8000"), _row(11, 10), _row(12, 11, pcpu=None),
            _row(13, 1, rss_kib=None, stat=""), _row(14, 99, "a %s %d %% b")]
    table = process_table(rows)
    assert table[0] == TABLE_HEADER and len(table) == len(rows) + 1
    assert table[1].split()[:2] == ["10", "1"] and table[1].endswith("python3 server.py --port 8000")
    assert table[2].endswith("  sleep 1") and table[3].endswith("    sleep 1")  # indented under their parents
    assert table[-1].endswith("a %s %d %% b")  # a command's own % signs are text
    row = table[4]  # pid 13: no rss, no state
    assert row == TABLE_FORMAT % (13, 1, "?", "0.5", "3s", "-", "1m15s", "sleep 1")


def test_a_command_with_a_line_break_still_gives_one_line_per_row() -> None:
    table = process_table([_row(5, 1, "sh -c 'a\nb'"), _row(6, 1)])
    assert len(table) == 3 and table[2].startswith(TABLE_FORMAT % (6, 1, "S", "0.5", "3s", "2", "1m15s", "")[:20])


def _tree_the_long_way(rows: list[ProcessInfo]) -> list[tuple[int, int]]:
    """The tree's definition, written plainly: roots in input order, children in input order, cycles last."""
    present = {p.pid for p in rows}
    out: list[tuple[int, int]] = []
    seen: set[int] = set()
    expanded: set[int] = set()

    def walk(pos: int, depth: int) -> None:
        if pos in seen:
            return
        seen.add(pos)
        out.append((depth, rows[pos].pid))
        if rows[pos].pid in expanded:
            return
        expanded.add(rows[pos].pid)
        for c, q in enumerate(rows):
            if q.ppid == rows[pos].pid and q.ppid != q.pid:
                walk(c, depth + 1)

    for pos, p in enumerate(rows):
        if p.ppid is None or p.ppid == p.pid or p.ppid not in present:
            walk(pos, 0)
    for pos in range(len(rows)):
        walk(pos, 0)
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.one_of(st.none(), st.integers(1, 12))), max_size=14))
def test_the_tree_is_its_definition(pairs: list[tuple[int, int | None]]) -> None:
    rows = [_row(pid, ppid) for pid, ppid in pairs]
    assert [(d, p.pid) for d, p in process_tree(rows)] == _tree_the_long_way(rows)


def test_a_table_of_unrelated_rows_is_all_roots_in_input_order() -> None:
    rows = [_row(pid, 1) for pid in (30, 20, 10)]
    assert [(d, p.pid) for d, p in process_tree(rows)] == [(0, 30), (0, 20), (0, 10)]


def test_fit_blocks_copies_only_what_it_cuts() -> None:
    short = {"type": "section", "text": {"type": "mrkdwn", "text": "ok"}}
    long = {"type": "section", "text": {"type": "mrkdwn", "text": "x" * (MAX_SECTION_TEXT + 5)}}
    out = fit_blocks([short, long])
    assert out[0] == short and len(out[1]["text"]["text"]) <= MAX_SECTION_TEXT
    assert len(long["text"]["text"]) == MAX_SECTION_TEXT + 5  # the input is left as it was
    header = {"type": "header", "text": {"type": "plain_text", "text": "h" * 200}}
    fields = {"type": "section", "fields": [{"type": "mrkdwn", "text": "f" * 2500}]}
    context = {"type": "context", "elements": [{"type": "mrkdwn", "text": "c" * 4000}]}
    cut = fit_blocks([header, fields, context])
    assert len(cut[0]["text"]["text"]) <= 150 and len(cut[1]["fields"][0]["text"]) <= 2000
    assert len(cut[2]["elements"][0]["text"]) <= MAX_SECTION_TEXT


def test_the_shown_command_memo_learns_new_values() -> None:
    r = Redactor()
    line = "server --model m --note tok-0123456789abcdef"
    assert shown_command(r)(line) == line
    r.add_values(["tok-0123456789abcdef"])
    assert shown_command(r)(line) == f"server --model m --note {MASK}"


def test_the_shown_command_memo_keeps_long_lines_out() -> None:
    r = Redactor()
    shown = shown_command(r)
    shown("x" * 5000)
    shown("short one")
    assert r.memo("shown_command") == {"short one": "short one"}


def test_a_shown_command_closure_masks_values_learnt_after_it_was_made() -> None:
    # the closure of one probe reads rows lazily: a value learnt between two reads of the same command line
    r = Redactor()
    shown = shown_command(r)
    line = "serve --note tok-0123456789abcdef"
    assert shown(line) == line
    r.add_values(["tok-0123456789abcdef"])
    assert shown(line) == f"serve --note {MASK}"


def test_short_command_of_nothing_is_a_question_mark() -> None:
    from bot.present.views import short_command

    assert short_command("") == "?" and short_command(None) == "?"  # type: ignore[arg-type]
