"""Work a launch does in short-lived children (Triton's `ptxas`, one compile after another) counts as its CPU time
(issue 44, the H100 run of 2026-12-08): the probe reads each process's ended children's CPU from /proc/PID/stat
(fields 16 and 17, proc(5)), and the watcher compares it apart from the process's own TIME, so a check that could not
read the children's (a probe cut short) adds no growth by itself."""

from __future__ import annotations

import json

from bot.core.models import ProcessInfo, Snapshot
from bot.core.observe import _cpu_growing, cpu_seconds
from bot.core.probe import parse_proc_stat_children_cpu
from bot.core.records import CheckRecord

#: /proc/PID/stat of a shell whose work runs in children (proc(5) layout; a COMM with a space and parentheses).
STAT = ("4242 (sh) S 1 4242 4242 0 -1 4194560 300 9000 0 0 2 1 395 120 20 0 1 0 12345 2846720 200 "
        "18446744073709551615 1 1 0 0 0 0 0 0 65536 0 0 0 17 3 0 0 0 0 0\n"
        "4343 (python3 (x) y) R 4242 4242 4242 0 -1 4194304 10 0 0 0 7 3 0 0 20 0 1 0 22222 100 10\n"
        "garbage line\n")


def test_the_ended_childrens_cpu_is_read_from_proc_stat():
    assert parse_proc_stat_children_cpu(STAT) == {4242: 5.15, 4343: 0.0}


def _snap(children: dict[int, float]) -> tuple[list[ProcessInfo], Snapshot]:
    p = ProcessInfo(pid=4242)
    p.cpu_time_s = 0.0
    return [p], Snapshot(host="h", children_cpu_s=children)


def test_childrens_cpu_is_compared_apart_from_the_processs_own():
    procs, snap = _snap({4242: 70.0})
    cpu = cpu_seconds(procs, snap)
    assert cpu == {"4242": 0.0, "4242c": 70.0}
    before = CheckRecord(t=100.0, cpu_s={"4242": 0.0, "4242c": 50.0})
    assert _cpu_growing(cpu, before, 110.0, None) is True  # 20 s of the children's work in 10 s
    # the previous check could not read the children's: no growth from their whole past at once
    blind = CheckRecord(t=100.0, cpu_s={"4242": 0.0})
    assert _cpu_growing(cpu, blind, 110.0, None) is not True
    # and this one could not: nothing grows either
    procs2, snap2 = _snap({})
    assert _cpu_growing(cpu_seconds(procs2, snap2), before, 110.0, None) is not True


def test_the_childrens_cpu_survives_a_record_stored_and_read_back():
    rec = CheckRecord(t=1.0, cpu_s={"4242": 1.0, "4242c": 5.0})
    back = CheckRecord.from_json(json.loads(json.dumps(rec.as_json())))
    assert back is not None
    assert back.cpu_s == {"4242": 1.0, "4242c": 5.0}
