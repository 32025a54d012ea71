"""The structure readers of the diagnosis (issue 44) on real lines from public reports: each sample in
tests/fixtures/structure/samples.yaml is copied verbatim from the GitHub issue or pull request its `source` names
(the file's header says what was anonymised), with a careful reader's reading of it written beside it by someone who
had not read the readers. One test per reader:

- prefixes: bot.core.diagnose.lines.normalise finds the message, its level and its source under any prefix;
- timestamps: bot.core.diagnose.timeline.stamp reads the time a line carries;
- wrapped: normalise joins a hard-wrapped line back into one logical line;
- traceback / native: bot.core.diagnose.errors.error_blocks reads the exception's type, message and frames, and says
  when the traceback was cut before its final line;
- ps: bot.core.bundle.parse_ps_text reads a process listing pasted without its header;
- shutdown: bot.core.diagnose.scan_log reads an orderly stop as the run's ending;
- backtrace: error_blocks reads a native backtrace's function names (glibc, UCX, absl's signal handler, Itanium-
  mangled names by bot.core.diagnose.errors.demangled);
- kernel_fault: bot.core.diagnose.rules.kernel_faults reads the kernel's line of a process killed by its own fault;
- traceback_intro: a traceback printed without its header is read from the line that introduced it;
- recurring: an error the same ranks say again later was outlived (no failure verdict).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from bot.core.bundle import parse_ps_text
from bot.core.diagnose import Observation, diagnose, scan_log
from bot.core.diagnose.errors import demangled, error_blocks
from bot.core.diagnose.lines import normalise
from bot.core.diagnose.rules import kernel_faults
from bot.core.diagnose.timeline import stamp

SAMPLES = yaml.safe_load((Path(__file__).resolve().parents[1] / "fixtures" / "structure" / "samples.yaml")
                         .read_text(encoding="utf-8"))


def _of(reader: str) -> list:
    return [pytest.param(s, id=s["id"]) for s in SAMPLES if s["reader"] == reader]


def _lines(sample: dict) -> list[str]:
    return sample["lines"].splitlines()


def test_every_sample_names_its_public_source():
    assert len(SAMPLES) >= 60
    for s in SAMPLES:
        assert re.search(r"[\w.-]+/[\w.-]+(?:#| PR #| pull )\d+|https://", s["source"]), s["id"]


@pytest.mark.parametrize("sample", _of("prefixes"))
def test_a_prefixed_line_gives_its_message_level_and_source(sample):
    first = normalise(_lines(sample))[0]
    expect = sample["expect"]
    assert first.body.strip() == expect["message"].strip(), first
    assert first.level == expect.get("level"), first
    if expect.get("source"):  # the label as the reader gives it (a journald unit without its `[pid]`)
        want = re.sub(r"\[\d+\]$", "", expect["source"].strip())
        assert first.source is not None and want in first.source + " " + first.text, first


def _seconds(iso: str) -> tuple[str, float]:
    """The (kind, seconds) stamp() should give for the expected ISO time (`--MM-DDThh:mm:ss` without a year)."""
    m = re.fullmatch(r"(?:(\d{4})-|--)(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|[+-]\d\d:?\d\d)?", iso)
    assert m, iso
    y, mo, d, h, mi, s, frac, off = m.groups()
    line = f"{y}-{mo}-{d} {h}:{mi}:{s}{'.' + frac if frac else ''}{off or ''}" if y else \
        f"{mo}-{d} {h}:{mi}:{s}{'.' + frac if frac else ''}"
    got = stamp(line)
    assert got is not None, line
    return got


@pytest.mark.parametrize("sample", _of("timestamps"))
def test_a_line_s_own_timestamp_is_read(sample):
    line = _lines(sample)[0]
    got = stamp(line)
    assert got is not None, line
    if sample["expect"].get("time") is None:  # a clock that is no wall clock (dmesg's seconds since boot)
        assert got[0] == "uptime", got
        return
    want = _seconds(str(sample["expect"]["time"]))
    assert got[0] == want[0] or (got[0], want[0]) == ("md", "iso"), (got, want)
    if got[0] == want[0]:
        assert abs(got[1] - want[1]) < 1.0, (line, got, want)


#: Samples the reader is known not to read as the reader beside them did (strict: one that comes right fails the run).
KNOWN = {
    "wrapped-by-hand-oom": "a person re-broke two exception messages at sentence ends, always at a space, with no "
                           "width and no mark: nothing in the lines tells those breaks from the log's own",
}


def _known(reader: str) -> list:
    return [pytest.param(p.values[0], id=p.id, marks=pytest.mark.xfail(strict=True, reason=KNOWN[p.id]))
            if p.id in KNOWN else p for p in _of(reader)]


@pytest.mark.parametrize("sample", _known("wrapped"))
def test_a_hard_wrapped_line_is_joined_back(sample):
    logical = normalise(_lines(sample))
    expect = sample["expect"]
    assert len(logical) == expect["logical_lines"], [x.text for x in logical]
    joined = " ".join(expect["joined"].split())
    assert any(joined in " ".join(x.text.split()) for x in logical), [x.text for x in logical]


@pytest.mark.parametrize("sample", _of("traceback"))
def test_a_traceback_is_read_as_a_structure(sample):
    blocks = [b for b in error_blocks(normalise(_lines(sample))) if b.kind == "python"]
    expect = sample["expect"]
    assert len(blocks) == expect["blocks"], [(b.exc_type, b.start, b.line) for b in blocks]
    last = blocks[-1]
    assert last.cut == expect["cut"], last
    assert last.exc_type == expect["type"], last
    if expect.get("message_contains"):
        assert expect["message_contains"] in last.message, last
    if expect.get("innermost_function"):
        assert last.frames and last.frames[-1].func == expect["innermost_function"], last.frames[-3:]


@pytest.mark.parametrize("sample", _of("native"))
def test_a_native_crash_is_read_as_a_structure(sample):
    blocks = error_blocks(normalise(_lines(sample)))
    expect = sample["expect"]
    assert blocks, _lines(sample)
    if expect.get("type"):
        assert any(b.exc_type == expect["type"] for b in blocks), [(b.kind, b.exc_type) for b in blocks]
    if expect.get("message_contains"):
        assert any(expect["message_contains"] in b.message for b in blocks), [b.message for b in blocks]
    for func in expect.get("frames_contain") or ():  # a dump's frames (a goroutine's), read with the crash
        assert any(f.func == func for b in blocks for f in b.frames), [(b.kind, b.frames) for b in blocks]


@pytest.mark.parametrize("sample", _of("ps"))
def test_a_process_listing_without_its_header_is_read(sample):
    rows, _ = parse_ps_text(sample["lines"])
    expect = sample["expect"]
    assert [r.pid for r in rows] == list(expect["pids"])
    if expect.get("ppid_1") is not None:
        assert sorted(r.pid for r in rows if r.ppid == 1) == sorted(expect["ppid_1"])


@pytest.mark.parametrize("sample", _of("shutdown"))
def test_an_orderly_stop_is_the_run_s_ending(sample):
    lines = _lines(sample)
    scan = scan_log(lines)
    expect = sample["expect"]
    assert expect["orderly"] is True
    assert scan.ending is not None and not scan.failures, (scan.ending, [h.line for h in scan.failures])
    if expect.get("signal_line"):
        assert any(expect["signal_line"].strip() in scan.lines[i] for i in (scan.stop_requested, scan.ending)
                   if i is not None), scan.lines[scan.ending]


@pytest.mark.parametrize("sample", _of("backtrace"))
def test_a_native_backtrace_gives_its_function_names(sample):
    blocks = error_blocks(normalise(_lines(sample)))
    expect = sample["expect"]
    funcs = {f.func for b in blocks for f in b.frames}
    assert set(expect["functions"]) <= funcs, funcs
    if expect.get("type"):
        assert any(b.exc_type == expect["type"] for b in blocks), [(b.kind, b.exc_type) for b in blocks]
    if expect.get("qualified"):
        assert any(f.file == expect["qualified"] for b in blocks for f in b.frames)


# Itanium C++ ABI names as the reports' backtraces print them (the second is cut where the report's line was cut).
@pytest.mark.parametrize(("symbol", "name"), [
    ("_ZN12tensorrt_llm7plugins15AllreducePlugin10initializeEv",  # NVIDIA/TensorRT-LLM#1826
     "tensorrt_llm::plugins::AllreducePlugin::initialize"),
    # lemonade-sdk/llamacpp-rocm#122
    ("_ZN24common_prompt_checkpoint10update_tgtE", "common_prompt_checkpoint::update_tgt"),
    ("_ZN13llama_context11synchronizeEv", "llama_context::synchronize"),  # lemonade-sdk/llamacpp-rocm#122
    ("_ZSt9terminatev", None),  # a substitution (std::) is not followed: the symbol stays as printed
    ("_ZN99tooshortE", None),
])
def test_a_mangled_symbol_is_read_by_its_names(symbol, name):
    assert demangled(symbol) == name


@pytest.mark.parametrize("sample", _of("kernel_fault"))
def test_the_kernel_line_of_a_process_killed_by_its_own_fault_is_read(sample):
    got = [[comm, pid] for comm, pid, _ in kernel_faults(_lines(sample))]
    assert got == sample["expect"]["processes"]
    verdict = diagnose(Observation(log_lines=[], dmesg_lines=_lines(sample), process_alive=False))
    assert verdict.verdict == "crashed" and any(_lines(sample)[0].strip()[:40] in e for e in verdict.evidence)


def test_an_oom_kill_or_an_xid_is_no_fault_of_the_process():
    lines = ["[Tue Sep  8 10:05:32 2026] Out of memory: Killed process 3838286 (lmdeploy) total-vm:1234kB",
             "[Tue Sep  8 10:05:32 2026] NVRM: Xid (PCI:0000:17:00): 79, pid=3838286, GPU has fallen off the bus."]
    assert kernel_faults(lines) == []


@pytest.mark.parametrize("sample", _of("traceback_intro"))
def test_a_traceback_without_its_header_is_read_from_the_line_that_introduced_it(sample):
    lines = _lines(sample)
    blocks = [b for b in error_blocks(normalise(lines)) if b.kind == "python"]
    assert blocks and blocks[-1].cut is sample["expect"]["cut"]
    intro = blocks[-1].intro
    assert intro is not None and lines[intro].strip() == sample["expect"]["intro"]
    assert blocks[-1].line == intro  # the line that says what failed, where the exception line is missing


@pytest.mark.parametrize("sample", _of("recurring"))
def test_an_error_the_same_ranks_say_again_later_was_outlived(sample):
    lines = _lines(sample)
    assert sample["expect"]["survived"] is True
    verdict = diagnose(Observation(log_lines=lines))
    assert verdict.verdict not in ("oom", "crashed"), verdict.summary
    # the same words from ranks that said them once, at one moment, stay a failure
    assert diagnose(Observation(log_lines=[x for x in lines if "21:49:33" in x])).verdict == "oom"


def test_a_top_capture_gives_its_task_rows():
    """top's summary block and header come before its task rows (sgl-project/sglang#3752, bundle 234's top.txt)."""
    from bot.core.bundle import parse_top_text
    from tests.support.paths import CASES

    text = next(CASES.glob("234-*")).joinpath("top.txt").read_text(encoding="utf-8")
    rows, raw = parse_top_text(text)
    assert [r.pid for r in rows][:3] == [22098, 22094, 22095]
    assert rows[0].stat == "R" and rows[0].args == "sglang::schedul"
    assert "300.7" in raw[22098]
    assert parse_top_text("top - 08:56:03 up 7:49\nTasks: 3035 total\n") == ([], {})
