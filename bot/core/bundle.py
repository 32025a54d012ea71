"""Parse the file texts of a case bundle (tests/fixtures/cases/README.md) into an `Observation` for `diagnose`.

A bundle holds evidence files (`server.log`, `ps.txt`, `top.txt`, `nvidia-smi.txt` / `.csv`, `netstat.txt` / `ss.txt`,
`curl.txt`, `dmesg.txt`, `proc-stack.txt`, `ipcs-m.txt`, `docker-ps.txt`) plus `observed.json` (facts only
watching over time could give). `case.md` and `expected.json` hold the answer and are NEVER read.

A missing file means UNKNOWN, never "empty output": its Observation field stays None.

Pure: no I/O (reading the directory is `bot.adapters.bundle.read_bundle`), only parsing on top of the existing
parsers (`bot.core.parse.ps.parse_ps`, `bot.core.parse.nvidia_smi.parse_query_gpu` / `parse_nvidia_smi_table`).
Where a reporter's `grep` removed a header (ps) or the capture used `noheader` (nvidia-smi CSV), the layout is
detected from the shape of the rows (column count and what each cell looks like).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from bot.core.diagnose import ContainerObs, ListenObs, Observation, ShmSegment
from bot.core.lifecycle import EXIT_LINE_RE, exit_status
from bot.core.models import GpuProcess, GpuReading, ProcessInfo
from bot.core.parse.log import strip_control
from bot.core.parse.nvidia_smi import GPU_QUERY_FIELDS, parse_nvidia_smi_table, parse_query_gpu
from bot.core.parse.ps import parse_ps
from bot.core.ranks import NODE_DIR_PREFIX, RANKS_FILE, SCONTROL_FILE, node_label, parse_ranks
from bot.core.stackdump import ProcessDump, parse_stack_json, parse_stack_text
from bot.core.stackgroups import rank_label

__all__ = [
    "BUNDLE_FILES",
    "STACK_DIR",
    "NodeBundles",
    "detect_ps_layout",
    "guess_port",
    "node_bundles",
    "observation_from_files",
    "observation_from_texts",
    "parse_docker_ps",
    "parse_gpu_csv",
    "parse_gpu_table",
    "parse_ipcs_m",
    "parse_listening",
    "parse_ps_text",
]

BUNDLE_FILES: tuple[str, ...] = (
    "server.log",
    "ps.txt",
    "top.txt",
    "nvidia-smi.txt",
    "nvidia-smi.csv",
    "netstat.txt",
    "ss.txt",
    "curl.txt",
    "dmesg.txt",
    "proc-stack.txt",
    "ipcs-m.txt",
    "docker-ps.txt",
    "py-spy.txt",
    "observed.json",
)
"""The files `bot.adapters.bundle.read_bundle` reads (case.md and expected.json are deliberately absent)."""

_MAX_LINE = 4000  # longer dmesg lines are cut before matching, as log lines are (bounds regex work per line)
_HEALTH = frozenset({"ok", "http_503", "refused", "timeout", "empty", "connect_timeout"})


# --- ps -------------------------------------------------------------------------------------------------

_STAT = r"[DRSTtWXZIP][<NLsl+]*"
_KIND_RE: Mapping[str, re.Pattern[str]] = MappingProxyType({
    "pid": re.compile(r"\d{1,9}"),
    "ppid": re.compile(r"\d{1,9}"),
    "pgid": re.compile(r"\d{1,9}"),
    "sid": re.compile(r"\d{1,9}"),
    "user": re.compile(r"[A-Za-z_][\w.-]*[+$]?|\d{1,10}"),
    "stat": re.compile(_STAT),
    "pcpu": re.compile(r"\d+(?:\.\d+)?"),
    "pmem": re.compile(r"\d+(?:\.\d+)?"),
    "rss": re.compile(r"\d+"),
    "vsz": re.compile(r"\d+"),
    "nlwp": re.compile(r"\d+"),
    "c": re.compile(r"\d+"),
    "tty": re.compile(r"\?{1,2}|pts/\d+|tty\w*|console|s\d{3}"),
    "pr": re.compile(r"-?\d{1,3}|rt"),
    "ni": re.compile(r"-?\d{1,2}"),
    "virt": re.compile(r"\d+(?:\.\d+)?[kmgtpe]?"),
    "res": re.compile(r"\d+(?:\.\d+)?[kmgtpe]?"),
    "shr": re.compile(r"\d+(?:\.\d+)?[kmgtpe]?"),
    "toptime": re.compile(r"\d+:\d\d(?:\.\d\d)?"),
    # procps (`19:08`, `Dec06`, `2024`) and BSD / macOS ps (`10:19AM`, `Tue05PM`, `6Dec24`)
    "start": re.compile(r"\d{1,2}:\d\d(?:[AP]M)?|[A-Z][a-z]{2}\d\d(?:[AP]M)?|\d{4}|\d{1,2}[A-Z][a-z]{2}\d\d"),
    "etimes": re.compile(r"\d+|(?:\d+-)?(?:\d+:)?\d+:\d\d"),
    "time": re.compile(r"(?:\d+-)?\d+:\d\d(?::\d\d)?(?:\.\d+)?"),
    "wchan": re.compile(r"\S+"),
})
_LSTART_RE = re.compile(
    r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +\d{1,2} "
    r"\d\d:\d\d:\d\d \d{4}"
)

# Headerless layouts seen in captures and reports, tried in this order. `lstart` spans 5 tokens;
# `args` takes the rest of the line. Names are `ps -o` specifiers (parse_ps ignores the ones it has no use for).
_PS_LAYOUTS: tuple[tuple[str, ...], ...] = (
    ("pid", "ppid", "pgid", "sid", "stat", "pcpu", "rss", "etimes", "time", "wchan", "args"),  # the probe
    ("pid", "ppid", "pgid", "sid", "stat", "pcpu", "pmem", "rss", "vsz", "etimes", "time", "wchan", "args"),
    ("user", "pid", "pcpu", "pmem", "vsz", "rss", "tty", "stat", "start", "time", "args"),  # ps aux
    ("pid", "ppid", "user", "stat", "lstart", "etimes", "pcpu", "pmem", "nlwp", "args"),
    ("user", "pid", "ppid", "c", "start", "tty", "time", "args"),  # ps -ef
    ("pid", "ppid", "stat", "pcpu", "etimes", "time", "args"),
    ("pid", "tty", "time", "args"),  # ps -e
    ("pid", "stat", "time", "args"),
    # top's task rows (procps-ng top: PID USER PR NI VIRT RES SHR S %CPU %MEM TIME+ COMMAND)
    ("pid", "user", "pr", "ni", "virt", "res", "shr", "stat", "pcpu", "pmem", "toptime", "args"),
    ("pid", "args"),  # pgrep -a, ps -o pid,args: the loosest, last
)
_LOOSEST = _PS_LAYOUTS[-1]
_HEADER_HINT = re.compile(r"^\s*(?:USER\s+)?PID\b|\bPID\s+PPID\b|\bCOMMAND\s*$|\bCMD\s*$")


def _fits(layout: Sequence[str], line: str) -> bool:
    """Whether a data line fits a headerless layout, cell by cell."""
    text = line
    if "lstart" in layout:
        m = _LSTART_RE.search(text)
        if not m:
            return False
        text = text[: m.start()] + " LSTART " + text[m.end() :]
    tokens = text.split()
    fixed = [k for k in layout if k != "args"]
    if len(tokens) < len(fixed):
        return False
    for kind, tok in zip(fixed, tokens, strict=False):
        if kind == "lstart":
            if tok != "LSTART":
                return False
            continue
        rx = _KIND_RE.get(kind)
        if rx is not None and not rx.fullmatch(tok):
            return False
    return True


def detect_ps_layout(lines: Sequence[str]) -> tuple[str, ...] | None:
    """The first known headerless `ps` layout that fits every data line.

    Falls back to the layout that fits the most lines; None when no layout fits any line.
    """
    data = [ln for ln in lines if ln.strip()]
    if not data:
        return None
    best: tuple[int, tuple[str, ...] | None] = (0, None)
    for layout in _PS_LAYOUTS:
        n = sum(_fits(layout, ln) for ln in data)
        if layout == _LOOSEST and best[0] * 2 >= len(data):
            return best[1]  # a layout with columns fits most rows: one truncated or wrapped row drops none
        if n == len(data):
            return layout
        if n > best[0]:
            best = (n, layout)
    return best[1]


def parse_ps_text(text: str) -> tuple[list[ProcessInfo], dict[int, str]]:
    """Parse any `ps` capture into (rows, raw line per PID).

    With a header line, `parse_ps` reads it as is. Without one (a `grep` removed it), the layout is detected by
    shape (`detect_ps_layout`); an `lstart` date (`Sat Jun  7 14:06:35 2025`) is cut out of each line before
    the row goes to `parse_ps` with the detected columns. Never raises.
    """
    if not isinstance(text, str):
        return [], {}
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return [], {}
    raw_by_pid: dict[int, str] = {}
    if any(_HEADER_HINT.search(ln) for ln in lines[:3]):
        rows = parse_ps(text)
        for ln in lines:
            toks = ln.split()
            for tok in toks[:2]:
                if tok.isascii() and tok.isdigit() and len(tok) <= 12 and any(r.pid == int(tok) for r in rows):
                    raw_by_pid.setdefault(int(tok), ln.strip())
                    break
        return rows, raw_by_pid
    layout = detect_ps_layout(lines)
    if layout is None:
        return [], {}
    columns = [k for k in layout if k != "lstart"]
    rows: list[ProcessInfo] = []
    for ln in lines:
        if not _fits(layout, ln):
            continue
        body = _LSTART_RE.sub(" ", ln, count=1) if "lstart" in layout else ln
        parsed = parse_ps(body, columns=columns)
        if parsed:
            rows.append(parsed[0])
            raw_by_pid.setdefault(parsed[0].pid, ln.strip())
    return rows, raw_by_pid


#: top's task table header (procps-ng top 3.x / 4.x): its summary block comes before it.
_TOP_HEADER = re.compile(r"^\s*PID\s+USER\s+PR\s+NI\s+VIRT\s+RES\b")


def parse_top_text(text: str) -> tuple[list[ProcessInfo], dict[int, str]]:
    """The task rows of a `top` capture (procps-ng top, batch or pasted: the summary block, then `PID USER PR NI
    VIRT RES SHR S %CPU %MEM TIME+ COMMAND`) as (rows, raw line per PID): pid, user, state, %CPU and the command as
    top shows it (cut to its column, 15 characters by default). Rows before a header, or without one, are read by
    shape. Never raises."""
    if not isinstance(text, str):
        return [], {}
    lines = text.splitlines()
    heads = [i for i, ln in enumerate(lines) if _TOP_HEADER.match(ln)]
    body = lines[heads[-1] + 1:] if heads else lines
    return parse_ps_text("\n".join(ln for ln in body if ln.strip() and not _TOP_HEADER.match(ln)))


# --- nvidia-smi -----------------------------------------------------------------------------------------

_CSV_FALLBACK: Mapping[int, tuple[str, ...]] = MappingProxyType({
    len(GPU_QUERY_FIELDS): GPU_QUERY_FIELDS,
    4: ("index", "memory.used", "memory.total", "utilization.gpu"),  # SGLang's killall / common by-hand query
    3: ("index", "memory.used", "memory.total"),
})
_UNIT_RE = re.compile(r"^\s*[-+]?\d+(?:\.\d+)?\s*(MiB|%|W|C|MHz)\s*$")


def _csv_cells(line: str) -> list[str]:
    return [c.strip() for c in line.split(",")]


def _infer_csv_fields(rows: Sequence[list[str]]) -> tuple[str, ...] | None:
    """Field names of headerless `--query-gpu` rows, from units in the values (`76015 MiB`, `0 %`) or the count."""
    if not rows:
        return None
    width = len(rows[0])
    if any(len(r) != width for r in rows):
        width = max(len(r) for r in rows)
    units: list[str | None] = []
    for col in range(width):
        seen = {m.group(1) for r in rows if col < len(r) and (m := _UNIT_RE.match(r[col]))}
        units.append(seen.pop() if len(seen) == 1 else None)
    if any(units):
        names: list[str] = []
        counts: dict[str, int] = {}
        by_unit = {
            "MiB": ("memory.used", "memory.total"),
            "%": ("utilization.gpu", "utilization.memory"),
            "W": ("power.draw", "power.limit"),
            "C": ("temperature.gpu",),
            "MHz": ("clocks.sm",),
        }
        for col, unit in enumerate(units):
            if unit is None:
                first = rows[0][col] if col < len(rows[0]) else ""
                if col == 0 and first.isdigit():
                    names.append("index")
                elif first.startswith("GPU-"):
                    names.append("uuid")
                elif re.fullmatch(r"P\d{1,2}", first):
                    names.append("pstate")
                elif first and not first[0].isdigit():
                    names.append("name")
                else:
                    names.append(f"unknown{col}")
                continue
            k = counts.get(unit, 0)
            counts[unit] = k + 1
            options = by_unit[unit]
            names.append(options[k] if k < len(options) else f"unknown{col}")
        if "index" in names:
            return tuple(names)
    return _CSV_FALLBACK.get(width)


def parse_gpu_csv(text: str) -> tuple[list[GpuReading], dict[int, str], list[str]]:
    """Parse `nvidia-smi --query-gpu` CSV, with or without header, into (readings, raw row per index, error lines).

    A header row is read by `parse_query_gpu` itself. Without one, the fields are inferred from the rows
    (`_infer_csv_fields`): e.g. 4 columns `0, 76015 MiB, 97887 MiB, 0 %` are index, memory.used,
    memory.total, utilization.gpu. Lines that are not rows (error text) are returned as error lines.
    """
    if not isinstance(text, str):
        return [], {}, []
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    data = [ln for ln in lines if _csv_cells(ln)[0].isascii() and _csv_cells(ln)[0].isdigit()
            and len(_csv_cells(ln)[0]) <= 6]  # '²'.isdigit() is True too; int() refuses it
    in_data = set(data)
    errors = [ln for ln in lines if ln not in in_data and not ln.lower().startswith("index")]
    has_header = any(ln.lower().startswith("index") for ln in lines)
    if has_header:
        gpus = parse_query_gpu(text)
    else:
        fields = _infer_csv_fields([_csv_cells(ln) for ln in data])
        gpus = parse_query_gpu(text, fields=fields) if fields else []
    raw = {}
    for ln in data:
        idx = int(_csv_cells(ln)[0])
        raw.setdefault(idx, ln)
    return gpus, raw, errors


_TABLE_METRICS_RE = re.compile(r"\d+MiB\s*/\s*\d+MiB")


def parse_gpu_table(text: str) -> tuple[list[GpuReading], list[GpuProcess], dict[int, str], list[str]]:
    """Parse plain `nvidia-smi` output into (readings, processes, raw metrics row per GPU, error lines).

    The readings come from `parse_nvidia_smi_table`; the raw row kept for quoting is each GPU box's metrics row
    (`| N/A 40C P0 97W / 350W | 2627MiB / 46068MiB | 100% Default |`). Text outside the table (for example
    `Unable to determine the device handle for GPU0000:17:00.0: Unknown Error`) is returned as error lines.
    """
    if not isinstance(text, str):
        return [], [], {}, []
    gpus, procs = parse_nvidia_smi_table(text)
    metric_rows = [
        ln.strip() for ln in text.splitlines() if ln.strip().startswith("|") and _TABLE_METRICS_RE.search(ln)
    ]
    raw = {g.index: row for g, row in zip(gpus, metric_rows, strict=False)}
    errors = []
    for ln in text.splitlines():
        s = ln.strip()
        if not s or s[0] in "|+" or re.match(r"^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) ", s):
            continue
        errors.append(s)
    return gpus, procs, raw, errors


# --- sockets, shm, docker, curl -------------------------------------------------------------------------

_ADDR_PORT_RE = re.compile(r"^(.*?)[:.](\d{1,5})$")
_OWNER_NETSTAT_RE = re.compile(r"^(\d+/\S+|-)$")
_OWNER_SS_RE = re.compile(r'users:\(\("([^"]+)",pid=(\d+)')


def parse_listening(text: str) -> list[ListenObs]:
    """Listening TCP sockets from `netstat -tlnp` / `netstat -ano` / `ss -ltnp` text, with the raw line.

    The local address is the first `ADDR:PORT` cell (`0.0.0.0:8000`, `:::34315`, `[::]:8000`, `*:8000`);
    the owner is netstat's `PID/Program` cell (`1/python3`) or ss's `users:(("python3",pid=1,...))`.
    """
    out: list[ListenObs] = []
    if not isinstance(text, str):
        return out
    for raw in text.splitlines():
        line = strip_control(raw).strip()
        if "LISTEN" not in line.upper().split() and "LISTEN" not in line:
            continue
        tokens = line.split()
        local = None
        for tok in tokens:
            m = _ADDR_PORT_RE.match(tok)
            if m and (":" in tok) and not tok.endswith(":*"):
                local = m
                break
        if local is None:
            continue
        port = int(local.group(2))
        if not 0 < port < 65536:
            continue
        owner = None
        if m2 := _OWNER_SS_RE.search(line):
            owner = f"{m2.group(2)}/{m2.group(1)}"
        else:
            for tok in tokens:
                if _OWNER_NETSTAT_RE.match(tok) and tok != "-":
                    owner = tok
                    break
        out.append(ListenObs(address=local.group(1).strip("[]") or "*", port=port, owner=owner, line=line))
    return out


def parse_ipcs_m(text: str) -> list[ShmSegment]:
    """`ipcs -m` rows (`key shmid owner perms bytes nattch status`) as ShmSegments, with the raw line."""
    out: list[ShmSegment] = []
    if not isinstance(text, str):
        return out
    for raw in text.splitlines():
        line = raw.strip()
        toks = line.split()
        if len(toks) < 6 or not toks[0].lower().startswith("0x"):
            continue

        def num(tok: str) -> int | None:
            return int(tok) if tok.isascii() and tok.isdigit() and len(tok) <= 12 else None

        out.append(
            ShmSegment(
                key=toks[0],
                shmid=num(toks[1]),
                owner=toks[2],
                size_bytes=num(toks[4]),
                nattch=num(toks[5]),
                status=" ".join(toks[6:]),
                line=line,
            )
        )
    return out


def parse_docker_ps(text: str) -> list[ContainerObs]:
    """`docker ps` rows as ContainerObs, cut by the header's column offsets (STATUS, PORTS, NAMES)."""
    out: list[ContainerObs] = []
    if not isinstance(text, str):
        return out
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    if not lines or "STATUS" not in lines[0] or "NAMES" not in lines[0]:
        return out
    head = lines[0]
    cols = {name: head.index(name) for name in ("STATUS", "PORTS", "NAMES") if name in head}
    s_at, n_at = cols["STATUS"], cols["NAMES"]
    p_at = cols.get("PORTS", n_at)
    for line in lines[1:]:
        status = line[s_at:p_at].strip() if len(line) > s_at else ""
        ports = line[p_at:n_at].strip() if "PORTS" in cols and len(line) > p_at else ""
        name = line[n_at:].strip() if len(line) > n_at else ""
        out.append(ContainerObs(name=name, status=status, ports=ports, line=line.strip()))
    return out


_URL_PORT_RE = re.compile(r"https?://[^/\s:]+:(\d{1,5})")
_HOSTPORT_RE = re.compile(r"(?:^|\s)(?:localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1?\]):(\d{1,5})\b")
_DOCKER_PORT_RE = re.compile(r"->(\d{1,5})/tcp")
_LOG_PORT_RES = (
    re.compile(r"--port[= ](\d{1,5})\b"),
    re.compile(r"\bport=(\d{1,5})\b"),
    re.compile(r"Uvicorn running on https?://[^\s:]+:(\d{1,5})"),
    re.compile(r"Starting vLLM (?:API )?server (?:\S+ )?on https?://[^\s:]*:(\d{1,5})"),
)


def guess_port(
    curl_lines: Sequence[str] | None,
    containers: Sequence[ContainerObs] | None,
    log_lines: Sequence[str] | None,
    processes: Sequence[ProcessInfo] | None,
) -> int | None:
    """The server's HTTP port: from the probe's URL, a container's published port, `--port N` in the
    command line, or the log (`port=8000`, `Uvicorn running on http://0.0.0.0:8000`). None when nothing says."""
    for line in curl_lines or []:
        if m := _URL_PORT_RE.search(line) or _HOSTPORT_RE.search(line):
            return int(m.group(1))
    for c in containers or []:
        if m := _DOCKER_PORT_RE.search(c.ports or c.line):
            return int(m.group(1))
    for p in processes or []:
        if m := _LOG_PORT_RES[0].search(p.args):
            return int(m.group(1))
    for line in log_lines or []:
        for rx in _LOG_PORT_RES:
            if m := rx.search(line):
                return int(m.group(1))
    return None


# --- observed.json --------------------------------------------------------------------------------------


#: The largest number of seconds observed.json may give (ten years); more, inf and NaN are not facts.
_MAX_SECONDS = 10 * 365 * 86400.0


def _seconds(v: Any) -> float | None:
    """A JSON number of seconds as a float in 0.._MAX_SECONDS, else None (bool, huge, inf, NaN, negative)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        x = float(v)
    except OverflowError:
        return None
    return x if math.isfinite(x) and 0 <= x <= _MAX_SECONDS else None


def _observed(data: Any, notes: list[str]) -> dict[str, Any]:
    """The known keys of observed.json with their types checked; bad values become notes, not facts."""
    out: dict[str, Any] = {}
    if not isinstance(data, Mapping):
        notes.append("observed.json is not a JSON object; ignored")
        return out
    for key in ("elapsed_s", "log_silent_s"):
        v = data.get(key)
        if (x := _seconds(v)) is not None:
            out[key] = x
        elif v is not None:
            notes.append(f"observed.json: {key} is not a non-negative number; ignored")
    code = data.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool) and -255 <= code <= 255:
        out["exit_code"] = code
    elif code is not None:
        notes.append("observed.json: exit_code is not an exit status (-255..255); ignored")
    for key in ("log_growing", "process_alive", "port_open", "gpu_mem_rising", "cpu_time_growing"):
        v = data.get(key)
        if isinstance(v, bool):
            out[key] = v
        elif v is not None:
            notes.append(f"observed.json: {key} is not true/false; ignored")
    grace = data.get("grace_s")
    if isinstance(grace, Mapping):
        ok = {str(k): x for k, v in grace.items() if (x := _seconds(v)) is not None}
        if ok:
            out["policy_grace_s"] = ok
    if (x := _seconds(data.get("silence_after_s"))) is not None:
        out["policy_silence_after_s"] = x
    for key in ("health", "generate"):
        v = data.get(key)
        if isinstance(v, str) and (v in _HEALTH or re.fullmatch(r"http_\d{3}", v)):
            out[key] = v
        elif v is not None:
            notes.append(f"observed.json: {key} is not one of ok, http_NNN, refused, timeout, empty; ignored")
    return out


def _lines(text: str | None) -> list[str] | None:
    return None if text is None else text.splitlines()


STACK_DIR = "py-spy"
"""The bundle's folder of py-spy dumps, `py-spy/LABEL-pid-N.json`, one per rank (bot.core.collect writes them)."""
#: `py-spy/LABEL-pid-N.json`: one rank's py-spy dump (bot.core.collect writes them).
_STACK_NAME_RE = re.compile(r"(?P<label>.+?)-pid-(?P<pid>\d{1,9})\.json")
#: Seconds server.log must be older than the bundle's newest other file before its file time says "silent".
FILE_TIME_SILENCE_S = 60.0


def _rank_stacks(stacks: Mapping[str, str]) -> list[tuple[str, ProcessDump]]:
    out = []
    for name in sorted(stacks):
        m = _STACK_NAME_RE.fullmatch(name)
        label = m.group("label").replace("_", " ") if m else name.removesuffix(".json")
        pid = int(m.group("pid")) if m else 0
        threads = parse_stack_json(stacks[name])
        out.append((label, ProcessDump(pid, threads is not None, threads or [],
                                       None if threads is not None else "not py-spy JSON")))
    return out


_PROCESS_LINE = re.compile(r"^Process (\d{1,9}): (.+)$", re.M)


def _text_stacks(text: str) -> list[tuple[str, ProcessDump]]:
    """The ranks' stacks in `py-spy dump` text (a `py-spy.txt`, or dumps pasted into the log, any prefix around the
    lines taken off first), labelled by the rank their command line names (`TP3`), else `pid N`."""
    if "Thread " not in text:
        return []
    from bot.core.diagnose.lines import normalise  # the prefix reader of the diagnosis (a paste under compose)

    plain = "\n".join(n.text for n in normalise(text.splitlines()))
    cmds = {int(m.group(1)): m.group(2) for m in _PROCESS_LINE.finditer(plain)}
    out = []
    for d in parse_stack_text(plain):
        label = rank_label(cmds.get(d.pid, "")) or (f"pid {d.pid}" if d.pid else "process")
        out.append((label, d))
    return out


def _inferred(obs: Observation, mtimes: Mapping[str, float], notes: list[str]) -> None:
    """Without observed.json: what the files' times and contents can still tell (the log's silence when the log
    was last written well before the other captures), and a note naming what stays unknown."""
    log_time = mtimes.get("server.log")
    others = [t for name, t in mtimes.items() if name != "server.log"]
    if log_time is not None and others and max(others) - log_time >= FILE_TIME_SILENCE_S:
        obs.log_silent_s = max(others) - log_time
        notes.append(f"observed.json is missing: the log's silence ({obs.log_silent_s:.0f} s) is inferred from file "
                     "times (server.log last written that long before the newest other file)")
    unknown = [k for k, v in (("whether the log is silent", obs.log_silent_s),
                              ("whether the process is alive", obs.process_alive),
                              ("whether the port is open", obs.port_open)) if v is None]
    if unknown:
        notes.append("observed.json is missing, so these are not known: " + ", ".join(unknown))


def observation_from_files(files: Mapping[str, str], mtimes: Mapping[str, float] | None = None) -> Observation:
    """An Observation from a bundle's files as read (relative path -> text, `py-spy/*.json` included;
    `mtimes` relative path -> epoch seconds), whether from a directory (bot.adapters.bundle) or from a bundle
    just collected in memory (`!bundle`). observed.json is parsed here: a malformed one is ignored with a note,
    a missing one leaves the facts to the files' times and contents. Pure; never raises."""
    texts = {n: t for n, t in files.items() if n in BUNDLE_FILES and n != "observed.json"}
    stacks = {n.split("/", 1)[1]: t for n, t in files.items() if n.startswith(f"{STACK_DIR}/")}
    observed: Any = None
    bad_json = False
    if "observed.json" in files:
        try:
            observed = json.loads(files["observed.json"]) if files["observed.json"].strip() else {}
        except (ValueError, RecursionError):
            observed, bad_json = {}, True
    obs = observation_from_texts(texts, observed, stacks=stacks,
                                 mtimes={n: t for n, t in (mtimes or {}).items() if n in texts})
    if bad_json:
        obs.notes.append("observed.json is not valid JSON; ignored")
    return obs


def observation_from_texts(texts: Mapping[str, str], observed: Any = None, *,
                           stacks: Mapping[str, str] | None = None,
                           mtimes: Mapping[str, float] | None = None) -> Observation:
    """Build an Observation from a bundle's file texts (keyed by file name) and parsed observed.json. Pure.

    A file absent from `texts` leaves its fields None (unknown); an empty file gives empty lists. `stacks`: the
    texts of `py-spy/*.json` keyed by file name (`TP0-pid-123.json`), read as the ranks' stacks. `observed`
    None means observed.json is absent: `mtimes` (file name -> epoch seconds) may then tell the log's silence,
    and a note names what is not known.
    """
    notes: list[str] = []
    obs = Observation(notes=notes)
    obs.log_lines = _lines(texts.get("server.log"))
    last = next((line for line in reversed(obs.log_lines or []) if line.strip()), None)
    if last is not None and EXIT_LINE_RE.match(last.strip()):
        # gpubot's launch wrapper writes its status as the log's very last line, after the server ended: taken as
        # the exit status; one anywhere else is the server's own text (it could print one), never a status, and
        # observed.json's word on the process wins over either
        obs.exit_code = exit_status([last])
    if obs.log_lines and any(EXIT_LINE_RE.match(line.strip()) for line in obs.log_lines):
        # the wrapper's words are no engine's (the watcher reads the log without them too)
        obs.log_lines = [line for line in obs.log_lines if not EXIT_LINE_RE.match(line.strip())]
    if (ps := texts.get("ps.txt")) is not None:
        obs.processes, obs.process_lines = parse_ps_text(ps)
    if (top := texts.get("top.txt")) is not None:  # a `top` capture: its task rows, where ps did not list the PID
        rows, raw = parse_top_text(top)
        known = {p.pid for p in obs.processes or []}
        obs.processes = (obs.processes or []) + [r for r in rows if r.pid not in known]
        obs.process_lines = {**raw, **(obs.process_lines or {})}
    gpu_errors: list[str] | None = None
    if (table := texts.get("nvidia-smi.txt")) is not None:
        gpus, procs, raw, errors = parse_gpu_table(table)
        obs.gpus, obs.gpu_processes, obs.gpu_lines = gpus, procs, dict(raw)
        gpu_errors = errors
    if (csv_text := texts.get("nvidia-smi.csv")) is not None:
        gpus, raw, errors = parse_gpu_csv(csv_text)
        known = {g.index for g in obs.gpus or []}
        obs.gpus = (obs.gpus or []) + [g for g in gpus if g.index not in known]
        for idx, row in raw.items():
            obs.gpu_lines.setdefault(idx, row)
        gpu_errors = (gpu_errors or []) + errors
    obs.gpu_error_lines = gpu_errors
    listen_texts = [t for name in ("netstat.txt", "ss.txt") if (t := texts.get(name)) is not None]
    if listen_texts:
        obs.listening = [s for t in listen_texts for s in parse_listening(t)]
    obs.probe_lines = _lines(texts.get("curl.txt"))
    obs.dmesg_lines = [line[:_MAX_LINE] for line in _lines(texts.get("dmesg.txt")) or []] \
        if "dmesg.txt" in texts else None
    obs.stack_lines = _lines(texts.get("proc-stack.txt"))
    if (ipcs := texts.get("ipcs-m.txt")) is not None:
        obs.shm_segments = parse_ipcs_m(ipcs)
    if (docker := texts.get("docker-ps.txt")) is not None:
        obs.containers = parse_docker_ps(docker)
    facts = _observed(observed, notes) if observed is not None else {}
    for key, value in facts.items():
        setattr(obs, key, value)
    if obs.process_alive is True and "exit_code" not in facts:
        obs.exit_code = None  # a process seen alive has no exit status, whatever line its log ends with
    if stacks:
        obs.rank_stacks = _rank_stacks(stacks)
    elif (dumps := _text_stacks(texts.get("py-spy.txt") or "") or _text_stacks(texts.get("server.log") or "")):
        obs.rank_stacks = dumps
    obs.port = guess_port(obs.probe_lines, obs.containers, obs.log_lines, obs.processes)
    if obs.port_open is None and obs.port is not None and obs.listening is not None:
        obs.port_open = any(s.port == obs.port for s in obs.listening)
    if obs.process_alive is None and obs.containers:
        status = obs.containers[0].status
        if status.startswith("Up"):
            obs.process_alive = True
        elif m := re.match(r"Exited \((-?\d+)\)", status):
            obs.process_alive = False
            obs.exit_code = int(m.group(1))
    if observed is None:
        _inferred(obs, mtimes or {}, notes)
    return obs


@dataclass
class NodeBundles:
    """The other ranks of a bundle of a launch across nodes: `rank0` (rank 0's node, whose files are the bundle's
    top level), `ranks` ((rank, node, Observation) of each `node-NAME/` folder), `scontrol` (`scontrol.txt`: a
    Slurm job as `scontrol show job -o` printed it, or None)."""

    rank0: str = "rank 0"
    ranks: list[tuple[int, str, Observation]] = field(default_factory=list)
    scontrol: str | None = None

    def __bool__(self) -> bool:
        return bool(self.ranks or self.scontrol)


def node_bundles(files: Mapping[str, str], mtimes: Mapping[str, float] | None = None) -> NodeBundles:
    """The ranks of a bundle of a launch across nodes from its files (relative path -> text; bot.core.ranks names
    the layout): each `node-NAME/` folder's files read as a bundle of their own (observation_from_files), which
    rank is on which node from `ranks.txt` (without it, the folders are ranks 1, 2, ... in name order), and
    `scontrol.txt`. A bundle of one host gives an empty NodeBundles. Never raises."""
    mtimes = mtimes or {}
    ranks = parse_ranks(files.get(RANKS_FILE, ""))
    rank_of = {node: k for k, node in ranks.items()}
    by_node: dict[str, dict[str, str]] = {}
    for rel, text in files.items():
        head, sep, tail = rel.partition("/")
        if sep and head.startswith(NODE_DIR_PREFIX) and len(head) > len(NODE_DIR_PREFIX):
            by_node.setdefault(head[len(NODE_DIR_PREFIX):], {})[tail] = text
    out = NodeBundles(rank0=ranks.get(0, "rank 0"), scontrol=files.get(SCONTROL_FILE))
    for i, node in enumerate(sorted(by_node), start=1):
        own = by_node[node]
        prefix = f"{NODE_DIR_PREFIX}{node}/"
        times = {rel: mtimes[prefix + rel] for rel in own if prefix + rel in mtimes}
        # a folder's name is the node's only in print (node_label: no escape, no new line)
        out.ranks.append((rank_of.get(node, i), node_label(node), observation_from_files(own, times)))
    return out
