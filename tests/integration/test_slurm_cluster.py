"""Slurm's side of a launch against a real two-node cluster on this host (tests/support/slurm.py): the batch script
of bot.core.slurm submitted with bot.adapters.slurm over the bot's local executor runs one task per node with the
rank variables and its GPUs; a job that cannot get GPUs is pending with Slurm's reason; scancel stops every step
on both nodes; a failing command gets its verdict from Slurm's state and exit code; commands reach each node of a
running job as overlapping steps (`srun --overlap --jobid`), and a cluster without accounting says so to sacct."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid

import pytest

from bot.adapters.remote import LocalExecutor, RemoteError
from bot.adapters.slurm import SlurmClient, SrunExecutor
from bot.core.slurm import SbatchSpec, SlurmError, batch_script, ended_verdict, pending_text
from tests.support.procs import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]


@pytest.fixture
def cluster(slurm_cluster):
    """This module's two-node cluster (tests/conftest.py)."""
    return slurm_cluster


@pytest.fixture
def client(cluster):
    yield SlurmClient(LocalExecutor("login"), conf=str(cluster.conf))
    cluster.cancel_all()


def _marker_alive(marker: str) -> bool:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0


async def _state(client, job_id, *states):
    seen = []

    async def reached():
        job = await client.show(job_id)
        seen[:] = [job]
        return job if job is not None and job.state in states else None

    try:
        return await wait_until(reached, what=f"job {job_id} {'/'.join(states)}")
    except AssertionError as e:
        job = seen[0] if seen else None
        out = job.stdout if job is not None else None
        text = open(out, errors="replace").read()[-800:] if out and os.path.exists(out) else ""
        raise AssertionError(f"{e}; last seen: {job and (job.state, job.reason, job.fields.get('ExitCode'))}; "
                             f"its output: {text!r}") from None


def _steps(cluster, job_id: str) -> list[str]:
    """The ids of the job's steps Slurm runs now (`squeue -s`)."""
    out = cluster.run("squeue", "-s", "-h", "-j", job_id, "-o", "%i").stdout
    return sorted(x.strip() for x in out.splitlines() if x.strip())


async def _reasoned(client, job_id):
    job = await client.show(job_id)
    return job if job is not None and job.pending and job.reason else None


async def test_a_two_node_job_runs_one_rank_per_node_and_scancel_stops_both(client, cluster, tmp_path):
    marker = f"gpubot-slurm-{uuid.uuid4().hex[:8]}"
    command = ("sh -c 'echo rank=$GPUBOT_NODE_RANK nnodes=$GPUBOT_NNODES master=$GPUBOT_MASTER_ADDR "
               f"port=$GPUBOT_MASTER_PORT cvd=$CUDA_VISIBLE_DEVICES model=$MODEL; exec sh -c \"sleep 300; true\" "
               f"{marker}'")  # the marker is the waiting shell's $0: pgrep finds it on either node
    spec = SbatchSpec(nodes=2, gpus_per_node=2, partition="gpu", time="10:00")
    script = batch_script(spec, command, job_name="big#1", output=str(tmp_path / "big-%j-%N.log"),
                          env={"MODEL": "/data/m x"}, master_port=29500)
    job_id = await client.submit(script)
    job = await _state(client, job_id, "RUNNING")
    assert job.nodes == ("n1", "n2") and job.source == "squeue -j"  # its state from squeue, which never reads names
    assert "JobName=big#1 " in (await client.show_text(job_id) or "")

    async def both_wrote():  # the step's output goes to the batch host's file, both ranks' lines
        lines = [x for p in tmp_path.glob(f"big-{job_id}-*.log") for x in p.read_text().splitlines()]
        texts = [x for x in lines if x.startswith("rank=")]
        return texts if len(texts) == 2 else None

    texts = await wait_until(both_wrote, what="both ranks' first line")
    assert len(list(tmp_path.glob(f"big-{job_id}-*.log"))) == 1  # %N: the batch host's name
    assert sorted(t.split()[0] for t in texts) == ["rank=0", "rank=1"]
    for t in texts:
        # the master is the first node's address as Slurm reaches it (its NodeAddr; here both are 127.0.0.1)
        assert "nnodes=2 master=127.0.0.1 port=29500 cvd=0,1 model=/data/m x" in t, t

    # no GPUs left: a second job waits, and Slurm says why
    second = await client.submit(batch_script(SbatchSpec(nodes=1, gpus_per_node=2), "true", job_name="wait#2",
                                              output=str(tmp_path / "wait-%j.log"), env={}, master_port=1))
    pending = await _state(client, second, "PENDING")
    if pending.reason is None:  # the scheduler has not looked at it yet
        pending = await wait_until(lambda: _reasoned(client, second), what="Slurm's reason for the wait")
    assert pending_text(pending).startswith(f"PENDING ({pending.reason}")

    await client.cancel(job_id)
    ended = await _state(client, job_id, "CANCELLED")
    assert ended_verdict(ended)[0] == "cancelled"
    await wait_until(lambda: not _marker_alive(marker), what="no step left on either node")
    await _state(client, second, "RUNNING", "COMPLETED", "COMPLETING")  # it got the GPUs once they were free


async def test_a_failing_command_is_said_from_slurm_s_state_and_exit_code(client, tmp_path):
    job_id = await client.submit(batch_script(SbatchSpec(nodes=1), "sh -c 'exit 3'", job_name="bad#3",
                                              output=str(tmp_path / "bad-%j.log"), env={}, master_port=1))
    job = await _state(client, job_id, "FAILED")
    assert ended_verdict(job) == ("crashed", "the job's command failed: Slurm says FAILED (NonZeroExitCode), "
                                             "exit code 3")


async def test_slurm_s_refusals_are_said_in_its_words(client, tmp_path):
    nowhere = batch_script(SbatchSpec(nodes=1, partition="nope"), "true", job_name="x#4",
                           output=str(tmp_path / "x-%j.log"), env={}, master_port=1)
    with pytest.raises(SlurmError, match="sbatch refused the job: sbatch: error: invalid partition specified: nope"):
        await client.submit(nowhere)
    huge = await client.submit(batch_script(SbatchSpec(nodes=3, gpus_per_node=2), "true", job_name="huge#5",
                                            output=str(tmp_path / "x-%j.log"), env={}, master_port=1))
    never = await wait_until(lambda: _reasoned(client, huge), what="Slurm's reason for the wait")
    assert pending_text(never) == ("PENDING (PartitionConfig: it asks for more than the partition has (nodes, GPUs): "
                                   "it will never start)")
    assert await client.show("999999") is None
    assert client.accounting_on is False  # sacct: "Slurm accounting storage is disabled" (this cluster has no slurmdbd)
    assert await client.accounting("999999") is None
    await client.cancel("999999")  # a job Slurm no longer knows is not an error


async def test_commands_reach_each_node_of_a_running_job_as_overlapping_steps(client, cluster, tmp_path):
    marker = f"gpubot-overlap-{uuid.uuid4().hex[:8]}"
    command = f"sh -c 'exec sh -c \"sleep 300; true\" {marker}'"
    job_id = await client.submit(batch_script(SbatchSpec(nodes=2, gpus_per_node=1), command, job_name="ov#6",
                                              output=str(tmp_path / "ov-%j.log"), env={}, master_port=1))
    await _state(client, job_id, "RUNNING")
    await wait_until(lambda: _marker_alive(marker), what="the job's step running")
    login = LocalExecutor("login")
    for node in ("n1", "n2"):
        ex = SrunExecutor(login, job_id, node, conf=str(cluster.conf))
        res = await ex.run("echo $SLURMD_NODENAME $SLURM_JOB_ID; cat", input=b"from stdin\n", timeout_s=30)
        assert res.exit_status == 0, res.stderr
        assert res.stdout.decode().split("\n")[:2] == [f"{node} {job_id}", "from stdin"]
        # the overlapping step sees the job's own processes (a probe's ps finds the ranks)
        ps = await ex.run_script(f"ps -eo args | grep -c '[{marker[0]}]{marker[1:]}'", timeout_s=30)
        assert int(ps.stdout.decode().strip()) >= 1, ps
        # a command that fails is the command's failure (its exit status and stderr), not srun's
        failed = await ex.run("echo no such tool >&2; exit 127", timeout_s=30)
        assert failed.exit_status == 127 and failed.stderr == b"no such tool\n", failed
        # even when its own words look like srun's
        odd = await ex.run("echo out; echo 'srun: error: cannot open /data/x' >&2; exit 2", timeout_s=30)
        assert odd.exit_status == 2 and odd.stdout == b"out\n", odd
        assert odd.stderr == b"srun: error: cannot open /data/x\n", odd
    # probe scripts go to one long-lived step per node (its probe agent): a job checked for weeks keeps its steps
    steps_before = _steps(cluster, job_id)
    ex = SrunExecutor(login, job_id, "n2", conf=str(cluster.conf))
    for _ in range(4):
        res = await ex.run_script("echo $SLURMD_NODENAME; echo err >&2; exit 3", timeout_s=30)
        assert res.exit_status == 3 and res.stdout == b"n2\nerr\n", res
    assert ex.agent_starts == 1 and len(ex.helper_pids()) == 1
    assert len(_steps(cluster, job_id)) == len(steps_before) + 1, (steps_before, _steps(cluster, job_id))
    # an agent whose step ended (here: its shell killed on the node) is replaced by a new one
    os.kill(next(iter(ex.helper_pids())), signal.SIGKILL)
    await wait_until(lambda: len(_steps(cluster, job_id)) == len(steps_before), what="the agent's step ended")
    assert (await ex.run_script("echo again", timeout_s=30)).stdout == b"again\n"
    assert ex.agent_starts in (1, 2)  # 2, unless the script went as a step of its own (the old agent seen ending)
    assert (await ex.run_script("echo again", timeout_s=30)).stdout == b"again\n" and ex.agent_starts == 2
    await ex.close()
    await wait_until(lambda: _steps(cluster, job_id) == steps_before, what="the agent's step ended")
    with pytest.raises(RemoteError, match="srun could not run on n3"):
        await SrunExecutor(login, job_id, "n3", conf=str(cluster.conf)).run("true", timeout_s=30)
    kept = SrunExecutor(login, job_id, "n1", conf=str(cluster.conf))
    assert (await kept.run_script("echo up", timeout_s=30)).stdout == b"up\n" and kept.agent_starts == 1
    await client.cancel(job_id)
    await _state(client, job_id, "CANCELLED")
    with pytest.raises(RemoteError, match=f"in job {job_id}"):  # the job ended: no step can start
        await SrunExecutor(login, job_id, "n1", conf=str(cluster.conf)).run("true", timeout_s=30)
    with pytest.raises(RemoteError, match=f"job {job_id}"):  # nor can its agent answer (its step ended with it)
        await kept.run_script("echo up", timeout_s=30)
    assert not kept.helper_pids()
    await wait_until(lambda: not _marker_alive(marker), what="no step left")
