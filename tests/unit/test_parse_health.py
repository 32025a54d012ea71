"""Tests for bot.core.parse.health.parse_curl (curl 7.x/8.x `-sS -w '%{http_code} %{time_total}'` output)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.models import HealthResult
from bot.core.parse.health import parse_curl

URL = "http://127.0.0.1:8000/health"


def test_ok() -> None:
    assert parse_curl(0, "200 0.012345", URL) == HealthResult(
        url=URL, status="ok", http_code=200, elapsed_s=0.012345
    )
    assert parse_curl(0, "204 0.001\n", URL).status == "ok"


@pytest.mark.parametrize(
    ("code", "status"), [(503, "http_503"), (404, "http_404"), (301, "http_301"), (500, "http_500")]
)
def test_other_http_codes(code: int, status: str) -> None:
    res = parse_curl(0, f"{code} 1.5", URL)
    assert (res.status, res.http_code, res.elapsed_s, res.detail) == (status, code, 1.5, None)


def test_refused() -> None:
    message = "curl: (7) Failed to connect to 127.0.0.1 port 8000 after 0 ms: Couldn't connect to server"
    out = message + "\n000 0.000412"
    res = parse_curl(7, out, URL)
    assert res.status == "refused"
    assert res.http_code is None
    assert res.elapsed_s == 0.000412
    assert (
        res.detail
        == "curl: (7) Failed to connect to 127.0.0.1 port 8000 after 0 ms: Couldn't connect to server"
    )


def test_timeout() -> None:
    out = "curl: (28) Operation timed out after 5001 milliseconds with 0 bytes received\n000 5.001234"
    res = parse_curl(28, out, URL)
    assert (res.status, res.http_code, res.elapsed_s) == ("timeout", None, 5.001234)
    assert res.detail is not None and res.detail.startswith("curl: (28) Operation timed out")


def test_empty_reply() -> None:
    res = parse_curl(52, "curl: (52) Empty reply from server\n000 0.002", URL)
    assert (res.status, res.detail) == ("empty", "curl: (52) Empty reply from server")


def test_curl_missing() -> None:
    res = parse_curl(127, "bash: line 1: curl: command not found\n", URL)
    assert res == HealthResult(url=URL, status="unavailable", detail="curl not installed on the host")


@pytest.mark.parametrize("rc", [124, 137])
def test_killed_by_outer_timeout(rc: int) -> None:
    res = parse_curl(rc, "", URL)
    assert res.status == "timeout" and res.http_code is None and res.detail is not None


def test_other_errors_keep_curls_message() -> None:
    res = parse_curl(
        6, "curl: (6) Could not resolve host: gpu-host-9\n000 0.000100", "http://gpu-host-9/health"
    )
    assert (res.status, res.detail, res.http_code) == (
        "error",
        "curl: (6) Could not resolve host: gpu-host-9",
        None,
    )
    res = parse_curl(56, "curl: (56) Recv failure: Connection reset by peer\n000 0.01", URL)
    assert res.status == "error" and "Connection reset" in (res.detail or "")
    assert parse_curl(3, "", URL).detail == "curl failed (exit 3)"
    assert parse_curl(None, "", URL).status == "error"


def test_odd_outputs() -> None:
    assert parse_curl(0, "", URL).status == "error"  # no code printed
    assert parse_curl(0, "000 0.1", URL).status == "error"
    res = parse_curl(0, "200 0,012", URL)  # old curl with a decimal-comma locale
    assert (res.status, res.elapsed_s) == ("ok", 0.012)
    res = parse_curl(7, "000 0.000412curl: (7) Failed to connect\n", URL)  # streams interleaved
    assert (res.status, res.elapsed_s, res.detail) == ("refused", 0.000412, "curl: (7) Failed to connect")
    res = parse_curl(7, "\x1b[31mcurl: (7) x" + "y" * 1000 + "\n000 0.1", URL)
    assert res.detail is not None and len(res.detail) == 300 and "\x1b" not in res.detail


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.one_of(st.none(), st.integers(-5, 300)),
    st.one_of(
        st.text(max_size=300),
        st.binary(max_size=300).map(lambda b: b.decode("utf-8", errors="replace")),
        st.from_regex(r"\A(curl: \([0-9]{1,2}\) [a-z ]{0,40}\n)?[0-9]{3} [0-9]{1,4}[.,][0-9]{1,6}\n?\Z"),
    ),
)
def test_fuzz_never_raises(rc: int | None, output: str) -> None:
    res = parse_curl(rc, output, URL)
    assert res.url == URL
    assert res.status in {
        "ok",
        "refused",
        "timeout",
        "empty",
        "unavailable",
        "error",
    } or res.status.startswith("http_")
    assert res.http_code is None or 100 <= res.http_code <= 999
