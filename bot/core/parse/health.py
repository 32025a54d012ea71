"""Pure parser for the probe's HTTP health check done with curl.

No I/O here. The probe runs, on the remote host,
`curl -sS -o /dev/null -m T -w '%{http_code} %{time_total}' URL 2>&1`
and hands over the exit status and the combined output. With `-sS`, curl prints nothing but the
`-w` text on success (`200 0.012345`); on failure its one-line error message on stderr
(`curl: (7) Failed to connect to 127.0.0.1 port 8000 after 0 ms: Couldn't connect to server`) comes
first, then the `-w` text with code `000`. Exit codes are from curl(1) "EXIT CODES" (curl 7.x/8.x).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from types import MappingProxyType

from bot.core.models import HealthResult
from bot.core.parse.log import strip_control

__all__ = ["parse_curl"]

# `%{http_code} %{time_total}` at the end of the output (time may use a locale decimal comma in old curl).
_WRITEOUT_RE = re.compile(r"(?:^|(?<=\s))(\d{3}) (\d{1,9}(?:[.,]\d{1,9})?)\s*$")
# Fallback when the `-w` text came first and curl's message after it (stream interleaving).
_WRITEOUT_HEAD_RE = re.compile(r"^\s*(\d{3}) (\d{1,9}(?:[.,]\d{1,9})?)(?!\d)")
_DETAIL_MAX = 300

_RC_STATUS: Mapping[int, str] = MappingProxyType({
    7: "refused",
    28: "timeout",
    52: "empty",
    124: "timeout",
    137: "timeout",
    127: "unavailable",
})


def _split_output(output: str) -> tuple[int | None, float | None, str | None]:
    """Return (http_code or None for 000, time_total seconds, curl's message) from curl output."""
    text = output if isinstance(output, str) else ""
    if len(text) > 20000:
        text = text[:10000] + "\n" + text[-10000:]
    code: int | None = None
    elapsed: float | None = None
    m = _WRITEOUT_RE.search(text) or _WRITEOUT_HEAD_RE.match(text)
    if m:
        code = int(m.group(1))
        if code < 100:  # `000`: no response; curl prints real HTTP codes as 1xx-5xx
            code = None
        try:
            elapsed = float(m.group(2).replace(",", "."))
        except ValueError:  # pragma: no cover - regex admits only numbers
            elapsed = None
        if elapsed is not None and not math.isfinite(elapsed):
            elapsed = None
        text = text[: m.start()] + text[m.end() :]
    message = None
    for raw in text.splitlines():
        line = strip_control(raw).strip()
        if line:
            message = line[:_DETAIL_MAX]
            break
    return code, elapsed, message


def parse_curl(rc: int | None, output: str, url: str) -> HealthResult:
    """Map a curl health probe's exit status and output to a HealthResult.

    `output` is the combined stdout/stderr of
    `curl -sS -o /dev/null -m T -w '%{http_code} %{time_total}' URL 2>&1`: `200 0.0123` on success, or
    curl's error line followed by `000 0.0004`. Returns `http_code` (None for `000` or when absent),
    `elapsed_s` (curl's `time_total`, seconds; None when absent) and `status`:

    - rc 0 and a 2xx code -> "ok"; rc 0 and another code -> "http_NNN" (e.g. "http_503");
      rc 0 without a code -> "error"
    - rc 7 -> "refused"; rc 28 -> "timeout"; rc 52 -> "empty" (connected, no reply)
    - rc 124/137 (killed by `timeout`) -> "timeout"
    - rc 127 -> "unavailable", detail "curl not installed on the host"
    - anything else (6 cannot resolve, 56 reset, None = no exit status, ...) -> "error"

    `detail` is curl's own message line (control characters removed, at most 300 characters) when it
    printed one, else a short explanation; None for "ok" and "http_NNN". Never raises.
    """
    code, elapsed, message = _split_output(output)
    if rc == 0:
        if code is not None and 200 <= code <= 299:
            return HealthResult(url=url, status="ok", http_code=code, elapsed_s=elapsed)
        if code is not None:
            return HealthResult(url=url, status=f"http_{code}", http_code=code, elapsed_s=elapsed)
        detail = message or "curl printed no HTTP status"
        return HealthResult(url=url, status="error", http_code=None, elapsed_s=elapsed, detail=detail)
    if rc == 127:
        return HealthResult(url=url, status="unavailable", detail="curl not installed on the host")
    if rc in (124, 137):
        detail = message or f"curl killed by timeout (exit {rc})"
        return HealthResult(url=url, status="timeout", http_code=code, elapsed_s=elapsed, detail=detail)
    if rc is None:
        status, fallback = "error", "curl gave no exit status"
    else:
        status, fallback = _RC_STATUS.get(rc, "error"), f"curl failed (exit {rc})"
    return HealthResult(url=url, status=status, http_code=code, elapsed_s=elapsed, detail=message or fallback)
