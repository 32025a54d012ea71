"""Slurm's commands on a login node (or the bot's own machine), through any Executor of bot.adapters.remote:
`sbatch --parsable` (the batch script on stdin), `squeue` (the state of many jobs in one call; JobBoard asks it once
per login node for every job watched there), `scontrol show job -o` (for a bundle), `sacct` (where accounting is
on), `scancel`, and `srun --overlap --jobid` to run commands on a job's node that gpubot cannot reach over SSH
(SrunExecutor). What they print is read by bot.core.slurm."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import shlex
import time
from collections.abc import Callable, Iterable

from bot.adapters.remote import (
    AGENT_RETRY_S,
    AgentLost,
    CommandResult,
    Executor,
    ProcessStream,
    RemoteError,
    ShellAgent,
)
from bot.core import agent
from bot.core.slurm import (
    SACCT_FIELDS,
    NodeState,
    SlurmError,
    SlurmJob,
    parse_sacct,
    parse_sbatch,
    parse_sinfo_nodes,
    parse_squeue,
    sinfo_format,
    squeue_format,
)

log = logging.getLogger(__name__)

#: srun's refusals to start a step (srun(1), Slurm 22.05): the job ended or is unknown, the node is not one of its
#: nodes, or the job has used up its steps (MaxStepCount).
_REFUSALS = (b"Unable to create step", b"Unable to confirm allocation", b"has expired", b"Invalid job id",
             b"Step limit reached", b"Invalid node name", b"Job step creation")
#: slurmstepd's word that the job (and so this step) was cancelled while the command ran.
_STEP_CANCELLED_RE = re.compile(rb"slurmstepd[^\n]*\*\*\* STEP [0-9.]+ ON \S+ CANCELLED")

#: Seconds one Slurm command may take (the controller answers in milliseconds; a busy one in seconds).
SLURM_COMMAND_TIMEOUT_S = 30.0
#: Job ids one `squeue -j` call asks for at most (a longer list is asked in several calls).
SQUEUE_BATCH = 500


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
        self.accounting_on: bool | None = None  # None until sacct was asked once

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

    async def jobs(self, job_ids: Iterable[str]) -> dict[str, SlurmJob]:
        """Job id -> the job as `squeue` says it now (bot.core.slurm.parse_squeue: Slurm's own fields only, so no job
        name can forge one), for each of `job_ids` the controller still has; one call per SQUEUE_BATCH ids. Raises
        SlurmError when squeue fails (not for jobs it no longer has), RemoteError when the node cannot be reached."""
        ids = sorted({str(int(j)) for j in job_ids}, key=int)
        out: dict[str, SlurmJob] = {}
        for i in range(0, len(ids), SQUEUE_BATCH):
            chunk = ids[i:i + SQUEUE_BATCH]
            res = await self.executor.run(self._command(
                f"squeue -a -h --states=all -j {','.join(chunk)} -O {shlex.quote(squeue_format())}"),
                timeout_s=self.timeout_s)
            if res.exit_status != 0:
                if b"Invalid job id" in res.stderr:  # it has none of them
                    continue
                raise SlurmError(f"squeue could not read jobs {','.join(chunk)[:100]}: {_said(res)}")
            out.update(parse_squeue(res.stdout.decode("utf-8", "replace"), chunk))
        return out

    async def show(self, job_id: str) -> SlurmJob | None:
        """The job as `squeue` says it now (`jobs`); once the controller forgot it (MinJobAge after its end), as its
        accounting says (`forgotten`); None when neither knows it."""
        job = (await self.jobs([job_id])).get(str(int(job_id)))
        return job if job is not None else await self.forgotten(job_id)

    async def forgotten(self, job_id: str) -> SlurmJob | None:
        """A job the controller no longer has, as its accounting says (`accounting`), never active (a runaway record
        that still says RUNNING is UNKNOWN); None when accounting has no record or is off, or sacct failed
        (logged: the controller's word that it forgot the job stands)."""
        try:
            job = await self.accounting(job_id)
        except SlurmError as e:  # Slurm's controller said it forgot the job: that stands, whatever sacct says
            log.warning("job %s: %s", job_id, e)
            return None
        if job is not None and job.active:  # a job the controller no longer has cannot run (a runaway record)
            said = f"sacct still says {job.state}, but the controller no longer knows the job"
            job = dataclasses.replace(job, state="UNKNOWN", reason=said,
                                      fields={**job.fields, "JobState": "UNKNOWN", "Reason": said})
        return job

    async def accounting(self, job_id: str) -> SlurmJob | None:
        """The job as `sacct -X -j` records it (bot.core.slurm.parse_sacct), or None when it has no record of it or
        the cluster keeps no accounting (`Slurm accounting storage is disabled`; then sacct is not asked again).
        Raises SlurmError when sacct fails otherwise (slurmdbd down), RemoteError when the node cannot be reached."""
        if self.accounting_on is False:
            return None
        res = await self.executor.run(
            self._command(f"sacct -X -n -P -j {int(job_id)} -o {','.join(SACCT_FIELDS)}"), timeout_s=self.timeout_s)
        if res.exit_status != 0:
            if b"accounting storage is disabled" in res.stderr + res.stdout:
                self.accounting_on = False
                return None
            raise SlurmError(f"sacct could not read job {job_id}: {_said(res)}")
        self.accounting_on = True
        return parse_sacct(res.stdout.decode("utf-8", "replace"), str(int(job_id)))

    async def node_states(self, nodes: Iterable[str]) -> dict[str, NodeState]:
        """Node -> its state as `sinfo -N` says it now (bot.core.slurm.parse_sinfo_nodes), for each of `nodes`
        Slurm knows. Raises SlurmError when sinfo fails, RemoteError when the node cannot be reached."""
        names = sorted(set(nodes))
        if not names:
            return {}
        res = await self.executor.run(self._command(
            f"sinfo -h -N -n {shlex.quote(','.join(names))} -O {shlex.quote(sinfo_format())}"),
            timeout_s=self.timeout_s)
        if res.exit_status != 0:
            raise SlurmError(f"sinfo could not read nodes {','.join(names)[:100]}: {_said(res)}")
        return parse_sinfo_nodes(res.stdout.decode("utf-8", "replace"), names)

    async def cancel(self, job_id: str) -> None:
        """`scancel` the job (every step of it, on every node). A job Slurm no longer knows is not an error."""
        res = await self.executor.run(self._command(f"scancel {int(job_id)}"), timeout_s=self.timeout_s)
        if res.exit_status != 0 and b"Invalid job id" not in res.stderr:
            raise SlurmError(f"scancel could not cancel job {job_id}: {_said(res)}")


class JobBoard:
    """The state of every job watched on one login node, read with one `squeue` call (SlurmClient.jobs) for all of
    them and shared by every check that asks within `max_age_s` of that call: one Slurm call per login node per
    check interval, whatever the number of jobs. `watched()` returns the job ids watched there now. A job squeue no
    longer lists is asked of accounting (SlurmClient.forgotten): it ended. `calls` counts the squeue
    calls made."""

    def __init__(self, client: SlurmClient, watched: Callable[[], Iterable[str]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self._watched = watched
        self._clock = clock
        self._seen: dict[str, SlurmJob] = {}
        self._asked: frozenset[str] = frozenset()
        self._at: float | None = None
        self._reading: asyncio.Future[None] | None = None
        self.calls = 0

    async def job(self, job_id: str, max_age_s: float) -> SlurmJob | None:
        """Job `job_id` as a squeue call begun at most `max_age_s` seconds ago said it (else a new call, for every
        watched job and this one; checks that ask meanwhile wait on that same call); as accounting says when squeue
        no longer lists it; None when neither knows it. Raises what SlurmClient.jobs raises (to every check that
        waited on that call)."""
        job_id = str(int(job_id))
        oldest = self._clock() - max(0.0, max_age_s)
        while not (self._at is not None and self._at >= oldest and job_id in self._asked):
            if self._reading is None or self._reading.done():  # a finished call, its callback not run yet: a new one
                self._reading = asyncio.ensure_future(self._read(job_id))
                self._reading.add_done_callback(self._done)
            await asyncio.shield(self._reading)
        found = self._seen.get(job_id)
        return found if found is not None else await self.client.forgotten(job_id)

    def _done(self, fut: asyncio.Future[None]) -> None:
        if self._reading is fut:
            self._reading = None
        if not fut.cancelled():
            fut.exception()  # retrieved here: each waiting check raises it

    async def _read(self, job_id: str) -> None:
        ids = frozenset({job_id, *(str(int(j)) for j in self._watched() if str(j).isascii() and str(j).isdigit())})
        begun = self._clock()
        self.calls += 1
        seen = await self.client.jobs(ids)
        self._seen, self._asked, self._at = seen, ids, begun


#: Seconds the probe agent of a job's node may take to start (its step is created by the controller first).
STEP_AGENT_START_S = 30.0


class SrunExecutor:
    """An Executor for node `node` of Slurm job `job_id`, for a node gpubot cannot reach over SSH: commands run there
    in steps that overlap the job's own (`srun --overlap --jobid=JOB --nodelist=NODE --nodes=1 --ntasks=1`, srun(1)
    of Slurm 22.05), started through `login`, the executor of the login node. Probe scripts (`run_script`) go to
    one long-lived step, a probe agent (bot.core.agent), so that checking a job for weeks does not use up its
    steps (MaxStepCount); other commands, and scripts while no agent runs (the login node keeps no more streams,
    or it failed: tried again after AGENT_RETRY_S), each run as a step of their own. stdin reaches the step. A
    command fails with RemoteError (srun's words) when srun could not start the step: the job ended, or the node
    is not one of its nodes."""

    def __init__(self, login: Executor, job_id: str, node: str, *, conf: str | None = None) -> None:
        self.login = login
        self.job_id = str(int(job_id))
        self.node = node
        self.conf = conf
        self.name = f"{node} (Slurm job {self.job_id})"
        self._agent: ShellAgent | None = None
        self._discarded = False  # closed: it starts no agent again
        self._agent_lock = asyncio.Lock()
        self._agent_retry_at = 0.0
        self.agent_starts = 0
        # srun's report of how this node's task ended (`srun: error: n1: task 0: Exited with exit code 127`)
        self._task_end = re.compile(rb"(?m)^srun: error: " + re.escape(node.encode()) + rb": task 0: [^\n]*\n?")

    def step_command(self, command: str, *, stream: bool = False) -> str:
        """`command` as the overlapping step on the node runs it (quoted for the login node's shell), from `/` (the
        login node's working directory may not exist on the node); `stream`: a long-lived one, its output passed
        on at once and srun's own messages in its stdout (nothing left unread on a channel's stderr)."""
        env = f"env SLURM_CONF={shlex.quote(self.conf)} " if self.conf else ""
        return (f"{env}srun --overlap --quiet {'--unbuffered ' if stream else ''}--chdir=/ --jobid={self.job_id} "
                f"--nodelist={shlex.quote(self.node)} --nodes=1 --ntasks=1 sh -c {shlex.quote(command)}"
                + (" 2>&1" if stream else ""))

    async def run(self, command: str, *, input: bytes | None = None, timeout_s: float | None = None) -> CommandResult:
        """Run `command` on the node (see the class): its own exit status, stdout and stderr as over SSH (srun's line
        on how the task ended left out). Raises RemoteError when srun could not start the step (its words), or when
        the job was cancelled while the command ran."""
        res = await self.login.run(self.step_command(command), input=input, timeout_s=timeout_s)
        if res.exit_status == 0:
            return res
        if _STEP_CANCELLED_RE.search(res.stderr):
            raise RemoteError(self.name, f"Slurm job {self.job_id} was cancelled while the command ran on {self.node}")
        ends = list(self._task_end.finditer(res.stderr))
        if not ends:  # no task ran: srun's own refusal (only its known words: a command may print `srun: error:`)
            if not res.stdout and any(w in res.stderr for w in _REFUSALS):
                raise RemoteError(self.name, f"srun could not run on {self.node} in job {self.job_id}: {_said(res)}")
            return res
        last = ends[-1]
        stderr = res.stderr[:last.start()] + res.stderr[last.end():]
        return dataclasses.replace(res, stderr=stderr)

    async def run_script(self, script: str, *, timeout_s: float | None = None) -> CommandResult:
        """Run the POSIX sh `script` on the node: on its probe agent (stderr merged into stdout), else as a step of
        its own (`sh -s`, the script on the step's stdin). Raises RemoteError (srun could not start the step, or
        the script did not finish within `timeout_s` seconds)."""
        budget = timeout_s if timeout_s is not None else SLURM_COMMAND_TIMEOUT_S
        async with self._agent_lock:  # one script at a time on the agent
            worker = await self._take_agent()
            if worker is not None:
                try:
                    return await worker.run(script, budget, self.name)
                except AgentLost as e:  # its step ended (the job ended, or it was cancelled): one step of its own
                    log.info("%s: %s; the script runs as a step of its own", self.name, e)
                finally:
                    if worker.closed:
                        self._agent = None
        return await self.run("sh -s", input=script.encode(), timeout_s=timeout_s)

    async def _take_agent(self) -> ShellAgent | None:
        """The node's probe agent, started on first use; None when none can run now."""
        if self._agent is not None and not self._agent.closed and not self._agent.stream.ended:
            return self._agent
        if self._agent is not None:  # its step ended (the job ended, or it was cancelled)
            self._agent.close()
        self._agent = None
        open_stream = getattr(self.login, "open_stream", None)
        if open_stream is None or self._discarded or time.monotonic() < self._agent_retry_at:
            return None
        stream: ProcessStream | None = None
        try:
            stream = await open_stream(self.step_command(agent.AGENT_COMMAND, stream=True))
            if stream is None:
                return None
            self._agent = await ShellAgent.start(stream, STEP_AGENT_START_S)
        except (AgentLost, RemoteError, OSError) as e:
            log.info("%s: no probe agent (%s); each script runs as a step of its own for %.0f s", self.name, e,
                     AGENT_RETRY_S)
            self._agent_retry_at = time.monotonic() + AGENT_RETRY_S
            return None
        self.agent_starts += 1
        return self._agent

    def helper_pids(self) -> set[int]:
        """The PID of the node's probe agent while it runs (never shown in a probe)."""
        return {self._agent.pid} if self._agent is not None and not self._agent.closed else set()

    def script_slots(self) -> int:
        """One script at a time (on its agent, or as a step)."""
        return 1

    async def open_stream(self, command: str) -> ProcessStream | None:
        """None: a node of a job keeps no streams of its own."""
        return None

    def discard(self) -> None:
        """End the node's probe agent, if it runs (its stdin closes and it gets SIGTERM: its step ends), and start
        none again: scripts run as steps of their own from now on."""
        self._discarded = True
        if self._agent is not None:
            self._agent.close()
            self._agent = None

    async def close(self) -> None:
        """`discard`; the login node's executor is pooled by its host."""
        self.discard()
