"""LaunchService: launch, kill and relaunch server variants on hosts, with pre-launch checks, verified GPU
release, incident threads and the audit trail. The I/O edge around the pure rules in `bot.core.lifecycle`.

A launch is recorded (state `starting`) before its process is started, and its PID and PGID (= SID, its
wrapper shell) right after; its root message is posted in between. Every action is recorded by the audit
writer with the Slack user ID, args and result.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bot.adapters.locks import DecisionLocks, LockTimeout
from bot.adapters.remote import RemoteError
from bot.adapters.secretbox import SecretBox
from bot.adapters.store import Store
from bot.config import Config, GenerateCheck, placement_plan, render_launch
from bot.core.commands import slash
from bot.core.fleet import DigestNotes, HostLine, digest_notes, free_gpus, host_line
from bot.core.lifecycle import (
    DEFAULT_GPU_FREE_MIB,
    Holder,
    KillOutcome,
    KillPreview,
    LaunchError,
    LaunchOutcome,
    PreflightResult,
    RenderedLaunch,
    Started,
    attribute_holders,
    gpu_memory,
    group_confirmed,
    holder_labels,
    kill_end,
    launch_script,
    parse_launch_output,
    prelaunch_checks,
    signal_script,
    unit_cleanup_script,
)
from bot.core.models import GpuReading, HostFailure, Launch, LaunchState, ProcessInfo, Snapshot
from bot.core.observe import ended_by, own_processes, remember_processes, started_after
from bot.core.placement import PlacementNote, PlacementPlan, order_hosts, pick_gpus
from bot.core.probe import MAX_PS_PIDS, ProbeRequest, ProbeRequestError
from bot.core.redact import MASK, SECRET_NAME_RE, Redactor
from bot.core.transitions import InvalidTransition, LaunchEvent, being_stopped, next_state
from bot.present.views import kill_view
from bot.services.audit import Audit
from bot.services.hosts import HostService
from bot.services.secrets import SecretService
from bot.services.spans import SpanService
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


@dataclass
class _ProbeParts:
    """What probes of one variant's launches ask: `health_path`, the variant's generation `check` (None: none) and,
    once checked sendable, `generate`: (path, JSON body or None, timeout in seconds) as the probe sends it."""

    health_path: str
    check: GenerateCheck | None
    generate: tuple[str, str | None, float] | None = None


@dataclass
class GpuWhois:
    """Who holds one GPU (LaunchService.whois): `gpu` its reading (None when the host has no such index; `gpus`
    the indexes it has), `holders` the processes with memory on it, `elapsed_s` each holder's age (pid -> seconds),
    `launches` the launches they belong to (id -> Launch), `claims` the live launches that claim the GPU, `error`
    why the host or its GPUs could not be read."""

    host: str
    index: int
    gpu: GpuReading | None = None
    gpus: list[int] = field(default_factory=list)
    holders: list[Holder] = field(default_factory=list)
    elapsed_s: dict[int, int | None] = field(default_factory=dict)
    launches: dict[int, Launch] = field(default_factory=dict)
    claims: list[Launch] = field(default_factory=list)
    error: str | None = None
    gpu_free_mib: float = DEFAULT_GPU_FREE_MIB


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
        self._probe_parts: dict[str, _ProbeParts] = {}  # variant -> what a probe of its launches asks
        self.hosts = hosts
        self._launches = store.launches
        self._clock = store.clock  # the bot's one clock (bot.core.clock): wall times of records
        self._audit = audit
        self._threads = threads
        self._redactor = redactor or Redactor(config.redact_patterns)
        self.secrets = SecretService(config, store.launches, self._redactor, secretbox)
        lc = config.lifecycle
        self.gpu_free_mib = lc.gpu_free_mib
        self.kill_grace_s = lc.kill_grace_s
        self.release_timeout_s = lc.release_timeout_s
        self.min_shm_free_mib = lc.min_shm_free_mib
        self.poll_s = poll_s
        self._interrupted: list[int] = []  # launches whose kill a restart interrupted, to finish at start
        self._unstarted: list[int] = []  # launches a restart left starting without a PID, to settle at start
        self.start_check_s = start_check_s
        self.sigkill_wait_s = sigkill_wait_s
        #: one launch decision per host and one kill per launch at a time, across the bots of a shared database
        self.locks = locks or DecisionLocks()
        self._activity: dict[int, float] = {}
        self.follow_hooks: list[FollowHook] = []
        # what SpanService (launches across nodes) shares of this one
        self.threads, self.audit, self.rows = threads, audit, store.launches
        self.snapshot, self.live_on, self.kill_view, self.start_rank0 = (self._snapshot, self._live_on, self._kill,
                                                                         self._start)
        self.spans = SpanService(self)
        self.early_exit_hooks: list[EarlyExitHook] = []

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
        """Resolve a launch reference: `12`, `#12`, `base#12`, a variant name (its live launch), or nothing: the
        launch of this thread; otherwise (outside a thread, or in a thread that is no launch's) the only live
        launch when `allow_only_live`. Raises LaunchError naming the live launches."""
        la = self._find(ref, channel=channel, thread_ts=thread_ts, allow_only_live=allow_only_live)
        if la.host not in self.config.hosts:
            raise LaunchError(f"{la.name} ran on host {la.host!r}, which is no longer in the config")
        return la

    def _find(self, ref: str | None, *, channel: str | None, thread_ts: str | None,
              allow_only_live: bool) -> Launch:
        if ref:
            text = ref.strip()
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise LaunchError(f"no launch {text[:40]!r}: not valid text; {self._live_list()}") from None
            prefix, _, num = text.rpartition("#") if "#" in text else ("", "", text)
            if num.isascii() and num.isdigit() and len(num) <= 12:
                la = self._launches.get(int(num))
                if la is None or (prefix and prefix != la.variant):
                    raise LaunchError(f"no launch {text[:40]!r}; {self._live_list()}")
                return la
            live = self._launches.live(variant=text)
            if len(live) == 1:
                return live[0]
            if len(live) > 1:
                raise LaunchError(f"{text[:40]!r} has {len(live)} live launches: "
                                  + ", ".join(f"{la.name} on {la.host}" for la in live) + "; name one")
            raise LaunchError(f"no live launch of {text[:40]!r}; {self._live_list()}")
        if channel and thread_ts:
            la = self._launches.for_thread(channel, thread_ts)
            if la is not None:
                return la
        if allow_only_live:  # the same outside a thread and in a thread that is no launch's
            live = self._launches.live()
            if len(live) == 1:
                return live[0]
        if channel and thread_ts:
            raise LaunchError(f"this thread belongs to no launch: name one; {self._live_list()}")
        raise LaunchError(f"name the launch (id or variant); {self._live_list()}")

    def _live_list(self) -> str:
        live = self._launches.live()
        if not live:
            return "no launch is live"
        return "live launches: " + ", ".join(f"{la.name} on {la.host}" for la in live[:10])

    def note_activity(self, launch_id: int) -> None:
        """Record that the bot itself just worked on the launch's processes (a stack dump): the next check does
        not count the CPU time that caused as progress. Real wall time (not the bot's clock): it is compared with
        the host's clock in the check's records."""
        self._activity[launch_id] = time.time()

    def bot_activity(self, launch_id: int) -> float | None:
        """Epoch seconds of the bot's latest own work on the launch's processes (see note_activity), or None."""
        return self._activity.get(launch_id)

    # -- who holds what -----------------------------------------------------------------------------
    def holders(self, snap: Snapshot, host_launches: Sequence[Launch] | None = None) -> list[Holder]:
        """GPU holders of a snapshot, attributed to this host's launches by tag (or orphan / foreign).
        `host_launches`: the host's recent launches when the caller has read them already (else read here)."""
        if host_launches is None:
            host_launches = [la for la in self._launches.recent(200) if la.host == snap.host or snap.host in la.nodes]
        return attribute_holders(snap.gpu, snap.table, host_launches, snap.launch_tags)

    def owners(self, snap: Snapshot, host_launches: Sequence[Launch] | None = None) -> dict[int, str]:
        """pid -> owner label (`base#12 by U0ALICE`, `orphan of base#12 by U0ALICE`, `foreign · bob`: Holder.label)
        of each GPU holder in `snap` (`host_launches` as `holders` takes them)."""
        return holder_labels(self.holders(snap, host_launches))

    async def status(self, hosts: Sequence[str]
                     ) -> tuple[list[Snapshot | HostFailure], dict[str, list[Holder]], dict[str, list[Launch]]]:
        """GPU status of `hosts` probed in parallel (one result per host, in order; a failing host is a
        HostFailure), each host's GPU holders attributed to its launches (Holder; labels: Holder.label), and each
        host's recent launches (read once for every host)."""
        by_host: dict[str, list[Launch]] = {}
        for la in self._launches.recent(200):  # read once for every host, not once per host
            for h in dict.fromkeys([la.host, *la.nodes]):  # a launch across nodes holds GPUs on each
                by_host.setdefault(h, []).append(la)
        keep = {h: [la.pid for la in by_host.get(h, ()) if la.pid] for h in hosts}
        results = await self.hosts.status(list(hosts), keep_pids=keep)
        holders = {r.host: self.holders(r, by_host.get(r.host, [])) for r in results
                   if not isinstance(r, HostFailure)}
        return results, holders, by_host

    async def whois(self, host: str, index: int) -> GpuWhois:
        """Who holds GPU `index` of `host` now: its reading, each holder (its launch and the Slack user who launched
        it, or foreign with its user on the host), how long each has run (seconds), and the live launches that claim
        the GPU (a launch still loading holds no memory yet). Never raises for remote failures (`error`)."""
        results, holders_of, recent_of = await self.status([host])
        result = results[0]
        live = [la for la in self._launches.live(host) if not la.gpus or index in la.gpus]
        if isinstance(result, HostFailure):
            return GpuWhois(host=host, index=index, error=result.reason, claims=live)
        if not result.gpu.ok:
            return GpuWhois(host=host, index=index, error=result.gpu.error or "GPU readings missing", claims=live)
        gpu = next((g for g in result.gpu.gpus if g.index == index), None)
        holders = [h for h in holders_of.get(host, ()) if h.gpu_index == index]
        rows = {p.pid: p for p in result.table}
        by_id = {la.id: la for la in recent_of.get(host, ())}
        return GpuWhois(host=host, index=index, gpu=gpu, gpus=[g.index for g in result.gpu.gpus], holders=holders,
                        elapsed_s={h.pid: rows[h.pid].elapsed_s for h in holders if h.pid in rows},
                        launches={h.launch_id: by_id[h.launch_id] for h in holders
                                  if h.launch_id is not None and h.launch_id in by_id},
                        claims=live, gpu_free_mib=self.config.lifecycle.gpu_free_mib)

    async def fleet(self, hosts: Sequence[str]) -> list[HostLine]:
        """One line per host of `hosts`, in order (bot.core.fleet): its GPUs free and used (free: under the config's
        `gpu_free_mib` and claimed by no live launch), utilisation, memory, its live launches and foreign holders,
        or why it could not be read."""
        results, holders, _ = await self.status(hosts)
        return self.fleet_lines(results, holders)

    def fleet_lines(self, results: Sequence[Snapshot | HostFailure],
                    holders: Mapping[str, Sequence[Holder]]) -> list[HostLine]:
        """`fleet`'s lines from a status already probed (`status`'s results and holders)."""
        live: dict[str, list[Launch]] = {}
        for la in self._launches.live():
            for h in dict.fromkeys([la.host, *la.nodes]):
                live.setdefault(h, []).append(la)
        free_mib = self.config.lifecycle.gpu_free_mib
        return [host_line(r, live.get(r.host, []), holders.get(r.host, ()), free_mib,
                          cfg.group if (cfg := self.config.hosts.get(r.host)) is not None else None)
                for r in results]

    def digest_notes(self, results: Sequence[Snapshot | HostFailure], holders: Mapping[str, Sequence[Holder]],
                     recent: Mapping[str, Sequence[Launch]]) -> DigestNotes:
        """The digest's notes (bot.core.fleet.digest_notes) from a status already probed (`status`'s three parts):
        idle GPUs held for more than an hour, failed launches not cleaned up, unreachable hosts."""
        return digest_notes(results, holders, [la for las in recent.values() for la in las], now=self._clock.time(),
                            gpu_free_mib=self.config.lifecycle.gpu_free_mib)

    @staticmethod
    def _tagged(la: Launch, snap: Snapshot) -> list[int]:
        return [pid for pid, tag in snap.launch_tags.items() if la.tag and tag == la.tag]

    def launch_processes_of(self, la: Launch, snap: Snapshot) -> list[ProcessInfo]:
        """The live processes of `la` in a snapshot taken with `select_tag=la.tag`: see
        bot.core.observe.own_processes (tag, confirmed session/group, processes seen before, descendants)."""
        return own_processes(snap, la)

    # -- probes of a launch -------------------------------------------------------------------------
    def launch_probe_request(self, la: Launch, *, tail_lines: int = 20, gpu: bool = True,
                             port: bool = True, generate: bool = False) -> ProbeRequest:
        """A probe of one launch: its session/process group, its tagged processes, its log (its own, rendered
        from the config: allowed even on a host without log_dirs) and its port and health endpoint; with
        `generate`, also its variant's generation check (when it names one; its timeout kept 2 s under the host's
        command timeout, so the probe still answers)."""
        parts = self._parts(la)
        req = ProbeRequest(select_tag=la.tag or None, log_path=la.log_path, own_log=True,
                           port=la.port if port else None, health_path=parts.health_path,
                           tail_lines=max(1, min(500, tail_lines)), gpu=gpu, stat_pids=self._stat_pids(la))
        if not (generate and port and la.port and parts.generate):
            return req
        path, body, timeout_s = parts.generate
        return replace(req, generate_path=path, generate_body=body, generate_timeout_s=timeout_s)

    def generation_check(self, la: Launch) -> GenerateCheck | None:
        """The generation check of the launch's variant (bot.config.schema.GenerateCheck), or None when it names none
        (or the variant is gone from the config)."""
        return self._parts(la).check

    def _parts(self, la: Launch) -> _ProbeParts:
        """What a probe of `la` asks of its variant, worked out once per variant (the config is fixed): its health
        path, and its generation check as sent (path, JSON body, timeout under the host's command timeout) once
        checked sendable; a check the probe could not send is left out alone (logged), never the whole probe."""
        parts = self._probe_parts.get(la.variant)
        if parts is not None:
            return parts
        v = self.config.resolved_variant(la.variant) if la.variant in self.config.variants else None
        parts = _ProbeParts((v.health if v else None) or "/health", v.generate if v else None)
        try:
            host = self.hosts.host_config(la.host)  # a host of the config, or a node of a Slurm job
        except KeyError:
            host = None
        if parts.check is not None and host is not None:
            path, body = parts.check.request()
            timeout_s = parts.check.timeout_under(host.command_timeout_s)
            try:
                ProbeRequest(port=1, generate_path=path, generate_body=body, generate_timeout_s=timeout_s).validate()
                parts.generate = (path, body, timeout_s)
            except ProbeRequestError as e:
                log.warning("variant %s: generation check left out: %s", la.variant, e)
        self._probe_parts[la.variant] = parts
        return parts

    @staticmethod
    def _stat_pids(la: Launch) -> tuple[int, ...]:
        """The PIDs whose start times a probe of `la` reads: its server, its wrapper and every process it remembers
        (newest last, at most MAX_PS_PIDS)."""
        pids = dict.fromkeys([*(p for p in (la.pid, la.pgid) if p), *la.seen_pids])
        return tuple(pids)[-MAX_PS_PIDS:]

    async def probe_launch(self, la: Launch, *, tail_lines: int = 20,
                           request: ProbeRequest | None = None) -> Snapshot | HostFailure:
        """One probe of the launch: `request` (a launch_probe_request, perhaps narrowed to what a liveness check
        needs), by default launch_probe_request with `tail_lines`. A launch across nodes: its rank 0, on its node."""
        if la.spans_nodes:
            la = self.spans.rank0(la)
        return await self.hosts.probe(la.host, request or self.launch_probe_request(la, tail_lines=tail_lines))

    async def read_log(self, la: Launch, lines: int) -> Snapshot | HostFailure:
        """The last `lines` (1..500) lines of the launch's log with its stat, in one probe (no GPUs, no port).
        Raises LaunchError when the launch has no log path."""
        if not la.log_path:
            raise LaunchError(f"{la.name} has no log path")
        if la.spans_nodes:  # rank 0's log, on its node
            la = self.spans.rank0(la)
        return await self.hosts.probe(la.host, self.launch_probe_request(la, tail_lines=lines, gpu=False, port=False))

    async def _snapshot(self, host: str, req: ProbeRequest) -> Snapshot:
        res = await self.hosts.probe(host, req)
        if isinstance(res, HostFailure):
            raise RemoteError(host, res.reason)
        return res

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
        return self._launches.get(la.id) or current

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
                snap = await self._snapshot(la.host, ProbeRequest(select_tag=la.tag or None, health_path=None,
                                                                  gpu=False))
            except RemoteError as e:
                log.warning("%s was left starting by a restart; %s cannot be read now: %s", la.name, la.host, e)
                continue
            procs = self.launch_processes_of(la, snap)
            if procs:
                leader = next((p for p in procs if p.pid == p.sid), procs[0])
                server = next((p for p in procs if p.ppid == leader.pid), leader)
                la = self._launches.set_started(la.id, server.pid, leader.pid)
                la = self._launches.update(la.id, state_detail="the bot restarted while starting it; its "
                                                               "processes were found again")
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
            spanning = self._spanning(variant, host)
            if spanning is not None:
                return await spanning(variant, params, user=user, channel=channel, thread_ts=thread_ts,
                                      relaunch_of=relaunch_of)
            plan = placement_plan(self.config, variant, host, tuple(prefer_gpus))
            preview = render_launch(self.config, variant, params, launch_id=0, host=plan.hosts[0] if plan else host,
                                    gpus=plan.stand_in_gpus if plan else None)
        except LaunchError as e:
            self._audit.record(user_id=user, action="launch", result="invalid", detail=str(e), channel=channel,
                               args={"variant": variant, **self.secrets.for_record(params)})
            raise
        if plan is not None:
            return await self._launch_placed(plan, variant, params, user=user, channel=channel, thread_ts=thread_ts,
                                             relaunch_of=relaunch_of)
        # One launch decision at a time per host: two /launch racing (on one bot or two) must not both pass the checks.
        try:
            async with self.locks.host(preview.host):
                return await self._launch_locked(preview, variant, params, user=user, channel=channel,
                                                 thread_ts=thread_ts, relaunch_of=relaunch_of)
        except LockTimeout as e:
            self._audit.record(user_id=user, action="launch", args={"variant": variant, "host": preview.host},
                               result="error", detail=str(e), host=preview.host, channel=channel)
            return LaunchOutcome(None, error=f"{e}; try again in a moment", host=preview.host)

    def _spanning(self, variant: str, host: str | None) -> Callable[..., Awaitable[LaunchOutcome]] | None:
        """The SpanService launch of a variant that spans nodes (a Slurm variant, or one with `hosts:`), else None.
        Raises LaunchError for an unknown variant, or a `host=` such a variant cannot take."""
        if variant not in self.config.variants:
            return None  # placement_plan says it is unknown
        v = self.config.resolved_variant(variant)
        runner = self.config.runner_of(v)
        if runner != "slurm" and not v.hosts:
            return None
        if host is not None and host != v.host:
            where = "where Slurm places it" if runner == "slurm" else f"on its hosts {', '.join(v.hosts or [])}"
            raise LaunchError(f"{variant} runs {where}; leave out host=")
        return self.spans.launch_slurm if runner == "slurm" else self.spans.launch_multi

    async def _launch_placed(self, plan: PlacementPlan, variant: str, params: dict[str, str], *, user: str,
                             channel: str | None, thread_ts: str | None, relaunch_of: int | None) -> LaunchOutcome:
        """Pick a host and GPUs for `plan` and launch there. The hosts are tried best fit first (a status of the
        group); on each, under its launch lock, the free GPUs are read again from a fresh probe and the launches
        recorded in the database, which a launch placed at the same moment has claimed (recorded with its GPUs)
        before it released the lock. A host that cannot take it now is passed over with its reason."""
        if len(plan.hosts) > 1:
            order, skipped = order_hosts(await self.fleet(list(plan.hosts)), plan)
        else:
            order, skipped = list(plan.hosts), {}
        fitting = len(order)
        port = self.config.resolved_variant(variant).port
        for host in order:
            try:
                async with self.locks.host(host):
                    try:
                        snap = await self._snapshot(host, ProbeRequest(port=port, health_path=None, shm=True))
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
                    out = await self._launch_locked(preview, variant, params, user=user, channel=channel,
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
            if la.spans_nodes:  # its own checks (the job, every rank) decide when it ended, not one host's look
                (same if la.variant == variant and host in la.nodes else others).append(la)
            elif recent or self.launch_processes_of(la, snap):
                (same if la.variant == variant else others).append(la)
            else:
                la = self.transition(la, LaunchEvent.GONE, state_detail="no process left (seen at a later launch)")
                await self._threads.show(la)
        return same, others

    async def _launch_locked(self, preview: RenderedLaunch, variant: str, params: dict[str, str], *, user: str,
                             channel: str | None, thread_ts: str | None, relaunch_of: int | None,
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
                snap = await self._snapshot(host, ProbeRequest(port=preview.port, health_path=None, shm=True))
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
        la = self.record_launch(variant, preview.params, host=host, port=preview.port, gpus=preview.gpus, user=user,
                                channel=channel, thread_ts=thread_ts, relaunch_of=relaunch_of)
        r = render_launch(self.config, variant, params, launch_id=la.id, host=host, tag=la.tag, gpus=preview.gpus)
        la = self.store_command(la, r)
        if thread_ts is None:
            la = await self._threads.open(la)
        out = await self._start(la, r, user, args, checks)
        out.placement = placed.describe() if placed is not None else None
        return out

    def record_launch(self, variant: str, params: Mapping[str, Any], *, host: str, port: int | None,
                      gpus: list[int], user: str, channel: str | None, thread_ts: str | None,
                      relaunch_of: int | None, nodes: list[str] | None = None) -> Launch:
        """Record a new launch (state `starting`; its secret params masked, sealed apart). Returns it, with its tag."""
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

    async def run_launch_script(self, host: str, r: RenderedLaunch) -> tuple[Started | None, str | None]:
        """Start `r`'s process tree on `host` with the launch script (bot.core.lifecycle.launch_script: its own
        systemd scope or cgroup where the host allows). Returns (what it printed, None), or (None, why it did not
        start: its output, at most 500 characters, or the host's error). Never raises RemoteError."""
        try:
            cfg = self.config.hosts[host]
            script = launch_script(r, systemd=cfg.systemd == "auto", cgroup=cfg.cgroup == "auto")
            res = await self.hosts.executor(host).run("sh -s", input=script.encode(), timeout_s=30)
        except RemoteError as e:
            return None, str(e)
        out = res.stdout.decode("utf-8", "replace")
        started = parse_launch_output(out)
        if started is not None:
            return started, None
        return None, (out + res.stderr.decode("utf-8", "replace")).strip()[:500] or f"exit {res.exit_status}"

    async def _start(self, la: Launch, r: RenderedLaunch, user: str, args: dict, checks: Any) -> LaunchOutcome:
        started, why = await self.run_launch_script(la.host, r)
        if started is None:
            la = self.transition(la, LaunchEvent.START_FAILED, state_detail=why)
            self._audit.record(user_id=user, action="launch", args=args, result="error", detail=why,
                               launch_id=la.id, host=la.host, channel=la.channel)
            await self._threads.show(la)
            return LaunchOutcome(la, checks=checks, error=f"could not start: {why}")
        pid = started.pid
        la = self._launches.set_started(la.id, pid, started.pgid, unit=started.unit, unit_manager=started.manager)
        if la.state != LaunchState.RUNNING:  # killed while it was starting: stop what just started, verified
            try:
                k = await self._kill(la, KillOutcome(target=la.name))
                detail = k.describe()
            except RemoteError as e:
                detail = f"could not stop it: {e}"
            la = self._launches.update(la.id, state_detail=f"cancelled while starting; {detail}")
            await self._threads.show(la)
            return LaunchOutcome(la, checks=checks, error=f"{la.name} was cancelled while it was starting ({detail})")
        self._audit.record(user_id=user, action="launch", args={**args, "launch": la.name}, result="started",
                           detail=f"pid {pid} log {r.log_path}", launch_id=la.id, host=la.host, channel=la.channel)
        await self._threads.show(la)
        outcome = LaunchOutcome(la, checks=checks)
        self.run_follow_hooks(la)
        await asyncio.sleep(self.start_check_s)
        try:
            snap = await self._snapshot(la.host, self.launch_probe_request(la, tail_lines=15))
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
        """What `kill(la)` would stop now (one probe of the host). Never raises: an unreadable host is
        reported in `error`."""
        out = KillPreview(target=la.name, host=la.host, launch_id=la.id, pgid=la.pgid, gpus=list(la.gpus))
        if la.spans_nodes:  # what shows is rank 0's; the kill stops every rank (scancel for a Slurm job)
            out.host = (f"Slurm job {la.job_id} on {la.host}" if la.job_id else "") + \
                (f"{', ' if la.job_id else ''}ranks on {', '.join(la.nodes[:8])}" if la.nodes else "")
            la = self.spans.rank0(la)
        try:
            snap = await self._snapshot(la.host, ProbeRequest(select_tag=la.tag or None, health_path=None))
        except RemoteError as e:
            out.error = str(e)
            return out
        out.processes = self.launch_processes_of(la, snap)
        pids = {p.pid for p in out.processes}
        if snap.gpu.ok:
            held = [gp for gp in snap.gpu.processes if gp.pid in pids]
            if held:
                out.gpu_mib = float(sum(gp.used_memory_mib or 0 for gp in held))
                out.gpus = sorted({gp.gpu_index for gp in held if gp.gpu_index is not None} | set(la.gpus))
            elif pids:  # per-process readings missing (some VMs): the memory used on the launch's GPUs
                out.gpu_mib = gpu_memory(snap.gpu, la.gpus)
            else:
                out.gpu_mib = 0.0
        return out

    async def kill_pid_preview(self, host: str, pid: int) -> KillPreview:
        """What `kill_pid(host, pid)` would stop now. Never raises; `refusal` is set when the pid does not
        exist or holds no GPU memory (kill_pid would refuse it too)."""
        out = KillPreview(target=f"pid {pid}", host=host, pid=pid)
        try:
            snap = await self._snapshot(host, ProbeRequest(pid=pid, health_path=None))
        except RemoteError as e:
            out.error = str(e)
            return out
        row = next((p for p in snap.table if p.pid == pid), None)
        held = [gp for gp in snap.gpu.processes if gp.pid == pid]
        if row is None:
            out.refusal = f"no process {pid} on {host}"
        elif not snap.gpu.ok:
            out.refusal = f"cannot tell whether pid {pid} holds a GPU ({snap.gpu.error})"
        elif not held:
            out.refusal = (f"pid {pid} holds no GPU memory; `{slash('kill', 'pid=')}` only stops processes that "
                           "hold a GPU")
        else:
            out.processes = [row]
            out.gpus = sorted({gp.gpu_index for gp in held if gp.gpu_index is not None})
            out.gpu_mib = float(sum(gp.used_memory_mib or 0 for gp in held))
        return out

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
        if current.state == LaunchState.STARTING and current.pid is None and not await self._has_processes(current):
            if current.spans_nodes:  # ranks above 0 may run already (a Slurm job is cancelled once sbatch returns)
                try:
                    out = await self.spans.kill(current, out)
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
            out = await (self.spans.kill(current, out) if current.spans_nodes else self._kill(current, out))
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

    async def _has_processes(self, la: Launch) -> bool:
        """Whether any process carries the launch's tag now (a launch whose PID was never recorded, e.g. the
        bot stopped between starting it and recording it). An unreadable host counts as yes (kill it properly)."""
        try:
            snap = await self._snapshot(la.host, ProbeRequest(select_tag=la.tag or None, health_path=None, gpu=False))
        except RemoteError:
            return True
        return bool(self.launch_processes_of(la, snap))

    async def _kill(self, la: Launch, out: KillOutcome) -> KillOutcome:
        snap = await self._snapshot(la.host, ProbeRequest(select_tag=la.tag or None, health_path=None,
                                                          stat_pids=self._stat_pids(la)))
        procs = self.launch_processes_of(la, snap)
        out.mem_before_mib = gpu_memory(snap.gpu, la.gpus)
        if not procs:
            out.mem_after_mib = out.mem_before_mib
            # a kill again after one that left memory held: the holders it named (escaped, untagged) are still
            # not "nothing left"
            held = self._left_holding(la, snap, set()) if la.state == LaunchState.KILL_FAILED else []
            if held:
                out.still_holding = held
            else:
                out.nothing_to_kill = out.released = True
            return out
        remembered = remember_processes(la, snap, procs, whole_table=True)
        if remembered is not None:
            self._launches.update(la.id, seen_pids=remembered[0], seen_starts=remembered[1])
        out.signalled = procs
        # only a group confirmed ours is signalled as a whole (a reused PGID may be a stranger's)
        pgid = la.pgid if group_confirmed(snap.table, self._tagged(la, snap), la.pgid,
                                          ended_by=ended_by(snap, la)) else None
        out.remaining, out.used_sigkill = await self._signal_and_wait(
            la.host, [p.pid for p in procs], pgid, tag=la.tag or None,
            survivors=lambda s: self.launch_processes_of(la, s), unit=la.unit, manager=la.unit_manager,
            starts=snap.start_ticks, stat_pids=self._stat_pids(la))
        cleanup = unit_cleanup_script(la.unit, la.unit_manager)
        if cleanup and not out.remaining:
            await self.hosts.executor(la.host).run("sh -s", input=cleanup.encode(), timeout_s=15)
        return await self._wait_released(la, out, {p.pid for p in out.signalled})

    async def _signal_and_wait(self, host: str, pids: list[int], pgid: int | None, *, tag: str | None,
                               survivors: Callable[[Snapshot], list[ProcessInfo]], unit: str | None = None,
                               manager: str | None = None, starts: Mapping[int, int] | None = None,
                               stat_pids: tuple[int, ...] = ()) -> tuple[list[ProcessInfo], bool]:
        """The one escalation loop: SIGTERM `pids` (and the group `pgid`, and the launch's whole cgroup `unit`
        through its `manager`), wait up to `kill_grace_s` for `survivors(snapshot)` to be empty, then SIGKILL
        what is left and wait `sigkill_wait_s` more. A PID whose start time the probe read (`starts`: PID -> clock
        ticks; `stat_pids` are read again by each later look) is signalled only while it is still that process.
        Returns (what is still alive, zombies left out; whether SIGKILL was needed). Raises RemoteError."""
        ex = self.hosts.executor(host)
        left: list[ProcessInfo] = []
        # the group leader's start time, as first read: a later look no longer lists a leader that is gone, and a
        # stranger may take its PID as a group of its own between the rounds
        leader = {pgid: starts[pgid]} if pgid and starts and pgid in starts else {}
        for sig, budget_s in (("TERM", self.kill_grace_s), ("KILL", self.sigkill_wait_s)):
            targets = pids if sig == "TERM" else [p.pid for p in left]
            script = signal_script(targets, pgid, sig, unit=unit, manager=manager, starts={**(starts or {}), **leader})
            await ex.run("sh -s", input=script.encode(), timeout_s=15)
            left, starts = await self._wait_gone(host, budget_s, tag, survivors, stat_pids)
            if not left:
                return [], sig == "KILL"
        return left, True

    async def _wait_gone(self, host: str, budget_s: float, tag: str | None,
                         survivors: Callable[[Snapshot], list[ProcessInfo]],
                         stat_pids: tuple[int, ...] = ()) -> tuple[list[ProcessInfo], dict[int, int]]:
        """Look again every `poll_s` until `survivors` of a look is empty or `budget_s` has passed. Returns the
        survivors of the last look (zombies left out) and the start times it read (PID -> clock ticks)."""
        deadline = time.monotonic() + budget_s
        while True:
            snap = await self._snapshot(host, ProbeRequest(select_tag=tag, health_path=None, gpu=False,
                                                           stat_pids=stat_pids))
            procs = [p for p in {p.pid: p for p in survivors(snap)}.values() if p.state != "Z"]
            if not procs or time.monotonic() >= deadline:
                return procs, snap.start_ticks
            await asyncio.sleep(self.poll_s)

    async def _wait_released(self, la: Launch, out: KillOutcome, pids: set[int]) -> KillOutcome:
        deadline = time.monotonic() + self.release_timeout_s
        while True:
            snap = await self._snapshot(la.host, ProbeRequest(health_path=None))
            out.mem_after_mib = gpu_memory(snap.gpu, la.gpus)
            out.gpu_error = None if snap.gpu.ok else snap.gpu.error
            out.still_holding = self._left_holding(la, snap, pids)
            if not snap.gpu.ok:
                out.released = not out.still_holding and not out.remaining
                return out
            gpus_free = not la.gpus or all((g.memory_used_mib or 0) < self.gpu_free_mib
                                           for g in snap.gpu.gpus if g.index in la.gpus)
            if not out.still_holding and gpus_free:
                out.released = True
                return out
            if time.monotonic() >= deadline:
                out.released = False
                return out
            await asyncio.sleep(self.poll_s)

    def _left_holding(self, la: Launch, snap: Snapshot, pids: set[int]) -> list[Holder]:
        """The GPU holders a kill of `la` leaves (pure over `snap`): the processes it signalled, any process tagged
        as its own, and, on the launch's GPUs, any other holder that started after the launch did (a child that
        escaped its session and environment, where no cgroup holds the launch): none of those is another live
        launch's."""
        by_pid = {p.pid: p for p in snap.table}
        others = {x.id for x in self._launches.live(la.host) if x.id != la.id}

        def newer(h: Holder) -> bool:
            return (h.pid in by_pid and h.launch_id not in others and (not la.gpus or h.gpu_index in la.gpus)
                    and started_after(snap, by_pid[h.pid], la.created_at) is True)

        return [h for h in self.holders(snap) if h.pid in pids or h.launch_id == la.id or newer(h)]

    async def kill_pid(self, host: str, pid: int, *, user: str, channel: str | None = None,
                       expect_command: str | None = None) -> KillOutcome:
        """Kill one (foreign) process that holds GPU memory: SIGTERM, grace, SIGKILL; report its GPU memory
        released or not. With `expect_command` (the command line shown when the kill was confirmed), a pid
        that now runs another command (reused) is not killed. Never raises; audited as `kill_pid`."""
        out = KillOutcome(target=f"pid {pid} on {host}", host=host)
        t0 = time.monotonic()
        try:
            snap = await self._snapshot(host, ProbeRequest(pid=pid, health_path=None, stat_pids=(pid,)))
            row = next((p for p in snap.table if p.pid == pid), None)
            held = sum(gp.used_memory_mib or 0 for gp in snap.gpu.processes if gp.pid == pid)
            out.mem_before_mib = float(held) if snap.gpu.ok else None
            if row is None:
                out.nothing_to_kill = out.released = True
            elif expect_command is not None and row.args != expect_command:
                out.error = (f"pid {pid} now runs another command ({row.args[:60]}); the process that was "
                             "confirmed is gone, nothing was killed")
            elif not snap.gpu.ok:
                out.error = f"cannot tell whether pid {pid} holds a GPU ({snap.gpu.error}); not killed"
            elif not any(gp.pid == pid for gp in snap.gpu.processes):
                out.error = (f"pid {pid} ({row.args[:60]}) holds no GPU memory; `{slash('kill', 'pid=')}` only "
                             "stops processes that hold a GPU")
            else:
                out.signalled = [row]
                out.remaining, out.used_sigkill = await self._signal_and_wait(
                    host, [pid], None, tag=None, survivors=lambda s: [p for p in s.table if p.pid == pid],
                    starts=snap.start_ticks, stat_pids=(pid,))
                after = await self._snapshot(host, ProbeRequest(health_path=None))
                out.still_holding = [h for h in self.holders(after) if h.pid == pid]
                out.mem_after_mib = float(sum(h.mib or 0 for h in out.still_holding)) if after.gpu.ok else None
                out.released = not out.remaining and not out.still_holding
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
        merged = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in la.params.items()
                  if v != MASK}  # a secret param is stored masked: its sealed value, else its default, or given
        sealed = self.secrets.sealed(la)
        merged.update({k: v for k, v in sealed.items() if la.params.get(k) == MASK})
        merged.update(params)
        lost = sorted(k for k, v in la.params.items() if MASK in str(v) and k not in params
                      and not (v == MASK and k in sealed))
        if lost:  # a value stored masked that cannot be restored: never relaunch with "[REDACTED]" or a default
            given = " ".join(f"{k}=" for k in lost)  # no placeholder value: redaction would mask it
            raise LaunchError(f"{la.name}'s {', '.join(lost)} {'was' if len(lost) == 1 else 'were'} stored masked and "
                              f"cannot be reused here (its sealed copy is missing or its key changed): give "
                              f"{'it' if len(lost) == 1 else 'them'} again: `{slash('relaunch', la.id, given)}` with "
                              f"the value after {'the' if len(lost) == 1 else 'each'} `=`")
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
