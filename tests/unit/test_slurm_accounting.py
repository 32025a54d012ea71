"""A job Slurm's controller has forgotten (ended longer ago than its MinJobAge) read from accounting: `sacct`'s lines
(tests/fixtures/slurm/sacct.txt, in sacct(1)'s `-P` format) give the same verdicts as `scontrol`'s, and
bot.adapters.slurm.SlurmClient asks sacct only when squeue no longer lists the job, and never again on a cluster
without accounting. The executor here stands in for the login node's shell (what Slurm's commands print on it)."""

from __future__ import annotations

import shlex

import pytest

from bot.adapters.remote import CommandResult
from bot.adapters.slurm import SlurmClient
from bot.core.slurm import ended_verdict, job_line, job_verdict, parse_sacct
from tests.support.paths import FIXTURES

SACCT = (FIXTURES / "slurm" / "sacct.txt").read_text()
RUNNING = (FIXTURES / "slurm" / "running.txt").read_text()
FORGOTTEN = CommandResult(1, b"", b"slurm_load_jobs error: Invalid job id specified\n", 0.01)
NO_ACCOUNTING = CommandResult(1, b"", b"Slurm accounting storage is disabled\n", 0.01)


@pytest.mark.parametrize(("job_id", "verdict", "words"), [
    ("4711", "time_limit", "Slurm ended the job at its time limit of 12:00:00: Slurm says TIMEOUT, exit code 0"),
    ("4712", "cancelled", "the job was cancelled (scancel): Slurm says CANCELLED, exit code 0, signal 15"),
    ("4713", "host_oom", "Slurm killed it for using more host memory than it was allocated: Slurm says "
                         "OUT_OF_MEMORY, exit code 0, signal 125"),
    ("4714", "exited", "the job ended by itself with exit code 0: Slurm says COMPLETED, exit code 0"),
])
def test_a_forgotten_job_gets_the_verdict_its_accounting_gives(job_id, verdict, words):
    job = parse_sacct(SACCT, job_id)
    assert job is not None and job.source == "sacct -j" and not job.active
    assert ended_verdict(job) == (verdict, words)
    assert job_line(job).startswith(f"`sacct -j {job_id}`: JobState={job.state} ")


def test_accounting_lines_read_like_scontrol_s():
    first = parse_sacct(SACCT, "4711")
    assert first.nodes == ("gpu-03", "gpu-07") and first.run_time_s == 12 * 3600 + 14 and first.name == "kimi-2n#1"
    assert first.time_limit_s == 12 * 3600
    # a job name holding `|` and `JobState=` cannot forge the state
    assert parse_sacct(SACCT, "4713").name == "small|JobState=COMPLETED"
    assert parse_sacct("5|FAILED|1:0|None|n1|00:01:00|UNLIMITED|x ExitCode=0:0\n", "5").name == "x ExitCode=0:0"
    assert parse_sacct(SACCT, "4713").state == "OUT_OF_MEMORY"
    never = parse_sacct(SACCT, "4715")
    assert never.nodes == () and never.state == "CANCELLED"
    assert parse_sacct(SACCT, "9") is None and parse_sacct("", "4711") is None
    assert parse_sacct("4711|TIMEOUT|0:0\n\x00|||", "4711") is None  # too few fields
    # a newline in the name (the last field) can only add lines after the job's own: the first line counts
    forged = "6|FAILED|1:0|None|n1|00:01:00|UNLIMITED|x\n6|COMPLETED|0:0|None|n1|00:01:00|UNLIMITED|y\n"
    job = parse_sacct(forged, "6")
    assert (job.state, job.exit_code, job.name) == ("FAILED", 1, "x")


def test_a_job_neither_scontrol_nor_sacct_knows_is_unknown_not_exited():
    v = job_verdict(None, "4711")
    assert v.verdict == "unknown" and "how it ended is unknown" in v.summary


class _LoginShell:
    """What Slurm's commands print on a login node, by command word; records each command run."""

    def __init__(self, answers: dict[str, CommandResult]) -> None:
        self.name = "login"
        self.answers = answers
        self.commands: list[str] = []

    async def run(self, command: str, *, input: bytes | None = None, timeout_s: float | None = None) -> CommandResult:
        self.commands.append(command)
        word = next(w for w in shlex.split(command) if w in self.answers)
        return self.answers[word]


async def test_the_client_asks_sacct_only_for_a_job_squeue_no_longer_lists():
    shell = _LoginShell({"squeue": FORGOTTEN, "sacct": CommandResult(0, SACCT.encode(), b"", 0.01)})
    job = await SlurmClient(shell).show("4711")
    assert job is not None and job.state == "TIMEOUT" and job.source == "sacct -j"
    assert shell.commands == [
        "squeue -a -h --states=all -j 4711 -O "
        "'JobID:|,State:|,exit_code:|,NodeList:|,TimeUsed:|,TimeLimit:|,RestartCnt:|,Reason:'",
        "sacct -X -n -P -j 4711 -o JobID,State,ExitCode,Reason,NodeList,Elapsed,Timelimit,JobName"]
    shell = _LoginShell({"squeue": CommandResult(0, b"12|RUNNING|0|n[1-2]|5:00|UNLIMITED|0|None\n", b"", 0.01)})
    known = await SlurmClient(shell).show("12")
    assert known is not None and known.source == "squeue -j" and known.active and len(shell.commands) == 1


async def test_a_running_record_of_a_job_the_controller_forgot_is_not_taken_for_a_running_job():
    runaway = CommandResult(0, b"77|RUNNING|0:0|None|gpu-[1-2]|2-00:00:00|UNLIMITED|base#3\n", b"", 0.01)
    job = await SlurmClient(_LoginShell({"squeue": FORGOTTEN, "sacct": runaway})).show("77")
    assert job is not None and not job.active and job.state == "UNKNOWN"
    assert ended_verdict(job)[0] == "unknown"
    assert "sacct still says RUNNING, but the controller no longer knows the job" in job_line(job)


async def test_without_accounting_sacct_is_asked_once_and_a_broken_one_is_logged(caplog):
    shell = _LoginShell({"squeue": FORGOTTEN, "sacct": NO_ACCOUNTING})
    client = SlurmClient(shell, conf="/etc/slurm x/slurm.conf")
    assert await client.show("4711") is None and await client.show("4712") is None
    assert [shlex.split(c)[2] for c in shell.commands] == ["squeue", "sacct", "squeue"]  # after env SLURM_CONF=
    assert shell.commands[1].startswith("env SLURM_CONF='/etc/slurm x/slurm.conf' sacct ")
    assert client.accounting_on is False
    down = CommandResult(1, b"", b"sacct: error: Problem talking to the database: Connection refused\n", 0.01)
    client = SlurmClient(_LoginShell({"squeue": FORGOTTEN, "sacct": down}))
    assert await client.show("4711") is None  # the controller's word stands
    assert "sacct could not read job 4711: sacct: error: Problem talking to the database" in caplog.text
    assert client.accounting_on is None  # asked again next time
