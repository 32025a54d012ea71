"""Hypothesis strategies for fuzzing every parser with hostile input, shared by tests/fuzz/.

The unit tests' own small per-parser strategies (`UNIT_*_TEXT`, and the captures they draw lines from) are
defined here too, at the end, and imported by tests/unit/test_parse_*.py: no test module imports another, so
what two of them share lives in a helper module. tests/fuzz/ reuses them as one branch each. What this module
adds on top is the input the acceptance of issue 5 names:

- arbitrary text, non-UTF-8 bytes (decoded as the probe decodes them, and raw where a parser takes bytes),
  ANSI/terminal escapes (well-formed, unterminated and 8-bit ones);
- 1 MB lines, generated sparingly: about one example in `HUGE_ONE_IN` carries one, built by repeating a
  short line, so 10 000 examples per parser stay affordable;
- real captures cut at random points (the H200 nvidia-smi/ps captures and the case bundles), with noise
  spliced in;
- unusual `ps` fields (huge or non-ASCII digits, NaN, `-`, impossible durations, `<defunct>`, kernel
  threads, tabs, empty commands) and nvidia-smi CSV cells (units, `[N/A]`, quotes, surplus commas).
"""

from __future__ import annotations

import functools
from pathlib import Path

import yaml
from hypothesis import strategies as st

from bot.core.grammar import MAX_COMMAND_CHARS
from tests.support.paths import CASES, H200, case_file, read

#: One example in this many (roughly) gets a 1 MB line.
HUGE_ONE_IN = 50
#: Length of a "1 MB line".
HUGE_LEN = 1_000_000

ANSI = [
    "\x1b[31m", "\x1b[0m", "\x1b[1;32m", "\x1b[38;5;196m", "\x1b[38;2;255;0;0m", "\x1b[2K", "\x1b[1A", "\x1b[?25l",
    "\x1b]0;window title\x07", "\x1b]8;;http://example.com\x1b\\link\x1b]8;;\x1b\\", "\x1b(B", "\x1b=", "\x1bM",
    "\x1b7", "\x1bc", "\x9b31m", "\x9d2;t\x9c",
    # broken ones: unterminated CSI/OSC, a lone ESC, ESC at the very end
    "\x1b[", "\x1b[31", "\x1b]0;never terminated", "\x1b", "\x1b[999999999999999999999m", "\x1b[;;;;;;;;;;;m",
]
CONTROL = ["\r", "\r\n", "\n\r", "\t", "\x00", "\x07", "\x08", "\x0b", "\x0c", "\x7f", "\x85", "\u2028", "\u2029",
           "\u202e", "\u2066", "\ufeff", "\ufffd", "\u200b"]
ODD_UNICODE = ["é", "ß", "日本語", "١٢٣", "²", "٣", "Ⅻ", "𝟗", "🔥", "\U0010ffff", "ﬁ", "İ", "ǅ"]

_NOISE_BITS = st.sampled_from([*ANSI, *CONTROL, *ODD_UNICODE, " ", "  ", ",", ":", "|", "-", "=", "'", '"', "\\"])


def _decode(data: bytes) -> str:
    """How the probe turns remote bytes into text (bot/core/probe.py `_text`)."""
    return data.decode("utf-8", errors="replace")


#: Bytes that are not UTF-8: lone continuation bytes, overlong forms, cut multi-byte characters, Latin-1.
NON_UTF8_BYTES = st.one_of(
    st.binary(max_size=300),
    st.lists(st.sampled_from([b"\xff", b"\xfe", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x94", b"\xc0\xaf", b"\xed\xa0\x80",
                              b"\x80", b"caf\xe9", b"ok", b" ", b"\n", b"\r", b"\x1b[31m", b"\x00"]),
             max_size=40).map(b"".join),
)


#: Arbitrary text: anything Unicode (no lone surrogates: everything a parser gets from the probe was decoded
#: from bytes), decoded non-UTF-8 bytes, and escape/control soup.
ARBITRARY_TEXT = st.one_of(
    st.text(max_size=300),
    NON_UTF8_BYTES.map(_decode),
    st.lists(st.one_of(_NOISE_BITS, st.text(max_size=12)), max_size=40).map("".join),
)

#: Text as it can arrive in Slack JSON: also lone surrogates (`"\\ud800"` decodes to one).
SLACK_TEXT = st.one_of(
    ARBITRARY_TEXT,
    st.lists(st.one_of(st.text(max_size=10), st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3)),
             max_size=8).map("".join),
)


def _huge(line: str) -> str:
    line = line or "x"
    return (line * (HUGE_LEN // len(line) + 1))[:HUGE_LEN]


def with_huge_line(text: st.SearchStrategy[str],
                   pieces: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[str]:
    """`text`, and about one time in HUGE_ONE_IN the same text with a 1 MB line (a short piece repeated) put
    before, inside or after it."""
    pieces = pieces if pieces is not None else ARBITRARY_TEXT

    def build(args: tuple[int, str, str, int]) -> str:
        pick, base, piece, where = args
        if pick != HUGE_ONE_IN // 2:  # a middle value: hypothesis favours the ends of integer ranges
            return base
        big = _huge(piece.replace("\n", " "))
        cut = where % (len(base) + 1)
        return base[:cut] + "\n" + big + "\n" + base[cut:]

    return st.tuples(st.integers(0, HUGE_ONE_IN - 1), text, pieces, st.integers(0, 10**6)).map(build)


def with_huge_bytes(data: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Bytes, sometimes with a 1 MB line of non-UTF-8 bytes or text inside."""
    return with_huge_line(data.map(lambda b: b.decode("latin-1")), NON_UTF8_BYTES.map(lambda b: b.decode("latin-1"))
                          ).map(lambda s: s.encode("latin-1"))


@functools.cache
def _read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8", errors="replace")


def capture_texts(*patterns: str) -> list[str]:
    """The text of every fixture file matching the glob `patterns` (under tests/fixtures/h200 and
    tests/fixtures/cases/*/)."""
    out: list[str] = []
    for pattern in patterns:
        for base in (H200, CASES):
            for p in sorted(base.glob(pattern)) + sorted(base.glob(f"*/{pattern}")):
                out.append(_read(str(p)))
    assert out, f"no fixture matches {patterns}"
    return out


def damaged(texts: list[str], noise: st.SearchStrategy[str] = ARBITRARY_TEXT) -> st.SearchStrategy[str]:
    """A real capture cut at a random point (and sometimes at its start too), sometimes with noise spliced
    in at a random place, sometimes one of its lines repeated: what a probe killed mid-write, a full pipe
    or a flaky tool gives."""

    def build(args: tuple[int, int, int, int, int, str, int]) -> str:
        which, end, start, mode, at, junk, rep = args
        text = texts[which % len(texts)]
        end = end % (len(text) + 1)
        start = start % (end + 1) if mode & 1 else 0
        out = text[start:end]
        if mode & 2:
            pos = at % (len(out) + 1)
            out = out[:pos] + junk + out[pos:]
        if mode & 4:
            lines = out.splitlines(keepends=True)
            if lines:
                line = lines[rep % len(lines)]
                lines.insert(rep % len(lines), line * (1 + rep % 5))
                out = "".join(lines)
        return out

    n = st.integers(0, 10**9)
    return st.tuples(n, n, n, st.integers(0, 7), n, noise, n).map(build)


def lines(line: st.SearchStrategy[str], *, max_lines: int = 30) -> st.SearchStrategy[str]:
    """Lines joined with `\\n` (sometimes `\\r\\n`), with or without a final newline."""
    return st.tuples(st.lists(line, max_size=max_lines), st.sampled_from(["\n", "\r\n"]), st.booleans()).map(
        lambda t: t[1].join(t[0]) + (t[1] if t[2] else ""))


# --- ps -------------------------------------------------------------------------------------------------

PS_HEADERS = [
    "    PID    PPID    PGID     SID STAT %CPU   RSS ELAPSED     TIME WCHAN                            COMMAND",
    "USER         PID %CPU %MEM    VSZ   RSS TTY      STAT START   TIME COMMAND",
    "    PID    PPID    PGID     SID STAT %CPU %MEM    VSZ   RSS ELAPSED     TIME WCHAN  COMMAND",
    "PID COMMAND", "PID", "COMMAND PID", "PID PID PID", "PID PPID", "  PID TTY          TIME CMD",
]
_PS_HEADER_WORDS = ["PID", "PPID", "PGID", "PGRP", "SID", "SESS", "STAT", "S", "%CPU", "RSS", "RSZ", "ELAPSED", "TIME",
                    "WCHAN", "COMMAND", "CMD", "ARGS", "USER", "%MEM", "VSZ", "TTY", "START", "NI", "LSTART"]
#: Integer-looking cells: normal, over int64, over what a float holds (309 digits), over what int() converts
#: (4300 digits), signed, non-ASCII digits (`int("١٢٣")` works, `int("²")` does not), and non-numbers.
INTS = ["0", "1", "42", "569", "4194304", "4194305", "999999999999999999", "9" * 19, "9" * 20, "9" * 21, "1" * 40,
        "9" * 309, "1" * 4301, "1" * 5000, "-1", "+1", "0x1f", "1e3", "1_000", "١٢٣", "²", "٣", "𝟗", "", "-", "?",
        "N/A", "nan"]
_FLOATS = ["0.0", "99.9", "3200.0", "nan", "NaN", "inf", "-inf", "1e400", "-0.0", "1,5", "1.2.3", ".", "5%",
           "9" * 400, "0x10"]
DURATIONS = ["00:00:04", "05:07", "1-02:03:04", "99-23:59:59", "999999-00:00:00", "12:60", "24:00:00",
             "1-24:00:00", "00:61:00", "1234567890123", "12345678901234567890", ":", "::", "1-", "-1:00",
             "18:36", "0", "1:2:3:4", "١:٠٠"]
_STATS = ["R", "S", "Sl", "Ssl+", "S<l", "D", "D+", "Z", "Z+", "T", "t", "I", "X", "W", "-", "?", "RN+", "SNl"]
_WCHANS = ["-", "0", "futex_wait_queue", "do_select", "ep_poll", "hrtimer_nanosleep", "nvidia_ioctl", "x" * 64]
_ARGS = [
    "/opt/venv/bin/python3 -m sglang.launch_server --model-path /data/models/kimi --tp-size 8 --port 8000",
    "python -m vllm.entrypoints.openai.api_server --api-key sk-abcdefghijklmnopqrstuvwx",
    "[kworker/0:1H-kblockd]", "[python3] <defunct>", "sglang::scheduler_TP0", "", " ", "sh -c 'exec  x  y'",
    "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz123456 python serve.py", "timeout -k 5 30 sh -s", "cmd\twith\ttabs",
    "日本語 プロセス", "\x1b[31mred\x1b[0m", "a" * 5000,
]


def _ps_row(cells: list[str], sep: str, indent: str) -> str:
    return indent + sep.join(cells)


#: One `ps` data row: PS_COLUMNS order (pid ppid pgid sid stat pcpu rss elapsed time wchan user args), every cell
#: drawn from normal and odd values, or a row with a random number of random cells.
PS_ROW = st.one_of(
    st.builds(
        lambda cells, sep, indent: _ps_row(cells, sep, indent),
        st.tuples(*(st.sampled_from(INTS) for _ in range(4)), st.sampled_from(_STATS), st.sampled_from(_FLOATS),
                  st.sampled_from(INTS), st.sampled_from(DURATIONS), st.sampled_from(DURATIONS),
                  st.sampled_from(_WCHANS), st.sampled_from(["root", "ubuntu", "1001", "-", "a" * 32]),
                  st.one_of(st.sampled_from(_ARGS), ARBITRARY_TEXT)).map(list),
        st.sampled_from([" ", "  ", "\t", " \t ", "      "]),
        st.sampled_from(["", " ", "    ", "\t"]),
    ),
    st.lists(st.one_of(st.sampled_from(INTS + _FLOATS + DURATIONS + _STATS + _WCHANS), st.text(max_size=8)),
             max_size=14).map(" ".join),
)
PS_HEADER = st.one_of(st.sampled_from(PS_HEADERS),
                      st.lists(st.sampled_from(_PS_HEADER_WORDS), min_size=1, max_size=12).map("  ".join))

#: Whole `ps` outputs: headers and rows in any order, cut captures, and noise.
_PS_BASE = st.one_of(
    lines(st.one_of(PS_HEADER, PS_ROW, PS_ROW, PS_ROW)),
    st.tuples(PS_HEADER, lines(PS_ROW)).map("\n".join),
    damaged(capture_texts("*ps.txt")),
    ARBITRARY_TEXT,
)
PS_TEXT = with_huge_line(_PS_BASE, st.one_of(PS_ROW, st.sampled_from(_ARGS)))
#: `-o` column lists (`parse_ps(columns=...)`).
PS_COLUMN_SPECS = st.one_of(
    st.none(),
    st.just("pid,ppid,pgid,sid,stat,pcpu,rss,etimes,time,wchan:32,args"),
    st.lists(st.sampled_from(["pid", "ppid", "pgid", "sid", "stat", "pcpu", "rss", "etimes", "etime", "time",
                              "wchan:32", "args", "comm", "pid=", "user", "lstart", "%cpu", ":", "=", ""]),
             max_size=12),
    st.lists(st.text(max_size=8), max_size=6),
)


# --- nvidia-smi -----------------------------------------------------------------------------------------

_CSV_CELLS = [
    "0", "7", "15", "255", "-1", "99999999999", "17235", "143771", "17235 MiB", "143771 MiB", "0 %", "100 %", "39",
    "122.56", "700.00", "693.07 W", "1980 MHz", "P0", "P8", "[N/A]", "N/A", "[Not Supported]", "[Unknown Error]",
    "[Insufficient Permissions]", "[GPU is lost]", "[Requires Reset]", "ERR!", "nan", "inf", "-inf", "1e400", "",
    "NVIDIA H200", "NVIDIA RTX 6000 Ada Generation", '"a, quoted, name"', '"unterminated', "GPU-3f1c2d4e-0000",
    "00000000:17:00.0", "/opt/venv/bin/python3", "[Not Found]", "python3 -m vllm", "١٢", "²", "index",
    "memory.used [MiB]", "pid", "used_gpu_memory [MiB]", "name", "uuid",
]
CSV_ROW = st.one_of(
    st.lists(st.sampled_from(_CSV_CELLS), max_size=16).map(", ".join),
    st.lists(st.one_of(st.sampled_from(_CSV_CELLS), ARBITRARY_TEXT), max_size=14).map(",".join),
)
#: `--query-gpu` / `--query-compute-apps` CSV outputs: cut real captures (with and without header), built rows,
#: noise, and nvidia-smi's error messages.
_NVIDIA_CSV_BASE = st.one_of(
    damaged(capture_texts("*.query-gpu.csv", "*.query-gpu.header.csv", "*.query-apps.csv", "nvidia-smi.csv",
                          "err.*.txt")),
    lines(CSV_ROW),
    ARBITRARY_TEXT,
)
NVIDIA_CSV_TEXT = with_huge_line(_NVIDIA_CSV_BASE, CSV_ROW)
#: Plain `nvidia-smi` tables: real captures cut at random points, with noise and repeated lines.
NVIDIA_TABLE_TEXT = with_huge_line(st.one_of(
    damaged(capture_texts("*.nvidia-smi.txt", "nvidia-smi.txt")),
    damaged(capture_texts("*.nvidia-smi.txt"), lines(st.sampled_from(["|", "+---+", "|===|", "| 0 N/A |",
                                                                      "|   0  NVIDIA H200   On  | 0000:17:00.0 Off |"]),
                                                     max_lines=5)),
    ARBITRARY_TEXT,
))
#: Query field lists the CSV parsers can be asked for.
QUERY_FIELDS = st.one_of(
    st.none(),
    st.lists(st.sampled_from(["index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu",
                              "temperature.gpu", "power.draw", "pid", "process_name", "used_memory", "gpu_uuid",
                              "clocks.sm", "bogus", "", "index [x]"]), max_size=14),
)
#: Exit statuses as the probe reports them (None: the END marker never came).
EXIT_CODES = st.one_of(st.none(), st.sampled_from([0, 0, 0, 1, 2, 6, 7, 9, 12, 15, 28, 52, 124, 127, 137, 255]),
                       st.integers(-(2**31), 2**31))


# --- /proc/net/tcp, log, curl ----------------------------------------------------------------------------

_TCP_ROWS = [
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
    "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 12345 1 0 100 0 0 10 0",
    "   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2222 1",
    "   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 0:0 00:0 0 0 0 9",
    "   2: 0100007F:FFFFF 00000000:0000 0A", "   3: GGGGGGGG:0016 00000000:0000 0A", "   4: 0100007F: 0 0A",
    "   5: 0100007F:0016 00000000:0000 01 0 0 0 0 0 99999999999999999999999",
    "0: 0100007F:0016 0 0a x x x x x ١٢٣", ":", "   6: :0016 0 0A",
]
_TCP_TOKENS = st.one_of(st.sampled_from(["0:", "0A", "0100007F:1F90", "FFFF", ":", "00000000:0000", "٠A", "0a",
                                          "00000000:00000000", "00:00000000"]), st.sampled_from(INTS))
#: A row shaped like a listening socket (`sl: local rem 0A ...`, mostly well-formed up to the state) whose
#: later fields (tx/rx queues, timers, uid, timeout, inode, ...) are any tokens.
_TCP_ROW = st.tuples(st.sampled_from(["0:", "  12:", "x:"]),
                     st.sampled_from(["0100007F:1F90", "00000000000000000000000001000000:1F90", "00000000:0016",
                                      "0100007F:", "GGGGGGGG:0016", "0100007F:FFFFF", "0100007F:٠٠١٦"]),
                     st.sampled_from(["00000000:0000", "00000000000000000000000000000000:0000", ""]),
                     st.sampled_from(["0A", "0A", "0a", "01", "٠A"]),
                     st.lists(_TCP_TOKENS, min_size=5, max_size=10)).map(lambda t: " ".join([*t[:4], *t[4]]))
_PROC_NET_BASE = st.one_of(
    lines(st.one_of(_TCP_ROW, st.sampled_from(_TCP_ROWS), st.lists(_TCP_TOKENS, max_size=12).map(" ".join))),
    damaged(_TCP_ROWS),
    ARBITRARY_TEXT,
)
PROC_NET_TEXT = with_huge_line(_PROC_NET_BASE)

_LOG_BASE = st.one_of(
    NON_UTF8_BYTES,
    damaged(capture_texts("server.log", "*.server.log")).map(lambda s: s.encode("utf-8", "surrogatepass")),
    lines(st.one_of(ARBITRARY_TEXT, st.sampled_from(ANSI), st.just("progress 10%\rprogress 100%"))).map(
        lambda s: s.encode("utf-8", "surrogatepass")),
)
LOG_BYTES = with_huge_bytes(_LOG_BASE)
LOG_STAT_TEXT = st.one_of(
    st.tuples(*(st.one_of(st.sampled_from(INTS + _FLOATS + ["1764402000.123456789", "9" * 5000]),
                          st.text(max_size=6)) for _ in range(3)),
              st.sampled_from([" ", "\n", "\t", "  "])).map(lambda t: t[3].join(t[:3])),
    ARBITRARY_TEXT,
    damaged(["5652 1764402000 41\n", "5652 1764402000.123456789 41\n", "no such file\n"]),
)
_CURL_BASE = st.one_of(
    damaged([*capture_texts("curl.txt"), "200 0.012345",
             "curl: (7) Failed to connect to 127.0.0.1 port 8000\n000 0.0004",
             "000 0.000412curl: (7) Failed to connect\n", "503 1,5", "200 9" * 200]),
    st.tuples(st.sampled_from(["", "curl: (28) Operation timed out\n", "curl: (56) Recv failure\n"]),
              st.sampled_from(["000", "200", "204", "503", "999", "099", "1000", "٢٠٠"]),
              st.sampled_from(["0.1", "0,012", "1e400", "99999999999", "nan", "", "0.1.2"])).map(
        lambda t: f"{t[0]}{t[1]} {t[2]}"),
    ARBITRARY_TEXT,
)
CURL_OUTPUT = with_huge_line(_CURL_BASE)


# --- probe output ----------------------------------------------------------------------------------------

NONCE = "0123456789abcdef"
SECTION_NAMES = ["clock", "hostname", "self", "ps", "gpu", "gpu_apps", "log_stat", "log_tail", "tags", "shm",
                 "tcp4", "tcp6", "health"]


def frame(name: str, body: bytes, rc: int | str | None, nonce: str = NONCE) -> bytes:
    """One section as the probe script prints it (rc None: the END marker is missing)."""
    out = b"\n@@" + nonce.encode() + b" BEGIN " + name.encode() + b"\n" + body
    if rc is not None:
        out += b"\n@@" + nonce.encode() + b" END " + name.encode() + b" rc=" + str(rc).encode() + b"\n"
    return out


def _body_for(name: str) -> st.SearchStrategy[str]:
    return {
        "clock": st.one_of(st.sampled_from(["1764402000.123456789", "1764402000", "nan", "inf", "-1", "1e400", "",
                                            "9" * 5000, "N"]), ARBITRARY_TEXT),
        "hostname": ARBITRARY_TEXT,
        "self": st.one_of(st.sampled_from(["1", "569", "0", "-1", "9" * 5000, "١٢٣", "x"]), ARBITRARY_TEXT),
        "ps": _PS_BASE,
        "gpu": _NVIDIA_CSV_BASE,
        "gpu_apps": _NVIDIA_CSV_BASE,
        "log_stat": LOG_STAT_TEXT,
        "log_tail": _LOG_BASE.map(lambda b: b.decode("latin-1")),
        "tags": lines(st.one_of(st.tuples(st.sampled_from(INTS), st.sampled_from(["12-abcdef", "x", "", "a" * 70,
                                                                                    "日本"])).map(
            lambda t: f"/proc/{t[0]}/environ:GPUBOT_LAUNCH={t[1]}"), ARBITRARY_TEXT)),
        "shm": st.one_of(
            st.tuples(st.lists(st.sampled_from([*INTS, "tmpfs", "0%", "/dev/shm"]), min_size=4, max_size=8),
                      st.booleans()).map(lambda t: ("Filesystem 1024-blocks Used Available Capacity Mounted on\n"
                                                    if t[1] else "") + " ".join(t[0])),
            ARBITRARY_TEXT),
        "tcp4": _PROC_NET_BASE,
        "tcp6": _PROC_NET_BASE,
        "health": _CURL_BASE,
    }[name]


def _encode(text: str) -> bytes:
    """A text body as the remote tool would have printed it (UTF-8). log_tail bodies are latin-1 "byte
    strings" (raw bytes, not always UTF-8) and are encoded back to those bytes by the caller instead."""
    return text.encode("utf-8", "surrogatepass")


#: Section bodies that try to look like markers: this nonce's and another's, cut ones, odd rc values.
MARKER_NOISE = st.lists(st.one_of(
    st.sampled_from([f"@@{NONCE} BEGIN ps", f"@@{NONCE} END ps rc=0", f"@@{NONCE} END gpu rc=", f"@@{NONCE} END",
                     f"\n@@{NONCE} BEGIN clock\n", f"@@{NONCE} END clock rc=-\n", f"@@{NONCE} BEGIN BAD NAME",
                     f"@@{NONCE} END log_tail rc=99999999999999999999999", "@@fedcba9876543210 BEGIN self\n",
                     f"@@{NONCE[:7]}", "@@", "@@@@", " BEGIN ", " END ", "rc=", "\n", "\r\n"]),
    ARBITRARY_TEXT), max_size=6).map("".join)


@st.composite
def probe_output(draw: st.DrawFn, *, rich: bool = True) -> bytes:
    """Raw probe script output: every section (or a random subset, in random order), each END marker
    sometimes missing or with an odd rc, noise between sections, the whole thing sometimes cut at a random
    byte. With `rich`, each body is hostile input for that section's own parser (slower to generate: for
    `assemble_snapshot`); otherwise bodies are noise and fake markers (for the splitter)."""
    names = draw(st.one_of(st.just(SECTION_NAMES), st.lists(st.sampled_from(SECTION_NAMES), max_size=16)))
    huge = draw(st.integers(0, HUGE_ONE_IN - 1)) == HUGE_ONE_IN // 2 and bool(names)
    huge_in = draw(st.integers(0, len(names) - 1)) if huge else -1  # one section gets a 1 MB line
    chunks = [draw(NON_UTF8_BYTES) if draw(st.booleans()) else b""]
    for i, name in enumerate(names):
        body = draw(_body_for(name) if rich else MARKER_NOISE)
        if i == huge_in:
            body = body + "\n" + _huge(draw(st.sampled_from(["x", "9", " ", "\x1b[31m", "é", "\ufffd", "a,"]))) + "\n"
        raw = body.encode("latin-1", "replace") if name == "log_tail" else _encode(body)
        rc = draw(st.one_of(st.just(0), st.just(0), st.none(), st.sampled_from([1, 2, 13, 124, 127, -1, "", "-",
                                                                                "9" * 5000]),
                            st.integers(-(2**40), 2**40)))
        chunks.append(frame(name, raw, rc))
        if draw(st.integers(0, 9)) == 5:
            chunks.append(draw(NON_UTF8_BYTES))
    out = b"".join(chunks)
    if draw(st.integers(0, 4)) == 2:
        out = out[: draw(st.integers(0, len(out)))]
    return out


# --- config ----------------------------------------------------------------------------------------------

_EXAMPLE_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "config.example.yaml"
_YAML_SCALARS = ["~", "null", "true", "false", "yes", "no", "on", "0", "-1", "22", "65536", "1e400", ".nan", ".inf",
                 "0x10", "0o17", "1_000", "'quoted'", '"dq\\u0000"', "[]", "{}", "*nope", "&a x", "!!python/none",
                 "!!binary aGk=", "|\n  block", ">-\n  folded", "${HF_TOKEN}", "/data/logs", "/", "..", "sk-abc",
                 "2001-12-14", "12:30:00", "<<: *a", "? complex key", "- item", "x" * 300]
_CONFIG_KEYS = ["hosts", "variants", "permissions", "watch", "lifecycle", "slack", "state_dir", "default_host",
                "database_url", "address", "port", "user", "known_hosts", "local", "log_dirs", "env", "command",
                "params", "host", "gpus", "extends", "viewers", "operators", "admins", "channels", "interval_s",
                "api_key", "token", "type", "default", "choices", "regex", "min", "max", "health", "log"]

_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=20),
              st.sampled_from(_YAML_SCALARS)),
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.one_of(st.sampled_from(_CONFIG_KEYS), st.text(max_size=8)), children,
                                               max_size=5)),
    max_leaves=25,
)


def _dump(data: object) -> str:
    try:
        return yaml.safe_dump(data, allow_unicode=True)
    except (yaml.YAMLError, ValueError):  # pragma: no cover - safe_dump handles every value _json makes
        return ""


#: Config files: the full example config cut and spliced, YAML built from random key/value trees (so
#: pydantic sees wrong types in every section), YAML soup, alias bombs, deep nesting, and non-UTF-8 bytes.
CONFIG_BYTES = st.one_of(
    damaged([_read(str(_EXAMPLE_CONFIG))],
            st.one_of(st.sampled_from(_YAML_SCALARS), st.sampled_from(_CONFIG_KEYS).map(lambda k: f"\n{k}: "),
                      ARBITRARY_TEXT)).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.dictionaries(st.sampled_from(_CONFIG_KEYS[:9]), _json, max_size=6).map(_dump).map(str.encode),
    lines(st.tuples(st.sampled_from(["", "  ", "    ", "- ", "  - "]), st.sampled_from(_CONFIG_KEYS),
                    st.sampled_from([": ", ":", " : ", ""]), st.sampled_from(_YAML_SCALARS)).map("".join)).map(
        str.encode),
    st.integers(1, 300).map(lambda n: ("a: " + "[" * n + "]" * n).encode()),
    st.integers(1, 12).map(lambda n: ("a: &a [x, x]\n" + "".join(f"{c}: &{c} [*{p}, *{p}, *{p}]\n" for p, c in
                                                                 list(zip("abcdefghijkl", "bcdefghijklm",
                                                                          strict=True))[:n])).encode()),
    NON_UTF8_BYTES,
    ARBITRARY_TEXT.map(lambda s: s.encode("utf-8", "surrogatepass")),
)


# --- the unit tests' own strategies ------------------------------------------------------------------------
# Smaller than the ones above, one per parser: each unit test module fuzzes its parser with its own, and
# tests/fuzz/test_fuzz_parsers.py uses each as one more branch.

#: Command texts (tests of bot.core.grammar): anything, quoting and Slack-escape soup, and lengths around
#: the MAX_COMMAND_CHARS limit.
_COMMAND_SPECIAL = [*"ab =\"'\\!<@>|&;ltgmp-/#$`\t\n", "\u201c", "\u201d", "\u2018", "\u2019", "\x00", "&lt;",
                    "&amp;", "<@UBOT123>", "probe", "gpu", "--yes", "pid="]
UNIT_COMMAND_TEXTS = st.one_of(
    st.text(max_size=120),
    st.lists(st.sampled_from(_COMMAND_SPECIAL), max_size=40).map("".join),
    st.integers(MAX_COMMAND_CHARS - 3, MAX_COMMAND_CHARS + 3).map(lambda n: ("ab c=d " * n)[:n]),
)

#: Log text (tests of bot.core.parse.log): anything, and escape/control soup with over-long runs.
UNIT_LOG_TEXT = st.one_of(
    st.text(max_size=600),
    st.lists(
        st.sampled_from(["\x1b[", "\x1b]", "\x07", "\x1b\\", "31m", "\r", "\n", "\t", "\x00", "é", "\ufffd",
                         "x" * 700, ";", "?"]),
        max_size=40,
    ).map("".join),
)

#: A plain `nvidia-smi` table in the old (driver 390) layout, with a "Not Supported" process row.
NVIDIA_SMI_OLD_LAYOUT = """\
+-----------------------------------------------------------------------------+
| NVIDIA-SMI 390.116                Driver Version: 390.116                   |
|-------------------------------+----------------------+----------------------+
| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |
|===============================+======================+======================|
|   0  GeForce GTX 108...  On   | 00000000:04:00.0 Off |                  N/A |
| 37%   64C    P2   131W / 150W |   2213MiB / 11178MiB |    100%      Default |
+-------------------------------+----------------------+----------------------+
|   1  GeForce GTX 108...  On   | 00000000:05:00.0 Off |                  N/A |
| 44%   68C    P2   130W / 150W |   2213MiB / 11178MiB |    100%      Default |
+-------------------------------+----------------------+----------------------+
|   2  GeForce GTX 560 Ti  Off  | 00000000:01:00.0 N/A |                  N/A |
| 40%   46C    P8    N/A /  N/A |    790MiB /  1217MiB |     N/A      Default |
+-------------------------------+----------------------+----------------------+

+-----------------------------------------------------------------------------+
| Processes:                                                       GPU Memory |
|  GPU       PID   Type   Process name                             Usage      |
|=============================================================================|
|    0      4910      C   /usr/bin/xmr-stak                           2203MiB |
|    1      4910      C   /usr/bin/xmr-stak                           2203MiB |
|    2                    Not Supported                                       |
+-----------------------------------------------------------------------------+
"""

_NVIDIA_REAL_LINES = [
    line
    for name in ("hung.query-gpu.csv", "busy.query-gpu.header.csv", "busy.query-apps.csv", "busy.nvidia-smi.txt")
    for line in read(H200 / name).splitlines()
] + NVIDIA_SMI_OLD_LAYOUT.splitlines()
_NVIDIA_FRAGMENTS = st.sampled_from([
    *_NVIDIA_REAL_LINES, ", ", ",", "\n", "\r", "|", '"', "[N/A]", "[Not Supported]", "\x1b[31m", "\x00", "\ufffd",
    "MiB", " / ", "0", "99999999999999999999", "x" * 5000, "|" + " " * 3000 + "|",
])
#: nvidia-smi output (tests of bot.core.parse.nvidia_smi): anything, decoded bytes, and real lines shuffled.
UNIT_NVIDIA_TEXT = st.one_of(
    st.text(max_size=500),
    st.binary(max_size=500).map(lambda b: b.decode("utf-8", errors="replace")),
    st.lists(_NVIDIA_FRAGMENTS, max_size=30).map("".join),
    st.lists(st.one_of(_NVIDIA_FRAGMENTS, st.text(max_size=20)), max_size=20).map("\n".join),
)

#: `ps` output exactly as the probe's `ps -eww -o PS_COLUMNS` prints it (an etime under ELAPSED, a zombie,
#: internal spaces and a trailing tab in commands).
PS_PROBE_OUTPUT = """\
    PID    PPID    PGID     SID STAT %CPU   RSS ELAPSED     TIME WCHAN                            USER     COMMAND
      1       0       1       1 Ss    0.0 12800  864000 00:00:09 do_epoll_wait                    root     /sbin/init
    566     561     566     566 Ss    0.2 16856      20 00:00:00 do_wait                          ubuntu   python3 /srv/fake_server.py 2
    569     566     566     566 Sl   20.2 628504     20 00:00:04 hrtimer_nanosleep                ubuntu   /opt/venv/bin/python3 -B -c x  y
    700     566     566     566 Z     0.0     0      20 00:00:00 -                                ubuntu   [python3] <defunct>
    701     566     566     566 R     9.5  1000 1-02:03:04 1-00:00:01 -                             1001     busy   loop\t
"""  # noqa: E501

_PS_REAL_LINES = (read(H200 / "hung.ps.txt").splitlines() + PS_PROBE_OUTPUT.splitlines()
                  + case_file("00", "ps.txt").splitlines())
_PS_FRAGMENTS = st.sampled_from(
    [*_PS_REAL_LINES, " ", "\n", "\t", "-", "\x1b[1m", "\x00", "\ufffd", "99999999999999999999999", "x" * 3000]
)
#: `ps` output (tests of bot.core.parse.ps): anything, decoded bytes, and real rows shuffled.
UNIT_PS_TEXT = st.one_of(
    st.text(max_size=500),
    st.binary(max_size=500).map(lambda b: b.decode("utf-8", errors="replace")),
    st.lists(_PS_FRAGMENTS, max_size=20).map("".join),
    st.lists(st.one_of(_PS_FRAGMENTS, st.text(max_size=30)), max_size=20).map("\n".join),
)
