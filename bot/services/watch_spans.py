"""The checks of a launch across nodes (a Slurm job, or a multi-host variant over SSH), as the Watcher's part
`SpanningChecks` (bot.services.watch): the job as Slurm says it (ended, requeued, pending, running: each told in the
thread), every rank looked at on its node, a rank's host that does not answer told, a rank gone judged by its own
log, and a job that ended judged by the most specific failure of its ranks' logs. It uses the Watcher's one-launch
look (`_look`, `_gather`), its acting on a verdict (`_act`, `_record`) and its thread (`_notice`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import replace

from bot.adapters.remote import RemoteError
from bot.adapters.store import DatabaseUnavailable
from bot.core.commands import slash
from bot.core.diagnose import Verdict
from bot.core.models import HostFailure, Launch, LaunchState
from bot.core.ranks import (
    NodeLook,
    job_end_verdict,
    most_specific_failure,
    rank_view,
    weigh_nodes,
)
from bot.core.records import CheckRecord
from bot.core.slurm import SlurmError, SlurmJob, job_line, job_nodes_text
from bot.core.text import counted
from bot.present.render import fmt_duration
from bot.services.looks import CheckOutcome, Look, Superseded

log = logging.getLogger("bot.services.watch")

#: How often a rank of a job Slurm ended (or a rank gone while rank 0 runs) is looked at before it counts as not
#: read (a node that does not answer once, under load, still gets its log read).
RANK_LOOKS = 3
#: At most this many ranks gone while rank 0 runs are read in full by one check.
GONE_RANKS_READ = 8


def _requeued(la: Launch, job: SlurmJob) -> bool:
    """Whether Slurm requeued `la`'s job since a check last recorded its restart count."""
    return job.restarts is not None and la.job_restarts is not None and job.restarts > la.job_restarts


class SpanningChecks:
    """The Watcher's checks of launches across nodes (a mixin of bot.services.watch.Watcher: it uses the
    Watcher's attributes and its one-launch look and act)."""

    async def _check_spanning(self, la: Launch, history: list[CheckRecord]) -> CheckOutcome:
        """One check of a launch across nodes. A Slurm job is read first (`squeue`, one call shared by every job on its
        login node, at most a check interval old): one Slurm ended gets its verdict from Slurm's state, reason and
        exit code (`_job_ended`); one Slurm requeued is told and started over (`_job_requeued`); a pending one is
        shown with its reason and never judged (`_job_pending`); a running one gets its nodes recorded (`_job_side`).
        Then rank 0 is looked at and judged as any launch (on its node), every other rank is probed (a rank's host
        that does not answer is told, `_rank_hosts`), and the verdict weighs every rank's evidence and names the
        odd one (bot.core.ranks.weigh_nodes), a rank gone of its own failure by its own log. Where a rank is gone or
        rank 0 not seen alive, Slurm is asked again (`_rank_not_alive`: its word of now decides whether the job
        ended or was requeued)."""
        runner = self.launches.runner(la)
        job = None
        if runner.scheduled:  # the job first, as Slurm says it
            la, job, done = await self._job_side(la, history)
            if done is not None:
                return done
        ranks = runner.ranks(la)
        if not ranks or ranks[0][2] is None:  # no node gpubot can probe: Slurm's word alone
            return CheckOutcome(None, False, la)
        view = rank_view(la, 0, ranks[0][2])
        looked = await self._gather(view, history)
        if isinstance(looked, HostFailure):
            self._history.add(la.id, CheckRecord.failed(self._clock.time(), looked.reason))
            await self._host_unreachable(view, looked.reason)
            return CheckOutcome(None, False, self._launch_rows.get(la.id) or la, error=looked.reason)
        looks = [runner.node_look(view, 0, ranks[0][1], looked.snap, looked.verdict.verdict),
                 *await runner.look_ranks(la, ranks[1:])]
        await self._rank_hosts(la, ranks, looks)
        if job is not None and (looked.obs.process_alive is not True or any(x.alive is False for x in looks)):
            ended = await self._rank_not_alive(la, looked, looks, history)
            if ended is not None:
                return ended
        failed = await self._gone_failure(la, looked, looks, ranks, history)
        verdict = weigh_nodes(looked.verdict, looks, failed)
        if job is not None:  # the job as Slurm sees it, after the ranks' lines
            n = len(looks) if len(looks) > 1 else 0
            verdict = replace(verdict, evidence=[*verdict.evidence[:n], job_line(job), *verdict.evidence[n:]])
        return await self._act(replace(looked, la=replace(looked.la, host=view.host), verdict=verdict), history,
                               others_gone=all(x.alive is False for x in looks[1:]))

    async def _gone_failure(self, la: Launch, looked: Look, looks: Sequence[NodeLook],
                            ranks: Sequence[tuple[int, str, str | None]], history: list[CheckRecord]
                            ) -> tuple[int, str, Verdict] | None:
        """Why the ranks gone while rank 0 runs (and Slurm still runs the job) ended: their own logs (an OOM, a
        crash), each read in full, the one that says most counting (as for a job that ended, and a bundle). Read
        once per set of ranks gone (kept in `_gone_failures`: a rank that stays gone is not read again at every
        check); None when no rank is gone or rank 0 is not seen alive."""
        gone = [x for x in looks[1:] if x.alive is False][:GONE_RANKS_READ]
        if not (looked.obs.process_alive and gone):
            self._gone_failures.pop(la.id, None)
            return None
        key = frozenset(x.rank for x in gone)
        known = self._gone_failures.get(la.id)
        if known is not None and known[0] == key:
            return known[1]
        failed = most_specific_failure(await asyncio.gather(*(
            self._rank_failure(la, x.rank, x.node, ranks[x.rank][2] or la.host, history) for x in gone)))
        self._gone_failures[la.id] = (key, failed)
        return failed

    async def _job_side(self, la: Launch, history: list[CheckRecord]
                        ) -> tuple[Launch, SlurmJob | None, CheckOutcome | None]:
        """The Slurm side of a check of a job's launch: the job as Slurm says it (at most a check interval old: one
        squeue per login node for all its jobs), and the outcome where that decides the check (Slurm unreachable,
        the job ended, requeued or pending); else None, with the job's nodes recorded (and told once they change)."""
        try:
            job = await self.launches.slurm.job(la, max_age_s=self._interval(la))
        except (RemoteError, SlurmError) as e:
            reason = f"Slurm on {la.host}: {e}"
            self._history.add(la.id, CheckRecord.failed(self._clock.time(), reason))
            await self._host_unreachable(la, reason)
            return la, None, CheckOutcome(None, False, self._launch_rows.get(la.id) or la, error=reason)
        if job is None or not job.active:
            return la, job, await self._job_ended(la, job, failed=await self._ranks_failure(la, job, history))
        if _requeued(la, job):
            return la, job, await self._job_requeued(la, job)
        if job.restarts is not None and la.job_restarts is None:  # first read: nothing to tell (never lowered)
            with self._unless_refused(la, "how often its job was requeued"):
                la = self._launch_rows.update(la.id, job_restarts=job.restarts)
        # a requeued job's old run still ending (COMPLETING on its old nodes) is not the job running again
        if job.pending or not job.nodes or (job.restarts and not la.nodes and job.state != "RUNNING"):
            return la, job, await self._job_pending(la, job)
        if list(job.nodes) != la.nodes:
            la = self._launch_rows.update(la.id, nodes=list(job.nodes), state_detail=job_nodes_text(job))
            await self._threads.show(la)
            again = f" again (after {counted(job.restarts or 0, 'requeue')})" if job.restarts else ""
            await self._notice(la, ":arrow_forward:", f"Slurm job {la.job_id} of {la.name} is "
                                                      f"{job_nodes_text(job)}{again}",
                               "The checks now look at every node of the job"
                               + (": a fresh start-up, then a fresh ready." if again else "."))
        return la, job, None

    async def _rank_not_alive(self, la: Launch, looked: Look, looks: Sequence[NodeLook],
                              history: list[CheckRecord]) -> CheckOutcome | None:
        """A rank gone, or rank 0 not seen alive, while Slurm, as last read, still has the job: Slurm's word of now
        decides, read afresh (a rank gone: until Slurm ends or requeues the job, at most `ending_wait_s`, since a
        stop Slurm makes, a cancel, a requeue, a node taken down, ends the ranks before Slurm's state says so). A
        job Slurm requeued is told so (`_job_requeued`); a job that ended gets its verdict (`_job_ended`; its ranks'
        own failure, a CUDA OOM where Slurm only records an exit, else the look that saw rank 0 gone); a job Slurm
        still runs after rank 0 is gone (its prolog, an image pull, a step not started yet, one that is ending) is
        not judged on one node's look (an outcome without a verdict); None where Slurm still runs the job and rank
        0 was not seen gone: the check goes on (a rank gone while rank 0 runs is judged by the caller)."""
        gone0 = looked.obs.process_alive is False
        gone = frozenset(x.rank for x in looks if x.alive is False)
        # a rank gone: Slurm's end or requeue is waited for, once for the same ranks gone (not at every check)
        if gone0 or (gone and not gone <= self._gone_waited.get(la.id, frozenset())):
            self._gone_waited[la.id] = gone
            job = await self._job_after_end(la)
        else:  # rank 0 not told: Slurm's word of now; ranks gone already waited for: of this check interval
            try:
                job = await self.launches.slurm.job(la, max_age_s=self._interval(la) if gone else 0.0)
            except (RemoteError, SlurmError) as e:
                log.info("%s: job %s not read again: %s", la.name, la.job_id, e)
                return None
        if job is not None and job.active and _requeued(la, job):
            return await self._job_requeued(la, job)
        if job is None or not job.active:
            failed = await self._ranks_failure(la, job, history, rank0_seen=looked.verdict)
            return await self._job_ended(la, job, looks, failed=failed)
        return CheckOutcome(None, False, self._launch_rows.get(la.id) or la) if gone0 else None

    async def _ranks_failure(self, la: Launch, job: SlurmJob | None, history: list[CheckRecord],
                             rank0_seen: Verdict | None = None) -> tuple[int, str, Verdict] | None:
        """Why a job found ended ended, by its ranks' own logs: every rank looked at (in parallel, _rank_failure)
        and the one that says most chosen (bot.core.ranks.most_specific_failure: a rank's OOM before the crashes and
        NCCL timeouts of the ranks it took down). `rank0_seen`: rank 0's verdict of the look that saw it gone, used
        when rank 0 cannot be looked at again. None when no rank could be looked at."""
        nodes = list(job.nodes) if job is not None and job.nodes else list(la.nodes)
        if not nodes:
            return None
        hosts = self.launches.config.hosts
        # a node the config does not have: the rank's log read on the login node, which shares the ranks' logs
        found = list(await asyncio.gather(*(self._rank_failure(la, k, node, node if node in hosts else la.host,
                                                               history) for k, node in enumerate(nodes))))
        if found[0] is None and rank0_seen is not None:
            found[0] = (0, nodes[0], rank0_seen)
        return most_specific_failure(found)

    async def _rank_failure(self, la: Launch, rank: int, node: str, host: str,
                            history: list[CheckRecord]) -> tuple[int, str, Verdict] | None:
        """Rank `rank`'s own verdict (on `node`, read through config host `host`) of its end: its log's last 200
        lines and its processes judged as the launch's are (rank 0 with the launch's check history, another rank
        afresh). A node that does not answer is asked again (RANK_LOOKS tries: the last look at an ending job is
        worth it on a busy node). None when it never answered."""
        view = rank_view(la, rank, host)
        own = rank == 0
        prev = next((r for r in reversed(history) if r.ok), None) if own else None
        for attempt in range(RANK_LOOKS):
            looked = await self._look(view, self.launches.launch_probe_request(view, tail_lines=200),
                                      history if own else [], prev, own=own)
            if isinstance(looked, Look):
                return rank, node, looked.verdict
            log.info("%s: rank %d on %s not looked at (try %d of %d): %s", la.name, rank, host, attempt + 1,
                     RANK_LOOKS, looked.reason)
            if attempt + 1 < RANK_LOOKS:
                await asyncio.sleep(self.ending_poll_s)
        return None

    async def _job_after_end(self, la: Launch) -> SlurmJob | None:
        """The job read again until Slurm says it ended (at most `ending_wait_s`): its ranks are gone."""
        deadline = self._clock.monotonic() + self.ending_wait_s
        job = None
        while True:
            try:
                job = await self.launches.slurm.job(la)
            except (RemoteError, SlurmError) as e:
                log.warning("%s: job %s not read: %s", la.name, la.job_id, e)
                return job
            if job is None or not job.active or _requeued(la, job) or self._clock.monotonic() >= deadline:
                return job
            await asyncio.sleep(self.ending_poll_s)

    async def _job_requeued(self, la: Launch, job: SlurmJob) -> CheckOutcome:
        """Slurm requeued the job (its restart count grew: `scontrol requeue`, a node failure, a preemption): told
        once in the thread, with the nodes Slurm took out of service among those it ran on (`sinfo`), and the
        launch starts over: no nodes, not ready, no alert state, checked at the start-up interval, so that the run
        that follows gets a fresh readiness watch and a fresh `ready`. Of two bots, the one whose compare and set
        of the restart count wins tells it."""
        old, nodes = la.job_restarts, list(la.nodes)
        try:
            states = await self.launches.slurm.slurm(la.host).node_states(nodes) if nodes else {}
        except (RemoteError, SlurmError) as e:
            log.info("%s: the states of nodes %s not read: %s", la.name, nodes, e)
            states = {}
        failed = [st.text() for st in states.values() if st.failed]
        why = (f"{'; '.join(failed)}" if failed else
               "no node of it is out of service: `scontrol requeue`, a preemption or the job's own exit")
        text = job_nodes_text(job)
        try:  # the root shows the job's state now (as a pending check writes it: no second notice for it)
            changed = self._launch_rows.update_if(
                la.id, {"job_restarts": old}, job_restarts=job.restarts, nodes=[], ready_at=None, alert_state=None,
                unreachable_since=None, state_detail=text[:300])
        except DatabaseUnavailable as e:
            log.error("check of %s: cannot record its requeue (%s)", la.name, e)
            return CheckOutcome(None, False, la, error=str(e))
        if changed is None:  # another bot recorded (and tells) it
            return CheckOutcome(None, False, self._launch_rows.get(la.id) or la)
        la = changed
        for memo in (self._cheap, self._memos, self._busy, self._rank_hosts_down, self._gone_waited,
                     self._gone_failures):
            memo.pop(la.id, None)
        await self._threads.show(la)
        await self._notice(la, ":repeat:", f"Slurm requeued job {la.job_id} of {la.name}: {why}. It now "
                                           f"{'waits in the queue: ' + text if job.pending else 'is ' + text}",
                           "Not a failure of the launch: when Slurm runs the job again, the checks follow its "
                           "start-up afresh and post a fresh ready.")
        with self._unless_refused(la, "its schedule"):
            self.watch(la)  # the start-up interval again
        return CheckOutcome(None, False, la)

    async def _job_pending(self, la: Launch, job: SlurmJob) -> CheckOutcome:
        """A job waiting in Slurm's queue: its state and reason on the root, a notice in the thread when the reason
        changes (once Slurm gave one). Never a hang: nothing is judged."""
        text = job_nodes_text(job)
        if la.state_detail != text:
            la = self._launch_rows.update(la.id, state_detail=text)
            await self._threads.show(la)
            if job.reason:
                await self._notice(la, ":hourglass_flowing_sand:", f"{la.name} waits in Slurm's queue: {text}",
                                   f"Not a hang: the checks start when Slurm runs job {la.job_id}. "
                                   f"`{slash('kill', la.id)}` takes it out of the queue.")
        return CheckOutcome(None, False, la)

    async def _job_ended(self, la: Launch, job: SlurmJob | None, looks: Sequence[NodeLook] = (),
                         failed: tuple[int, str, Verdict] | None = None) -> CheckOutcome:
        """A job Slurm ended (or forgot): the verdict from Slurm's state, reason and exit code, or from the log of
        the rank that `failed` where Slurm only records an exit (bot.core.ranks.job_end_verdict), with its
        `scontrol` line and the ranks' last `looks`, posted once; the launch ends (exited for exit 0, else
        failed)."""
        verdict = job_end_verdict(job, la.job_id or "", looks, failed)
        name, summary = verdict.verdict, verdict.summary
        record = CheckRecord(t=self._clock.time(), alive=False, verdict=name)
        self._history.add(la.id, record)
        current = self._launch_rows.get(la.id)
        if current is None or not current.live or current.state == LaunchState.KILL_FAILED:
            # killed meanwhile, or a kill that cancelled the job and could not verify every rank: a deliberate stop
            # is no news (a kill_failed launch stays so: a kill again verifies what is left)
            self.unwatch(la.id)
            return CheckOutcome(verdict, False, current)
        fields = {"alert_state": name, "state_detail": summary[:300]}
        # rank 0's own failure may have been posted while Slurm was ending the job; composed before it is recorded
        end = LaunchState.EXITED if name == "exited" else LaunchState.FAILED
        alert = await self._alerts.compose(replace(current, **fields, state=end), verdict, record) \
            if name != current.alert_state else None
        try:
            la = self._record(la, current, fields, end, current.alert_state)
        except Superseded:
            return CheckOutcome(verdict, False, self._launch_rows.get(la.id))
        alerted = False
        if name != current.alert_state:
            alerted = await self._alerts.send(la, verdict, alert) if alert is not None else False
        else:
            await self._threads.show(la, verdict)
        with self._unless_refused(la, "its schedule"):
            self.unwatch(la.id)
        return CheckOutcome(verdict, alerted, la)

    async def _rank_hosts(self, la: Launch, ranks: Sequence[tuple[int, str, str | None]],
                          looks: Sequence[NodeLook]) -> None:
        """Tell the thread once when the host of a rank above 0 has not answered two looks in a row (which rank,
        which host, why), and once when it answers again, with how long it was out: since the last look it answered
        (a host that hangs fails a look only at the probe's deadline, so the first failed look's time would say
        too little). Rank 0's host is the launch's own (`_host_unreachable`). Kept in memory (host -> looks failed
        in a row, the last look it answered or the first failed, told): a restart of the bot tells a host still
        down once more."""
        down = self._rank_hosts_down.setdefault(la.id, {})
        now = self._clock.time()
        for (rank, node, host), look in zip(ranks[1:], looks[1:], strict=False):
            if host is None:
                continue
            failed, since, told = down.get(host, (0, now, False))
            if look.alive is None and look.error:
                failed += 1
                down[host] = (failed, since, told or failed >= 2)
                if failed >= 2 and not told:
                    await self._notice(la, ":electric_plug:",
                                       f"{node} (rank {rank} of {la.name}) cannot be reached: {look.error}",
                                       f"The checks of {la.name} go on and tell this thread when {node} is back; "
                                       f"rank {rank} is not seen meanwhile.")
            else:
                down[host] = (0, now, False)  # answered now: an outage from here on counts from this look
                if told:
                    await self._notice(la, ":white_check_mark:",
                                       f"{node} (rank {rank} of {la.name}) is reachable again (it was not for "
                                       f"{fmt_duration(now - since)})", f"The checks of {la.name} go on.")
