"""Tests for bot.core.parse.log: control stripping, tail cleaning, the log-stat line, and fuzz."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.parse.log import clean_log_lines, parse_log_stat, strip_control
from tests.support.strategies import UNIT_LOG_TEXT as fuzz_text

H200 = Path(__file__).parent.parent / "fixtures" / "h200"
_FORBIDDEN = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("plain text", "plain text"),
        ("\x1b[31mERROR\x1b[0m done", "ERROR done"),
        ("\x1b[1;32;40mINFO\x1b[m", "INFO"),
        ("\x1b[2K\x1b[1Gprogress", "progress"),
        ("\x1b[?25lhidden cursor\x1b[?25h", "hidden cursor"),
        ("\x1b]0;window title\x07after", "after"),
        ("\x1b]8;;https://example.com\x1b\\link\x1b]8;;\x1b\\", "link"),
        ("a\tb", "a\tb"),
        ("a\x00b\x07c\x08d\x7fe", "abcde"),
        ("line1\nline2\r", "line1line2"),
        ("\x1b(Bcharset", "charset"),
        ("\x1b7saved\x1b8", "saved"),
        ("ünïcödé \ufffd ✓", "ünïcödé \ufffd ✓"),
        ("\u202eevil\u202c", "evil"),
        ("\x9b31mC1 CSI", "C1 CSI"),
        ("", ""),
    ],
)
def test_strip_control(raw: str, expected: str) -> None:
    assert strip_control(raw) == expected


def test_clean_real_server_log_tail() -> None:
    raw = (H200 / "hung.server.log").read_bytes()
    lines = clean_log_lines(raw, max_lines=5)
    expected = raw.decode("utf-8", errors="replace").rstrip("\n").split("\n")[-5:]
    assert lines == [line.rstrip() for line in expected]


def test_clean_handles_progress_bars_crlf_and_ansi() -> None:
    raw = (
        b"start\r\n"
        b"Loading: 10%|#  |\rLoading: 50%|## |\rLoading: 100%|###|\n"
        b"\x1b[32mINFO\x1b[0m Load weight end\n"
        b"trailing cr\r\r\n"
    )
    assert clean_log_lines(raw) == ["start", "Loading: 100%|###|", "INFO Load weight end", "trailing cr"]


def test_clean_decodes_invalid_utf8_with_replacement() -> None:
    raw = "hé".encode()[:-1] + b"\n" + b"\xff\xfeok\n" + "日本".encode()[:4]  # cut inside characters
    assert clean_log_lines(raw) == ["h\ufffd", "\ufffd\ufffdok", "日\ufffd"]


def test_clean_width_and_line_limits() -> None:
    raw = "\n".join(f"line {i} " + "x" * 1000 for i in range(100)) + "\n"
    lines = clean_log_lines(raw, max_lines=3, max_width=50)
    assert len(lines) == 3
    assert lines[0].startswith("line 97 ")
    assert all(len(line) == 50 and line.endswith("…") for line in lines)
    assert clean_log_lines("short", max_width=5) == ["short"]
    assert clean_log_lines("toolong", max_width=5) == ["tool…"]
    assert clean_log_lines("abc", max_width=0) == ["…"]
    assert clean_log_lines("a\nb", max_lines=0) == []
    assert clean_log_lines(b"") == []
    assert clean_log_lines("\n") == [""]


def test_clean_keeps_blank_lines_inside() -> None:
    assert clean_log_lines("a\n\nb\n") == ["a", "", "b"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5652 1764402000 41", (5652, 1764402000.0, 41)),
        ("5652 1764402000.123456789 41\n", (5652, 1764402000.123456789, 41)),
        ("  0 0 0  ", (0, 0.0, 0)),
        ("5652 1764402000\n41\n", (5652, 1764402000.0, 41)),
        ("5652 x 41", (5652, None, 41)),
        ("-1 1764402000 41", (None, 1764402000.0, 41)),
        ("5652 nan 41", (5652, None, 41)),
        ("5652 inf 4.5", (5652, None, None)),
        ("5652 1764402000 41 /var/log/server.log", (None, None, None)),
        ("stat: cannot statx '/x': No such file or directory", (None, None, None)),
        ("", (None, None, None)),
        ("１２ 3 4", (None, 3.0, 4)),
    ],
)
def test_parse_log_stat(text: str, expected: tuple[int | None, float | None, int | None]) -> None:
    assert parse_log_stat(text) == expected


FUZZ = settings(max_examples=300, deadline=None, database=None)


@FUZZ
@given(fuzz_text)
def test_fuzz_strip_control(text: str) -> None:
    out = strip_control(text)
    assert not _FORBIDDEN.search(out)
    assert "\x1b" not in out
    assert strip_control(out) == out


@FUZZ
@given(
    st.one_of(fuzz_text, st.binary(max_size=2000)),
    st.integers(-2, 30),
    st.integers(-2, 500),
)
def test_fuzz_clean_log_lines(raw: str | bytes, max_lines: int, max_width: int) -> None:
    lines = clean_log_lines(raw, max_lines=max_lines, max_width=max_width)
    assert len(lines) <= max(0, max_lines)
    for line in lines:
        assert len(line) <= max(1, max_width)
        assert not _FORBIDDEN.search(line)


@FUZZ
@given(st.one_of(st.text(max_size=100), st.from_regex(r"\A\d{1,12} \d{1,10}(\.\d{1,9})? \d{1,8}\Z")))
def test_fuzz_parse_log_stat(text: str) -> None:
    size, mtime, lines = parse_log_stat(text)
    assert size is None or size >= 0
    assert lines is None or lines >= 0
    assert mtime is None or mtime >= 0


def _mask_sk(lines: list[str]) -> list[str]:
    """A stand-in redactor (bot.core.redact.redact_lines in production): masks `sk-` words."""
    return [re.sub(r"sk-\S*", "[REDACTED]", line) for line in lines]


def test_clean_redactor_runs_on_full_width_lines_before_the_cut() -> None:
    raw = "x" * 385 + " sk-ABCDEFGHIJKLMNOPQRSTUVWXYZ\n"
    assert clean_log_lines(raw, max_width=400) == ["x" * 385 + " sk-ABCDEFGHIJ…"]  # cut first: a prefix leaks
    assert clean_log_lines(raw, max_width=400, redactor=_mask_sk) == ["x" * 385 + " [REDACTED]"]
    assert clean_log_lines(raw, max_width=390, redactor=_mask_sk) == ["x" * 385 + " [RE…"]


def test_clean_redactor_sees_cleaned_lines_and_context_above_the_window() -> None:
    seen: list[list[str]] = []

    def spy(lines: list[str]) -> list[str]:
        seen.append(list(lines))
        return [line.upper() for line in lines]

    raw = b"one\n\x1b[31mtwo\x1b[0m  \nbar 10%\rbar 100%\nfour\n"
    assert clean_log_lines(raw, max_lines=2, redactor=spy) == ["BAR 100%", "FOUR"]
    assert seen == [["one", "two", "bar 100%", "four"]]


def test_clean_redactor_with_wrong_length_masks_everything() -> None:
    assert clean_log_lines("a\nb\n", redactor=lambda lines: lines[:1]) == ["[REDACTED]", "[REDACTED]"]
    assert clean_log_lines("a\nb\n", max_lines=0, redactor=_mask_sk) == []
    assert clean_log_lines("", redactor=_mask_sk) == []


@FUZZ
@given(st.one_of(fuzz_text, st.binary(max_size=2000), st.lists(st.sampled_from(["sk-", "x" * 50, "\n", " ", "ab"]),
                                                               max_size=30).map("".join)),
       st.integers(-2, 30), st.integers(-2, 500))
def test_fuzz_clean_log_lines_with_redactor(raw: str | bytes, max_lines: int, max_width: int) -> None:
    plain = clean_log_lines(raw, max_lines=max_lines, max_width=max_width)
    assert clean_log_lines(raw, max_lines=max_lines, max_width=max_width, redactor=lambda ls: ls) == plain
    lines = clean_log_lines(raw, max_lines=max_lines, max_width=max_width, redactor=_mask_sk)
    assert len(lines) == len(plain) <= max(0, max_lines)
    for line in lines:
        assert len(line) <= max(1, max_width)
        assert not _FORBIDDEN.search(line)
        assert "sk-" not in line
