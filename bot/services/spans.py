"""Launches that span nodes (the I/O edge around bot.core.ranks and bot.core.slurm): a Slurm job submitted on a login
node, or one process tree per host of a multi-host SSH variant, as one launch: one row, one thread, one watch, one
kill. The runner of a variant is `Config.runner_of`: `slurm` (sbatch on its host) or `ssh` (with `hosts:`, here).

A Slurm launch's row has `host` = the login node, `job_id`, and `nodes` once Slurm gave it some. Its ranks run in one
`srun` step (one task per node); a node that is a host of the config is probed over SSH like any host, any other
node through the login node as a step that overlaps the job's (`srun --overlap --jobid`); rank K's processes carry the
tag `<tag>-rK`. A multi-host launch's row has `host` = its first host (rank 0, with its PID) and
`nodes` = its hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bot.adapters.locks import LockTimeout
from bot.adapters.remote import RemoteError
from bot.adapters.slurm import JobBoard, SlurmClient
from bot.config import render_launch
from bot.config.checks import sbatch_spec
from bot.core.lifecycle import (
    KillOutcome,
    LaunchError,
    LaunchOutcome,
    PreflightResult,
    RenderedLaunch,
    prelaunch_checks,
)
from bot.core.models import HostFailure, Launch, LaunchState, Snapshot
from bot.core.probe import ProbeRequest
from bot.core.ranks import NodeLook, rank_log_parts, rank_tag, rank_view
from bot.core.slurm import SlurmError, SlurmJob, batch_script, job_nodes_text, sbatch_problems
from bot.core.transitions import LaunchEvent

if TYPE_CHECKING:
    from bot.services.launches import LaunchService

log = logging.getLogger(__name__)

#: Seconds a kill waits for Slurm to end a cancelled job (its steps stopped on every node).
SCANCEL_WAIT_S = 30.0


class SpanService:
    """Launch, look at and kill launches across nodes for `launches` (the LaunchService whose rows, threads, audit
    and hooks they share)."""

    def __init__(self, launches: LaunchService) -> None:
        self._svc = launches
        self._clients: dict[str, SlurmClient] = {}
        self._boards: dict[str, JobBoard] = {}

    # -- where the ranks are ------------------------------------------------------------------------
    def slurm(self, login: str) -> SlurmClient:
        """The Slurm client of login node `login` (its executor; its `slurm_conf`)."""
        client = self._clients.get(login)
        if client is None:
            cfg = self._svc.config.hosts[login]
            client = self._clients[login] = SlurmClient(self._svc.hosts.executor(login), conf=cfg.slurm_conf)
        return client

    def ranks(self, la: Launch) -> list[tuple[int, str, str | None]]:
        """(rank, node, host) of each rank of `la`, rank order: host is the config's host of that name, probed over
        SSH; a node of a live launch's Slurm job that the config does not have is reached through the login node with
        `srun --overlap --jobid` (HostService.job_node); None for a node nothing can reach (then rank 0's files are
        read on the login node, rank0)."""
        hosts = self._svc.config.hosts

        def host_of(node: str) -> str | None:
            if node in hosts:
                return node
            if la.job_id and la.live and la.host in hosts:  # an ended job has no step to run in
                return self._svc.hosts.job_node(la.host, la.job_id, node)
            return None

        return [(k, node, host_of(node)) for k, node in enumerate(la.nodes)]

    def rank0(self, la: Launch) -> Launch:
        """Rank 0 of a launch across nodes as a launch on its node (bot.core.ranks.rank_view); a Slurm job not
        running yet, or whose first node is no host of the config, is `la` itself (on its login node)."""
        ranks = self.ranks(la)
        if not ranks or ranks[0][2] is None:
            return la
        return rank_view(la, 0, ranks[0][2])

    async def job(self, la: Launch, max_age_s: float = 0.0) -> SlurmJob | None:
        """The launch's Slurm job as `squeue` said it at most `max_age_s` seconds ago (one call per login node for
        every live job there: bot.adapters.slurm.JobBoard), as accounting says once Slurm forgot it, None when
        neither knows it. Raises RemoteError, SlurmError."""
        assert la.job_id is not None
        board = self._boards.get(la.host)
        if board is None:
            login = la.host
            board = self._boards[login] = JobBoard(
                self.slurm(login), lambda: [x.job_id for x in self._svc.live(login) if x.job_id])
        return await board.job(la.job_id, max_age_s)

    def slurm_calls(self, login: str) -> int:
        """How many `squeue` calls the checks made on login node `login` so far (JobBoard.calls)."""
        board = self._boards.get(login)
        return board.calls if board is not None else 0

    async def look_ranks(self, la: Launch, ranks: Sequence[tuple[int, str, str | None]]) -> list[NodeLook]:
        """One probe of each of `ranks` (in parallel): whether its processes run, how long its log has been silent,
        its last log line and its GPUs' utilisation. Never raises (a node that cannot be read says why)."""
        async def one(rank: int, node: str, host: str | None) -> NodeLook:
            if host is None:
                return NodeLook(rank, node, None, error="not a host of the config; it cannot be probed")
            view = rank_view(la, rank, host)
            res = await self._svc.hosts.probe(host, self._svc.launch_probe_request(view, tail_lines=5, port=False))
            if isinstance(res, HostFailure):
                return NodeLook(rank, node, None, error=res.reason)
            return self.node_look(view, rank, node, res)

        return list(await asyncio.gather(*(one(*r) for r in ranks)))

    def node_look(self, view: Launch, rank: int, node: str, snap: Snapshot, verdict: str | None = None) -> NodeLook:
        """What `snap` (a probe of rank `rank` as `view`) says of that rank (bot.core.ranks.NodeLook)."""
        procs = self._svc.launch_processes_of(view, snap)
        pids = {p.pid for p in procs}
        held = {gp.gpu_index for gp in snap.gpu.processes if gp.pid in pids} if snap.gpu.ok else set()
        utils = [g.utilization_gpu_pct for g in snap.gpu.gpus if g.index in held and g.utilization_gpu_pct is not None]
        silent = snap.log.seconds_since_write(snap.clock) if snap.log is not None else None
        last = next((ln for ln in reversed(snap.log.tail) if ln.strip()), None) if snap.log else None
        return NodeLook(rank, node, bool(procs), silent_s=silent, last_line=last,
                        gpu_util=sum(utils) / len(utils) if utils else None, verdict=verdict)

    # -- launch -------------------------------------------------------------------------------------
    async def launch_slurm(self, variant: str, params: dict[str, str], *, user: str, channel: str | None,
                           thread_ts: str | None, relaunch_of: int | None) -> LaunchOutcome:
        """Submit a Slurm variant: its command rendered into a batch script (bot.core.slurm.batch_script: one srun
        step across the nodes, the ranks' variables and logs), `sbatch --parsable` on its login node, the job id
        recorded, and the job's state as Slurm says it shown in the thread (PENDING with its reason, or RUNNING on
        its nodes). Raises LaunchError for bad input (nothing recorded); a refusal by Slurm or an unreachable login
        node is in the outcome."""
        svc = self._svc
        v = svc.config.resolved_variant(variant)
        spec = sbatch_spec(v)
        problems = sbatch_problems(spec)
        if problems:
            raise LaunchError(f"{variant}: {'; '.join(problems)}")
        login = v.host or ""
        render_launch(svc.config, variant, params, launch_id=0, host=login, slurm=True)  # bad params: LaunchError
        args = {"variant": variant, "host": login, "params": svc.secrets.for_record(params), "runner": "slurm"}
        la = svc.record_launch(variant, params, host=login, port=v.port, gpus=[], user=user, channel=channel,
                               thread_ts=thread_ts, relaunch_of=relaunch_of)
        r = render_launch(svc.config, variant, params, launch_id=la.id, host=login, tag=la.tag, slurm=True)
        la = svc.store_command(la, r)
        if thread_ts is None:
            la = await svc.threads.open(la)
        prefix, suffix = rank_log_parts(r.log_path)
        env = {k: val for k, val in r.env.items() if k != "CUDA_VISIBLE_DEVICES"}  # Slurm sets it: the GPUs it gave
        script = batch_script(spec, r.command, job_name=f"gpubot-{variant}-{la.id}",
                              output=f"{prefix.removesuffix('-rank')}-batch{suffix}", env=env,
                              master_port=v.master_port, log_path=r.log_path, rank_logs=(prefix, suffix),
                              tag_var="GPUBOT_LAUNCH", workdir=v.workdir)
        client = self.slurm(login)
        try:
            job_id = await client.submit(script)
        except (SlurmError, RemoteError) as e:
            why = str(e)
            la = svc.transition(la, LaunchEvent.START_FAILED, state_detail=why)
            svc.audit.record(user_id=user, action="launch", args=args, result="error", detail=why, launch_id=la.id,
                             host=login, channel=la.channel)
            await svc.threads.show(la)
            return LaunchOutcome(la, error=f"could not submit: {why}", host=login)
        current = svc.rows.get(la.id)
        if current is None or current.state != LaunchState.STARTING:  # killed while sbatch ran: cancel the job
            why = f"killed while it was being submitted: Slurm job {job_id} cancelled"
            try:
                await client.cancel(job_id)
            except (SlurmError, RemoteError) as e:
                why = f"killed while it was being submitted, but Slurm job {job_id} could not be cancelled: {e}"
            la = svc.rows.update(la.id, job_id=job_id, state_detail=why)
            svc.audit.record(user_id=user, action="launch", args=args, result="cancelled", detail=why,
                             launch_id=la.id, host=login, channel=la.channel)
            await svc.threads.show(la)
            return LaunchOutcome(la, error=why, host=login)
        # a job just submitted has not been requeued: a requeue before the first check is told too
        la = svc.transition(la, LaunchEvent.STARTED, job_id=job_id, job_restarts=0,
                            state_detail=f"Slurm job {job_id} submitted")
        try:
            job = await client.show(job_id)
        except (SlurmError, RemoteError) as e:
            log.warning("%s: job %s submitted, but not read back: %s", la.name, job_id, e)
            job = None
        if job is not None:
            la = svc.rows.update(la.id, state_detail=job_nodes_text(job),
                                 **({"nodes": list(job.nodes)} if job.nodes and not job.pending else {}))
        svc.audit.record(user_id=user, action="launch", args={**args, "launch": la.name}, result="started",
                         detail=f"Slurm job {job_id} log {r.log_path}", launch_id=la.id, host=login, channel=la.channel)
        await svc.threads.show(la)
        svc.run_follow_hooks(la)
        return LaunchOutcome(la, checks=PreflightResult(passed=[f"sbatch accepted it: job {job_id}"]), host=login)

    async def launch_multi(self, variant: str, params: dict[str, str], *, user: str, channel: str | None,
                           thread_ts: str | None, relaunch_of: int | None) -> LaunchOutcome:
        """Start a multi-host variant over SSH: under every host's launch lock (taken in name order), each host's
        pre-launch checks; then one row and one thread, and one process tree per host (rank K on the K-th host,
        with `{{ node_rank }}` K, `{{ nnodes }}`, `{{ master_addr }}` rank 0's address, tag `<tag>-rK`, log
        `<stem>-rankK<ext>`), ranks above 0 first, rank 0 last (its PID is the launch's; the watch starts with it).
        A rank that does not start stops the others. Raises LaunchError for bad input."""
        svc = self._svc
        v = svc.config.resolved_variant(variant)
        hosts = list(v.hosts or [])
        previews = [render_launch(svc.config, variant, params, launch_id=0, host=h, rank=k)
                    for k, h in enumerate(hosts)]
        args = {"variant": variant, "hosts": hosts, "params": svc.secrets.for_record(params)}
        try:
            async with contextlib.AsyncExitStack() as stack:
                for h in sorted(hosts):
                    await stack.enter_async_context(svc.locks.host(h))
                problems, passed = await self._checks(previews, variant)
                if problems:
                    svc.audit.record(user_id=user, action="launch", args=args, result="refused",
                                     detail="; ".join(problems), host=hosts[0], channel=channel)
                    return LaunchOutcome(None, checks=PreflightResult(problems=problems), host=", ".join(hosts))
                la = svc.record_launch(variant, params, host=hosts[0], port=v.port, gpus=previews[0].gpus, user=user,
                                       channel=channel, thread_ts=thread_ts, relaunch_of=relaunch_of, nodes=hosts)
                rendered = [render_launch(svc.config, variant, params, launch_id=la.id, host=h,
                                          tag=rank_tag(la.tag, k), rank=k) for k, h in enumerate(hosts)]
                la = svc.store_command(la, rendered[0])
                if thread_ts is None:
                    la = await svc.threads.open(la)
                for k in range(1, len(hosts)):
                    why = await self._start_rank(rendered[k], hosts[k])
                    current = svc.rows.get(la.id)
                    if why is None and (current is None or current.state != LaunchState.STARTING):
                        await self._stop_ranks(la, range(1, k + 1))  # killed while its ranks started
                        return LaunchOutcome(current or la, error="killed while its ranks were starting",
                                             host=", ".join(hosts))
                    if why is not None:
                        await self._stop_ranks(la, range(1, k + 1))  # rank k too: it may have started half way
                        why = f"rank {k} on {hosts[k]} could not start: {why}"
                        la = svc.transition(la, LaunchEvent.START_FAILED, state_detail=why)
                        svc.audit.record(user_id=user, action="launch", args=args, result="error", detail=why,
                                         launch_id=la.id, host=hosts[k], channel=la.channel)
                        await svc.threads.show(la)
                        return LaunchOutcome(la, error=why, host=", ".join(hosts))
                checks = PreflightResult(passed=passed)
                out = await svc.start_rank0(la, rendered[0], user, args, checks)
                if out.launch is not None and out.launch.state == LaunchState.FAILED and out.launch.pid is None:
                    await self._stop_ranks(la, range(1, len(hosts)))
                return out
        except LockTimeout as e:
            svc.audit.record(user_id=user, action="launch", args=args, result="error", detail=str(e), host=hosts[0],
                             channel=channel)
            return LaunchOutcome(None, error=f"{e}; try again in a moment", host=", ".join(hosts))

    async def _checks(self, previews: list[RenderedLaunch], variant: str) -> tuple[list[str], list[str]]:
        """Each host's pre-launch checks (its port, GPUs, /dev/shm, launches there): problems prefixed by the host,
        and the checks passed (rank 0's)."""
        svc = self._svc
        problems: list[str] = []
        passed: list[str] = []
        snaps = await asyncio.gather(*(svc.snapshot(r.host, ProbeRequest(port=r.port, health_path=None, shm=True))
                                       for r in previews), return_exceptions=True)  # every host at once
        for k, (r, snap) in enumerate(zip(previews, snaps, strict=True)):
            if isinstance(snap, RemoteError):
                problems.append(f"{r.host}: cannot be read: {snap}")
                continue
            if isinstance(snap, BaseException):
                raise snap
            same, others = await svc.live_on(r.host, snap, variant)
            res = prelaunch_checks(snap, r, svc.holders(snap), live_same_variant=same, other_live=others,
                                   gpu_free_mib=svc.gpu_free_mib, shm_free_mib=snap.shm_free_mib,
                                   min_shm_free_mib=svc.min_shm_free_mib)
            problems += [f"{r.host} (rank {k}): {p}" for p in res.problems]
            if k == 0:
                passed = list(res.passed)
        return problems, passed

    async def _start_rank(self, r: RenderedLaunch, host: str) -> str | None:
        """Start one rank's process tree on `host` (the launch script, as for any launch). Returns why it did not
        start, or None."""
        return (await self._svc.run_launch_script(host, r))[1]

    async def _stop_ranks(self, la: Launch, ranks: Sequence[int]) -> None:
        """Stop ranks `ranks` of `la` (a start that failed part way), verified like any kill; never raises."""
        for k in ranks:
            host = la.nodes[k]
            try:
                await self._svc.kill_view(rank_view(la, k, host), KillOutcome(target=f"{la.name} rank {k}", host=host))
            except RemoteError as e:
                log.warning("%s: rank %d on %s could not be stopped: %s", la.name, k, host, e)

    # -- kill ---------------------------------------------------------------------------------------
    async def kill(self, la: Launch, out: KillOutcome) -> KillOutcome:
        """Stop every rank of `la`: a Slurm job with `scancel` (then wait until Slurm says it ended, at most
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
                    await asyncio.sleep(self._svc.poll_s)
                    job = await client.show(la.job_id)
            except SlurmError as e:
                out.error, out.partial = str(e), scancelled
                return out
            if job is not None and job.active:
                said.append(f"Slurm job {la.job_id} is still {job.state} after scancel")
            elif scancelled:
                out.cancelled_job = la.job_id
            if job is not None and job.nodes and not la.nodes:
                la = self._svc.rows.update(la.id, nodes=list(job.nodes))
        # a node reached through Slurm (no host of the config) is Slurm's to clean: once its job ended, every step of
        # it was stopped there, and srun can no longer reach it
        parts = await asyncio.gather(*(self._kill_rank(la, k, node, host if host in self._svc.config.hosts else None)
                                       for k, node, host in self.ranks(la)))
        for part in parts:
            out.signalled += part.signalled
            out.remaining += part.remaining
            out.still_holding += part.still_holding
            out.used_sigkill = out.used_sigkill or part.used_sigkill
            for name in ("mem_before_mib", "mem_after_mib"):
                a, b = getattr(out, name), getattr(part, name)
                setattr(out, name, b if a is None else a if b is None else a + b)
            if part.error:
                said.append(part.error)
            if part.gpu_error:
                out.gpu_error = part.gpu_error
        if said:
            out.error = "; ".join(said)
            # part of it was stopped: the job's scancel accepted, or a rank's host reached and its processes stopped
            out.partial = scancelled or any(not p.error and p.signalled for p in parts)
        out.nothing_to_kill = not la.job_id and all(p.nothing_to_kill for p in parts)
        out.released = not out.error and all(p.released or p.nothing_to_kill for p in parts)
        return out

    async def _kill_rank(self, la: Launch, rank: int, node: str, host: str | None) -> KillOutcome:
        target = f"{la.name} rank {rank} on {node}"
        if host is None:
            return KillOutcome(target=target, nothing_to_kill=True, released=True)
        try:
            return await self._svc.kill_view(rank_view(la, rank, host), KillOutcome(target=target, host=host))
        except RemoteError as e:
            return KillOutcome(target=target, host=host, error=f"{node}: {e}")
