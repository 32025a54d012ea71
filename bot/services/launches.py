"""LaunchService: launch, kill and relaunch server variants, with pre-launch checks, verified GPU release, incident
threads and the audit trail: the life of a launch, the same for every kind. How a launch of each kind starts, is looked
at and stops is its runner's (bot.services.runners, chosen once: `runner_for` from the variant, `runner` of a row);
the runner returns outcomes, applied here once: the record, the thread, the transitions, the audit, the hooks.

A launch is recorded (state `starting`) before its process is started, and its PID and PGID (= SID, its
wrapper shell) right after; its root message is posted in between. Every action is recorded by the audit
writer with the Slack user ID, args and result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from bot.adapters.locks import DecisionLocks, LockTimeout
from bot.adapters.remote import RemoteError
from bot.adapters.secretbox import SecretBox
from bot.adapters.store import Store
from bot.config import Config, GenerateCheck, placement_plan, render_launch
from bot.core.commands import slash
from bot.core.fleet import free_gpus
from bot.core.lifecycle import (
    Holder,
    KillOutcome,
    KillPreview,
    LaunchError,
    LaunchOutcome,
    PreflightResult,
    RenderedLaunch,
    kill_end,
    prelaunch_checks,
)
from bot.core.models import HostFailure, Launch, LaunchKind, LaunchState, ProcessInfo, Snapshot
from bot.core.placement import PlacementNote, PlacementPlan, order_hosts, pick_gpus
from bot.core.probe import ProbeRequest
from bot.core.redact import MASK, SECRET_NAME_RE, Redactor
from bot.core.transitions import InvalidTransition, LaunchEvent, being_stopped, next_state
from bot.present.views import kill_view
from bot.services.audit import Audit
from bot.services.holders import GpuHolders
from bot.services.hosts import HostService
from bot.services.lookup import find_launch
from bot.services.probes import LaunchProbes
from bot.services.runners import Begun, Runner, runner_for
from bot.services.runners.host import HostRunner
from bot.services.runners.hosts import MultiHostRunner
from bot.services.runners.kill import KillPolicy, ProcessKiller
from bot.services.runners.slurm import SlurmRunner
from bot.services.secrets import SecretService
from bot.services.threads import IncidentThreads

log = logging.getLogger(__name__)
#: The state detail of a launch whose kill a restart interrupted, until a kill runs again: the persistent mark that
#: makes the next start finish it (even when the start that found it stopped too).
KILL_INTERRUPTED_DETAIL = "the bot stopped during a kill; kill it again"

#: The user id audited for a kill the bot runs again itself (one a restart interrupted).
RESUMED_BY = "gpubot"

#: A launch in state `starting` younger than this counts as live without looking for its processes.
STARTING_GRACE_S = 120.0
#: Tries of a state change that another writer keeps winning (`transition`).
TRANSITION_TRIES = 3
#: Longest snooze, minutes.
MAX_SNOOZE_MIN = 1440

#: Called with each launch whose process started (the watcher schedules its checks).
FollowHook = Callable[[Launch], Any]
#: Awaited with a launch found gone at its first check (the watcher diagnoses it: crashed, oom, ...).
EarlyExitHook = Callable[[Launch], Awaitable[Any]]


class LaunchService:
    """Launch/kill/relaunch for every configured host. Timings in seconds, memory in MiB; the lifecycle
    policy (GPU free threshold, kill grace, release timeout, /dev/shm minimum) comes from `config.lifecycle`.
    `poll_s` is how often a kill looks again, `start_check_s` when a new launch is first looked at. With a
    `secretbox`, a launch's secret param values are kept sealed in its row (`secrets`: SecretService): a restarted
    bot masks them again and a relaunch reuses them."""

    def __init__(self, config: Config, hosts: HostService, store: Store, audit: Audit, threads: IncidentThreads, *,
                 redactor: Redactor | None = None, poll_s: float = 0.5, start_check_s: float = 1.0,
                 sigkill_wait_s: float = 5.0, secretbox: SecretBox | None = None,
                 locks: DecisionLocks | None = None):
        self.config = config
        self.hosts = hosts
        self._launches = store.launches
        self._clock = store.clock  # the bot's one clock (bot.core.clock): wall times of records
        self._audit = audit
        self._threads = threads
        self._redactor = redactor or Redactor(config.redact_patterns)
        self.secrets = SecretService(config, store.launches, self._redactor, secretbox)
        lc = config.lifecycle
        self.gpu_free_mib = lc.gpu_free_mib
        self.min_shm_free_mib = lc.min_shm_free_mib
        self._interrupted: list[int] = []  # launches whose kill a restart interrupted, to finish at start
        self._unstarted: list[int] = []  # launches a restart left starting without a PID, to settle at start
        self.start_check_s = start_check_s
        #: one launch decision per host and one kill per launch at a time, across the bots of a shared database
        self.locks = locks or DecisionLocks()
        self._activity: dict[int, float] = {}
        self.follow_hooks: list[FollowHook] = []
        self.early_exit_hooks: list[EarlyExitHook] = []
        #: what a probe of a launch asks and says; who holds which GPU; the verified kill of a process tree
        self.probes = LaunchProbes(config, hosts)
        self.gpu_holders = GpuHolders(config, hosts, store.launches, store.clock)
        self.killer = ProcessKiller(hosts, self.probes, self.gpu_holders.holders, store.launches, KillPolicy(
            kill_grace_s=lc.kill_grace_s, sigkill_wait_s=sigkill_wait_s, release_timeout_s=lc.release_timeout_s,
            gpu_free_mib=lc.gpu_free_mib, poll_s=poll_s))
        #: the runner of each kind of launch; the Slurm one also answers the checks' questions of a job
        self.slurm = SlurmRunner(config, hosts, self.probes, self.killer, store.launches, poll_s=poll_s)
        self._runners: dict[LaunchKind, Runner] = {
            LaunchKind.HOST: HostRunner(config, hosts, self.killer),
            LaunchKind.HOSTS: MultiHostRunner(config, hosts, self.probes, self.killer, store.launches),
            LaunchKind.SLURM: self.slurm}

    def runner(self, la: Launch) -> Runner:
        """The runner of a recorded launch (bot.services.runners): how it is looked at, logged, dumped and stopped."""
        return self._runners[la.kind]

    # -- lookup -------------------------------------------------------------------------------------
    def get(self, launch_id: int) -> Launch | None:
        """The launch with this id, or None."""
        return self._launches.get(launch_id)

    def live(self, host: str | None = None) -> list[Launch]:
        """Live launches, newest first (optionally on one host)."""
        return self._launches.live(host)

    def thread_launch(self, channel: str | None, thread_ts: str | None) -> Launch | None:
        """The launch whose incident thread is (channel, thread_ts) (the newest, after relaunches), or None."""
        if not channel or not thread_ts:
            return None
        return self._launches.for_thread(channel, thread_ts)

    def find(self, ref: str | None, *, channel: str | None = None, thread_ts: str | None = None,
             allow_only_live: bool = True) -> Launch:
        """Resolve a launch reference (bot.services.lookup.find_launch: `12`, `#12`, `base#12`, a variant name, or
        nothing: this thread's launch, else the only live one). Raises LaunchError naming the live launches."""
        return find_launch(self.config, self._launches, ref, channel=channel, thread_ts=thread_ts,
                           allow_only_live=allow_only_live)

    def note_activity(self, launch_id: int) -> None:
        """Record that the bot itself just worked on the launch's processes (a stack dump): the next check does
        not count the CPU time that caused as progress. Real wall time (not the bot's clock): it is compared with
        the host's clock in the check's records."""
        self._activity[launch_id] = time.time()

    def bot_activity(self, launch_id: int) -> float | None:
        """Epoch seconds of the bot's latest own work on the launch's processes (see note_activity), or None."""
        return self._activity.get(launch_id)

    # -- who holds what (bot.services.holders) -----------------------------------------------------
    def holders(self, snap: Snapshot, host_launches: Sequence[Launch] | None = None) -> list[Holder]:
        """GpuHolders.holders: the GPU holders of a snapshot, attributed to its host's launches."""
        return self.gpu_holders.holders(snap, host_launches)

    def owners(self, snap: Snapshot, host_launches: Sequence[Launch] | None = None) -> dict[int, str]:
        """GpuHolders.owners: pid -> owner label of each GPU holder in `snap`."""
        return self.gpu_holders.owners(snap, host_launches)

    def launch_processes_of(self, la: Launch, snap: Snapshot) -> list[ProcessInfo]:
        """The live processes of `la` in a snapshot taken with `select_tag=la.tag` (LaunchProbes.processes_of)."""
        return self.probes.processes_of(la, snap)

    # -- probes of a launch (bot.services.probes) --------------------------------------------------
    def launch_probe_request(self, la: Launch, *, tail_lines: int = 20, gpu: bool = True,
                             port: bool = True, generate: bool = False) -> ProbeRequest:
        """A probe of one launch (LaunchProbes.request)."""
        return self.probes.request(la, tail_lines=tail_lines, gpu=gpu, port=port, generate=generate)

    def generation_check(self, la: Launch) -> GenerateCheck | None:
        """The generation check of the launch's variant, or None (LaunchProbes.generation_check)."""
        return self.probes.generation_check(la)

    async def probe_launch(self, la: Launch, *, tail_lines: int = 20,
                           request: ProbeRequest | None = None) -> Snapshot | HostFailure:
        """One probe of the launch: `request` (a launch_probe_request, perhaps narrowed to what a liveness check
        needs), by default launch_probe_request with `tail_lines`. A launch across nodes: its rank 0, on its node."""
        la = self.runner(la).rank0(la)
        return await self.hosts.probe(la.host, request or self.launch_probe_request(la, tail_lines=tail_lines))

    async def read_log(self, la: Launch, lines: int) -> Snapshot | HostFailure:
        """The last `lines` (1..500) lines of the launch's log with its stat, in one probe (no GPUs, no port).
        Raises LaunchError when the launch has no log path."""
        if not la.log_path:
            raise LaunchError(f"{la.name} has no log path")
        la = self.runner(la).rank0(la)  # rank 0's log, on its node
        return await self.hosts.probe(la.host, self.launch_probe_request(la, tail_lines=lines, gpu=False, port=False))

    # -- state --------------------------------------------------------------------------------------
    def transition(self, la: Launch, event: LaunchEvent, to: LaunchState | None = None, **fields: Any) -> Launch:
        """Apply `event` to launch `la` (bot.core.transitions: the one table of how a launch's state changes) and
        write its new state with `fields` in one update; the only writer of launches' states. An event that
        cannot happen in the state the launch has NOW (another writer won a race) writes `fields` alone and is
        logged. The state is compared and set in one write: another bot on a shared database may have moved it
        since it was read, and then the event is applied to the new state (up to TRANSITION_TRIES times). Returns
        the launch as stored. Raises what the store raises (DatabaseUnavailable)."""
        for _ in range(TRANSITION_TRIES):
            current = self._launches.get(la.id) or la
            try:
                state = next_state(current.state, event, to)
            except InvalidTransition as e:
                log.warning("%s: %s; its state stays %s", la.name, e, current.state.value)
                return self._launches.update(la.id, **fields) if fields else current
            # compare and set: another bot on the database may have moved the state since it was read
            done = self._launches.update_if(la.id, {"state": current.state}, state=state, **fields)
            if done is not None:
                return done
        log.warning("%s: %s lost %d races for its state; it stays %s", la.name, event.value, TRANSITION_TRIES,
                    current.state.value)
        return self._launches.update(la.id, **fields) if fields else (self._launches.get(la.id) or current)

    # -- launch -------------------------------------------------------------------------------------
    def recover_interrupted_kills(self) -> list[Launch]:
        """Launches left `stopping` by a bot that stopped mid-kill become `kill_failed` (live again, so they
        are watched and can be killed), and are remembered for `finish_interrupted_kills`. Call once at start,
        before taking commands. Returns them."""
        out = []
        for la in self._launches.in_state(LaunchState.STOPPING):
            out.append(self.transition(la, LaunchEvent.KILL_INTERRUPTED, state_detail=KILL_INTERRUPTED_DETAIL))
            log.warning("%s was being stopped when the bot stopped; it is now kill_failed", la.name)
        # the row itself is the marker: a bot that stopped again before finishing them (during this start) left
        # them kill_failed with this detail, and the next start finishes them
        earlier = [la.id for la in self._launches.in_state(LaunchState.KILL_FAILED)
                   if la.state_detail == KILL_INTERRUPTED_DETAIL and la.id not in {x.id for x in out}]
        self._interrupted = [*earlier, *(la.id for la in out)]
        self._unstarted = [la.id for la in self._launches.in_state(LaunchState.STARTING) if la.pid is None]
        return out

    async def recover_orphans(self) -> list[Launch]:
        """`recover_interrupted_kills` for a bot that just became the leader of a shared database, where other
        bots live on: a launch left `stopping` counts as interrupted only while nobody holds its kill lock, one left
        `starting` without a PID only while nobody holds its host's launch decision (the bot that was at it is
        gone). Returns the launches that became `kill_failed`."""
        out = []
        for la in self._launches.in_state(LaunchState.STOPPING):
            if await self.locks.kill_free(la.id):
                out.append(self.transition(la, LaunchEvent.KILL_INTERRUPTED, state_detail=KILL_INTERRUPTED_DETAIL))
                log.warning("%s was being stopped by a bot that is gone; it is now kill_failed", la.name)
        earlier = [la.id for la in self._launches.in_state(LaunchState.KILL_FAILED)
                   if la.state_detail == KILL_INTERRUPTED_DETAIL and la.id not in {x.id for x in out}]
        self._interrupted = [*earlier, *(la.id for la in out)]
        self._unstarted = [la.id for la in self._launches.in_state(LaunchState.STARTING)
                           if la.pid is None and await self.locks.host_free(la.host)]
        return out

    async def finish_interrupted_starts(self) -> list[Launch]:
        """Settle each launch a restart left `starting` without a PID (the bot stopped between recording it and
        starting its process, or before it read the PID back), found by `recover_interrupted_kills`: its processes
        are looked up by its tag; found, it becomes `running` with its wrapper (the session leader) and server
        recorded; none, it ended (`exited`, said why). An unreachable host leaves it as it is (the watcher looks
        again). Returns the launches it changed; never raises."""
        changed = []
        pending, self._unstarted = self._unstarted, []
        for launch_id in pending:
            la = self.get(launch_id)
            if la is None or la.state != LaunchState.STARTING or la.pid is not None:
                continue
            try:
                snap = await self.probes.snapshot(la.host, ProbeRequest(select_tag=la.tag or None, health_path=None,
                                                                  gpu=False))
            except RemoteError as e:
                log.warning("%s was left starting by a restart; %s cannot be read now: %s", la.name, la.host, e)
                continue
            procs = self.launch_processes_of(la, snap)
            if procs:
                leader = next((p for p in procs if p.pid == p.sid), procs[0])
                server = next((p for p in procs if p.ppid == leader.pid), leader)
                la = self.transition(la, LaunchEvent.STARTED, pid=server.pid, pgid=leader.pid, sid=leader.pid,
                                     unit=None, unit_manager=None, state_detail="the bot restarted while starting "
                                                                                "it; its processes were found again")
            else:
                la = self.transition(la, LaunchEvent.GONE, state_detail="the bot stopped while starting it; none "
                                                                        "of its processes runs")
            changed.append(la)
            await self._threads.show(la)
        return changed

    async def finish_interrupted_kills(self) -> list[KillOutcome]:
        """Finish each kill a restart interrupted (`recover_interrupted_kills`): the kill runs again, as any kill
        (its processes found by tag, cgroup and start time), and its result is posted in the launch's thread, led by
        "the kill of base#7 was interrupted by a restart of the bot". A launch killed or relaunched meanwhile is
        left alone. Returns the outcomes; never raises."""
        outs = []
        pending, self._interrupted = self._interrupted, []
        for launch_id in pending:
            la = self.get(launch_id)
            if la is None or la.state != LaunchState.KILL_FAILED:
                continue
            try:
                out = await self.kill(la, user=RESUMED_BY)
            except Exception:  # the kill reports remote failures itself; anything else must not stop the start
                log.exception("finishing the interrupted kill of %s failed", la.name)
                continue
            outs.append(out)
            la = self.get(launch_id) or la
            await self._threads.post(la, "kill_result", **kill_view(out, la.gpus),
                                     intro=f"The kill of {la.name} was interrupted by a restart of the bot; "
                                           "it ran again now.")
        return outs

    async def launch(self, variant: str, params: dict[str, str], *, user: str, channel: str | None = None,
                     host: str | None = None, thread_ts: str | None = None,
                     relaunch_of: int | None = None, prefer_gpus: Sequence[int] = ()) -> LaunchOutcome:
        """Check, record, open the incident thread (unless `thread_ts` continues one) and start one launch. A variant
        placed on a host group, or with a `gpu_count`, gets its host and GPUs picked first (`_launch_placed`;
        `prefer_gpus` are kept when free). Raises LaunchError for bad input (audited as invalid; nothing recorded);
        never raises for remote failures (they are in the outcome and the audit trail)."""
        self.secrets.learn(variant, params)  # before anything is recorded, posted or logged
        try:
            runner = runner_for(self.config, variant, host, self._runners)
            if runner is not None and not runner.placed:
                previews = runner.plan(variant, params)
                return await self._launch_ranks(runner, previews, variant, params, user=user, channel=channel,
                                                thread_ts=thread_ts, relaunch_of=relaunch_of)
            plan = placement_plan(self.config, variant, host, tuple(prefer_gpus))
            preview = render_launch(self.config, variant, params, launch_id=0, host=plan.hosts[0] if plan else host,
                                    gpus=plan.stand_in_gpus if plan else None)
        except LaunchError as e:
            self._audit.record(user_id=user, action="launch", result="invalid", detail=str(e), channel=channel,
                               args={"variant": variant, **self.secrets.for_record(params)})
            raise
        assert runner is not None  # an unknown variant: placement_plan raised
        if plan is not None:
            return await self._launch_placed(plan, runner, variant, params, user=user, channel=channel,
                                             thread_ts=thread_ts, relaunch_of=relaunch_of)
        # One launch decision at a time per host: two /launch racing (on one bot or two) must not both pass the checks.
        try:
            async with self.locks.host(preview.host):
                return await self._launch_locked(preview, runner, variant, params, user=user, channel=channel,
                                                 thread_ts=thread_ts, relaunch_of=relaunch_of)
        except LockTimeout as e:
            self._audit.record(user_id=user, action="launch", args={"variant": variant, "host": preview.host},
                               result="error", detail=str(e), host=preview.host, channel=channel)
            return LaunchOutcome(None, error=f"{e}; try again in a moment", host=preview.host)

    async def _launch_placed(self, plan: PlacementPlan, runner: Runner, variant: str, params: dict[str, str], *,
                             user: str, channel: str | None, thread_ts: str | None,
                             relaunch_of: int | None) -> LaunchOutcome:
        """Pick a host and GPUs for `plan` and launch there. The hosts are tried best fit first (a status of the
        group); on each, under its launch lock, the free GPUs are read again from a fresh probe and the launches
        recorded in the database, which a launch placed at the same moment has claimed (recorded with its GPUs)
        before it released the lock. A host that cannot take it now is passed over with its reason."""
        if len(plan.hosts) > 1:
            order, skipped = order_hosts(await self.gpu_holders.fleet(list(plan.hosts)), plan)
        else:
            order, skipped = list(plan.hosts), {}
        fitting = len(order)
        port = self.config.resolved_variant(variant).port
        for host in order:
            try:
                async with self.locks.host(host):
                    try:
                        snap = await self.probes.snapshot(host, ProbeRequest(port=port, health_path=None, shm=True))
                    except RemoteError as e:
                        skipped[host] = f"down: {str(e)[:120]}"
                        continue
                    same, others = await self._live_on(host, snap, variant)
                    free = free_gpus(snap.gpu, [*same, *others], self.gpu_free_mib)
                    gpus = pick_gpus(free, plan)
                    if gpus is None:
                        skipped[host] = (f"too few free GPUs: {len(free)} of {len(snap.gpu.gpus)} free"
                                         if snap.gpu.ok else f"GPUs unreadable: {(snap.gpu.error or '?')[:120]}")
                        continue
                    preview = render_launch(self.config, variant, params, launch_id=0, host=host, gpus=gpus)
                    note = PlacementNote(host=host, gpus=gpus, free_there=len(free), plan=plan, skipped=dict(skipped),
                                         fitting=fitting)
                    out = await self._launch_locked(preview, runner, variant, params, user=user, channel=channel,
                                                    thread_ts=thread_ts, relaunch_of=relaunch_of, snap=snap,
                                                    live=(same, others), placed=note)
                    if out.launch is None and out.checks.problems and len(order) > 1:
                        skipped[host] = f"refused: {out.checks.problems[0][:160]}"
                        continue  # the next host; when none is left, every host's reason is said below
                    return out
            except LockTimeout:
                skipped[host] = "busy: another launch was being decided there"
        where = plan.where
        if skipped and all(why.startswith("busy:") for why in skipped.values()) and len(skipped) == len(order):
            detail = f"every host of {where} that had room was busy deciding another launch"
            self._audit.record(user_id=user, action="launch", args={"variant": variant, "where": where},
                               result="error", detail=detail, channel=channel)
            return LaunchOutcome(None, error=f"{detail}; try again in a moment", host=where)
        need = (f"GPU{'' if len(plan.gpus) == 1 else 's'} {','.join(map(str, plan.gpus))} free" if plan.gpus else
                f"{plan.count} free GPU{'' if plan.count == 1 else 's'}")
        lines = [f"{h}: {why}" for h, why in sorted(skipped.items())]
        shown = lines[:8] + ([f"... and {len(lines) - 8} more hosts"] if len(lines) > 8 else [])
        problem = (f"no host of {where} can take it now (it needs {need})" if plan.group
                   else f"{plan.hosts[0]} does not have {need} now")
        problem += (": " + "; ".join(shown) if shown else "") + (
            f". Find room with `{slash('free', plan.count, f'group={plan.group}' if plan.group else '')}`".rstrip()
            if plan.count else "")
        self._audit.record(user_id=user, action="launch", args={"variant": variant, "where": where}, result="refused",
                           detail=problem, channel=channel)
        return LaunchOutcome(None, checks=PreflightResult(problems=[problem]), host=where)

    async def _live_on(self, host: str, snap: Snapshot, variant: str) -> tuple[list[Launch], list[Launch]]:
        """The live launches of ours on `host` that still run (or started a moment ago), split into those of
        `variant` and the others; a live launch with no process left in `snap` is marked gone (and its thread
        shown)."""
        same, others = [], []
        for la in self._launches.live(host):
            recent = la.state == LaunchState.STARTING and self._clock.time() - la.created_at < STARTING_GRACE_S
            if self.runner(la).spans:  # its own checks (the job, every rank) decide when it ended, not one host's look
                (same if la.variant == variant and host in la.nodes else others).append(la)
            elif recent or self.launch_processes_of(la, snap):
                (same if la.variant == variant else others).append(la)
            else:
                la = self.transition(la, LaunchEvent.GONE, state_detail="no process left (seen at a later launch)")
                await self._threads.show(la)
        return same, others

    async def _launch_locked(self, preview: RenderedLaunch, runner: Runner, variant: str, params: dict[str, str], *,
                             user: str, channel: str | None, thread_ts: str | None, relaunch_of: int | None,
                             snap: Snapshot | None = None, live: tuple[list[Launch], list[Launch]] | None = None,
                             placed: PlacementNote | None = None) -> LaunchOutcome:
        """The checks, the record (the GPUs' claim) and the start, under the host's launch lock. `snap` and `live`
        when the caller has read them under the lock; `placed`: the launch's placement (then another live launch of
        the same variant on other GPUs and port is no obstacle)."""
        host = preview.host
        args = {"variant": variant, "host": host, "params": self.secrets.for_record(params)}
        if placed is not None:
            args["gpus"] = list(placed.gpus)
        if snap is None:
            try:
                snap = await self.probes.snapshot(host, ProbeRequest(port=preview.port, health_path=None, shm=True))
            except RemoteError as e:
                self._audit.record(user_id=user, action="launch", args=args, result="error", detail=str(e), host=host,
                                   channel=channel)
                return LaunchOutcome(None, error=f"pre-launch check of {host} failed: {e}", host=host)
        same, others = live if live is not None else await self._live_on(host, snap, variant)
        if placed is not None:
            same, others = [], [*same, *others]
        checks = prelaunch_checks(snap, preview, self.holders(snap), live_same_variant=same, other_live=others,
                                  gpu_free_mib=self.gpu_free_mib, shm_free_mib=snap.shm_free_mib,
                                  min_shm_free_mib=self.min_shm_free_mib)
        if not checks.ok:
            self._audit.record(user_id=user, action="launch", args=args, result="refused",
                               detail="; ".join(checks.problems), host=host, channel=channel)
            return LaunchOutcome(None, checks=checks, host=host)
        la = self.record_launch(variant, preview.params, user=user, channel=channel, thread_ts=thread_ts,
                                relaunch_of=relaunch_of, **runner.row(variant, [preview]))
        out = await self._begin(la, runner, runner.render(variant, params, la), user, args, checks)
        out.placement = placed.describe() if placed is not None else None
        return out

    async def _launch_ranks(self, runner: Runner, previews: list[RenderedLaunch], variant: str,
                            params: dict[str, str], *, user: str, channel: str | None, thread_ts: str | None,
                            relaunch_of: int | None) -> LaunchOutcome:
        """A launch its runner places itself (across nodes): under the launch decision of every host it decides on
        (taken in name order), each one's pre-launch checks; then the record, the thread and the start."""
        args = runner.audit_args(variant, previews, self.secrets.for_record(params))
        decided = runner.decides_on(previews)
        try:
            async with contextlib.AsyncExitStack() as stack:
                for h in sorted(decided):
                    await stack.enter_async_context(self.locks.host(h))
                problems, passed = await self._rank_checks([r for r in previews if r.host in decided], variant)
                if problems:
                    self._audit.record(user_id=user, action="launch", args=args, result="refused",
                                       detail="; ".join(problems), host=previews[0].host, channel=channel)
                    return LaunchOutcome(None, checks=PreflightResult(problems=problems),
                                         host=runner.shown_host(previews))
                la = self.record_launch(variant, params, user=user, channel=channel, thread_ts=thread_ts,
                                        relaunch_of=relaunch_of, **runner.row(variant, previews))
                return await self._begin(la, runner, runner.render(variant, params, la), user, args,
                                         PreflightResult(passed=passed))
        except LockTimeout as e:
            self._audit.record(user_id=user, action="launch", args=args, result="error", detail=str(e),
                               host=previews[0].host, channel=channel)
            return LaunchOutcome(None, error=f"{e}; try again in a moment", host=runner.shown_host(previews))

    async def _rank_checks(self, previews: list[RenderedLaunch], variant: str) -> tuple[list[str], list[str]]:
        """Each rank's host's pre-launch checks (its port, GPUs, /dev/shm, launches there), all read at once:
        problems prefixed by the host and rank, and the checks passed (rank 0's)."""
        problems: list[str] = []
        passed: list[str] = []
        snaps = await asyncio.gather(*(self.probes.snapshot(r.host, ProbeRequest(port=r.port, health_path=None,
                                                                                 shm=True))
                                       for r in previews), return_exceptions=True)  # every host at once
        for k, (r, snap) in enumerate(zip(previews, snaps, strict=True)):
            if isinstance(snap, RemoteError):
                problems.append(f"{r.host}: cannot be read: {snap}")
                continue
            if isinstance(snap, BaseException):
                raise snap
            same, others = await self._live_on(r.host, snap, variant)
            res = prelaunch_checks(snap, r, self.holders(snap), live_same_variant=same, other_live=others,
                                   gpu_free_mib=self.gpu_free_mib, shm_free_mib=snap.shm_free_mib,
                                   min_shm_free_mib=self.min_shm_free_mib)
            problems += [f"{r.host} (rank {k}): {p}" for p in res.problems]
            if k == 0:
                passed = list(res.passed)
        return problems, passed

    def record_launch(self, variant: str, params: Mapping[str, Any], *, host: str, port: int | None,
                      gpus: list[int], user: str, channel: str | None, thread_ts: str | None,
                      relaunch_of: int | None, nodes: list[str] | None = None) -> Launch:
        """Record a new launch (state `starting`; its secret params masked, sealed apart; `nodes`: the nodes of a
        launch across nodes). Returns it, with its tag."""
        secret = self.secrets.params(variant, dict(params))
        return self._launches.create(host=host, variant=variant, params=self.secrets.for_record(dict(params)),
                                     command="", log_path=None, port=port, gpus=gpus, created_by=user,
                                     channel=channel, thread_ts=thread_ts, relaunch_of=relaunch_of,
                                     sealed_secrets=self.secrets.seal(secret), nodes=nodes)

    def store_command(self, la: Launch, r: RenderedLaunch) -> Launch:
        """Record the launch's rendered command (secret-named params' values masked, redacted) and its log path."""
        command = r.command
        for k, v in r.params.items():  # values of secret-named params never reach the database
            if SECRET_NAME_RE.search(k) and str(v):
                command = command.replace(shlex.quote(str(v)), MASK)
        return self._launches.update(la.id, command=self._redactor(command), log_path=r.log_path)

    def run_follow_hooks(self, la: Launch) -> None:
        """Tell the follow hooks (the watcher schedules its checks) that `la` is live and must be followed: it
        started, or a kill left it live (`kill_failed`, or its state before a kill that failed: a check that ran
        while it was `stopping` stopped following it); a failing hook is logged."""
        for hook in self.follow_hooks:
            try:
                hook(la)
            except Exception:
                log.exception("a follow hook failed for %s", la.name)

    async def _then(self, la: Launch, begun: Begun) -> Launch:
        """What the runner does once its outcome `begun` is recorded (`Begun.then`), its fields written while `la`
        still runs (a kill meanwhile keeps what it wrote). Returns the launch as stored."""
        if begun.then is None:
            return la
        fields = await begun.then(la)
        if not fields:
            return la
        return self._launches.update_if(la.id, {"state": LaunchState.RUNNING}, **fields) or self.get(la.id) or la

    async def _begin(self, la: Launch, runner: Runner, rendered: list[RenderedLaunch], user: str,
                     args: dict[str, Any], checks: PreflightResult) -> LaunchOutcome:
        """Start the launch recorded as `la` with its runner and apply what it returned (bot.services.runners.Begun):
        its command recorded, its thread opened (unless it continues one), the `started` (or `start_failed`) event
        with what started, the audit, the thread's root, the follow hooks; a launch killed while it started has what
        started stopped; one that asks for it is looked at once more after `start_check_s` (its early exit)."""
        la = self.store_command(la, rendered[0])
        if la.thread_ts is None:
            la = await self._threads.open(la)
        begun = await runner.start(la, rendered)
        checks = PreflightResult(passed=begun.passed) if begun.passed else checks
        if begun.cancelled is not None:  # killed while it started; the runner stopped what had started
            # what the kill recorded stands (a kill that could not stop every rank is kill_failed, with its reason)
            cancelled = self._launches.update_if(la.id, {"state": LaunchState.KILLED}, **(begun.fields or {}),
                                                 state_detail=begun.cancelled)
            la = cancelled or self._launches.update(la.id, **(begun.fields or {}))
            if cancelled is not None:
                self._audit.record(user_id=user, action="launch", args=args, result="cancelled",
                                   detail=begun.cancelled, launch_id=la.id, host=begun.audit_host or la.host,
                                   channel=la.channel)
            await self._threads.show(la)
            return LaunchOutcome(la, error=begun.cancelled, host=begun.host)
        if begun.fields is None:
            la = self.transition(la, LaunchEvent.START_FAILED, state_detail=begun.failed)
            self._audit.record(user_id=user, action="launch", args=args, result="error", detail=begun.failed,
                               launch_id=la.id, host=begun.audit_host or la.host, channel=la.channel)
            await self._then(la, begun)
            await self._threads.show(la)
            return LaunchOutcome(la, checks=checks, error=begun.error, host=begun.host)
        la = self.transition(la, LaunchEvent.STARTED, **begun.fields)
        if la.state != LaunchState.RUNNING:  # killed while it was starting: stop what just started, verified
            try:
                detail = (await runner.undo(la, KillOutcome(target=la.name))).describe()
            except RemoteError as e:
                detail = f"could not stop it: {e}"
            la = self._launches.update(la.id, state_detail=f"cancelled while starting; {detail}")
            await self._threads.show(la)
            return LaunchOutcome(la, checks=checks, error=f"{la.name} was cancelled while it was starting ({detail})",
                                 host=begun.host)
        la = await self._then(la, begun)
        self._audit.record(user_id=user, action="launch", args={**args, "launch": la.name}, result="started",
                           detail=begun.detail, launch_id=la.id, host=la.host, channel=la.channel)
        await self._threads.show(la)
        outcome = LaunchOutcome(la, checks=checks, host=begun.host)
        self.run_follow_hooks(la)
        if not begun.first_look:
            return outcome
        await asyncio.sleep(self.start_check_s)
        try:
            snap = await self.probes.snapshot(la.host, self.launch_probe_request(la, tail_lines=15))
        except RemoteError:
            return outcome
        if not self.launch_processes_of(la, snap):
            outcome.exited_early = (snap.log.tail if snap.log else []) or ["(the log is empty)"]
            await self._early_exit(la)
            outcome.launch = self._launches.get(la.id) or la
        return outcome

    async def _early_exit(self, la: Launch) -> None:
        """A launch gone at its first check: the hooks diagnose it (crashed, oom, ... with an alert); if it is
        still live after them, it ended without a verdict: `exited`."""
        for hook in self.early_exit_hooks:
            try:
                await hook(la)
            except Exception:
                log.exception("an early-exit hook failed for %s", la.name)
        current = self._launches.get(la.id)
        if current is not None and current.live:
            current = self.transition(current, LaunchEvent.GONE, state_detail="exited within the first check")
            await self._threads.show(current)

    # -- kill ---------------------------------------------------------------------------------------
    async def kill_preview(self, la: Launch) -> KillPreview:
        """What `kill(la)` would stop now (one probe of the host; of a launch across nodes, rank 0's, while the kill
        stops every rank). Never raises: an unreadable host is reported in `error`."""
        runner = self.runner(la)
        out = KillPreview(target=la.name, host=runner.where(la), launch_id=la.id, pgid=la.pgid, gpus=list(la.gpus))
        return await self.killer.preview(runner.rank0(la), out)

    async def kill_pid_preview(self, host: str, pid: int) -> KillPreview:
        """What `kill_pid(host, pid)` would stop now (ProcessKiller.pid_preview). Never raises."""
        return await self.killer.pid_preview(host, pid)

    async def kill(self, la: Launch, *, user: str, channel: str | None = None) -> KillOutcome:
        """SIGTERM the launch's process group and every process of its session (and tagged ones), wait
        `kill_grace_s`, SIGKILL what is left, then poll GPU memory until the launch's GPUs are released
        (at most `release_timeout_s`). Records the end state, updates the root message and audits. Never
        raises for remote failures; the outcome says what happened."""
        try:
            async with self.locks.kill(la.id, wait_s=0):  # a second kill (on this bot or another) does not wait
                return await self._kill_locked(la, user=user, channel=channel)
        except LockTimeout:
            return KillOutcome(target=la.name, host=la.host, error=being_stopped(la.name))

    async def _kill_locked(self, la: Launch, *, user: str, channel: str | None) -> KillOutcome:
        t0 = time.monotonic()
        out = KillOutcome(target=la.name, host=la.host)
        current = self._launches.get(la.id) or la
        if current.state == LaunchState.STOPPING:
            out.error = being_stopped(la.name)
            return out
        runner = self.runner(current)
        if current.state == LaunchState.STARTING and current.pid is None and \
                not await self.killer.has_processes(current):
            if runner.spans:  # ranks above 0 may run already (a Slurm job is cancelled once sbatch returns)
                try:
                    out = await runner.stop(current, out)
                except RemoteError as e:
                    log.warning("%s: ranks not stopped while starting: %s", la.name, e)
            la = self.transition(current, LaunchEvent.CANCELLED, state_detail="cancelled while starting")
            out.nothing_to_kill = out.released = True
            self._audit.record(user_id=user, action="kill", args={"launch": la.name}, result="cancelled",
                               detail="cancelled before its process was recorded", launch_id=la.id, host=la.host,
                               channel=channel)
            await self._threads.show(la)
            return out
        # not live while it is being stopped: the readiness checks stay quiet about a deliberate stop
        self.transition(current, LaunchEvent.KILL_BEGUN)
        try:
            out = await runner.stop(current, out)
        except RemoteError as e:
            out.error = str(e)
        except BaseException:  # cancelled (shutdown) mid-kill: never leave it `stopping`, which nothing may kill
            self.transition(la, LaunchEvent.KILL_INTERRUPTED, state_detail="the kill was interrupted; kill it again")
            raise
        out.seconds = time.monotonic() - t0
        state, detail, result = kill_end(out, current.state, current.state_detail)
        la = self.transition(la, LaunchEvent.KILL_ENDED, to=state, state_detail=detail)
        self._audit.record(user_id=user, action="kill", args={"launch": la.name}, result=result, detail=detail,
                           launch_id=la.id, host=la.host, channel=channel)
        if la.live:  # what the kill left may run: followed again
            self.run_follow_hooks(la)
        await self._threads.show(la)
        return out

    async def kill_pid(self, host: str, pid: int, *, user: str, channel: str | None = None,
                       expect_command: str | None = None) -> KillOutcome:
        """Kill one (foreign) process that holds GPU memory: SIGTERM, grace, SIGKILL; report its GPU memory
        released or not. With `expect_command` (the command line shown when the kill was confirmed), a pid
        that now runs another command (reused) is not killed. Never raises; audited as `kill_pid`."""
        out = KillOutcome(target=f"pid {pid} on {host}", host=host)
        t0 = time.monotonic()
        try:
            out = await self.killer.kill_pid(host, pid, out, expect_command)
        except RemoteError as e:
            out.error = str(e)
        out.seconds = time.monotonic() - t0
        self._audit.record(user_id=user, action="kill_pid", args={"host": host, "pid": pid},
                           result="error" if out.error else ("released" if out.released else "incomplete"),
                           detail=out.describe(), host=host, channel=channel)
        return out

    # -- relaunch -----------------------------------------------------------------------------------
    async def relaunch(self, la: Launch, params: dict[str, str], *, user: str,
                       channel: str | None = None) -> tuple[KillOutcome, LaunchOutcome | None]:
        """Kill `la` (verified: processes gone and GPU memory released), then launch the same variant on the
        same host with its params updated by `params`, in the same thread. Returns both outcomes; the launch
        outcome is None when the kill did not complete. Raises LaunchError for bad params (before killing)
        or while another kill of `la` runs."""
        merged = self.secrets.relaunch_params(la, params)
        # validate before killing: the params, and a placed launch's host still in its group
        plan = placement_plan(self.config, la.variant, la.host, la.gpus)
        render_launch(self.config, la.variant, merged, launch_id=0, host=la.host,
                      gpus=plan.stand_in_gpus if plan else None)
        current = self._launches.get(la.id) or la
        if current.state == LaunchState.STOPPING:
            raise LaunchError(f"{being_stopped(la.name)}; relaunch it when that has answered")
        if current.live:
            k = await self.kill(current, user=user, channel=channel)
        else:
            k = KillOutcome(target=la.name, nothing_to_kill=True, released=True)
        args = {"launch": la.name, "params": self.secrets.for_record(params)}
        if not k.clean or not (k.released or k.gpu_error):
            self._audit.record(user_id=user, action="relaunch", args=args, result="refused",
                               detail="the old launch did not stop cleanly", launch_id=la.id, host=la.host,
                               channel=channel)
            return k, None
        new = await self.launch(la.variant, merged, user=user, channel=la.channel or channel, host=la.host,
                                thread_ts=la.thread_ts, relaunch_of=la.id, prefer_gpus=la.gpus)
        self._audit.record(user_id=user, action="relaunch", args=args, result="started" if new.ok else "failed",
                           detail=new.launch.name if new.launch else "; ".join(new.checks.problems) or new.error,
                           launch_id=la.id, host=la.host, channel=channel)
        return k, new

    # -- alerts -------------------------------------------------------------------------------------
    def snooze(self, la: Launch, minutes: int, *, user: str, channel: str | None = None) -> Launch:
        """Hold back `la`'s alerts for `minutes` (1..MAX_SNOOZE_MIN; its checks go on). Returns the launch.
        Raises LaunchError for an out-of-range duration."""
        if not 1 <= minutes <= MAX_SNOOZE_MIN:
            raise LaunchError(f"minutes must be 1..{MAX_SNOOZE_MIN}")
        la = self._launches.update(la.id, snoozed_until=self._clock.time() + minutes * 60)
        self._audit.record(user_id=user, action="snooze", args={"launch": la.name, "minutes": minutes},
                           launch_id=la.id, host=la.host, channel=channel)
        return la
