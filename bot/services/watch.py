"""Follow every launch for its whole life: scheduled checks, observations, verdicts, alerts.

Each check probes the launch (processes, log, GPUs, port, health) in one round trip, turns the snapshot
into an Observation and a compact record (bot.core.observe), stores the record, and judges it: while it
starts with the readiness rules (`judge`, around the pure `diagnose()`), once it was ready with the
liveness rules (bot.core.serving) at the slower `serving_interval_s`. Only a change of verdict is posted to
the launch's thread, once: the verdict and the launch's new state are written before the alert is sent
(and the root message is rendered from them), so a restart never repeats it. An unreachable host is told
once per thread, and again when it is back. A launch across nodes is checked by the Watcher's part in
bot.services.watch_spans (its Slurm job, every rank). The scheduling (persisted APScheduler jobs) is
bot.adapters.scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import replace

from bot.adapters.cpu import CpuPool
from bot.adapters.scheduler import Scheduler
from bot.adapters.store import DatabaseUnavailable, Store
from bot.config import Config, WatchPolicy
from bot.core.clock import aligned_delay
from bot.core.diagnose import LineMemo, Observation, Verdict
from bot.core.diagnose.stacks import STACK_EVIDENCE_PREFIX, stack_activity, with_stacks
from bot.core.fleet import TABLES_UP_TO, summarize
from bot.core.models import HealthResult, HostFailure, Launch, LaunchState, LogCursor, Snapshot
from bot.core.observe import (
    QUIET_VERDICTS,
    is_news,
    judge,
    new_log_lines,
    observation_from_snapshot,
    remember_processes,
    server_ending,
)
from bot.core.probe import ProbeRequest
from bot.core.records import CheckRecord
from bot.core.serving import generation_due, judge_serving
from bot.core.stackdump import full_text
from bot.core.transitions import LaunchEvent
from bot.present.chart import draw_timeline, timeline_inputs
from bot.present.render import Renderer, fmt_duration
from bot.present.views import digest_notes_view, fleet_view, status_view
from bot.services.alerts import AlertPoster
from bot.services.history import HISTORY_CHECKS, CheckHistory
from bot.services.launches import LaunchService
from bot.services.looks import CheckOutcome, Superseded
from bot.services.looks import Look as _Look
from bot.services.stacks import StackDump, StackDumpError, StackService
from bot.services.surface import Surface
from bot.services.threads import IncidentThreads
from bot.services.watch_spans import SpanningChecks

log = logging.getLogger(__name__)

#: Seconds py-spy may take per rank when the watcher dumps a hang (a hung py-spy delays the alert by at most
#: this plus the kill grace, per rank).
HANG_DUMP_TIMEOUT_S = 10


#: A start-up whose only progress is CPU time has its stacks dumped at most once per this many checks (the dump tells
#: a busy-wait from work; between two dumps the last one stands).
BUSY_DUMP_EVERY = 3

#: How long a check waits, at most, for the end of a launch whose server process is gone to be complete (seconds):
#: its wrapper's exit status written, the GPU memory of the dying process freed. Looked at again every
#: ENDING_POLL_S meanwhile.
ENDING_WAIT_S = 10.0
ENDING_POLL_S = 1.0

#: A serving launch gets a full look (every process on its host, its log's last lines) at least every this many
#: checks; the checks in between are cheap (`Watcher._liveness_request`) while it stays fine.
FULL_CHECK_EVERY = 10
#: The oldest reading of a host's GPUs (seconds) a cheap check takes from another launch's check on the same host.
GPU_SHARE_MAX_S = 10.0


def _new_fields(verdict: Verdict, current: Launch, record: CheckRecord, *, news: bool, serving: bool,
                ended: bool) -> dict[str, object]:
    """The launch's fields a check changes (pure): its alert state (on news, or a quiet verdict over a quiet
    state), the state detail on news or when the verdict ends it, and `ready_at` when it first became ready. Its
    end state is not a field: the check reports the event (`_record`) and LaunchService applies it."""
    fields: dict[str, object] = {}
    if news or (verdict.verdict in QUIET_VERDICTS and current.alert_state in (None, "", *QUIET_VERDICTS)):
        if verdict.verdict != current.alert_state:
            fields["alert_state"] = verdict.verdict
    if news:
        fields["state_detail"] = verdict.summary[:300]
    if verdict.verdict == "ready" and not serving:
        fields["ready_at"] = record.t
    if ended:
        fields.setdefault("state_detail", verdict.summary[:300])
    return fields



class Watcher(SpanningChecks):
    """Schedules and runs readiness checks, and the `/gpu status` digest. `policy` overrides the config's
    `watch:` (a variant's own `watch:` still wins). With `stacks`, a new silent_hang takes the ranks' stack dumps
    itself (`stack_dump_on_hang`)."""

    def __init__(self, config: Config, launches: LaunchService, store: Store, alerts: AlertPoster,
                 threads: IncidentThreads, surface: Surface, renderer: Renderer, scheduler: Scheduler, *,
                 history: CheckHistory, cpu: CpuPool, policy: WatchPolicy | None = None,
                 stacks: StackService | None = None):
        self.config = config
        self.launches = launches
        self._launch_rows = store.launches
        self._clock = store.clock  # the bot's one clock (bot.core.clock)
        self._history = history
        self._cpu = cpu
        self._alerts = alerts
        self._threads = threads
        self._surface = surface
        self._render = renderer
        self.scheduler = scheduler
        self.policy = policy or config.watch
        self._stacks = stacks
        self.ending_wait_s, self.ending_poll_s = ENDING_WAIT_S, ENDING_POLL_S
        self._locks: dict[int, asyncio.Lock] = {}
        self._running: set[asyncio.Task] = set()  # checks in flight (cancelled by stop)
        self._unrecorded: dict[int, str | None] = {}  # alert_state posted while the database refused to record it
        self._cheap: dict[int, int] = {}  # cheap checks since the last full look, per launch
        self._aligned: set[int] = set()  # serving launches checked at their host's moment (`watch`)
        self._memos: dict[int, LineMemo] = {}  # per launch: the lines its checks matched (never matched again)
        #: per launch: the last dump taken to tell a busy-wait from work (monotonic time, dump)
        self._busy: dict[int, tuple[float, StackDump]] = {}
        #: per launch across nodes: a rank's host that did not answer -> (failed looks in a row, since when, told)
        self._rank_hosts_down: dict[int, dict[str, tuple[int, float, bool]]] = {}
        #: per launch across nodes: the ranks seen gone that Slurm's end was already waited for
        self._gone_waited: dict[int, frozenset[int]] = {}
        #: per launch across nodes: the ranks seen gone while rank 0 runs, and why they ended (their own logs)
        self._gone_failures: dict[int, tuple[frozenset[int], tuple[int, str, Verdict] | None]] = {}
        self._policies: dict[str, WatchPolicy] = {}  # per variant
        self._stopping = False
        self._started = False  # between start and stop: new launches are followed (`launched`, `exited_early`)
        #: a follower's watcher (another bot on the shared database leads): it runs no scheduled checks, but a
        #: launch this bot started and found gone at its first look is diagnosed here at once
        self.following = False

    async def start(self) -> None:
        """Start the scheduler (inside the running loop), follow every live launch (also the ones an earlier
        run watched: their jobs come back from the database), and schedule the digest when
        `watch.digest_cron` and `watch.digest_channel` are set."""
        self._stopping = False
        self.scheduler.start(self)
        digest = self.config.watch
        self.scheduler.set_digest(digest.digest_cron if digest.digest_cron and digest.digest_channel else None)
        self._started = True
        unwatched = [la for la in self._launch_rows.live() if not self.scheduler.is_watched(la.id)]
        for k, la in enumerate(unwatched):  # spread over one interval: not all due at the same instant
            self.watch(la, spread=(k + 1) / len(unwatched))

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the scheduler without running pending jobs (they stay in the database), then cancel the checks
        still in flight and wait up to `timeout_s` seconds for them to end (their remote commands are
        stopped), so nothing outlives the bot's shutdown."""
        self._stopping = True
        self._started = False
        self.scheduler.shutdown(self)
        running = [t for t in self._running if t is not asyncio.current_task() and not t.done()]
        for t in running:
            t.cancel()
        if running:
            await asyncio.wait(running, timeout=timeout_s)

    def policy_for(self, la: Launch) -> WatchPolicy:
        """The watch policy of `la`: this watcher's, with the keys its variant's own `watch:` sets replaced
        (key by key; phase_grace_s entries merged). Worked out once per variant (the config does not change while
        the bot runs)."""
        policy = self._policies.get(la.variant)
        if policy is None:
            policy = self.policy
            if la.variant in self.config.variants:
                policy = self.policy.overridden_by(self.config.resolved_variant(la.variant).watch)
            self._policies[la.variant] = policy
        return policy

    def watch(self, la: Launch, *, spread: float = 1.0, aligned: bool = False) -> None:
        """Check `la` every `interval_s` seconds of its policy while it starts, every `serving_interval_s` once it
        was ready; the first time `spread` (0..1) of an interval from now (one interval by default: many launches
        watched at once get spread over it, so their checks, and their writes, do not all come due together). With
        `aligned`, a launch that serves is checked at its host's moment within the interval instead
        (bot.core.clock.aligned_delay): the launches of a host come due together, and their cheap looks share a
        round trip (bot.services.probe_batch)."""
        interval = self._interval(la)
        if aligned and la.ready_at is not None:
            self.scheduler.watch(la.id, interval, aligned_delay(la.host, interval, self._clock.time()))
            self._aligned.add(la.id)
        else:
            self.scheduler.watch(la.id, interval, interval * min(1.0, max(0.0, spread)))
            self._aligned.discard(la.id)

    def _interval(self, la: Launch) -> float:
        """Seconds between two checks of `la` now: its policy's `interval_s` while it starts, `serving_interval_s`
        once it was ready."""
        policy = self.policy_for(la)
        return policy.serving_interval_s if la.ready_at is not None else policy.interval_s

    def unwatch(self, launch_id: int) -> None:
        """Stop checking launch `launch_id` (its records stay in the database)."""
        self.scheduler.unwatch(launch_id)
        self._history.forget(launch_id)
        self._cheap.pop(launch_id, None)
        self._aligned.discard(launch_id)
        self._memos.pop(launch_id, None)
        self._busy.pop(launch_id, None)
        self._rank_hosts_down.pop(launch_id, None)
        self._gone_waited.pop(launch_id, None)
        self._gone_failures.pop(launch_id, None)

    def follow(self, la: Launch) -> None:
        """`la` is live and to be followed (LaunchService's follow hook, wired in bot.wiring: it started, or a kill
        left it live): check it while this watcher runs (a launch already checked keeps its schedule)."""
        if self._started and not self.scheduler.is_watched(la.id):
            self.watch(la)

    def _not_live(self, launch_id: int, current: Launch | None) -> None:
        """A check found launch `launch_id` not live (`current`: as stored now): stop following it, unless a kill
        is stopping it (`stopping`): the kill's end decides, and what a kill leaves live (`kill_failed`) is
        followed on with what the checks remember of it (a host told unreachable is not told again)."""
        if current is None or current.state != LaunchState.STOPPING:
            self.unwatch(launch_id)

    async def exited_early(self, la: Launch) -> None:
        """A launch was gone at its first look (LaunchService's hook, wired in bot.wiring): diagnose it now while
        this watcher runs, or while it follows another bot's (`following`: the bot that launched it says it)."""
        if self._started or self.following:
            await self.early_exit(la)

    def adopt(self) -> int:
        """Follow every live launch that this running watcher does not check yet: ones another bot on the shared
        database started (its leader calls this every second or so). Returns how many it took on."""
        if not self._started:
            return 0
        new = [la for la in self._launch_rows.live() if not self.scheduler.is_watched(la.id)]
        for la in new:
            self.watch(la)
        return len(new)

    async def early_exit(self, la: Launch) -> None:
        """A launch gone at its first look (LaunchService hook): check it now, so a crash or an OOM gets its
        verdict and alert instead of a bare `exited`."""
        await self.check(la.id)

    async def digest(self) -> bool:
        """Post `/gpu status` of every configured host (holders labelled by launch) to the digest channel, led by
        what needs someone where anything does (bot.core.fleet.digest_notes). Returns True when it was posted."""
        channel = self.config.watch.digest_channel
        if not channel:
            return False
        try:
            hosts = self.config.host_names()
            results, holders, recent = await self.launches.gpu_holders.status(hosts)
            if len(hosts) > TABLES_UP_TO:  # a fleet: one line per host under its totals
                lines = self.launches.gpu_holders.fleet_lines(results, holders)
                msg = self._render.render("fleet", **fleet_view(summarize(lines), title="GPU fleet digest"))
            else:
                msg = self._render.render("status", **status_view(results, holders))
            notes = digest_notes_view(self.launches.gpu_holders.digest_notes(results, holders, recent))
            said = self._render.render("digest_notes", **notes)
            # what needs someone (idle held GPUs, failed or hung launches, unreachable hosts) before the hosts' rows
            msg = said.then(msg) if notes["sections"] else msg.then(said)
            return await self._surface.post(channel, msg) is not None
        except Exception:
            log.exception("the digest failed")
            return False

    async def timeline(self, la: Launch) -> tuple[bytes, int]:
        """The launch's timeline chart (PNG bytes, drawn off the event loop) and how many checks it shows. Raises
        what the database raises."""
        records = await self._history.all(la.id)
        return await self._cpu.run(draw_timeline, timeline_inputs(la, records, self._render.redactor)), len(records)

    async def check(self, launch_id: int) -> CheckOutcome:
        """Probe, record, diagnose; post the verdict when it changed. One check of a launch at a time (the
        scheduled one and an early-exit one never race). Never raises."""
        lock = self._locks.setdefault(launch_id, asyncio.Lock())
        task = asyncio.current_task()
        if task is not None:
            self._running.add(task)
        try:
            async with lock:
                try:
                    return await self._check(launch_id)
                except Exception as e:  # a bug in one check must not kill the job or the loop
                    log.exception("check of launch %s failed", launch_id)
                    return CheckOutcome(None, False, self._launch_rows.get(launch_id), error=type(e).__name__)
        except asyncio.CancelledError:
            if not self._stopping:
                raise
            log.info("check of launch %s stopped: the bot is shutting down", launch_id)
            return CheckOutcome(None, False, None, error="shutting down")
        finally:
            self._running.discard(task)

    @contextlib.contextmanager
    def _unless_refused(self, la: Launch, what: str) -> Iterator[None]:
        """Go on with the check when the database refuses to write `what` (logged): the verdict still counts."""
        try:
            yield
        except Exception as e:  # DatabaseUnavailable, or the job store's own (sqlalchemy) error
            if not isinstance(e, DatabaseUnavailable) and "sqlalchemy" not in type(e).__module__:
                raise
            log.error("check of %s: cannot record %s: %s", la.name, what, e)

    def _liveness_request(self, la: Launch, prev: CheckRecord | None, *, generate: bool = False) -> ProbeRequest | None:
        """The cheap check of a launch that serves and was fine last time: only its own processes (`ps -p`, their
        tags), what its log got since the last check (from that check's cursor), its port, health endpoint and
        GPUs (the host's reading of another launch's check within half an interval will do); not every process on
        the host nor the log's last 200 lines. None when a full look is due: while it
        starts, after trouble, without a previous record to go on, or every FULL_CHECK_EVERY checks (to see new
        processes of the launch)."""
        cursor = LogCursor.from_list(prev.log_cursor) if prev is not None else None
        own = {int(p) for p in (prev.cpu_s if prev is not None else ()) if p.isascii() and p.isdigit() and len(p) <= 7}
        pids = sorted(own | ({la.pid} if la.pid else set()))
        # the launches of a host are checked at the same moment: their full looks are spread over the cycle by their
        # ids, not all due together (a whole process table each)
        n = self._cheap.get(la.id, la.id % FULL_CHECK_EVERY)
        if (la.ready_at is None or la.alert_state != "ready" or la.unreachable_since is not None or prev is None
                or not pids or (la.log_path and cursor is None) or n >= FULL_CHECK_EVERY):
            self._cheap[la.id] = 0
            return None
        self._cheap[la.id] = n + 1
        req = self.launches.launch_probe_request(la, tail_lines=200, generate=generate)
        # the host's GPUs as another launch's check read them within half an interval: one reading for them all
        shared_s = min(GPU_SHARE_MAX_S, self.policy_for(la).serving_interval_s / 2)
        return replace(req, ps_pids=tuple(pids), log_cursor=cursor, log_since=cursor is not None,
                       gpu_max_age_s=max(0.0, shared_s))

    def _generation_due(self, la: Launch, history: list[CheckRecord]) -> bool:
        """Whether this check of `la` runs its variant's generation check: only once it serves, and then by
        bot.core.serving.generation_due (every check once the log is silent, else at the check's own interval)."""
        check = self.launches.generation_check(la)
        if check is None or la.ready_at is None or la.state != LaunchState.RUNNING:
            return False
        since_ready = [r for r in history if r.t >= la.ready_at]
        return generation_due(since_ready, step_s=self.policy_for(la).serving_interval_s, grace_s=check.grace_s,
                              interval_s=check.interval_s)

    async def _look(self, la: Launch, req: ProbeRequest, history: list[CheckRecord],
                    prev: CheckRecord | None, generated: HealthResult | None = None, *,
                    own: bool = True) -> _Look | HostFailure:
        """Probe the launch with `req`, and judge what it saw: the readiness rules while it starts, the liveness
        rules once it was ready. Remembers the launch's processes (its row) as a side effect. `generated`: the
        generation check an earlier look of this same check ran (it is not run twice). Without `own` (`la` is a
        view of another rank than the one the launch's checks follow): nothing is remembered, its log is read
        afresh."""
        snap = await self.launches.probe_launch(la, request=req)
        if isinstance(snap, HostFailure):
            return snap
        if generated is not None and snap.generate is None:
            snap = replace(snap, generate=generated)
        memo = self._memos.setdefault(la.id, LineMemo()) if own else LineMemo()
        obs, record = observation_from_snapshot(snap, la, prev, quiet_since=self.launches.bot_activity(la.id),
                                                memo=memo, earlier=history if own else ())
        remembered = remember_processes(la, snap, obs.processes or [], whole_table=req.ps_pids is None) \
            if own else None
        if remembered is not None:
            with self._unless_refused(la, "the processes it remembers"):
                la = self._launch_rows.update(la.id, seen_pids=remembered[0], seen_starts=remembered[1])
        ending = server_ending(snap, la, obs.processes or [], record.exit_status)
        policy = self.policy_for(la)
        if la.ready_at is not None:
            since_ready = [r for r in history if r.ok and r.t >= (la.ready_at or 0)]
            check = self.launches.generation_check(la)
            verdict = judge_serving(obs, new_log_lines(snap, prev), [*since_ready, record],
                                    failures_needed=policy.health_failures, hang_silence_s=policy.serving_silence_s,
                                    exit_code=record.exit_status, launch_id=la.id,
                                    generate_failures=check.failures if check else 2,
                                    generate_silence_s=check.grace_s if check else None)
        else:
            verdict = judge(obs, prev, grace_s=policy.phase_grace_s, silence_after_s=policy.silence_after_s,
                            posted=la.alert_state, exit_code=record.exit_status, launch_id=la.id, memo=memo)
            # CPU time alone past the grace (a guess, or long enough to be called a hang without stacks): the stacks
            # tell work from a busy-wait
            if own and obs.rank_stacks is None and (
                    (verdict.verdict in ("loading", "silent_hang") and obs.cpu_time_growing)
                    or (obs.cpu_time_growing is None and la.id in self._busy)):
                obs, verdict = await self._busy_or_working(la, snap, obs, prev, verdict, record, memo)
        return _Look(la, snap, obs, record, verdict, ending)

    async def _busy_or_working(self, la: Launch, snap: Snapshot, obs: Observation, prev: CheckRecord | None,
                               verdict: Verdict, record: CheckRecord, memo: LineMemo) -> tuple[Observation, Verdict]:
        """A start-up whose only sign of progress past its grace is CPU time: the ranks' stacks decide whether that
        CPU time is work (compiling, loading: still loading) or a busy-wait (a synchronize, a collective: a hang).
        The dump is taken at most once per BUSY_DUMP_EVERY checks of the launch and reused meanwhile; without a
        StackService, py-spy, or `stack_dump_on_hang`, the verdict stands. A check whose CPU time is unknown (the
        dump itself fell in its window) goes on from the last dump while it stands: work seen then is work still."""
        policy = self.policy_for(la)
        if self._stacks is None or not policy.stack_dump_on_hang:
            return obs, verdict
        now = self._clock.monotonic()
        cached = self._busy.get(la.id)
        fresh = cached is not None and now - cached[0] <= BUSY_DUMP_EVERY * policy.interval_s
        if obs.cpu_time_growing is None:
            ranks = cached[1].ranks() if fresh and cached is not None and cached[1].ok else None
            if not ranks or (stack_activity(ranks) or ("",))[0] != "working":
                return obs, verdict
            obs = replace(obs, cpu_time_growing=True, rank_stacks=ranks)
            return obs, judge(obs, prev, grace_s=policy.phase_grace_s, silence_after_s=policy.silence_after_s,
                              posted=la.alert_state, exit_code=record.exit_status, launch_id=la.id, memo=memo)
        strict = judge(replace(obs, cpu_time_growing=False), prev, grace_s=policy.phase_grace_s,
                       silence_after_s=policy.silence_after_s, posted=la.alert_state, exit_code=record.exit_status,
                       launch_id=la.id, memo=memo)
        if strict.verdict != "silent_hang":
            return obs, verdict  # something besides CPU time moves: no dump needed
        if not fresh:
            try:
                dump = await self._dump_ranks(la, snap, policy)
            except StackDumpError as e:
                log.info("%s: no stacks to tell work from a busy-wait: %s", la.name, e)
                return obs, verdict
            except Exception:
                log.exception("stack dump of %s failed", la.name)
                return obs, verdict
            cached = (now, dump)
            self._busy[la.id] = cached
        assert cached is not None
        ranks = cached[1].ranks() if cached[1].ok else None
        if not ranks:
            return obs, verdict
        obs = replace(obs, rank_stacks=ranks)
        return obs, judge(obs, prev, grace_s=policy.phase_grace_s, silence_after_s=policy.silence_after_s,
                          posted=la.alert_state, exit_code=record.exit_status, launch_id=la.id, memo=memo)

    async def _dump_ranks(self, la: Launch, snap: Snapshot, policy: WatchPolicy) -> StackDump:
        """The watcher's py-spy dump of `la`'s ranks on its host (as `snap` found them). Raises StackDumpError."""
        assert self._stacks is not None
        return await self._stacks.dump_processes(la, self.launches.launch_processes_of(la, snap),
                                                 native=policy.stack_dump_native, user="watcher", channel=la.channel,
                                                 timeout_s=HANG_DUMP_TIMEOUT_S, ranks_only=True)

    async def _check(self, launch_id: int) -> CheckOutcome:
        """One check: gather (the cheap look, or the full one), then judge and act on what it saw."""
        la = self._launch_rows.get(launch_id)
        if la is None or not la.live:
            self._not_live(launch_id, la)
            return CheckOutcome(None, False, la)
        history = await self._history.recent(la.id, HISTORY_CHECKS)  # bounded: a launch may serve for weeks
        if self.launches.runner(la).spans:
            return await self._check_spanning(la, history)
        looked = await self._gather(la, history)
        if isinstance(looked, HostFailure):
            self._history.add(la.id, CheckRecord.failed(self._clock.time(), looked.reason))
            await self._host_unreachable(la, looked.reason)
            return CheckOutcome(None, False, self._launch_rows.get(la.id) or la, error=looked.reason)
        return await self._act(looked, history)

    async def _notice(self, la: Launch, icon: str, text: str, hint: str) -> None:
        """A notice in the launch's thread (none without a channel)."""
        if la.channel:
            msg = self._render.render("notice", icon=icon, text=text, hint=hint)
            await self._surface.post(la.channel, msg, thread_ts=la.thread_ts)

    async def _gather(self, la: Launch, history: list[CheckRecord]) -> _Look | HostFailure:
        """Look at `la`: the cheap liveness look when it serves and was fine, the full look when that saw a
        change (or is not due); each judged (`_look`)."""
        prev = next((r for r in reversed(history) if r.ok), None)
        generate = self._generation_due(la, history)
        cheap = self._liveness_request(la, prev, generate=generate)
        generated = None
        if cheap is not None:
            looked = await self._look(la, cheap, history, prev)
            if isinstance(looked, _Look) and looked.verdict.verdict == "ready":
                return looked
            self._cheap[la.id] = 0  # something changed (or the host did not answer): the full look decides
            if isinstance(looked, _Look):  # its generation check counts: a hung one is not waited for twice
                generated, generate = looked.snap.generate, False
        full = self.launches.launch_probe_request(la, tail_lines=200, generate=generate)
        looked = await self._look(la, full, history, prev, generated)
        # a server that is gone while its end is under way (the wrapper about to write its status, a CUDA process's
        # memory being freed): look again for a few seconds rather than judge a half-finished end
        deadline = self._clock.monotonic() + self.ending_wait_s
        while isinstance(looked, _Look) and looked.ending and self._clock.monotonic() < deadline:
            await asyncio.sleep(self.ending_poll_s)
            looked = await self._look(looked.la, self.launches.launch_probe_request(looked.la, tail_lines=200),
                                      history, prev)
        return looked

    async def _act(self, looked: _Look, history: list[CheckRecord], *, others_gone: bool = True) -> CheckOutcome:
        """Record what a check saw and act on its verdict: the ranks' stacks for a new hang, the launch's new
        fields, the alert when it is news (or the root's update), the schedule when it ended or became ready.
        `others_gone`: False when a rank of a launch across hosts other than rank 0 was not seen gone (then a
        launch a kill left `kill_failed` stays so, whatever rank 0's host shows)."""
        la, snap, obs, record, verdict = looked.la, looked.snap, looked.obs, looked.record, looked.verdict
        if la.unreachable_since is not None:
            la = await self._host_back(la)
        serving = la.ready_at is not None
        dump_files: list[tuple[str, bytes]] = []
        if verdict.verdict != la.alert_state and not self._snoozed(la):
            verdict, dump_files = await self._stack_evidence(la, verdict, self.policy_for(la), snap)
        record.verdict, record.phase = verdict.verdict, verdict.phase
        self._history.add(la.id, record)
        current = self._launch_rows.get(la.id)
        if current is None or not current.live:  # killed while this check ran: a deliberate stop is no news
            self._not_live(la.id, current)
            return CheckOutcome(verdict, False, current)
        if current.state == LaunchState.KILL_FAILED and obs.process_alive is False:
            if not others_gone:  # a rank on another host not seen gone (unreachable): what the kill left may run
                return CheckOutcome(verdict, False, current)
            return await self._after_failed_kill(current, obs, verdict)
        stored_alert = current.alert_state  # as the database has it (the compare and set of `_record`)
        if la.id in self._unrecorded:  # an alert the database refused to record was posted: it is the last one
            current = replace(current, alert_state=self._unrecorded[la.id])
        # a launch ends once its server is gone, whatever the verdict (a failure verdict alone does not end it: an
        # engine may log an OOM it survives, a caught allocation failure, and a live launch must stay watched)
        ended = obs.process_alive is False and verdict.verdict != "ready"
        if self._snoozed(current) and not ended:
            return CheckOutcome(verdict, False, current)  # nothing recorded: the change is posted after the snooze
        previous = [r.verdict for r in history if r.ok]
        news = is_news(verdict.verdict, current.alert_state, previous=previous[-1] if previous else None,
                       serving=serving) or (ended and verdict.verdict != current.alert_state)
        fields = _new_fields(verdict, current, record, news=news, serving=serving, ended=ended)
        # the verdict ends the launch (leftovers still hold GPUs: /gpu status shows them, /kill stops them)
        end = (LaunchState.EXITED if verdict.verdict == "exited" else LaunchState.FAILED) if ended else None
        # the alert is composed before it is recorded (its records read, its chart drawn: slow under load), so that
        # queueing it follows the record at once: a leader killed in between loses no alert it had recorded
        after = replace(current, **fields, **({"state": end} if end is not None else {}))  # type: ignore[arg-type]
        alert = await self._alerts.compose(after, verdict, record, recovered=serving and verdict.verdict == "ready",
                                           files=dump_files) if news else None
        if fields or end is not None:
            try:
                la = self._record(la, current, fields, end, stored_alert)
            except Superseded:  # another bot recorded (and posts) this change: no second alert
                return CheckOutcome(verdict, False, self._launch_rows.get(la.id))
        alerted = False
        if news:
            alerted = await self._alerts.send(la, verdict, alert) if alert is not None else False  # the root shows it
        elif fields:
            await self._threads.show(la, verdict if ended else None)
        with self._unless_refused(la, "its schedule"):  # the job store is in the same database
            if ended:
                self.unwatch(la.id)
            elif "ready_at" in fields or (la.ready_at is not None and la.id not in self._aligned):
                self.watch(la, aligned=True)  # from now on: liveness checks at the serving interval, with its host's
        return CheckOutcome(verdict, alerted, la)

    async def _after_failed_kill(self, la: Launch, obs: Observation, verdict: Verdict) -> CheckOutcome:
        """A launch a kill left `kill_failed` whose own processes are all gone: the bot stopped it, so it did not
        "exit" and no alert is posted. Once its GPUs hold no memory (a holder that escaped it may still: then it
        stays kill_failed, and `/kill` names the holder) it becomes `killed`, quietly, and is no longer watched."""
        free = self.launches.gpu_free_mib
        if obs.gpus is None or any((g.memory_used_mib or 0) > free for g in obs.gpus):
            return CheckOutcome(verdict, False, la)
        try:
            la = self.launches.transition(la, LaunchEvent.LEFTOVERS_GONE,
                                          state_detail=f"{(la.state_detail or 'kill_failed').rstrip('.;')}; what "
                                                       "it left has ended since and its GPU memory is released")
        except DatabaseUnavailable as e:
            log.error("check of %s: cannot record that its leftovers ended (%s)", la.name, e)
            return CheckOutcome(verdict, False, la)
        await self._threads.show(la)
        with self._unless_refused(la, "its schedule"):
            self.unwatch(la.id)
        return CheckOutcome(verdict, False, la)

    def _snoozed(self, la: Launch) -> bool:
        """Whether `la`'s alerts are snoozed now (the bot's clock)."""
        return bool(la.snoozed_until and self._clock.time() < la.snoozed_until)

    def _record(self, la: Launch, current: Launch, fields: dict[str, object], end: LaunchState | None,
                stored_alert: str | None) -> Launch:
        """Write a check's new fields first (a crash or restart after this never posts the same alert twice),
        with the launch's end (`end`: the ENDED event, applied by LaunchService). When the database refuses, the
        alert goes anyway and is remembered here, so it is posted once. A new alert state is compared and set
        against `stored_alert` (the database's when the check read it): raises Superseded when another bot on the
        shared database recorded a change first."""
        try:
            if end is not None:
                la = self.launches.transition(la, LaunchEvent.ENDED, to=end, **fields)
            elif "alert_state" in fields:  # compare and set: of two bots checking it, one posts the change
                changed = self._launch_rows.update_if(la.id, {"alert_state": stored_alert}, **fields)
                if changed is None:
                    raise Superseded(la.id)
                la = changed
            else:
                la = self._launch_rows.update(la.id, **fields)
            self._unrecorded.pop(la.id, None)
        except DatabaseUnavailable as e:
            log.error("check of %s: cannot record %s (%s); posting the verdict anyway", la.name, sorted(fields), e)
            la = replace(current, **fields, **({"state": end} if end is not None else {}))  # type: ignore[arg-type]
            self._unrecorded[la.id] = la.alert_state
        return la

    async def _stack_evidence(self, la: Launch, verdict: Verdict, policy: WatchPolicy,
                              snap: Snapshot) -> tuple[Verdict, list[tuple[str, bytes]]]:
        """A new silent_hang with the ranks' stacks: the verdict with where each rank waits (with_stacks) and the
        full dump as a file to attach. The ranks are those of `snap`, the check's own probe (no second probe); of a
        launch across nodes, every rank, each node probed for the dump. Any other verdict, no StackService or
        `stack_dump_on_hang` off: unchanged. A dump that fails is one evidence line; it never costs the alert."""
        if verdict.verdict != "silent_hang" or self._stacks is None or not policy.stack_dump_on_hang:
            return verdict, []
        busy = self._busy.get(la.id)
        if busy is not None and busy[1].ok and any(STACK_EVIDENCE_PREFIX in e for e in verdict.evidence):
            # the stacks that decided this hang (a busy-wait) are its evidence already: attach them, no second dump
            text = self._render.redactor(full_text(busy[1].dumps))
            return verdict, [(f"{la.variant}-{la.id}-stackdump.txt", text.encode("utf-8", "replace"))]
        row = self._launch_rows.get(la.id)
        try:
            if row is not None and self.launches.runner(row).spans:  # every rank on its node: the summary spans them
                dump = await self._stacks.dump(row, native=policy.stack_dump_native, user="watcher",
                                               channel=la.channel, timeout_s=HANG_DUMP_TIMEOUT_S, ranks_only=True)
            else:
                dump = await self._dump_ranks(la, snap, policy)
        except StackDumpError as e:
            return with_stacks(verdict, None, unavailable=str(e))[0], []
        except Exception:
            log.exception("stack dump of %s failed", la.name)
            return verdict, []
        verdict, _ = with_stacks(verdict, dump.ranks())
        if not dump.ok:
            return verdict, []
        text = self._render.redactor(full_text(dump.dumps))
        return verdict, [(f"{la.variant}-{la.id}-stackdump.txt", text.encode("utf-8", "replace"))]

    async def _host_unreachable(self, la: Launch, reason: str) -> None:
        """Tell the launch's thread once that its host cannot be reached (after two failed checks in a row,
        so one dropped connection is no news)."""
        if la.unreachable_since is not None or not la.channel:
            return
        recent = await self._history.recent(la.id, 2)
        if len(recent) < 2 or any(r.ok for r in recent):
            return
        la = self._launch_rows.update(la.id, unreachable_since=recent[0].t)
        msg = self._render.render("notice", icon=":electric_plug:",
                                  text=f"{la.host} cannot be reached: {reason}",
                                  hint=f"The checks of {la.name} go on; this thread is told when {la.host} is back.")
        await self._surface.post(la.channel, msg, thread_ts=la.thread_ts)

    async def _host_back(self, la: Launch) -> Launch:
        """Tell the thread that the host answers again (once), and forget that it was unreachable."""
        since = la.unreachable_since or self._clock.time()
        la = self._launch_rows.update(la.id, unreachable_since=None)
        if la.channel:
            msg = self._render.render("notice", icon=":white_check_mark:",
                                      text=f"{la.host} is reachable again (it was not for "
                                           f"{fmt_duration(self._clock.time() - since)})",
                                      hint=f"The checks of {la.name} go on.")
            await self._surface.post(la.channel, msg, thread_ts=la.thread_ts)
        return la
