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
            self.spans_nodes = False
    launches = [La("t1", 100)]
    whole = attribute_holders(snap.gpu, snap.table, launches, snap.launch_tags)
    part = attribute_holders(cut.gpu, cut.table, launches, cut.launch_tags)
    assert [(h.pid, h.owner, h.command) for h in whole] == [(h.pid, h.owner, h.command) for h in part]
    assert [h.owner for h in part] == ["t1#1", "foreign", "foreign"]


def test_a_parent_cycle_ends_the_walk():
    snap = Snapshot(host="h", table=[_row(5, 6), _row(6, 5)], launch_tags={5: "t"})
    assert sorted(p.pid for p in status_snapshot(snap).table) == [5, 6]


def test_probe_concurrency_is_split_among_the_shards_of_a_status():
    from bot.services.hosts import split_concurrency

    assert split_concurrency(32, {0: 5, 1: 3}) == {0: 5, 1: 3}  # they fit: one wave
    shares = split_concurrency(32, {k: n for k, n in enumerate([5, 11, 9, 7, 8, 6, 10, 8])})
    assert sum(shares.values()) == 32 and all(s >= 1 for s in shares.values())
    assert shares[1] >= shares[0] and max(-(-n // shares[k]) for k, n in
                                          enumerate([5, 11, 9, 7, 8, 6, 10, 8])) <= 3
    assert split_concurrency(2, {0: 10, 1: 10, 2: 10}) == {0: 1, 1: 1, 2: 1}  # at least one each


def test_a_launch_s_recorded_process_is_kept_even_untagged_and_apart_from_the_holders():
    snap = _snapshot()
    snap.table.append(_row(900, 1, "launcher that cleared its environment"))
    class La:
        tag, pid, live, name, id, spans_nodes = "t9", 900, True, "t9#9", 9, False
    snap.launch_tags[200] = "t9"  # the holder 200 carries t9's tag; its launcher 900 carries none
    cut = status_snapshot(snap, keep=[900])
    assert 900 in [p.pid for p in cut.table]
    owners = [h.owner for h in attribute_holders(cut.gpu, cut.table, [La()], cut.launch_tags) if h.pid == 200]
    assert owners == ["t9#9"]
    # without it the launcher would look gone: the holder an orphan
    bare = status_snapshot(snap)
    assert [h.owner for h in attribute_holders(bare.gpu, bare.table, [La()], bare.launch_tags)
            if h.pid == 200] == ["orphan of t9#9"]
