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


# --- what the stacks add to a verdict (bot.core.diagnose.stacks) and rank labels ---------------------------

from bot.core.diagnose import Verdict  # noqa: E402
from bot.core.diagnose.stacks import with_stacks  # noqa: E402
from bot.core.stackgroups import rank_label  # noqa: E402


def _hang(phase=None) -> Verdict:
    return Verdict(verdict="silent_hang", phase=phase, evidence=["no log progress for 10m", "GPU 0: 74 GiB"],
                   next_steps=["Dump every rank's Python stack: `py-spy dump --pid PID`", "Look at dmesg"],
                   summary="Alive but no progress for 10m in a phase the evidence does not show.")


def test_stacks_in_init_process_group_set_comm_init_on_a_hang_whose_log_showed_no_phase():
    v, s = with_stacks(_hang(), [("TP0", dump("init_missing_rank-rank0.json"))])
    assert s is not None and v.phase == "comm_init"
    assert v.evidence[0] == "no log progress for 10m"
    assert v.evidence[1].startswith("stacks (py-spy, 1 rank): TP0 is in _create_c10d_store"), v.evidence
    assert "so the phase is comm_init, not unknown" in v.summary
    assert not any("py-spy" in step for step in v.next_steps)  # done already
    assert any("/dev/shm" in step for step in v.next_steps)     # the comm_init steps instead


def test_stacks_in_a_collective_keep_the_log_s_phase_and_name_the_odd_rank():
    ranks = [("TP0", dump("allreduce_skipped-rank0.json")), ("TP1", dump("allreduce_skipped-rank1.json"))]
    v, _ = with_stacks(_hang("weight_loading"), ranks)
    assert v.phase == "weight_loading"
    assert "TP1 is in " in v.evidence[1] and "while TP0 waits in all_reduce" in v.evidence[1]


def test_stacks_change_no_other_verdict_and_a_failed_dump_is_one_line():
    crashed = Verdict(verdict="crashed", phase=None, evidence=["x"], next_steps=[], summary="s")
    assert with_stacks(crashed, [("TP0", dump("init_missing_rank-rank0.json"))]) == (crashed, None)
    v, s = with_stacks(_hang(), [("TP0", ProcessDump(1, False, error="py-spy is not installed on the host"))])
    assert s is None and v.phase is None
    assert v.evidence[1] == "stacks (py-spy): not taken: py-spy is not installed on the host"


def test_rank_labels_come_from_each_engine_s_process_titles_and_flags():
    assert [rank_label(a) for a in ("sglang::scheduler_TP3", "sglang::scheduler_DP0_TP5_EP5", "VLLM::Worker_TP7",
                                    "python x.py --worker-rank 1", "torchrun --local-rank=2 t.py",
                                    "python -m sglang.launch_server --tp 8", "xTP3")] == \
        ["TP3", "DP0 TP5", "TP7", "rank 1", "local rank 2", None, None]
    # data-parallel and pipeline ranks stay apart; a model path or name naming "TP4" is no rank
    assert [rank_label(a) for a in ("sglang::scheduler_DP1_TP0", "VLLM::Worker_PP1_TP0",
                                    "python -m vllm serve /m/llama-70b_TP4", "python serve --name qwen:TP8")] == \
        ["DP1 TP0", "PP1 TP0", None, None]


def test_a_rank_py_spy_could_not_attach_to_is_named_as_such():
    s = summarize_ranks([("TP0", dump("allreduce_skipped-rank1.json")),
                         ("TP1", ProcessDump(pid=2, ok=False, error="py-spy did not finish within 10 s"))])
    assert s.line.startswith("TP1 could not be dumped while TP0 is in "), s.line
