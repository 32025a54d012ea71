"""Slurm's commands on a login node (or the bot's own machine), through any Executor of bot.adapters.remote:
`sbatch --parsable` (the batch script on stdin), `scontrol show job -o`, `scancel`. What they print is read by
bot.core.slurm."""

from __future__ import annotations

import shlex

from bot.adapters.remote import CommandResult, Executor
from bot.core.slurm import SlurmError, SlurmJob, parse_sbatch, parse_show_job

#: Seconds one Slurm command may take (the controller answers in milliseconds; a busy one in seconds).
SLURM_COMMAND_TIMEOUT_S = 30.0


def _said(res: CommandResult) -> str:
    """Slurm's own words of a failed command: its stderr (else stdout), one line, at most 300 characters."""
    text = (res.stderr or res.stdout).decode("utf-8", "replace").strip()
    return " ".join(text.split())[:300] or f"exit {res.exit_status}"


class SlurmClient:
    """Submit, read and cancel jobs with Slurm's commands over `executor`. `conf`: the cluster's slurm.conf when it
    is not where Slurm looks by default (SLURM_CONF). Each method raises SlurmError when Slurm refuses, with Slurm's
    words, and what the executor raises (RemoteError) when the node cannot be reached."""

    def __init__(self, executor: Executor, *, conf: str | None = None,
                 timeout_s: float = SLURM_COMMAND_TIMEOUT_S) -> None:
        self.executor = executor
        self.conf = conf
        self.timeout_s = timeout_s

    def _command(self, words: str) -> str:
        return (f"env SLURM_CONF={shlex.quote(self.conf)} " if self.conf else "") + words

    async def submit(self, script: str) -> str:
        """Submit `script` (its `#SBATCH` lines say the allocation) with `sbatch --parsable`; returns the job id."""
        res = await self.executor.run(self._command("sbatch --parsable"), input=script.encode(),
                                      timeout_s=self.timeout_s)
        if res.exit_status != 0:
            raise SlurmError(f"sbatch refused the job: {_said(res)}")
        return parse_sbatch(res.stdout.decode("utf-8", "replace"))

    async def show_text(self, job_id: str) -> str | None:
        """`scontrol show job -o JOB`'s output as Slurm printed it, or None when Slurm no longer knows the job (it
        ended longer ago than the controller's MinJobAge)."""
        res = await self.executor.run(self._command(f"scontrol show job -o {int(job_id)}"), timeout_s=self.timeout_s)
        if res.exit_status != 0:
            if b"Invalid job id" in res.stderr:
                return None
            raise SlurmError(f"scontrol could not read job {job_id}: {_said(res)}")
        return res.stdout.decode("utf-8", "replace")

    async def show(self, job_id: str) -> SlurmJob | None:
        """The job as `scontrol show job -o` says it now (bot.core.slurm.parse_show_job), or None when Slurm no
        longer knows it."""
        text = await self.show_text(job_id)
        jobs = [j for j in parse_show_job(text) if j.job_id == str(int(job_id))] if text is not None else []
        return jobs[0] if jobs else None

    async def cancel(self, job_id: str) -> None:
        """`scancel` the job (every step of it, on every node). A job Slurm no longer knows is not an error."""
        res = await self.executor.run(self._command(f"scancel {int(job_id)}"), timeout_s=self.timeout_s)
        if res.exit_status != 0 and b"Invalid job id" not in res.stderr:
            raise SlurmError(f"scancel could not cancel job {job_id}: {_said(res)}")
