"""What a probe worker sends the bot for a status (bot.core.probe.status_snapshot): the GPU holders, the rows tagged
as a launch's and their ancestors, nothing else of the table; the snapshot it was cut from unchanged."""

from __future__ import annotations

from bot.core.lifecycle import attribute_holders
from bot.core.models import GpuProcess, GpuSection, ProcessInfo, Snapshot
from bot.core.probe import status_snapshot


def _row(pid: int, ppid: int, args: str = "") -> ProcessInfo:
    return ProcessInfo(pid=pid, ppid=ppid, pgid=pid, sid=1, stat="S", args=args or f"proc {pid}")


def _snapshot() -> Snapshot:
    table = [_row(1, 0, "init"), _row(100, 1, "launcher"), _row(101, 100, "tp0"), _row(102, 100, "tp1"),
             _row(200, 1, "foreign holder"), *(_row(1000 + i, 1) for i in range(500)), _row(300, 1, "tagged idle"),
             _row(400, 400, "own parent")]
    gpu = GpuSection(ok=True, processes=[GpuProcess(pid=101, gpu_index=0, used_memory_mib=1000),
                                         GpuProcess(pid=200, gpu_index=1, used_memory_mib=500),
                                         GpuProcess(pid=400, gpu_index=1, used_memory_mib=5)])
    snap = Snapshot(host="h", gpu=gpu, table=table, all_process_count=len(table),
                    launch_tags={100: "t1", 101: "t1", 102: "t1", 300: "t2"})
    snap.processes = [r for r in table if r.pid in (101, 200, 400)]
    return snap


def test_only_the_rows_that_label_holders_are_kept():
    snap = _snapshot()
    cut = status_snapshot(snap)
    assert sorted(p.pid for p in cut.table) == [1, 100, 101, 102, 200, 300, 400]
    assert cut.all_process_count == len(snap.table) == 507
    assert [p.pid for p in cut.processes] == [101, 200, 400]
    assert len(snap.table) == 507  # the original is not changed
    # the labels are the same from the cut table as from the whole one
    class La:
        def __init__(self, tag, pid):
            self.tag, self.pid, self.live, self.name, self.id = tag, pid, True, f"{tag}#1", 1
    launches = [La("t1", 100)]
    whole = attribute_holders(snap.gpu, snap.table, launches, snap.launch_tags)
    part = attribute_holders(cut.gpu, cut.table, launches, cut.launch_tags)
    assert [(h.pid, h.owner, h.command) for h in whole] == [(h.pid, h.owner, h.command) for h in part]
    assert [h.owner for h in part] == ["t1#1", "foreign", "foreign"]


def test_a_parent_cycle_ends_the_walk():
    snap = Snapshot(host="h", table=[_row(5, 6), _row(6, 5)], launch_tags={5: "t"})
    assert sorted(p.pid for p in status_snapshot(snap).table) == [5, 6]
