"""Real py-spy dumps of hung torch.distributed ranks, captured on an H200 (tests/fixtures/pyspy/h200/README.md),
read by the stack dump parser: every dump gives its thread and the frames that say where the rank waits."""

from __future__ import annotations

import pytest

from bot.core.stackdump import ProcessDump, _parse_json, summarize_process
from tests.support.paths import FIXTURES

H200_DUMPS = FIXTURES / "pyspy" / "h200"

#: dump file -> a frame name its main thread must show (Python dumps), or a native frame's library (--native)
WHERE = {
    "init_missing_rank-rank0.json": "_create_c10d_store",  # waiting in init_process_group for rank 1
    "allreduce_skipped-rank0.json": "all_reduce",  # waiting for rank 1 in the collective
    "allreduce_skipped-rank1.json": "<module>",  # the rank that never entered it (asleep)
    "init_missing_rank-rank0-native.json": "clock_nanosleep",
    "allreduce_skipped-rank1-native.json": "clock_nanosleep",
}


@pytest.mark.parametrize("name", sorted(p.name for p in H200_DUMPS.glob("*.json")))
def test_every_real_dump_parses_into_its_main_thread(name):
    threads = _parse_json((H200_DUMPS / name).read_text())
    assert threads, name
    main = next(t for t in threads if t.name == "MainThread")
    assert main.frames and not main.active
    if name in WHERE:
        assert any(f.name == WHERE[name] for f in main.frames), [f.name for f in main.frames]
    lines = summarize_process(ProcessDump(pid=main.os_thread_id or 1, ok=True, threads=threads))
    assert lines[0].startswith("pid ") and "MainThread" in "\n".join(lines)


def test_the_native_dump_of_the_waiting_rank_reaches_into_c10d():
    threads = _parse_json((H200_DUMPS / "init_missing_rank-rank0-native.json").read_text())
    names = [f.name for t in threads for f in t.frames]
    assert any("c10d" in n or "TCPStore" in n for n in names), names[:20]
