"""A launch across nodes (bot.core.ranks): rank tags and logs, the rank view a probe of one node uses, the odd rank
among every node's evidence and the verdict that names it with its node."""

from __future__ import annotations

from bot.core.diagnose import Verdict
from bot.core.models import Launch, LaunchState
from bot.core.ranks import NodeLook, base_tag, odd_rank, rank_log, rank_log_parts, rank_tag, rank_view, weigh_nodes


def _launch(**kw) -> Launch:
    base = dict(id=7, host="login", variant="two", params={}, command="serve", log_path="/logs/gpubot-two-7-ab.log",
                port=30000, gpus=[], pid=4242, pgid=4242, sid=4242, state=LaunchState.RUNNING, state_detail=None,
                created_by="U1", created_at=0.0, ended_at=None, channel="C1", thread_ts="1.0", tag="7-ab",
                seen_pids={4242: 1.0}, job_id="12", nodes=["n1", "n2"])
    base.update(kw)
    return Launch(**base)


def test_rank_tags_round_trip_and_leave_other_tags_alone():
    assert rank_tag("7-ab", 0) == "7-ab"
    assert rank_tag("7-ab", 3) == "7-ab-r3"
    assert base_tag(rank_tag("7-ab", 3)) == "7-ab"
    assert base_tag("7-ab") == "7-ab"
    assert base_tag("7-ab-rx") == "7-ab-rx"  # not a rank suffix
    assert rank_tag("", 2) == ""


def test_rank_logs_sit_beside_the_launchs_log():
    assert rank_log("/logs/gpubot-two-7-ab.log", 0) == "/logs/gpubot-two-7-ab.log"
    assert rank_log("/logs/gpubot-two-7-ab.log", 2) == "/logs/gpubot-two-7-ab-rank2.log"
    assert rank_log("/logs/server", 1) == "/logs/server-rank1"
    assert rank_log("/logs/.hidden", 1) == "/logs/.hidden-rank1"
    assert rank_log(None, 1) is None
    assert rank_log_parts("/a/b.c.log") == ("/a/b.c-rank", ".log")


def test_rank_view_of_a_slurm_job_keeps_no_login_node_pids():
    la = _launch()
    r0 = rank_view(la, 0, "n1")
    assert (r0.host, r0.tag, r0.port, r0.pid, r0.seen_pids) == ("n1", "7-ab", 30000, None, {})
    r1 = rank_view(la, 1, "n2")
    assert (r1.host, r1.tag, r1.port, r1.log_path) == ("n2", "7-ab-r1", None, "/logs/gpubot-two-7-ab-rank1.log")
    assert r1.id == la.id and r1.job_id is None and r1.nodes == []


def test_rank_view_of_a_multi_host_launch_keeps_rank_0s_pid():
    la = _launch(job_id=None, nodes=["a", "b"], host="a")
    assert rank_view(la, 0, "a").pid == 4242 and rank_view(la, 0, "a").seen_pids == {4242: 1.0}
    assert rank_view(la, 1, "b").pid is None


def test_the_rank_that_is_gone_is_odd_before_a_silent_one():
    looks = [NodeLook(0, "n1", True, silent_s=50), NodeLook(1, "n2", False, silent_s=1)]
    odd, why = odd_rank(looks)
    assert odd.rank == 1 and "gone" in why


def test_the_rank_silent_first_is_odd_only_with_a_clear_gap():
    looks = [NodeLook(0, "n1", True, silent_s=10.2), NodeLook(1, "n2", True, silent_s=30.0)]
    odd, why = odd_rank(looks)
    assert odd.node == "n2" and "silent first" in why and "19s" in why
    assert odd_rank([NodeLook(0, "n1", True, silent_s=10.2), NodeLook(1, "n2", True, silent_s=10.5)]) is None
    assert odd_rank([NodeLook(0, "n1", True, silent_s=10), NodeLook(1, "n2", True, silent_s=None)]) is None
    assert odd_rank([NodeLook(0, "n1", True, silent_s=10)]) is None


def test_an_unreadable_node_is_named():
    odd, why = odd_rank([NodeLook(0, "n1", True), NodeLook(1, "n2", None, error="timed out")])
    assert odd.rank == 1 and "could not be read" in why
    assert "could not be read (timed out)" in NodeLook(1, "n2", None, error="timed out").line()


def _verdict(name: str) -> Verdict:
    return Verdict(name, "weight_loading", ["- log silent for 40s"], ["py-spy dump"], "The launch went silent.")


def test_weigh_nodes_names_the_odd_rank_with_its_node_and_keeps_rank_0s_evidence():
    looks = [NodeLook(0, "n1", True, silent_s=5, last_line="Waiting for 1 other node(s)", gpu_util=0.0),
             NodeLook(1, "n2", True, silent_s=40, last_line="Load weight begin")]
    v = weigh_nodes(_verdict("silent_hang"), looks)
    assert v.verdict == "silent_hang"
    assert "Odd one out: rank 1 on node n2" in v.summary
    assert v.evidence[0].startswith("rank 0 on n1: running") and "GPU 0 %" in v.evidence[0]
    assert v.evidence[1].startswith("rank 1 on n2: running, log silent for 40s")
    assert v.evidence[-1] == "- log silent for 40s"
    assert v.next_steps[0].startswith("Look at node n2 (rank 1)")


def test_a_rank_gone_while_rank_0_looks_ready_is_a_crash():
    looks = [NodeLook(0, "n1", True), NodeLook(1, "n2", False)]
    v = weigh_nodes(_verdict("ready"), looks)
    assert v.verdict == "crashed" and "rank 1 on node n2 is gone" in v.summary


def test_ready_stays_ready_and_one_rank_is_left_alone():
    looks = [NodeLook(0, "n1", True, silent_s=1), NodeLook(1, "n2", True, silent_s=30)]
    assert weigh_nodes(_verdict("ready"), looks).summary == "The launch went silent."
    single = _verdict("silent_hang")
    assert weigh_nodes(single, [NodeLook(0, "n1", True)]) is single


def test_a_ranks_gpu_holders_are_its_launchs():
    from bot.core.lifecycle import attribute_holders
    from bot.core.models import GpuProcess, GpuSection, ProcessInfo

    la = _launch(job_id=None, host="a", nodes=["a", "b"], pid=10, tag="7-ab")
    procs = [ProcessInfo(10, args="sh wrapper"), ProcessInfo(11, ppid=10, args="python serve --node-rank 0"),
             ProcessInfo(21, args="python serve --node-rank 1"), ProcessInfo(31, args="python other")]
    gpu = GpuSection(ok=True, processes=[GpuProcess(pid=11, gpu_index=0), GpuProcess(pid=21, gpu_index=1),
                                         GpuProcess(pid=31, gpu_index=2)])
    holders = attribute_holders(gpu, procs, [la], {10: "7-ab", 11: "7-ab", 21: "7-ab-r1", 31: "9-zz"})
    assert [(h.pid, h.owner, h.launch_id) for h in holders][:2] == [(11, "two#7", 7), (21, "two#7", 7)]
    assert holders[2].owner == "foreign" and holders[2].launch_id is None
