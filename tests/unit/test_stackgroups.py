"""Cross-rank stack analysis on the real H200 dumps (tests/fixtures/pyspy/h200) and on 8-rank groups built
from them: the odd rank is named, the phase and cause follow the frames."""

from __future__ import annotations

import copy

from bot.core.stackdump import ProcessDump, _parse_json
from bot.core.stackgroups import rank_place, summarize_ranks
from tests.support.paths import FIXTURES

H200 = FIXTURES / "pyspy" / "h200"


def dump(name: str) -> ProcessDump:
    return ProcessDump(pid=1, ok=True, threads=_parse_json((H200 / name).read_text()) or [])


def test_a_rank_missing_from_init_process_group_is_comm_init_in_the_rendezvous():
    s = summarize_ranks([("TP0", dump("init_missing_rank-rank0.json"))])
    assert s.phase == "comm_init" and s.odd is None
    assert s.line.startswith("TP0 is in _create_c10d_store (torch/distributed/rendezvous.py:199)"), s.line
    assert "rendezvous" in s.cause


def test_the_rank_that_skipped_all_reduce_is_named_the_odd_one_out():
    s = summarize_ranks([("TP0", dump("allreduce_skipped-rank0.json")), ("TP1", dump("allreduce_skipped-rank1.json"))])
    assert s.odd is not None and s.odd.labels == ["TP1"]
    assert s.line.startswith("TP1 is in ") and "while TP0 waits in all_reduce" in s.line, s.line
    assert rank_place("TP0", dump("allreduce_skipped-rank0.json")).waiting


def test_seven_ranks_in_all_reduce_and_one_asleep_names_the_sleeper():
    waiting, sleeping = dump("allreduce_skipped-rank0.json"), dump("allreduce_skipped-rank1.json")
    ranks = [(f"TP{i}", copy.deepcopy(waiting)) for i in range(8) if i != 3] + [("TP3", sleeping)]
    s = summarize_ranks(ranks)
    assert s.odd is not None and s.odd.labels == ["TP3"]
    assert "7 ranks (TP0, TP1, TP2, TP4, ...) wait in all_reduce" in s.line, s.line
    assert [len(g.labels) for g in s.groups] == [7, 1]


def test_native_dumps_map_to_the_same_phase():
    s = summarize_ranks([("TP0", dump("init_missing_rank-rank0-native.json"))])
    assert s.phase == "comm_init", s.line


def test_a_rank_that_could_not_be_dumped_is_its_own_group():
    s = summarize_ranks([("TP0", dump("allreduce_skipped-rank0.json")),
                         ("TP1", ProcessDump(pid=2, ok=False, error="py-spy: permission denied"))])
    assert any(g.where == "not dumped" for g in s.groups)
    assert summarize_ranks([]).line == "no rank could be dumped"
