"""Pure parsers for `nvidia-smi` output: CSV queries, the plain table and exit codes.

No I/O and no subprocess here: the probe runs the commands on the remote host and hands the text and
exit status over. Formats were taken from real captures (NVIDIA H200, driver 580.159.04 / CUDA 13.0,
`tests/fixtures/h200/`) and from public bug-report captures of drivers 387-590 (`tests/fixtures/cases/`):

- `nvidia-smi --query-gpu=<GPU_QUERY_FIELDS> --format=csv,noheader,nounits`
  (`0, GPU-..., NVIDIA H200, 17235, 143771, 0, 0, 39, 122.56, 700.00, P0, 1980, 0`)
- the same with `--format=csv` (header row `memory.used [MiB]`, values with units `17235 MiB`)
- `nvidia-smi --query-compute-apps=<APPS_QUERY_FIELDS> --format=csv,noheader,nounits`
  (empty output and exit 0 when no process uses a GPU)
- plain `nvidia-smi` (the boxed table)
- exit codes from the nvidia-smi(1) man page, "RETURN VALUE".

Every function here is total: bad input gives None / empty lists / an error string, never an exception.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from bot.core.models import GpuProcess, GpuReading, GpuSection, GpuSource
from bot.core.parse.log import no_mentions, strip_control

__all__ = [
    "APPS_QUERY_FIELDS",
    "GPU_QUERY_FIELDS",
    "assign_gpu_indexes",
    "describe_exit",
    "gpu_section_from_outputs",
    "parse_number",
    "parse_nvidia_smi_table",
    "parse_query_apps",
    "parse_query_gpu",
]

GPU_QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "name",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "utilization.memory",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "pstate",
    "clocks.sm",
    "ecc.errors.uncorrected.volatile.total",
)
"""Fields of the probe's `nvidia-smi --query-gpu=...` call, in the order they are requested."""

APPS_QUERY_FIELDS: tuple[str, ...] = ("pid", "process_name", "gpu_uuid", "gpu_bus_id", "used_memory")
"""Fields of the probe's `nvidia-smi --query-compute-apps=...` call, in the order they are requested."""

# Query names and the names nvidia-smi prints in a CSV header, mapped to one canonical field name.
# (nvidia-smi --help-query-gpu / --help-query-compute-apps list the aliases; the header always uses
# the long form, e.g. `clocks.current.sm [MHz]` for `clocks.sm`, `used_gpu_memory [MiB]` for
# `used_memory`.)
_ALIASES: Mapping[str, str] = MappingProxyType({
    "gpu_name": "name",
    "gpu_uuid": "uuid",  # only in --query-gpu context; apps keep gpu_uuid (see _APPS_ALIASES)
    "clocks.current.sm": "clocks.sm",
    "clocks.current.graphics": "clocks.gr",
    "clocks.current.memory": "clocks.mem",
    "power.draw.instant": "power.draw",
    "enforced.power.limit": "power.limit",
})
_APPS_ALIASES: Mapping[str, str] = MappingProxyType({
    "used_gpu_memory": "used_memory",
    "name": "process_name",
    "uuid": "gpu_uuid",
    "pci.bus_id": "gpu_bus_id",
})

# GpuReading attribute for each canonical query field, and whether the value is numeric.
_GPU_ATTRS: Mapping[str, tuple[str, bool]] = MappingProxyType({
    "uuid": ("uuid", False),
    "name": ("name", False),
    "memory.used": ("memory_used_mib", True),
    "memory.total": ("memory_total_mib", True),
    "utilization.gpu": ("utilization_gpu_pct", True),
    "utilization.memory": ("utilization_memory_pct", True),
    "temperature.gpu": ("temperature_c", True),
    "power.draw": ("power_draw_w", True),
    "power.limit": ("power_limit_w", True),
    "pstate": ("pstate", False),
    "clocks.sm": ("clocks_sm_mhz", True),
    "ecc.errors.uncorrected.volatile.total": ("ecc_uncorrected", True),
})

# Values nvidia-smi prints instead of a number or string it cannot report.
_MISSING = frozenset({
    "",
    "n/a",
    "[n/a]",
    "[not supported]",
    "not supported",
    "[unknown error]",
    "unknown error",
    "[insufficient permissions]",
    "insufficient permissions",
    "[gpu is lost]",
    "[requires reset]",
    "[not found]",
    "err!",
})

_NUMBER_RE = re.compile(
    r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*"
    r"(?:%|°?C|[KMGT]i?B|B|[mkM]?W|[KMG]?Hz|[mu]?s|[mu]?V|RPM)?\s*$",
    re.IGNORECASE,
)
_HEADER_UNIT_RE = re.compile(r"\s*\[[^\]]*\]\s*$")
_INT_RE = re.compile(r"^\s*(\d{1,9})\s*$")

# Longer lines cannot be nvidia-smi rows (CSV rows are < 1 KiB, table rows < 200 chars); skipping
# them bounds the regex work per line and keeps csv's field-size limit out of the way.
_MAX_CSV_LINE = 8192
_MAX_TABLE_LINE = 1000


def parse_number(token: str) -> float | None:
    """Return the number in one nvidia-smi value, or None when there is none.

    Accepts plain numbers (`17235`, `122.56`) and numbers followed by one unit as nvidia-smi prints
    them with `--format=csv` (`17235 MiB`, `0 %`, `693.07 W`, `1500 MHz`, `39 C`). The unit is only
    stripped, not converted: the caller knows what unit its field uses. Returns None for `[N/A]`,
    `N/A`, `[Not Supported]`, `[Unknown Error]`, `[Insufficient Permissions]`, empty text, NaN/inf,
    or anything else that is not a number with an optional known unit.

    Format source: nvidia-smi `--query-*` CSV output (driver 580.159.04, `--format=csv[,nounits]`).
    Never raises.
    """
    if not isinstance(token, str) or len(token) > 100:
        return None
    m = _NUMBER_RE.match(token)
    if not m:
        return None
    try:
        value = float(m.group(1))
    except ValueError:  # pragma: no cover - the regex only admits valid floats
        return None
    return value if math.isfinite(value) else None


def _parse_text(token: str) -> str | None:
    """Return a stripped string value, or None for empty / `[N/A]`-style placeholders."""
    value = token.strip()
    if value.lower() in _MISSING:
        return None
    return value


def _name(token: str) -> str | None:
    """A process name from nvidia-smi (the host's text): `_parse_text` with Slack mention openers broken."""
    value = _parse_text(token)
    return None if value is None else no_mentions(value)


def _parse_int(token: str) -> int | None:
    """Return a non-negative int (index, pid), or None."""
    m = _INT_RE.match(token)
    return int(m.group(1)) if m else None


def _canonical(name: str, apps: bool) -> str:
    """Return the canonical field name for a query field or a CSV header cell (`memory.used [MiB]`)."""
    if len(name) > 200:
        return name
    key = _HEADER_UNIT_RE.sub("", name).strip().lower()
    if apps:
        return _APPS_ALIASES.get(key, key)
    return _ALIASES.get(key, key)


def _csv_rows(text: str) -> Iterable[list[str]]:
    """Yield the cells of each CSV line of `text`; lines that csv cannot read are skipped."""
    if not isinstance(text, str):
        return
    for line in text.splitlines():
        if not line.strip() or len(line) > _MAX_CSV_LINE:
            continue
        try:
            cells = next(csv.reader([line.replace("\x00", "")], skipinitialspace=True), None)
        except csv.Error:
            continue
        if cells:
            yield [c.strip() for c in cells]


def _fit_cells(cells: list[str], n_fields: int, text_pos: int | None) -> list[str] | None:
    """Align a row with the field list.

    Returns None for a row with fewer cells than fields (a truncated line). Surplus cells (a free-text
    value that contained a comma) are joined back into the free-text field at `text_pos`; without one,
    the surplus is dropped.
    """
    if len(cells) < n_fields:
        return None
    surplus = len(cells) - n_fields
    if surplus and text_pos is not None and text_pos < n_fields:
        merged = ", ".join(cells[text_pos : text_pos + surplus + 1])
        return [*cells[:text_pos], merged, *cells[text_pos + surplus + 1 :]]
    return cells[:n_fields]


def _is_header(cells: list[str], key_field: str, apps: bool) -> bool:
    """Whether a row is a CSV header naming `key_field` (its first cell is not an integer)."""
    if _parse_int(cells[0]) is not None:
        return False
    return key_field in {_canonical(c, apps) for c in cells}


def parse_query_gpu(text: str, fields: Sequence[str] = GPU_QUERY_FIELDS) -> list[GpuReading]:
    """Parse `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]` output into GpuReadings.

    `fields` names the columns in order when the output has no header (the probe uses
    `--format=csv,noheader,nounits` with GPU_QUERY_FIELDS). When a header row is present (its first
    cell is not an integer and it names `index`), the header wins: names like `memory.used [MiB]` and
    `clocks.current.sm [MHz]` are mapped back to query fields, and values with units (`17235 MiB`) are
    accepted. Units: memory MiB, utilization %, temperature C, power W, clocks MHz.

    Rows whose index is not an integer (error messages, `[N/A]`) or that have fewer cells than fields
    (truncated lines) are skipped; unknown fields are ignored; unparseable values become None. A field
    list without `index` yields []. Format source: nvidia-smi of driver 580.159.04 (H200 capture).
    Never raises.
    """
    cols = [_canonical(f, apps=False) for f in fields]
    out: list[GpuReading] = []
    for cells in _csv_rows(text):
        if _is_header(cells, "index", apps=False):
            cols = [_canonical(c, apps=False) for c in cells]
            continue
        if "index" not in cols:
            continue
        row = _fit_cells(cells, len(cols), cols.index("name") if "name" in cols else None)
        if row is None:
            continue
        values = dict(zip(cols, row, strict=True))
        index = _parse_int(values["index"])
        if index is None:
            continue
        reading = GpuReading(index=index)
        for col, raw in values.items():
            spec = _GPU_ATTRS.get(col)
            if spec is None:
                continue
            attr, numeric = spec
            setattr(reading, attr, parse_number(raw) if numeric else _parse_text(raw))
        out.append(reading)
    return out


def parse_query_apps(text: str, fields: Sequence[str] = APPS_QUERY_FIELDS) -> list[GpuProcess]:
    """Parse `nvidia-smi --query-compute-apps=... --format=csv[,noheader][,nounits]` into GpuProcesses.

    `fields` names the columns when there is no header (the probe uses APPS_QUERY_FIELDS with
    `noheader,nounits`); a header row (`pid, process_name, gpu_uuid, gpu_bus_id, used_gpu_memory [MiB]`)
    overrides it. `used_memory_mib` is MiB (None for `[N/A]`, e.g. inside some containers);
    `gpu_index` is left None (see `assign_gpu_indexes`); `gpu_bus_id` is not kept.

    Empty output (nvidia-smi prints nothing, exit 0, when no compute process exists) gives [].
    Rows with a non-integer pid (`No running processes found`, errors), truncated rows and garbage
    are skipped. Format source: nvidia-smi of driver 580.159.04 (H200 capture). Never raises.
    """
    cols = [_canonical(f, apps=True) for f in fields]
    out: list[GpuProcess] = []
    for cells in _csv_rows(text):
        if _is_header(cells, "pid", apps=True):
            cols = [_canonical(c, apps=True) for c in cells]
            continue
        if "pid" not in cols:
            continue
        text_pos = cols.index("process_name") if "process_name" in cols else None
        row = _fit_cells(cells, len(cols), text_pos)
        if row is None:
            continue
        values = dict(zip(cols, row, strict=True))
        pid = _parse_int(values["pid"])
        if pid is None:
            continue
        out.append(
            GpuProcess(
                pid=pid,
                used_memory_mib=parse_number(values["used_memory"]) if "used_memory" in values else None,
                gpu_uuid=_parse_text(values["gpu_uuid"]) if "gpu_uuid" in values else None,
                process_name=_name(values["process_name"]) if "process_name" in values else None,
            )
        )
    return out


def assign_gpu_indexes(gpus: Iterable[GpuReading], procs: Iterable[GpuProcess]) -> list[GpuProcess]:
    """Return NEW GpuProcess objects with `gpu_index` set from the GPU whose uuid matches `gpu_uuid`.

    The inputs are not mutated (copies via `dataclasses.replace`). UUIDs are compared
    case-insensitively after stripping. A process whose uuid matches no GPU keeps the `gpu_index` it
    already had (e.g. from the plain table), which is None for CSV-parsed processes. Order is kept.
    Never raises.
    """
    by_uuid: dict[str, int] = {}
    for gpu in gpus:
        if gpu.uuid:
            by_uuid.setdefault(gpu.uuid.strip().lower(), gpu.index)
    out: list[GpuProcess] = []
    for proc in procs:
        index = by_uuid.get(proc.gpu_uuid.strip().lower()) if proc.gpu_uuid else None
        out.append(dataclasses.replace(proc, gpu_index=index if index is not None else proc.gpu_index))
    return out


_EXIT_MESSAGES: Mapping[int, str] = MappingProxyType({
    127: "nvidia-smi not found on the host",
    6: "no NVIDIA GPU found (nvidia-smi exit 6: No devices were found)",
    9: "NVIDIA driver is not loaded (nvidia-smi exit 9)",
    12: "NVML shared library not found (nvidia-smi exit 12)",
    15: "a GPU has fallen off the bus (nvidia-smi exit 15)",
})
# Exit codes whose output is shell or timeout noise, never worth quoting.
_NO_DETAIL = frozenset({124, 127, 137})


def _first_line(output: str, limit: int = 200) -> str | None:
    """Return the first non-empty line of `output`, control characters removed, cut to `limit` chars."""
    if not isinstance(output, str):
        return None
    for raw in output.splitlines():
        line = strip_control(raw).strip()
        if line:
            return line[:limit]
    return None


def describe_exit(rc: int | None, output: str, timeout_s: float | None = None) -> str | None:
    """Return a one-line human explanation of a failed nvidia-smi call, or None when `rc` is 0.

    Mapping (nvidia-smi(1) "RETURN VALUE", plus the shell's 127 and coreutils `timeout`'s 124/137):
    124/137 -> "nvidia-smi did not answer in {timeout_s:g} s (killed by timeout)" ("in time" when
    `timeout_s` is None); 127 -> "nvidia-smi not found on the host"; 6 -> no GPU found; 9 -> driver not
    loaded; 12 -> NVML library not found; 15 -> GPU fallen off the bus; anything else (2, 255, ...) ->
    "nvidia-smi failed (exit N)". `rc` None (no exit status was reported) -> "nvidia-smi gave no exit
    status".

    Except for 124/127/137, the first non-empty line of `output` (control characters removed, cut to
    200 characters) is appended as `: <line>` when it is not already part of the message, e.g.
    "nvidia-smi failed (exit 255): Unable to determine the device handle for GPU0000:17:00.0: Unknown
    Error". Never raises.
    """
    if rc == 0:
        return None
    if rc in (124, 137):
        when = "in time" if timeout_s is None or not math.isfinite(timeout_s) else f"in {timeout_s:g} s"
        return f"nvidia-smi did not answer {when} (killed by timeout)"
    if rc is None:
        message = "nvidia-smi gave no exit status"
    else:
        message = _EXIT_MESSAGES.get(rc, f"nvidia-smi failed (exit {rc})")
    if rc not in _NO_DETAIL:
        line = _first_line(output)
        if line and line.lower().rstrip(".") not in message.lower():
            message = f"{message}: {line}"
    return message


# --- plain `nvidia-smi` table -------------------------------------------------------------------

_BUS_ID_RE = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]\b")
_GPU_HEAD_RE = re.compile(r"^\s*(\d{1,4})\s+(.*?)\s*$")
_PERSISTENCE_RE = re.compile(r"\s+(On|Off|N/A)\s*$")
_TEMP_RE = re.compile(r"(?<![\w.])(\d+)C\b")
_PERF_RE = re.compile(r"\b(P\d{1,2})\b")
_POWER_RE = re.compile(r"(\d+(?:\.\d+)?W|N/A|ERR!)\s*/\s*(\d+(?:\.\d+)?W|N/A|ERR!)")
_MEM_RE = re.compile(r"(\d+)MiB\s*/\s*(\d+)MiB")
_UTIL_RE = re.compile(r"^\s*(\d+)%")
_PROC_ROW_RE = re.compile(
    r"^\s*(\d{1,4})\s+"  # GPU index
    r"(?:(?:\d+|N/A)\s+(?:\d+|N/A)\s+)?"  # GI ID, CI ID (drivers >= 450)
    r"(\d{1,9})\s+"  # PID
    r"([A-Z][A-Z+]*)\s+"  # Type: C, G, C+G, M, M+C ...
    r"(.*?)\s+"  # Process name (may contain spaces, may be shortened with "...")
    r"(\d+MiB|N/A)\s*$"  # GPU memory usage
)


def _table_cells(line: str) -> list[str] | None:
    """Return the `|`-separated cells of a table row (`| a | b |`), or None for other lines."""
    s = line.strip()
    if len(s) < 2 or not s.startswith("|") or not s.endswith("|"):
        return None
    return s[1:-1].split("|")


def _watts(token: str) -> float | None:
    """Return watts from `122W` / `122.5W`, None for `N/A` / `ERR!`."""
    return parse_number(token[:-1]) if token.endswith("W") else None


def _apply_metrics(gpu: GpuReading, cells: list[str]) -> None:
    """Fill temperature, pstate, power, memory and utilization from the second row of a GPU box."""
    first = cells[0]
    if m := _TEMP_RE.search(first):
        gpu.temperature_c = float(m.group(1))
    if m := _PERF_RE.search(first):
        gpu.pstate = m.group(1)
    if m := _POWER_RE.search(first):
        gpu.power_draw_w = _watts(m.group(1))
        gpu.power_limit_w = _watts(m.group(2))
    if len(cells) > 1 and (m := _MEM_RE.search(cells[1])):
        gpu.memory_used_mib = float(m.group(1))
        gpu.memory_total_mib = float(m.group(2))
    if len(cells) > 2 and (m := _UTIL_RE.match(cells[2])):
        gpu.utilization_gpu_pct = float(m.group(1))


def parse_nvidia_smi_table(text: str) -> tuple[list[GpuReading], list[GpuProcess]]:
    """Parse plain `nvidia-smi` output into (GPU readings, GPU processes).

    GPU boxes are recognised by a first row `|   0  NAME  Persistence | BUS-ID Disp | ECC |` whose
    second cell starts with a PCI bus id; the next row gives temperature (C), perf state, power
    draw/cap (W), memory used/total (MiB) and GPU-Util (%). `name` may be shortened by nvidia-smi
    (`NVIDIA RTX 6000 Ada Gene...`); `uuid` is never in the table (None); the volatile uncorrected ECC
    count is kept when numeric. Values shown as `N/A` / `ERR!` become None. MIG device boxes are not GPUs
    and are skipped.

    Process rows (`|    0   N/A  N/A   569   C   /opt/venv/bin/python3   8610MiB |`, and the pre-450
    layout without GI/CI columns) give `GpuProcess(pid, used_memory_mib, gpu_index, process_name)`;
    `No running processes found` gives none. Rows cut by a truncated excerpt are skipped or left with
    None values; an error message instead of a table (`Unable to determine the device handle ...`)
    gives ([], []).

    Format source: nvidia-smi table layouts of drivers 387-470 (narrow) and 525-590 (wide), e.g.
    580.159.04 on an H200. Never raises.
    """
    gpus: list[GpuReading] = []
    procs: list[GpuProcess] = []
    if not isinstance(text, str):
        return gpus, procs
    pending: GpuReading | None = None  # GPU whose metrics row is expected next
    for line in text.splitlines():
        if len(line) > _MAX_TABLE_LINE:
            pending = None
            continue
        cells = _table_cells(line)
        if cells is None:
            # border lines (+---+, |===|) keep `pending`; anything else ends a GPU box
            if not line.strip().startswith("+"):
                pending = None
            continue
        if len(cells) == 1:
            pending = None
            m = _PROC_ROW_RE.match(cells[0])
            if m:
                mem = m.group(5)
                procs.append(
                    GpuProcess(
                        pid=int(m.group(2)),
                        used_memory_mib=parse_number(mem[:-3]) if mem.endswith("MiB") else None,
                        gpu_index=int(m.group(1)),
                        process_name=m.group(4).strip() or None,
                    )
                )
            continue
        if pending is not None:
            _apply_metrics(pending, cells)
            pending = None
            continue
        head = _GPU_HEAD_RE.match(cells[0])
        if head and _BUS_ID_RE.match(cells[1].strip()):
            name = _PERSISTENCE_RE.sub("", head.group(2)).strip()
            gpu = GpuReading(index=int(head.group(1)), name=name or None)
            if len(cells) > 2:
                ecc = cells[2].strip()
                gpu.ecc_uncorrected = parse_number(ecc) if ecc.isdigit() else None
            gpus.append(gpu)
            pending = gpu
    return gpus, procs


def gpu_section_from_outputs(
    gpu_rc: int | None,
    gpu_out: str,
    apps_rc: int | None,
    apps_out: str,
    *,
    timeout_s: float = 10.0,
) -> GpuSection:
    """Combine the probe's two nvidia-smi CSV queries into a GpuSection.

    `gpu_out` is the output of `--query-gpu=<GPU_QUERY_FIELDS> --format=csv,noheader,nounits` with exit
    status `gpu_rc`; `apps_out` of `--query-compute-apps=<APPS_QUERY_FIELDS> --format=csv,noheader,nounits`
    with `apps_rc` (a header row in either is also accepted). `timeout_s` is the timeout the probe used,
    in seconds, quoted when an exit status says the call was killed.

    - `gpu_rc` != 0 (or None): ok False, `error` from `describe_exit`; processes are still parsed
      when `apps_rc` is 0.
    - `gpu_rc` 0 but no GPU row could be parsed: ok False, error "nvidia-smi printed no GPU rows"
      (plus the first output line, if any).
    - otherwise ok True with the readings.
    - `apps_rc` != 0: `processes_error` from `describe_exit`, processes [].
    Processes get `gpu_index` from the GPU uuid (`assign_gpu_indexes`). `source` is NVIDIA_SMI.
    Never raises.
    """
    processes: list[GpuProcess] = []
    processes_error: str | None = None
    if apps_rc == 0:
        processes = parse_query_apps(apps_out)
    else:
        processes_error = describe_exit(apps_rc, apps_out, timeout_s)

    if gpu_rc != 0:
        return GpuSection(
            ok=False,
            processes=processes,
            source=GpuSource.NVIDIA_SMI,
            error=describe_exit(gpu_rc, gpu_out, timeout_s),
            processes_error=processes_error,
        )
    gpus = parse_query_gpu(gpu_out)
    processes = assign_gpu_indexes(gpus, processes)
    if not gpus:
        line = _first_line(gpu_out)
        error = "nvidia-smi printed no GPU rows" + (f": {line}" if line else "")
        return GpuSection(
            ok=False,
            processes=processes,
            source=GpuSource.NVIDIA_SMI,
            error=error,
            processes_error=processes_error,
        )
    return GpuSection(
        ok=True,
        gpus=gpus,
        processes=processes,
        source=GpuSource.NVIDIA_SMI,
        processes_error=processes_error,
    )
