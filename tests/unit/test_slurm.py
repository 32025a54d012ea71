"""Slurm's side of a launch (bot.core.slurm, bot.core.hostlist): real `scontrol show job -o` lines of Slurm 22.05
(tests/fixtures/slurm), the verdict of a job Slurm ended, pending reasons, and the batch script's options checked."""

from __future__ import annotations

import pytest

from bot.core.hostlist import expand_hostlist
from bot.core.slurm import (
    SbatchSpec,
    SlurmError,
    batch_script,
    ended_verdict,
    job_line,
    parse_sbatch,
    parse_show_job,
    parse_sinfo_nodes,
    parse_squeue,
    pending_text,
    sbatch_problems,
    sinfo_format,
    squeue_format,
)
from tests.support.paths import FIXTURES

SLURM = FIXTURES / "slurm"


def _job(name: str):
    jobs = parse_show_job((SLURM / f"{name}.txt").read_text())
    assert len(jobs) == 1
    return jobs[0]


def test_a_running_two_node_job_and_one_pending_behind_it():
    running = _job("running")
    assert running.state == "RUNNING" and running.active and not running.pending
    assert running.nodes == ("n1", "n2") and running.reason is None and running.time_limit_s is None
    assert running.fields["TresPerNode"] == "gres:gpu:2" and running.fields["AllocNode:Sid"].startswith("localhost")
    pending = _job("pending")
    assert pending.pending and pending.nodes == () and pending.reason == "Resources"
    assert pending_text(pending) == "PENDING (Resources: waiting for nodes or GPUs to free up)"


@pytest.mark.parametrize(("name", "verdict", "words"), [
    ("timeout", "time_limit", "Slurm ended the job at its time limit of 00:01:00: Slurm says TIMEOUT (TimeLimit), "
                              "exit code 0, signal 15"),
    ("failed", "crashed", "the job's command failed: Slurm says FAILED (NonZeroExitCode), exit code 3"),
    ("cancelled", "cancelled", "the job was cancelled (scancel): Slurm says CANCELLED, exit code 0, signal 15"),
])
def test_a_job_slurm_ended_gets_its_own_verdict(name, verdict, words):
    job = _job(name)
    assert not job.active
    assert ended_verdict(job) == (verdict, words)


def test_unparsable_output_gives_no_job_and_sbatch_output_gives_the_id():
    assert parse_show_job((SLURM / "unknown.stderr.txt").read_text()) == []
    assert parse_show_job("JobId=x JobState=RUNNING\n\x00garbage") == []
    assert parse_sbatch("1234\n") == "1234" and parse_sbatch("77;cluster-a") == "77"
    with pytest.raises(SlurmError, match="did not print a job id: 'sbatch: error: Batch job submission failed"):
        parse_sbatch("sbatch: error: Batch job submission failed: Requested node configuration is not available")


def test_hostlists_as_slurm_prints_them():
    assert expand_hostlist("n[1-2],gpu07") == ["n1", "n2", "gpu07"]
    assert expand_hostlist("gpu-[01-03,10]") == ["gpu-01", "gpu-02", "gpu-03", "gpu-10"]
    assert expand_hostlist("") == [] and expand_hostlist("(null)") == [] and expand_hostlist("odd[9-1]") == ["odd[9-1]"]


def test_the_batch_script_sets_one_task_per_node_and_the_rank_variables():
    spec = SbatchSpec(nodes=2, gpus_per_node=8, partition="h200", time="4:00:00", account="ml-infra",
                      extra_sbatch=("--exclusive", "--constraint=ib"))
    script = batch_script(spec, "python3 -m sglang.launch_server --nnodes \"$GPUBOT_NNODES\"", job_name="big#3",
                          output="/logs/big-3-%N.log", env={"HF_HOME": "/data/hf x"}, master_port=29500)
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gres=gpu:8", "#SBATCH --partition=h200",
                 "#SBATCH --time=4:00:00", "#SBATCH --account=ml-infra", "#SBATCH --exclusive",
                 "#SBATCH --constraint=ib", "#SBATCH --job-name='big#3'", "export HF_HOME='/data/hf x'",
                 "export GPUBOT_MASTER_ADDR GPUBOT_MASTER_PORT=29500 GPUBOT_NNODES=$SLURM_JOB_NUM_NODES"):
        assert line in script.splitlines(), line
    assert script.splitlines()[-1].startswith("exec srun --kill-on-bad-exit=1 sh -c 'GPUBOT_NODE_RANK=$SLURM_NODEID;")


@pytest.mark.parametrize(("spec", "problem"), [
    (SbatchSpec(nodes=0), "nodes must be 1..1024"),
    (SbatchSpec(gpus_per_node=99), "gpus_per_node must be 0..64"),
    (SbatchSpec(partition="h200; rm -rf /"), "partition must be a plain name"),
    (SbatchSpec(time="soon"), "time must be minutes or [DD-]HH:MM:SS"),
    (SbatchSpec(extra_sbatch=("--wrap=id",)), "--wrap is (a prefix of) an option gpubot sets"),
    (SbatchSpec(extra_sbatch=("--comment=a\nb",)), "is not one --name or --name=value option on one line"),
    (SbatchSpec(extra_sbatch=("-N 4",)), "is not one --name or --name=value option"),
    (SbatchSpec(extra_sbatch=("--out=/tmp/evil-%j",)), "--out is (a prefix of) an option gpubot sets"),
    (SbatchSpec(extra_sbatch=("--comment=x --output=/tmp/evil",)), "its value has blanks"),
    (SbatchSpec(extra_sbatch=("--container=/oci/bundle",)), "--container would run the job's steps in another"),
    (SbatchSpec(extra_sbatch=("--container-image=nvcr.io/nvidia/pytorch:24.01-py3",)), "--container-image would run"),
    (SbatchSpec(extra_sbatch=("--container-mounts=/data:/data",)), "in another container"),
])
def test_what_the_allocation_may_not_say(spec, problem):
    assert any(problem in p for p in sbatch_problems(spec)), sbatch_problems(spec)
    with pytest.raises(SlurmError):
        batch_script(spec, "true", job_name="x", output="/tmp/x", env={}, master_port=1)


def test_free_text_holding_a_key_gpubot_reads_makes_the_record_ambiguous_never_a_forged_state():
    clean = "JobId=3 JobName=x JobState=RUNNING Reason=None ExitCode=0:0 NodeList=n1 StdOut=/logs/x.log"
    (job,) = parse_show_job(clean)
    assert job.state == "RUNNING" and job.active
    for forged in (
        clean.replace("/logs/x.log", "/logs/x JobState=COMPLETED ExitCode=0:0 y.log"),  # a path, after the state
        clean.replace("JobName=x", "JobName=x JobState=COMPLETED ExitCode=0:0"),  # the name, before it
        # a newline in the name: the first part has no state, the second repeats keys of the real record
        clean.replace("JobName=x", "JobName=x\nJobId=3 JobState=COMPLETED ExitCode=0:0 Reason=None"),
        # ... and a line after it that does not begin with `JobId=`: it goes on with the record before it
        clean.replace("JobName=x", "JobName=x\nJobId=3 JobState=COMPLETED Reason=None ExitCode=0:0\nX"),
        # a whole second record of the same job: neither counts
        clean.replace("JobName=x", "JobName=x\nJobId=3 JobState=COMPLETED Reason=None ExitCode=0:0\nJobId=3 X"),
        clean.replace("ExitCode=0:0", "ExitCode=\u00b2:0") + "\nJobId=3 JobState=COMPLETED",
    ):
        assert not [j for j in parse_show_job(forged) if j.state == "COMPLETED"], forged
        assert parse_show_job(forged) == [], forged


def test_joining_the_lines_of_a_huge_record_is_linear():
    import time
    for n in (20_000, 200_000):
        text = "JobId=3 JobState=RUNNING" + "\n x" * n
        t0 = time.process_time()
        (job,) = parse_show_job(text)
        took = time.process_time() - t0
        assert job.state == "RUNNING"
        if n == 20_000:
            small = max(took, 1e-4)
    assert took < 40 * small + 0.5, (small, took)  # 10x the text: about 10x the time, never 100x


def test_squeue_s_own_fields_are_read_by_position_and_a_planted_name_is_never_asked_for():
    text = ("2|FAILED|768|n1|0:07|365-00:00:00|0|NonZeroExitCode\n"
            "3|CANCELLED|15|n[1-2]|1:02:03|UNLIMITED|2|None\n"
            "4|PENDING|0||0:00|UNLIMITED|0|JobHeldUser\n"
            "9|COMPLETED|0|n1|0:01|UNLIMITED|0|None\n"  # a job not asked for
            "garbage line\n5|running|0|n1|0:00|UNLIMITED|0|None\n6|RUNNING|\u00b2|n1|0:00|UNLIMITED|0|None\n")
    jobs = parse_squeue(text, ["2", "3", "4", "5", "6", "7"])
    assert sorted(jobs) == ["2", "3", "4"]  # 5 and 6 are not of the shape (a state, a status of ASCII digits)
    failed, cancelled, held = jobs["2"], jobs["3"], jobs["4"]
    assert (failed.state, failed.exit_code, failed.signal, failed.reason) == ("FAILED", 3, 0, "NonZeroExitCode")
    assert failed.run_time_s == 7 and failed.source == "squeue -j"
    assert (cancelled.exit_code, cancelled.signal, cancelled.nodes) == (0, 15, ("n1", "n2"))
    assert cancelled.run_time_s == 3723 and cancelled.reason is None and cancelled.restarts == 2
    assert held.pending and held.reason == "JobHeldUser" and held.nodes == ()
    assert ended_verdict(failed) == ("crashed", "the job's command failed: Slurm says FAILED (NonZeroExitCode), "
                                                "exit code 3")
    assert job_line(cancelled) == ("`squeue -j 3`: JobState=CANCELLED Reason=None ExitCode=0:15 RunTime=1:02:03 "
                                   "TimeLimit=UNLIMITED NodeList=n[1-2]")
    assert failed.restarts == 0 and held.restarts == 0
    assert squeue_format() == "JobID:|,State:|,exit_code:|,NodeList:|,TimeUsed:|,TimeLimit:|,RestartCnt:|,Reason:"


@pytest.mark.parametrize("reason", [
    "x|0|n[7-9]|0:00|1:00|0|Foo",  # a `|`: stays in the reason, the last field
    "x\n2|COMPLETED|0|n1|0:00|1:00|0|None",  # a newline: a line after the job's own, which counts
    "x\x0b2|COMPLETED|0|n1|0:00|1:00|0|None",  # a vertical tab is no line break of Slurm's
])
def test_free_text_in_the_reason_cannot_move_a_field_or_end_a_running_job(reason):
    (job,) = parse_squeue(f"2|RUNNING|0|n1|0:05|1:00:00|1|{reason}\n", ["2"]).values()
    assert (job.state, job.nodes, job.exit_code, job.run_time_s, job.restarts) == ("RUNNING", ("n1",), 0, 5, 1), job
    assert job.active


def test_a_reason_is_redacted_before_it_is_kept():
    token = "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7"
    (job,) = parse_squeue(f"2|FAILED|256|n1|0:07|UNLIMITED|0|failed: HF_TOKEN={token}\n", ["2"]).values()
    assert token not in (job.reason or "") and token not in job_line(job), job_line(job)
    (shown,) = parse_show_job(f"JobId=2 JobState=FAILED Reason=bad_token_{token} ExitCode=1:0")
    assert token not in (shown.reason or "") and token not in shown.fields["Reason"]


def test_plain_scontrol_show_job_as_pasted_reads_like_the_one_line_form():
    one = _job("failed")
    # the same job as plain `scontrol show job` prints it: a first line, then indented lines that go on with it
    fields = one.fields.items()
    first = " ".join(f"{k}={v}" for k, v in list(fields)[:2])
    rest = [" ".join(f"{k}={v}" for k, v in list(fields)[i:i + 3]) for i in range(2, len(one.fields), 3)]
    plain = "\n".join([first, *(f"   {r}" for r in rest)]) + "\n"
    (job,) = parse_show_job(plain)
    assert (job.job_id, job.state, job.reason, job.nodes, job.exit_code) == (
        one.job_id, one.state, one.reason, one.nodes, one.exit_code)
    assert len(parse_show_job(plain + plain.replace(f"JobId={one.job_id}", "JobId=99"))) == 2


def test_sinfo_node_states_are_read_by_position_and_a_reason_moves_nothing():
    """`sinfo -h -N -O NodeList:|,StateLong:|,Reason:` as Slurm 22.05 prints it: a node's state without its flag
    suffix, the first line of a node (one in two partitions is listed twice), an admin's reason redacted and never
    a field of its own."""
    token = "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7"
    text = ("n1|idle|none\n"
            "n2|down*|PSU failed|n3|idle|x\n"  # a `|` in the reason stays in the reason
            "n2|idle|later line\n"  # n2's second partition: the first line counts
            f"n3|drained|rma HF_TOKEN={token}\n"
            "n4|IDLE|none\nn5|mixed+drain|cooling\n"
            "n9|down|not asked for\nbroken line\n")
    states = parse_sinfo_nodes(text, ["n1", "n2", "n3", "n4", "n5"])
    assert sorted(states) == ["n1", "n2", "n3", "n5"]  # n4's state is not Slurm's lowercase words
    assert (states["n1"].state, states["n1"].reason, states["n1"].failed) == ("idle", None, False)
    assert (states["n2"].state, states["n2"].reason, states["n2"].failed) == ("down", "PSU failed|n3|idle|x", True)
    assert states["n3"].failed and token not in (states["n3"].reason or "")
    assert states["n5"].failed and states["n5"].state == "mixed+drain"
    assert states["n2"].text() == "n2 is down (Slurm's reason: `PSU failed|n3|idle|x`)"
    assert sinfo_format() == "NodeList:|,StateLong:|,Reason:"
    assert parse_sinfo_nodes("", ["n1"]) == {} and parse_sinfo_nodes("\x00|||\n", ["\x00"]) == {}


def test_scontrol_s_restart_count_is_read_and_a_planted_one_is_ambiguous():
    (job,) = parse_show_job("JobId=7 JobName=x JobState=PENDING Reason=BeginTime Restarts=2 ExitCode=0:0")
    assert job.restarts == 2
    assert parse_show_job("JobId=7 JobName=x Restarts=0 JobState=PENDING Restarts=2 ExitCode=0:0") == []
