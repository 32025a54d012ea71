"""The runner of a Slurm variant (the I/O edge around bot.core.slurm): its command rendered into a batch script (one
`srun` step across the nodes, one task per node, the ranks' variables and logs), `sbatch --parsable` on its login node,
the job read back. Its row has `host` = the login node, `job_id`, and `nodes` once Slurm gave it some. A node that is a
host of the config is probed over SSH like any host, any other node through the login node as a step that overlaps the
job's (`srun --overlap --jobid`, HostService.job_node); rank K's processes carry the tag `<tag>-rK`.

Guarantees: a job submitted while its launch was killed is cancelled before the start answers; a kill cancels the job
(`scancel`, only while Slurm says it is active: a job that ended is never said to be cancelled), waits until Slurm
says it ended (at most SCANCEL_WAIT_S), then stops on every rank's node what is left; the checks read every job of a
login node with one `squeue` (bot.adapters.slurm.JobBoard). Raises RemoteError when the login node cannot be reached.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from bot.adapters.remote import RemoteError
from bot.adapters.slurm import JobBoard, SlurmClient
from bot.config import Config, render_launch
from bot.config.checks import sbatch_spec
from bot.core.lifecycle import KillOutcome, LaunchError, RenderedLaunch
from bot.core.models import Launch, LaunchKind, LaunchState
from bot.core.ranks import SCONTROL_FILE, rank_log_parts
from bot.core.slurm import SlurmError, SlurmJob, batch_script, job_nodes_text, sbatch_problems
from bot.services.hosts import HostService
from bot.services.probes import LaunchProbes
from bot.services.runners import Begun
from bot.services.runners.kill import ProcessKiller
from bot.services.runners.ranks import RankedRunner

log = logging.getLogger("bot.services.launches")

#: Seconds a kill waits for Slurm to end a cancelled job (its steps stopped on every node).
SCANCEL_WAIT_S = 30.0


class JobRows(Protocol):
    """What the Slurm runner reads and writes of its launches: whether one is still `starting` (a kill while sbatch
    ran), the live jobs of a login node (read by one `squeue`), and the nodes a kill learnt of a job."""

    def get(self, launch_id: int) -> Launch | None: ...

    def live(self, host: str | None = None, variant: str | None = None) -> list[Launch]: ...

    def update(self, launch_id: int, **fields: Any) -> Launch: ...


class SlurmRunner(RankedRunner):
    """Launches of Slurm variants: one job per launch, submitted on its login node."""

    kind = LaunchKind.SLURM
    spans = True
    placed = False
    scheduled = True

    def __init__(self, config: Config, hosts: HostService, probes: LaunchProbes, killer: ProcessKiller,
                 rows: JobRows, *, poll_s: float) -> None:
        super().__init__(config, hosts, probes, killer)
        self.rows = rows
        self.poll_s = poll_s
        self._clients: dict[str, SlurmClient] = {}
        self._boards: dict[str, JobBoard] = {}

    # -- the job ------------------------------------------------------------------------------------
    def slurm(self, login: str) -> SlurmClient:
        """The Slurm client of login node `login` (its executor; its `slurm_conf`)."""
        client = self._clients.get(login)
        if client is None:
            cfg = self.config.hosts[login]
            client = self._clients[login] = SlurmClient(self.hosts.executor(login), conf=cfg.slurm_conf)
        return client

    async def job(self, la: Launch, max_age_s: float = 0.0) -> SlurmJob | None:
        """The launch's Slurm job as `squeue` said it at most `max_age_s` seconds ago (one call per login node for
        every live job there: bot.adapters.slurm.JobBoard), as accounting says once Slurm forgot it, None when
        neither knows it. Raises RemoteError, SlurmError."""
        assert la.job_id is not None
        board = self._boards.get(la.host)
        if board is None:
            login = la.host
            board = self._boards[login] = JobBoard(
                self.slurm(login), lambda: [x.job_id for x in self.rows.live(login) if x.job_id])
        return await board.job(la.job_id, max_age_s)

    def slurm_calls(self, login: str) -> int:
        """How many `squeue` calls the checks made on login node `login` so far (JobBoard.calls)."""
        board = self._boards.get(login)
        return board.calls if board is not None else 0

    def _reach(self, la: Launch, node: str) -> str | None:
        """A node of a live job that the config does not have: a step overlapping the job's, through the login node
        (an ended job has no step to run in)."""
        if la.job_id and la.live and la.host in self.config.hosts:
            return self.hosts.job_node(la.host, la.job_id, node)
        return None

    # -- start --------------------------------------------------------------------------------------
    def plan(self, variant: str, params: Mapping[str, str]) -> list[RenderedLaunch]:
        """The batch's command on its login node. Raises LaunchError for an sbatch spec or params it cannot take."""
        v = self.config.resolved_variant(variant)
        problems = sbatch_problems(sbatch_spec(v))
        if problems:
            raise LaunchError(f"{variant}: {'; '.join(problems)}")
        return [render_launch(self.config, variant, dict(params), launch_id=0, host=v.host or "", slurm=True)]

    def decides_on(self, previews: Sequence[RenderedLaunch]) -> list[str]:
        """None: Slurm decides where it runs."""
        return []

    def shown_host(self, previews: Sequence[RenderedLaunch]) -> str:
        """Its login node."""
        return previews[0].host

    def row(self, variant: str, previews: Sequence[RenderedLaunch]) -> dict[str, Any]:
        """The login node, the variant's port, no GPUs (Slurm's)."""
        return {"host": previews[0].host, "port": self.config.resolved_variant(variant).port, "gpus": []}

    def audit_args(self, variant: str, previews: Sequence[RenderedLaunch], params: Mapping[str, Any]
                   ) -> dict[str, Any]:
        """variant, host (the login node), params, runner."""
        return {"variant": variant, "host": previews[0].host, "params": params, "runner": "slurm"}

    def render(self, variant: str, params: Mapping[str, str], la: Launch) -> list[RenderedLaunch]:
        """The batch's command, tagged."""
        return [render_launch(self.config, variant, dict(params), launch_id=la.id, host=la.host, tag=la.tag,
                              slurm=True)]

    async def start(self, la: Launch, rendered: Sequence[RenderedLaunch]) -> Begun:
        """`sbatch --parsable` of the batch script on the login node; the job's id is recorded with the `started`
        event at once (a kill from then on cancels the job), then the job is read back (`then`: PENDING with its
        reason, or RUNNING on its nodes). A refusal by Slurm or an unreachable login node is `failed`."""
        v = self.config.resolved_variant(la.variant)
        r, login = rendered[0], la.host
        prefix, suffix = rank_log_parts(r.log_path)
        env = {k: val for k, val in r.env.items() if k != "CUDA_VISIBLE_DEVICES"}  # Slurm sets it: the GPUs it gave
        script = batch_script(sbatch_spec(v), r.command, job_name=f"gpubot-{la.variant}-{la.id}",
                              output=f"{prefix.removesuffix('-rank')}-batch{suffix}", env=env,
                              master_port=v.master_port, log_path=r.log_path, rank_logs=(prefix, suffix),
                              tag_var="GPUBOT_LAUNCH", workdir=v.workdir)
        client = self.slurm(login)
        try:
            job_id = await client.submit(script)
        except (SlurmError, RemoteError) as e:
            return Begun(failed=str(e), error=f"could not submit: {e}", host=login)
        current = self.rows.get(la.id)
        if current is None or current.state != LaunchState.STARTING:  # killed while sbatch ran: cancel the job
            why = f"killed while it was being submitted: Slurm job {job_id} cancelled"
            try:
                await client.cancel(job_id)
            except (SlurmError, RemoteError) as e:
                why = f"killed while it was being submitted, but Slurm job {job_id} could not be cancelled: {e}"
            return Begun(cancelled=why, fields={"job_id": job_id}, host=login)

        async def read_back(la: Launch) -> dict[str, Any]:
            try:
                job = await client.show(job_id)
            except (SlurmError, RemoteError) as e:
                log.warning("%s: job %s submitted, but not read back: %s", la.name, job_id, e)
                return {}
            fields: dict[str, Any] = {"state_detail": job_nodes_text(job)}
            if job.nodes and not job.pending:
                fields["nodes"] = list(job.nodes)
            return fields

        # a job just submitted has not been requeued: a requeue before the first check is told too
        return Begun(fields={"job_id": job_id, "job_restarts": 0, "state_detail": f"Slurm job {job_id} submitted"},
                     detail=f"Slurm job {job_id} log {r.log_path}", host=login,
                     passed=[f"sbatch accepted it: job {job_id}"], then=read_back)

    # -- stop ---------------------------------------------------------------------------------------
    async def undo(self, la: Launch, out: KillOutcome) -> KillOutcome:
        """Cancel the job, as a kill does."""
        return await self.stop(la, out)

    async def stop(self, la: Launch, out: KillOutcome) -> KillOutcome:
        """Stop every rank of `la`: the job with `scancel` (then wait until Slurm says it ended, at most
        SCANCEL_WAIT_S), then on every rank's node what is left of the rank (its tagged processes), verified as any
        kill is; the outcomes of all ranks in one. Raises RemoteError when the login node cannot be reached."""
        said: list[str] = []
        scancelled = False  # scancel accepted: the job is being torn down, whatever follows
        if la.job_id:
            client = self.slurm(la.host)
            try:
                job = await client.show(la.job_id)
                if job is not None and job.active:  # a job that already ended (a stale button) is not cancelled
                    await client.cancel(la.job_id)
                    scancelled = True
                    job = await client.show(la.job_id)
                deadline = asyncio.get_running_loop().time() + SCANCEL_WAIT_S
                while job is not None and job.active and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(self.poll_s)
                    job = await client.show(la.job_id)
            except SlurmError as e:
                out.error, out.partial = str(e), scancelled
                return out
            if job is not None and job.active:
                said.append(f"Slurm job {la.job_id} is still {job.state} after scancel")
            elif scancelled:
                out.cancelled_job = la.job_id
            if job is not None and job.nodes and not la.nodes:
                la = self.rows.update(la.id, nodes=list(job.nodes))
        # a node reached through Slurm (no host of the config) is Slurm's to clean: once its job ended, every step of
        # it was stopped there, and srun can no longer reach it
        return await self.stop_ranks(la, out, said, partial=scancelled, whole_job=bool(la.job_id))

    # -- what is shown and collected ----------------------------------------------------------------
    def where(self, la: Launch) -> str:
        """`Slurm job 12 on login, ranks on n1, n2`."""
        return (f"Slurm job {la.job_id} on {la.host}" if la.job_id else "") + \
            (f"{', ' if la.job_id else ''}ranks on {', '.join(la.nodes[:8])}" if la.nodes else "")

    def unreachable_rank0(self, la: Launch, node: str) -> str:
        """Its node is no host of the config, and srun reaches it only while the job runs."""
        return (f"node {node} is not a host of the config"
                + (" and the job has ended (srun reaches a node only while its job runs)" if la.job_id else ""))

    async def bundle_parts(self, la: Launch) -> tuple[dict[str, str], list[str]]:
        """`scontrol show job -o` of the job (its accounting's record, under scontrol's keys, once the controller
        forgot it)."""
        if not la.job_id:
            return {}, []
        try:
            client = self.slurm(la.host)
            text = await client.show_text(la.job_id)
            if text is None:  # the controller forgot it: its accounting's record, under scontrol's keys
                job = await client.forgotten(la.job_id)
                text = f"Slurm no longer knows job {la.job_id}\n" + (
                    "" if job is None else f"{job.source} {la.job_id}: " + " ".join(
                        f"{k}={v}" for k, v in job.fields.items()) + "\n")
            return {SCONTROL_FILE: text}, []
        except (RemoteError, SlurmError) as e:
            return {}, [f"scontrol show job {la.job_id}: {e}"]
