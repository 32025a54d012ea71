"""Launches through Slurm, as chat transcripts against a real two-node cluster on this host (tests/support/slurm.py):
`/launch` of a Slurm variant of the demo server submits a job on the login node (here the bot's own machine), the
thread shows Slurm's state (PENDING with its reason; RUNNING on its nodes), the watch follows the job and every node
(nodes n1 and n2 are hosts of the config, probed like any host), `/kill` is scancel with nothing left, a job Slurm
ends at its time limit gets a verdict that says so, `/relaunch` resubmits in the same thread; on two nodes, a rank
that hangs on node 2 is named with its node, also where the nodes are no hosts of the config (each probed through
the login node with `srun --overlap --jobid`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bot.config import Config
from bot.core.models import HostFailure, LaunchState
from bot.demo.fakegpu import install_fake_gpu
from tests.support.alerts import alerts, full_text, wait_alert, wait_checks
from tests.support.builders import FAST_WATCH, OPERATOR
from tests.support.bundles import bundle_files
from tests.support.procs import FAKE_SERVER, free_port, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

COMMAND = ("{{ python }} {{ server }} --workers 1 --gpus 0 --port {{ port }} --mode {{ mode }} --load-s {{ load_s }}"
           " --gpu-state {{ state }} --nnodes {{ nnodes }} --node-rank {{ node_rank }}"
           " --dist-init-addr {{ master_addr }}:{{ master_port }} --hang-node {{ hang_node }}"
           " --fail-node {{ fail_node }}")


@pytest.fixture
def cluster(slurm_cluster):
    """This module's two-node cluster (tests/conftest.py)."""
    return slurm_cluster


@pytest.fixture
def slurm_config(cluster, tmp_path) -> Config:
    """Host `login` (the bot's machine, Slurm's login node), nodes n1 and n2 as local hosts with a fake nvidia-smi,
    and Slurm variants of the fake server: `one` (1 node, 2 GPUs), `two` (2 nodes, one rank each), `short` (one
    with a 1-minute time limit)."""
    return _config(cluster, tmp_path, nodes_are_hosts=True)


def _config(cluster, tmp_path, *, nodes_are_hosts: bool) -> Config:
    """slurm_config; without `nodes_are_hosts`, `login` alone (with the fake nvidia-smi) and no host for a node."""
    gpu = install_fake_gpu(tmp_path / "fakegpu", gpu_count=2)
    logs = tmp_path / "logs"
    logs.mkdir()
    logs.chmod(0o777)
    node = {"local": True, "nvidia_smi": str(gpu.bin_dir / "nvidia-smi"), "use_nvml": False, "log_dirs": [str(logs)],
            "systemd": "off", "cgroup": "off"}
    one = {
        "host": "login", "command": COMMAND, "nodes": 1, "gpus_per_node": 2, "port": free_port(),
        "master_port": free_port(),
        "params": {"python": {"type": "path", "default": sys.executable},
                   "server": {"type": "path", "default": FAKE_SERVER},
                   "mode": {"type": "str", "default": "ready", "choices": ["ready", "hang", "crash", "oom"]},
                   "load_s": {"type": "float", "default": 0.3},
                   "state": {"type": "path", "default": str(gpu.state_dir)},
                   "hang_node": {"type": "int", "default": -1},
                   "fail_node": {"type": "int", "default": 0}},
    }
    login = {"local": True, "runner": "slurm", "slurm_conf": str(cluster.conf), "log_dirs": [str(logs)]}
    if not nodes_are_hosts:
        login["nvidia_smi"] = node["nvidia_smi"]
    return Config.model_validate({
        "hosts": {"login": login, "n1": node, "n2": dict(node)} if nodes_are_hosts else {"login": login},
        "variants": {"one": one,
                     "two": {"extends": "one", "nodes": 2, "gpus_per_node": 1, "port": free_port(),
                             "master_port": free_port()},
                     "short": {"extends": "one", "time": "1"},
                     # rank 0 loads for longer than the grace of weight loading would allow elsewhere: its log goes
                     # silent well after the hung rank's
                     "two_slow": {"extends": "two", "watch": {"phase_grace_s": {"weight_loading": 5}}}},
        "state_dir": str(tmp_path / "state"),
        "permissions": {"operators": [OPERATOR]},
        "lifecycle": {"kill_grace_s": 3, "release_timeout_s": 10},
    })


@pytest.fixture
async def slurm_bot(make_bot, slurm_config, cluster):
    bot = await make_bot(slurm_config, watch=True, watch_policy=FAST_WATCH)
    yield bot
    cluster.cancel_all()


def _fake_servers(cluster) -> list[int]:
    """Pids of the fake servers the cluster's jobs run."""
    out = []
    for pid in cluster.processes():
        try:
            if FAKE_SERVER.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            continue
    return out


async def test_one_node_job_becomes_ready_and_kill_leaves_nothing(slurm_bot, cluster):
    bot = slurm_bot
    said = await bot.chat.say("/launch one")
    assert "Submitted one#1 to Slurm on login as job" in said.text, said.text
    la = bot.launch(1)
    assert la.job_id and la.job_id in cluster.jobs()
    la = await wait_alert(bot, 1, {"ready"}, timeout=200)
    assert la.nodes and la.nodes[0] in ("n1", "n2")
    root = bot.chat.posts[0]
    assert f"Slurm job {la.job_id}" in root.text and la.nodes[0] in root.text, root.text
    (ready,) = alerts(bot, "ready")
    assert ready.thread_ts == la.thread_ts
    # a Slurm launch has no process group of its own: no `pgid=None` in a probe's header or a button's confirm
    probed = await bot.chat.say("/probe 1")
    assert "Probe of" in probed.text and "None" not in probed.text.splitlines()[0], probed.text
    # the GPUs Slurm gave the job are the ones the rank sees
    log_text = Path(la.log_path).read_text()
    assert "fired up and ready to roll" in log_text
    killed = await bot.chat.say("/kill 1 --yes")
    assert f"Killed one#1: Slurm job {la.job_id} cancelled (scancel) and ended" in killed.text, killed.text
    assert "0 processes signalled" not in killed.text, killed.text
    await wait_until(lambda: bot.launch(1).state == LaunchState.KILLED, what="one#1 killed")
    await wait_until(lambda: not cluster.jobs(), what="the queue empty")
    await wait_until(lambda: not _fake_servers(cluster), what="no fake server left")


async def test_pending_job_is_shown_with_slurms_reason_never_a_hang(slurm_bot, cluster):
    bot = slurm_bot
    # every GPU of the cluster taken by someone else's job
    held = cluster.run("sbatch", "--parsable", "--nodes=2", "--gres=gpu:2", "--output=/dev/null", "--wrap", "sleep 600")
    assert held.returncode == 0, held.stderr
    said = await bot.chat.say("/launch one")
    assert "PENDING" in said.text, said.text
    await wait_until(lambda: "Resources" in (bot.launch(1).state_detail or ""), timeout=60,
                     what="Slurm's reason on the launch")
    notice = await wait_until(lambda: next((p for p in bot.chat.posts if "waits in Slurm's queue" in p.text), None),
                              what="the pending notice")
    assert "Resources" in notice.text and "Not a hang" in notice.text
    la = bot.launch(1)
    assert la.state == LaunchState.RUNNING and la.alert_state in (None, "")
    assert not alerts(bot, "silent_hang")
    killed = await bot.chat.say("/kill 1 --yes")
    assert bot.launch(1).state == LaunchState.KILLED, killed.text
    await wait_until(lambda: la.job_id not in cluster.jobs(), what="the pending job gone from the queue")


async def test_hang_is_alerted_with_the_jobs_evidence_then_relaunch_resubmits(slurm_bot, cluster):
    bot = slurm_bot
    await bot.chat.say("/launch one mode=hang")
    la = await wait_alert(bot, 1, {"silent_hang"}, timeout=200)
    (hang,) = alerts(bot, "silent_hang")
    text = full_text(hang)
    assert "Load weight end" in text, text
    assert f"`squeue -j {la.job_id}`: JobState=RUNNING" in text, text  # the job's evidence
    confirm = str(hang.blocks)  # its Kill button's confirm names no process group a Slurm launch does not have
    assert "Stops every process of one#1 on login" in confirm and "process group None" not in confirm, confirm
    assert hang.thread_ts == la.thread_ts
    said = await bot.chat.say("!relaunch mode=ready", thread=la.thread_ts)
    assert "Submitted one#2" in said.text, said.text
    new = bot.launch(2)
    assert new.relaunch_of == 1 and new.thread_ts == la.thread_ts and new.job_id != la.job_id
    assert bot.launch(1).state == LaunchState.KILLED
    await wait_alert(bot, 2, {"ready"}, timeout=200)
    assert la.job_id not in cluster.jobs()


async def test_time_limit_gets_its_own_verdict(slurm_bot, cluster):
    bot = slurm_bot
    await bot.chat.say("/launch short")
    await wait_alert(bot, 1, {"ready"}, timeout=200)
    la = await wait_alert(bot, 1, {"time_limit"}, timeout=180)  # Slurm ends it a minute after it started
    assert la.state == LaunchState.FAILED
    (posted,) = alerts(bot, "time_limit")
    assert "time limit" in posted.text and "TIMEOUT" in full_text(posted), full_text(posted)
    await wait_until(lambda: not _fake_servers(cluster), what="no fake server left")


async def test_two_nodes_become_ready_and_a_hung_rank_is_named_with_its_node(slurm_bot, cluster):
    bot = slurm_bot
    said = await bot.chat.say("/launch two")
    assert "Submitted two#1" in said.text, said.text
    la = await wait_alert(bot, 1, {"ready"}, timeout=200)
    assert la.nodes == ["n1", "n2"]
    rank1 = Path(la.log_path.replace(".log", "-rank1.log"))
    assert "Node 1 joined node 0" in rank1.read_text()
    await bot.chat.say("/kill 1 --yes")
    await wait_until(lambda: not cluster.jobs() and not _fake_servers(cluster), what="both nodes' steps stopped")

    await bot.chat.say("/launch two_slow hang_node=1 load_s=2.5")
    la = await wait_alert(bot, 2, {"silent_hang"}, timeout=200)
    (hang,) = alerts(bot, "silent_hang")
    text = full_text(hang)
    assert "rank 1 on node n2" in text, text
    assert "rank 0 on n1" in text and "rank 1 on n2" in text
    await bot.chat.say("/kill 2 --yes")
    assert bot.launch(2).state == LaunchState.KILLED
    await wait_until(lambda: not cluster.jobs() and not _fake_servers(cluster), what="both nodes' steps stopped")


async def test_rank_0_dying_of_a_cuda_oom_is_oom_naming_its_rank_and_node_whatever_slurm_records(slurm_bot, cluster):
    bot = slurm_bot
    await bot.chat.say("/launch two mode=oom")
    la = await wait_alert(bot, 1, {"oom"}, timeout=200)
    await wait_until(lambda: not bot.launch(1).live, 120, what="the launch ended")
    (posted,) = alerts(bot, "oom")  # one alert, not a second one when Slurm ended the job
    text = full_text(posted)
    assert "Rank 0 on node n1" in text or "rank 0 on node n1" in text, text
    assert "CUDA out of memory" in text, text
    la = bot.launch(1)
    assert la.state == LaunchState.FAILED and la.alert_state == "oom", (la.state, la.alert_state)
    await wait_until(lambda: not cluster.jobs() and not _fake_servers(cluster), what="both nodes' steps stopped")
    if "JobState=" in text:  # Slurm's word is evidence, whatever exit it gave the ranks it ended; the alert may come
        # from rank 0's own log while Slurm still ends the job: the verdict is rank 0's OOM either way (asserted above)
        assert any(f"JobState={s}" in text for s in ("RUNNING", "COMPLETING", "FAILED", "COMPLETED")), text


async def test_rank_1_dying_of_a_cuda_oom_on_its_own_is_oom_naming_rank_1_not_slurm_s_exit(slurm_bot, cluster):
    """Rank 1 (node n2) runs out of GPU memory while rank 0 still runs; srun --kill-on-bad-exit then ends rank 0
    (SIGTERM): whichever the check sees first (rank 1 gone while rank 0 runs, or the job Slurm ended), the thread
    says rank 1's OOM on n2, once, never Slurm's bare exit code or `crashed`."""
    bot = slurm_bot
    await bot.chat.say("/launch two mode=oom fail_node=1")
    await wait_alert(bot, 1, {"oom"}, timeout=200)
    await wait_until(lambda: not bot.launch(1).live, 120, what="the launch ended")
    (posted,) = alerts(bot, "oom")
    text = full_text(posted)
    assert "Rank 1 on node n2" in text and "CUDA out of memory" in text, text
    assert not alerts(bot, "crashed"), [p.text for p in alerts(bot, "crashed")]
    la = bot.launch(1)
    assert la.state == LaunchState.FAILED and la.alert_state == "oom", (la.state, la.alert_state)
    await wait_until(lambda: not cluster.jobs() and not _fake_servers(cluster), what="both nodes' steps stopped")


async def test_rank_0_s_node_failing_a_look_after_the_job_ended_still_gives_rank_0_s_own_verdict(
        slurm_bot, cluster, monkeypatch):
    """The last look at rank 0 of a job Slurm ended decides between rank 0's own verdict (its OOM) and Slurm's bare
    `FAILED`: a node that does not answer that look once (a probe timed out on a busy node) is looked at again."""
    bot = slurm_bot
    launches = bot.runtime.launches
    real = launches.probe_launch
    failed: list[str] = []

    async def once_unanswered(la, *args, **kwargs):
        if not failed and la.host == "n1" and not cluster.jobs():  # the first look at rank 0 once the job is gone
            failed.append(la.host)
            return HostFailure(la.host, "probe timed out after 20s (injected)")
        return await real(la, *args, **kwargs)

    monkeypatch.setattr(launches, "probe_launch", once_unanswered)
    await bot.chat.say("/launch two mode=oom")
    await wait_alert(bot, 1, {"oom"}, timeout=200)
    await wait_until(lambda: not bot.launch(1).live, 120, what="the launch ended")
    (posted,) = alerts(bot, "oom")
    assert "rank 0 on node n1" in full_text(posted).lower(), full_text(posted)
    assert failed == ["n1"], failed  # the injected failure was met (else this test tests nothing)
    await wait_until(lambda: not cluster.jobs() and not _fake_servers(cluster), what="both nodes' steps stopped")


async def _requeued_then_ready_again(bot, cluster, la, *, cause: str | None, release=None):
    """After Slurm requeued `la`'s job: the requeue told once (naming `cause` when given), the root showing it
    pending, and once Slurm runs it again (its begin time moved to now; `release` first, when given) the job's
    running again told once and a fresh `ready`."""
    notice = await bot.chat.wait_post(lambda p: "Slurm requeued job" in p.text, 120, what="the requeue notice")
    assert notice.thread_ts == la.thread_ts, notice
    if cause is not None:
        assert cause in notice.text, notice.text
    await wait_until(lambda: "PENDING" in bot.chat.posts[0].text, 60, what="the root showing the requeued job")
    print("ROOT while requeued:", bot.chat.posts[0].text)
    row = bot.launch(la.id)
    assert row.ready_at is None and row.alert_state is None and row.job_restarts == 1, row
    if release is not None:
        release()
    moved = cluster.run("scontrol", "update", f"JobId={la.job_id}", "StartTime=now")
    assert moved.returncode == 0, moved.stderr
    await wait_until(lambda: len(alerts(bot, "ready")) == 2, 300, what=lambda: (
        f"a fresh ready after the requeue (Slurm's jobs: {cluster.jobs()}; the launch: {bot.launch(la.id)})"))
    again = [p for p in bot.chat.posts if "again (after 1 requeue)" in p.text]
    assert len(again) == 1 and again[0].thread_ts == la.thread_ts, [p.text for p in again]
    assert len([p for p in bot.chat.posts if "Slurm requeued job" in p.text]) == 1
    assert not alerts(bot, "crashed") and not alerts(bot, "node_fail") and not alerts(bot, "silent_hang")
    row = bot.launch(la.id)
    assert row.state == LaunchState.RUNNING and row.alert_state == "ready" and row.ready_at is not None, row
    root = bot.chat.posts[0].text
    assert "ready" in root.splitlines()[0] and "on n1, n2" in root and "PENDING" not in root, root


async def test_scontrol_requeue_of_a_ready_job_is_told_then_a_fresh_ready(slurm_bot, cluster):
    bot = slurm_bot
    await bot.chat.say("/launch two")
    la = await wait_alert(bot, 1, {"ready"}, timeout=200)
    requeued = cluster.run("scontrol", "requeue", la.job_id)
    assert requeued.returncode == 0, requeued.stderr
    await _requeued_then_ready_again(bot, cluster, la, cause="no node of it is out of service")
    await bot.chat.say("/kill 1 --yes")
    await wait_until(lambda: not cluster.jobs() and not _fake_servers(cluster), what="the job's steps stopped")


async def test_a_node_set_down_under_a_ready_job_is_told_with_the_node_then_a_fresh_ready(slurm_bot, cluster):
    bot = slurm_bot
    await bot.chat.say("/launch two")
    la = await wait_alert(bot, 1, {"ready"}, timeout=200)
    down = cluster.run("scontrol", "update", "NodeName=n2", "State=DOWN", "Reason=gpubot-test-psu")
    assert down.returncode == 0, down.stderr
    try:
        await _requeued_then_ready_again(
            bot, cluster, la, cause="n2 is down (Slurm's reason: `gpubot-test-psu`)",
            release=lambda: cluster.run("scontrol", "update", "NodeName=n2", "State=RESUME"))
    finally:
        cluster.run("scontrol", "update", "NodeName=n2", "State=RESUME")
    await bot.chat.say("/kill 1 --yes")
    await wait_until(lambda: not cluster.jobs() and not _fake_servers(cluster), what="the job's steps stopped")


#: How many launch-then-outside-scancel rounds the test below runs (10 were run for issue 45: GPUBOT_SCANCEL_RUNS=10).
SCANCEL_RUNS = int(os.environ.get("GPUBOT_SCANCEL_RUNS", "3"))


@pytest.mark.timeout(120 + 90 * SCANCEL_RUNS)
async def test_an_outside_scancel_of_a_ready_two_node_job_is_cancelled_never_crashed(slurm_bot, cluster):
    """Someone cancels the job with `scancel` (not `/kill`): Slurm ends both ranks, rank 1's may be seen gone
    before Slurm's state says CANCELLED; each round is posted `cancelled`, never `crashed` or another failure."""
    bot = slurm_bot
    for k in range(1, SCANCEL_RUNS + 1):
        await bot.chat.say("/launch two")
        la = await wait_alert(bot, k, {"ready"}, timeout=200)
        cancelled = cluster.run("scancel", la.job_id)
        assert cancelled.returncode == 0, cancelled.stderr
        la = await wait_alert(bot, k, {"cancelled", "crashed", "oom", "nccl_error", "unknown", "exited"},
                              timeout=120)
        assert la.alert_state == "cancelled", (k, la.alert_state, [full_text(p) for p in alerts(bot)][-1])
        await wait_until(lambda: not cluster.jobs() and not _fake_servers(cluster), what="the job's steps stopped")
    assert len(alerts(bot, "cancelled")) == SCANCEL_RUNS and not alerts(bot, "crashed")


async def test_a_job_name_planted_with_slurm_fields_and_newlines_changes_nothing(make_bot, slurm_config, cluster):
    """Anyone on the job's account (the job itself too) may rename it: a name holding `JobState=COMPLETED`,
    `ExitCode=0:0`, a forged squeue line and newlines is never read as the job's state; the watch goes on and
    nothing is posted."""
    bot = await make_bot(slurm_config, watch=True, watch_policy=FAST_WATCH.model_copy(update={"serving_interval_s": 1}))
    await bot.chat.say("/launch one")
    la = await wait_alert(bot, 1, {"ready"}, timeout=200)
    planted = (f"x JobState=COMPLETED ExitCode=0:0 Reason=None\nJobId={la.job_id} JobState=COMPLETED ExitCode=0:0\n"
               f"{la.job_id}|COMPLETED|None|0|n1|0:01|UNLIMITED|/x")
    renamed = cluster.run("scontrol", "update", f"JobId={la.job_id}", f"JobName={planted}")
    assert renamed.returncode == 0, renamed.stderr
    shown = cluster.run("scontrol", "show", "job", "-o", la.job_id).stdout
    assert "JobState=COMPLETED" in shown and "JobState=RUNNING" in shown, shown  # the trap is set
    posted = len(alerts(bot))
    await wait_checks(bot, 1, more=4)
    la = bot.launch(1)
    assert la.live and la.state == LaunchState.RUNNING and la.alert_state == "ready", (la.state, la.alert_state)
    assert len(alerts(bot)) == posted, [p.text for p in alerts(bot)][posted:]
    assert bot.runtime.launches.slurm.slurm_calls("login") >= 1  # the checks read the job through squeue
    await bot.chat.say("/kill 1 --yes")
    assert bot.launch(1).state == LaunchState.KILLED
    await wait_until(lambda: not cluster.jobs() and not _fake_servers(cluster), what="the job's step stopped")
    cluster.cancel_all()


async def test_nodes_that_are_no_hosts_are_probed_through_slurm(make_bot, cluster, tmp_path):
    bot = await make_bot(_config(cluster, tmp_path, nodes_are_hosts=False), watch=True, watch_policy=FAST_WATCH)
    try:
        await bot.chat.say("/launch two_slow hang_node=1 load_s=2.5")
        la = await wait_alert(bot, 1, {"silent_hang"}, timeout=200)
        assert la.nodes == ["n1", "n2"]
        (hang,) = alerts(bot, "silent_hang")
        text = full_text(hang)
        assert "rank 1 on node n2" in text, text  # the odd one, named with its node
        # both ranks were read on their nodes (srun --overlap), not only followed through scontrol
        assert "rank 0 on n1: running" in text and "rank 1 on n2: running" in text, text
        assert "could not be read" not in text and "srun could not run" not in text, text
        # `!bundle`: each node's files read through srun, rank 1's in node-n2/, with the job as scontrol says it
        answer = await bot.chat.say("!bundle", thread=la.thread_ts)
        assert answer.audit == "ok", answer.text
        ((_name, data),) = answer.post.files
        files = bundle_files(data)
        assert {"server.log", "ps.txt", "node-n2/ps.txt", "ranks.txt", "scontrol.txt"} <= set(files), set(files)
        assert b"Init torch distributed begin" in files["node-n2/server.log"], files["node-n2/server.log"]
        await bot.chat.say("/kill 1 --yes")
        assert bot.launch(1).state == LaunchState.KILLED
        await wait_until(lambda: not cluster.jobs() and not _fake_servers(cluster), what="both nodes' steps stopped")
    finally:
        cluster.cancel_all()
