"""Tests for bot.core.parse.nvidia_smi against real captures (tests/fixtures) plus synthetic and fuzz input."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.core.models import GpuProcess, GpuReading, GpuSource
from bot.core.parse.nvidia_smi import (
    APPS_QUERY_FIELDS,
    GPU_QUERY_FIELDS,
    assign_gpu_indexes,
    describe_exit,
    gpu_section_from_outputs,
    parse_number,
    parse_nvidia_smi_table,
    parse_query_apps,
    parse_query_gpu,
)
from tests.support.paths import CASES, FIXTURES, H200, case_file, read  # noqa: F401
from tests.support.strategies import NVIDIA_SMI_OLD_LAYOUT as OLD_LAYOUT
from tests.support.strategies import UNIT_NVIDIA_TEXT as fuzz_text

UUID = "GPU-5a1c0de2-7b3e-4f10-9c8d-0e1f2a3b4c5d"


# --- parse_number ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("17235", 17235.0),
        ("122.56", 122.56),
        (" 0 ", 0.0),
        ("17235 MiB", 17235.0),
        ("0 %", 0.0),
        ("693.07 W", 693.07),
        ("1500 MHz", 1500.0),
        ("39 C", 39.0),
        ("46867MiB", 46867.0),
        ("[N/A]", None),
        ("N/A", None),
        ("[Not Supported]", None),
        ("[Unknown Error]", None),
        ("[Insufficient Permissions]", None),
        ("", None),
        ("   ", None),
        ("P0", None),
        ("nan", None),
        ("inf", None),
        ("12abc", None),
        ("1e999", None),
        ("GPU-5a1c0de2", None),
    ],
)
def test_parse_number(token: str, expected: float | None) -> None:
    assert parse_number(token) == expected


# --- parse_query_gpu -------------------------------------------------------------------------------


def test_query_fields_match_fixture_header_order() -> None:
    header = read(H200 / "hung.query-gpu.header.csv").splitlines()[0]
    names = [c.split(" [")[0] for c in header.split(", ")]
    assert names[:11] == list(GPU_QUERY_FIELDS[:11])
    assert names[11] == "clocks.current.sm"  # printed name of the query field clocks.sm
    assert names[12] == GPU_QUERY_FIELDS[12]
    assert APPS_QUERY_FIELDS == ("pid", "process_name", "gpu_uuid", "gpu_bus_id", "used_memory")


def test_query_gpu_hung_noheader() -> None:
    (gpu,) = parse_query_gpu(read(H200 / "hung.query-gpu.csv"))
    assert gpu == GpuReading(
        index=0,
        uuid=UUID,
        name="NVIDIA H200",
        memory_used_mib=17235.0,
        memory_total_mib=143771.0,
        utilization_gpu_pct=0.0,
        utilization_memory_pct=0.0,
        temperature_c=39.0,
        power_draw_w=122.56,
        power_limit_w=700.0,
        pstate="P0",
        clocks_sm_mhz=1980.0,
        ecc_uncorrected=0.0,
    )
    assert gpu.memory_total_gib == pytest.approx(140.4, abs=0.01)


def test_query_gpu_hung_header_variant_same_numbers() -> None:
    (gpu,) = parse_query_gpu(read(H200 / "hung.query-gpu.header.csv"))
    assert gpu.index == 0
    assert gpu.uuid == UUID
    assert gpu.memory_used_mib == 17235.0
    assert gpu.memory_total_mib == 143771.0
    assert gpu.utilization_gpu_pct == 0.0
    assert gpu.temperature_c == 39.0
    assert gpu.power_draw_w == 122.57  # a separate nvidia-smi call, a few ms later
    assert gpu.power_limit_w == 700.0
    assert gpu.clocks_sm_mhz == 1980.0  # header says clocks.current.sm [MHz]
    assert gpu.ecc_uncorrected == 0.0


def test_query_gpu_header_overrides_fields_argument() -> None:
    gpus = parse_query_gpu(read(H200 / "busy.query-gpu.header.csv"), fields=("bogus", "fields"))
    assert [g.utilization_gpu_pct for g in gpus] == [100.0]
    assert gpus[0].clocks_sm_mhz == 1500.0


@pytest.mark.parametrize(
    ("scenario", "used", "util", "power"),
    [("busy", 18242.0, 100.0, 693.30), ("freed", 0.0, 0.0, 79.78), ("orphans", 17235.0, 0.0, 128.10)],
)
def test_query_gpu_other_scenarios(scenario: str, used: float, util: float, power: float) -> None:
    (gpu,) = parse_query_gpu(read(H200 / f"{scenario}.query-gpu.csv"))
    assert (gpu.memory_used_mib, gpu.utilization_gpu_pct, gpu.power_draw_w) == (used, util, power)


def test_query_gpu_case00_columns_given_with_units() -> None:
    text = case_file("00", "nvidia-smi.csv")
    gpus = parse_query_gpu(text, fields=("index", "memory.used", "memory.total", "utilization.gpu"))
    assert [g.index for g in gpus] == list(range(8))
    assert {g.memory_used_mib for g in gpus} == {76015.0, 76017.0}
    assert [g.memory_used_mib for g in gpus[:3]] == [76015.0, 76017.0, 76017.0]
    assert all(g.memory_total_mib == 97887.0 for g in gpus)
    assert all(g.utilization_gpu_pct == 0.0 for g in gpus)
    assert all(g.uuid is None and g.temperature_c is None for g in gpus)


def test_query_gpu_not_available_values() -> None:
    text = (
        "0, GPU-aaaa, Tesla T4, [N/A], 15360, [Not Supported], [N/A], 45, [Unknown Error], "
        "[Insufficient Permissions], [N/A], [N/A], [N/A]\n"
        "[N/A], GPU-bbbb, Broken, 1, 2, 3, 4, 5, 6, 7, P0, 8, 9\n"
        "1, GPU-cccc, Tesla T4, 100, 15360, 5, 1, 40, 27.5, 70.00, P8, 300, [Not Supported]\n"
    )
    a, b = parse_query_gpu(text)
    assert a.index == 0 and a.name == "Tesla T4" and a.memory_total_mib == 15360.0
    assert a.memory_used_mib is None
    assert a.utilization_gpu_pct is None
    assert a.temperature_c == 45.0
    assert a.power_draw_w is None and a.power_limit_w is None
    assert a.pstate is None and a.clocks_sm_mhz is None and a.ecc_uncorrected is None
    assert b.index == 1 and b.pstate == "P8" and b.ecc_uncorrected is None


def test_query_gpu_skips_truncated_and_error_lines() -> None:
    full = read(H200 / "hung.query-gpu.csv").strip()
    text = "Failed to initialize NVML: Driver/library version mismatch\n" + full + "\n" + full[:40] + "\n"
    gpus = parse_query_gpu(text)
    assert len(gpus) == 1 and gpus[0].memory_used_mib == 17235.0


def test_query_gpu_ignores_unknown_fields_and_huge_lines() -> None:
    text = "3, 12345, fast, 42\n" + "7, " + "9" * 500_000 + "\n"
    (gpu,) = parse_query_gpu(text, fields=("index", "memory.used", "fan.speed", "temperature.gpu"))
    assert (gpu.index, gpu.memory_used_mib, gpu.temperature_c) == (3, 12345.0, 42.0)


def test_query_gpu_error_outputs_give_nothing() -> None:
    assert parse_query_gpu(read(H200 / "err.bad-field.txt")) == []
    assert parse_query_gpu(read(H200 / "err.bad-index.txt")) == []
    assert parse_query_gpu("") == []
    assert parse_query_gpu(read(H200 / "hung.query-gpu.csv"), fields=("uuid", "name")) == []


# --- parse_query_apps ------------------------------------------------------------------------------


def test_query_apps_hung() -> None:
    procs = parse_query_apps(read(H200 / "hung.query-apps.csv"))
    assert [p.pid for p in procs] == [569, 570]
    assert [p.used_memory_mib for p in procs] == [8610.0, 8610.0]
    assert all(p.gpu_uuid == UUID and p.process_name == "/opt/venv/bin/python3" for p in procs)
    assert all(p.gpu_index is None for p in procs)


def test_query_apps_busy_and_freed() -> None:
    procs = parse_query_apps(read(H200 / "busy.query-apps.csv"))
    assert [(p.pid, p.used_memory_mib, p.process_name) for p in procs][-1] == (637, 1002.0, "python3")
    assert parse_query_apps(read(H200 / "freed.query-apps.csv")) == []
    assert parse_query_apps("") == []


def test_query_apps_header_with_units_and_garbage() -> None:
    text = (
        "pid, process_name, gpu_uuid, gpu_bus_id, used_gpu_memory [MiB]\n"
        "426, python3, GPU-75b0e2d1-a357-f910-da77-d58124bca704, 00000000:00:06.0, 3590 MiB\n"
        "No running processes found\n"
        "x27, python3, GPU-1, 00000000:00:06.0, 1 MiB\n"
        "427, /opt/my, app, GPU-75b0e2d1-a357-f910-da77-d58124bca704, 00000000:00:06.0, [N/A]\n"
        "428, python3\n"
    )
    a, b = parse_query_apps(text)
    assert (a.pid, a.used_memory_mib, a.gpu_uuid) == (426, 3590.0, "GPU-75b0e2d1-a357-f910-da77-d58124bca704")
    # a comma inside the process name is joined back rather than shifting the other columns
    assert (b.pid, b.process_name, b.used_memory_mib) == (427, "/opt/my, app", None)
    assert b.gpu_uuid == "GPU-75b0e2d1-a357-f910-da77-d58124bca704"


def test_assign_gpu_indexes_returns_new_objects() -> None:
    gpus = [GpuReading(index=0, uuid="GPU-a"), GpuReading(index=3, uuid="GPU-B")]
    procs = [
        GpuProcess(pid=1, gpu_uuid="GPU-b"),
        GpuProcess(pid=2, gpu_uuid="GPU-zzz"),
        GpuProcess(pid=3, gpu_uuid=None, gpu_index=5),
        GpuProcess(pid=4, gpu_uuid=" GPU-a "),
    ]
    out = assign_gpu_indexes(gpus, procs)
    assert [p.gpu_index for p in out] == [3, None, 5, 0]
    assert [p.gpu_index for p in procs] == [None, None, 5, None]  # inputs untouched
    assert out[0] is not procs[0]


# --- describe_exit ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rc", "output", "timeout_s", "expected"),
    [
        (0, "anything", None, None),
        (124, "", 10.0, "nvidia-smi did not answer in 10 s (killed by timeout)"),
        (137, "partial, output", 2.5, "nvidia-smi did not answer in 2.5 s (killed by timeout)"),
        (124, "", None, "nvidia-smi did not answer in time (killed by timeout)"),
        (127, "bash: line 1: nvidia-smi: command not found", None, "nvidia-smi not found on the host"),
        (
            6,
            "No devices were found\n",
            None,
            "no NVIDIA GPU found (nvidia-smi exit 6: No devices were found)",
        ),
        (9, "", None, "NVIDIA driver is not loaded (nvidia-smi exit 9)"),
        (12, "", None, "NVML shared library not found (nvidia-smi exit 12)"),
        (15, "", None, "a GPU has fallen off the bus (nvidia-smi exit 15)"),
        (255, "", None, "nvidia-smi failed (exit 255)"),
        (3, "", None, "nvidia-smi failed (exit 3)"),
        (
            255,
            "\n  Unable to determine the device handle for GPU0000:17:00.0: Unknown Error\n",
            None,
            "nvidia-smi failed (exit 255): Unable to determine the device handle for GPU0000:17:00.0: "
            "Unknown Error",
        ),
        (
            9,
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            None,
            "NVIDIA driver is not loaded (nvidia-smi exit 9): NVIDIA-SMI has failed because it couldn't "
            "communicate with the NVIDIA driver.",
        ),
        (None, "", None, "nvidia-smi gave no exit status"),
    ],
)
def test_describe_exit(rc: int | None, output: str, timeout_s: float | None, expected: str | None) -> None:
    assert describe_exit(rc, output, timeout_s) == expected


def test_describe_exit_real_error_captures() -> None:
    assert describe_exit(2, read(H200 / "err.bad-field.txt")) == (
        'nvidia-smi failed (exit 2): Field "bogus.field" is not a valid field to query.'
    )
    assert describe_exit(6, read(H200 / "err.bad-index.txt")) == (
        "no NVIDIA GPU found (nvidia-smi exit 6: No devices were found)"
    )
    gpu_lost = case_file("20", "nvidia-smi.txt")
    assert describe_exit(255, gpu_lost).endswith(": Unknown Error")


def test_describe_exit_cuts_long_line_and_strips_control() -> None:
    msg = describe_exit(4, "\x1b[31m" + "x" * 1000 + "\x1b[0m")
    assert msg == "nvidia-smi failed (exit 4): " + "x" * 200


# --- gpu_section_from_outputs ----------------------------------------------------------------------


def test_section_ok_assigns_indexes() -> None:
    sec = gpu_section_from_outputs(
        0, read(H200 / "busy.query-gpu.csv"), 0, read(H200 / "busy.query-apps.csv")
    )
    assert sec.ok and sec.error is None and sec.processes_error is None
    assert sec.source is GpuSource.NVIDIA_SMI
    assert [g.memory_used_mib for g in sec.gpus] == [18242.0]
    assert [(p.pid, p.gpu_index) for p in sec.processes] == [(569, 0), (570, 0), (637, 0)]


def test_section_freed_has_no_processes() -> None:
    sec = gpu_section_from_outputs(
        0, read(H200 / "freed.query-gpu.csv"), 0, read(H200 / "freed.query-apps.csv")
    )
    assert sec.ok and sec.processes == [] and sec.gpus[0].memory_used_mib == 0.0


def test_section_gpu_query_timeout() -> None:
    sec = gpu_section_from_outputs(124, "", 124, "", timeout_s=10)
    assert not sec.ok
    assert sec.error == "nvidia-smi did not answer in 10 s (killed by timeout)"
    assert sec.processes_error == sec.error
    assert sec.gpus == [] and sec.processes == []


def test_section_only_apps_failed() -> None:
    sec = gpu_section_from_outputs(0, read(H200 / "hung.query-gpu.csv"), 255, "Unknown Error")
    assert sec.ok and len(sec.gpus) == 1
    assert sec.processes == []
    assert sec.processes_error == "nvidia-smi failed (exit 255): Unknown Error"


def test_section_rc0_without_rows_is_not_ok() -> None:
    sec = gpu_section_from_outputs(0, "No devices were found\n", 0, "")
    assert not sec.ok and sec.error == "nvidia-smi printed no GPU rows: No devices were found"


def test_section_driver_not_loaded() -> None:
    out = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
    sec = gpu_section_from_outputs(9, out, 9, out)
    assert not sec.ok and sec.error is not None
    assert sec.error.startswith("NVIDIA driver is not loaded (nvidia-smi exit 9)")


# --- parse_nvidia_smi_table ------------------------------------------------------------------------


def test_table_h200_hung() -> None:
    gpus, procs = parse_nvidia_smi_table(read(H200 / "hung.nvidia-smi.txt"))
    (gpu,) = gpus
    assert gpu.index == 0 and gpu.name == "NVIDIA H200"
    assert (gpu.temperature_c, gpu.pstate, gpu.power_draw_w, gpu.power_limit_w) == (39.0, "P0", 122.0, 700.0)
    assert (gpu.memory_used_mib, gpu.memory_total_mib, gpu.utilization_gpu_pct) == (17235.0, 143771.0, 0.0)
    assert gpu.ecc_uncorrected == 0.0 and gpu.uuid is None
    assert [(p.gpu_index, p.pid, p.process_name, p.used_memory_mib) for p in procs] == [
        (0, 569, "/opt/venv/bin/python3", 8610.0),
        (0, 570, "/opt/venv/bin/python3", 8610.0),
    ]


def test_table_h200_busy_and_freed() -> None:
    gpus, procs = parse_nvidia_smi_table(read(H200 / "busy.nvidia-smi.txt"))
    assert (gpus[0].utilization_gpu_pct, gpus[0].power_draw_w, gpus[0].temperature_c) == (100.0, 694.0, 57.0)
    assert [(p.pid, p.process_name, p.used_memory_mib) for p in procs][-1] == (637, "python3", 1002.0)
    gpus, procs = parse_nvidia_smi_table(read(H200 / "freed.nvidia-smi.txt"))
    assert gpus[0].memory_used_mib == 0.0 and procs == []


def test_table_case18_rtx6000_truncated_name() -> None:
    gpus, procs = parse_nvidia_smi_table(case_file("18", "nvidia-smi.txt"))
    (gpu,) = gpus
    assert gpu.name == "NVIDIA RTX 6000 Ada Gene..."
    assert (gpu.memory_used_mib, gpu.memory_total_mib, gpu.utilization_gpu_pct) == (46867.0, 49140.0, 100.0)
    assert (gpu.temperature_c, gpu.pstate, gpu.power_draw_w, gpu.power_limit_w) == (47.0, "P2", 90.0, 300.0)
    assert gpu.ecc_uncorrected is None  # "Off"
    assert procs == []


def test_table_case24_l40s() -> None:
    gpus, procs = parse_nvidia_smi_table(case_file("24", "nvidia-smi.txt"))
    assert [
        (g.index, g.name, g.memory_used_mib, g.memory_total_mib, g.utilization_gpu_pct) for g in gpus
    ] == [(0, "NVIDIA L40S", 886.0, 46068.0, 0.0)]
    assert gpus[0].power_draw_w == 78.0 and gpus[0].power_limit_w == 350.0 and gpus[0].temperature_c == 28.0
    assert procs == []


def test_table_case28_two_gpus_excerpt() -> None:
    gpus, procs = parse_nvidia_smi_table(case_file("28", "nvidia-smi.txt"))
    assert [(g.index, g.memory_used_mib, g.utilization_gpu_pct, g.power_draw_w) for g in gpus] == [
        (0, 2627.0, 100.0, 97.0),
        (1, 2691.0, 100.0, 94.0),
    ]
    assert all(g.name == "NVIDIA L40S" and g.memory_total_mib == 46068.0 for g in gpus)
    assert procs == []


def test_table_case20_error_line_only() -> None:
    assert parse_nvidia_smi_table(case_file("20", "nvidia-smi.txt")) == ([], [])


# Older narrow layout (drivers up to 470): copied from a public README that documents an
# nvidia-docker/xmr-stak setup (3x GTX 1080 Ti), and a driver 390.116 capture with N/A power
# (tests/support/strategies.py NVIDIA_SMI_OLD_LAYOUT, whose lines the fuzz strategy draws from too).
def test_table_old_narrow_layout() -> None:
    gpus, procs = parse_nvidia_smi_table(OLD_LAYOUT)
    assert [(g.index, g.name) for g in gpus] == [
        (0, "GeForce GTX 108..."),
        (1, "GeForce GTX 108..."),
        (2, "GeForce GTX 560 Ti"),
    ]
    assert [(g.temperature_c, g.power_draw_w, g.power_limit_w, g.utilization_gpu_pct) for g in gpus] == [
        (64.0, 131.0, 150.0, 100.0),
        (68.0, 130.0, 150.0, 100.0),
        (46.0, None, None, None),
    ]
    assert gpus[2].memory_total_mib == 1217.0 and gpus[2].pstate == "P8"
    assert [(p.gpu_index, p.pid, p.process_name, p.used_memory_mib) for p in procs] == [
        (0, 4910, "/usr/bin/xmr-stak", 2203.0),
        (1, 4910, "/usr/bin/xmr-stak", 2203.0),
    ]


# MIG mode (driver 535.161.08, A100, from a public capture): MIG device boxes are not GPUs.
MIG_LAYOUT = """\
| NVIDIA-SMI 535.161.08             Driver Version: 535.161.08   CUDA Version: 12.2     |
|-----------------------------------------+----------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |
|                                         |                      |               MIG M. |
|=========================================+======================+======================|
|   0  NVIDIA A100-PCIE-40GB          Off | 00000000:18:00.0 Off |                   On |
| N/A   51C    P0              71W / 250W |     38MiB / 40960MiB |     N/A      Default |
|                                         |                      |              Enabled |
+-----------------------------------------+----------------------+----------------------+
+---------------------------------------------------------------------------------------+
| MIG devices:                                                                          |
+------------------+--------------------------------+-----------+-----------------------+
| GPU  GI  CI  MIG |                   Memory-Usage |        Vol|      Shared           |
|      ID  ID  Dev |                     BAR1-Usage | SM     Unc| CE ENC DEC OFA JPG    |
|                  |                                |        ECC|                       |
|==================+================================+===========+=======================|
|  0    7   0   0  |               5MiB /  4864MiB  | 14      0 |  1   0    0    0    0 |
|                  |               0MiB /  8191MiB  |           |                       |
+------------------+--------------------------------+-----------+-----------------------+
+---------------------------------------------------------------------------------------+
| Processes:                                                                            |
|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |
|        ID   ID                                                             Usage      |
|=======================================================================================|
|    0    7    0      12345      C   python -m vllm.entrypoints.api_server      4000MiB |
+---------------------------------------------------------------------------------------+
"""


def test_table_mig_layout() -> None:
    gpus, procs = parse_nvidia_smi_table(MIG_LAYOUT)
    assert [(g.index, g.name, g.memory_used_mib, g.utilization_gpu_pct) for g in gpus] == [
        (0, "NVIDIA A100-PCIE-40GB", 38.0, None)
    ]
    assert [(p.gpu_index, p.pid, p.process_name, p.used_memory_mib) for p in procs] == [
        (0, 12345, "python -m vllm.entrypoints.api_server", 4000.0)
    ]


def test_table_truncated_box() -> None:
    text = read(H200 / "hung.nvidia-smi.txt")
    cut = text[: text.index("| N/A   39C")]
    gpus, procs = parse_nvidia_smi_table(cut)
    assert [(g.index, g.name, g.memory_used_mib) for g in gpus] == [(0, "NVIDIA H200", None)]
    assert procs == []


# --- fuzz ------------------------------------------------------------------------------------------

FUZZ = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(fuzz_text)
def test_fuzz_query_parsers_never_raise(text: str) -> None:
    for gpu in parse_query_gpu(text):
        assert isinstance(gpu.index, int) and gpu.index >= 0
    for proc in parse_query_apps(text):
        assert isinstance(proc.pid, int) and proc.pid >= 0
    parse_query_gpu(text, fields=("index", "memory.used"))
    parse_query_apps(text, fields=("pid",))


@FUZZ
@given(fuzz_text)
def test_fuzz_table_parser_never_raises(text: str) -> None:
    gpus, procs = parse_nvidia_smi_table(text)
    assert all(isinstance(g.index, int) for g in gpus)
    assert all(isinstance(p.pid, int) for p in procs)


@FUZZ
@given(st.one_of(st.none(), st.integers(-1000, 1000)), fuzz_text, st.one_of(st.none(), st.floats()))
def test_fuzz_describe_exit_and_section(rc: int | None, text: str, timeout_s: float | None) -> None:
    msg = describe_exit(rc, text, timeout_s)
    assert (msg is None) == (rc == 0)
    sec = gpu_section_from_outputs(rc, text, rc, text, timeout_s=timeout_s if timeout_s is not None else 10.0)
    assert sec.ok == bool(sec.gpus)
    assert parse_number(text) is None or isinstance(parse_number(text), float)
