"""One readiness check of a launch, as data (pure): a probe Snapshot -> a diagnose() Observation plus the
compact record stored for history and charts; phase durations from those records.

A record is a bot.core.records.CheckRecord (its fields are described there); `verdict` and `phase` are set after
diagnosis; a failed check is `CheckRecord.failed(t, reason)`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace

from bot.core.diagnose import LineMemo, Observation, Verdict, cpu_progress, diagnose
from bot.core.diagnose.logscan import newest_meaningful
from bot.core.lifecycle import EXIT_LINE_RE, launch_processes, log_exit_status
from bot.core.models import Launch, LaunchState, ProcessInfo, Snapshot
from bot.core.records import CheckRecord
from bot.core.serving import ended_verdict

#: Verdicts of a wedged or failing server while serving; a swap between them needs two checks to be news.
SERVING_TROUBLE = frozenset({"unhealthy", "silent_hang"})
#: Verdicts that are not news by themselves (a change into `loading` is only posted when leaving a problem).
QUIET_VERDICTS = frozenset({"loading", "unknown"})


def judge(obs: Observation, prev: CheckRecord | None, *, grace_s: dict[str, float] | None,
          silence_after_s: float, posted: str | None = None, exit_code: int | None = None,
          launch_id: int | None = None, memo: LineMemo | None = None) -> Verdict:
    """The readiness verdict of one check: `diagnose(obs)`, the judgement a bundle of the same check gets offline,
    with only what watching over time adds:
    - a launch with no process left is judged with the exit status its wrapper logged (`exit_code`, the record's
      `exit_status`; bot.core.serving.ended_verdict), and its leftovers are named;
    - leaving `silent_hang` (the verdict `posted` last) needs real progress: a new log line, an advancing
      progress counter, rising GPU memory or computing GPUs; growing CPU time alone keeps it `silent_hang`.
    `memo`: the launch's LineMemo (lines seen at the last check are not matched again)."""
    if obs.process_alive is False:
        return ended_verdict(obs, exit_code, launch_id, memo=memo)
    verdict = diagnose(obs, grace_s=grace_s or None, silence_after_s=silence_after_s, memo=memo)
    if posted == "silent_hang" and verdict.verdict in QUIET_VERDICTS and obs.cpu_time_growing:
        strict = diagnose(replace(obs, cpu_time_growing=False), grace_s=grace_s or None,
                          silence_after_s=silence_after_s, memo=memo)
        if strict.verdict == "silent_hang":
            return replace(strict, evidence=[*strict.evidence, "CPU time grows, but that alone is no progress"])
    return verdict


def is_news(verdict: str, posted: str | None, *, previous: str | None = None, serving: bool = False) -> bool:
    """Whether a check's `verdict` is posted, given the verdict `posted` last (None: nothing yet) and the
    verdict of the check before this one (`previous`). Only a change is news; a quiet verdict (loading,
    unknown) only when it leaves a problem, and, like a recovery to `ready` while serving, only when the
    check before saw it too: a verdict that flips back within one check posts nothing."""
    if verdict == posted:
        return False
    if verdict in QUIET_VERDICTS:
        if posted in (None, "", *QUIET_VERDICTS):
            return False
        return previous == verdict
    if serving and verdict == "ready":
        return previous == verdict
    if serving and {verdict, posted} <= SERVING_TROUBLE:
        return previous == verdict  # unhealthy <-> serving hang on a wobbling GPU reading: one alert
    return True


def new_log_lines(snap: Snapshot, prev: CheckRecord | None) -> list[str]:
    """The lines of the snapshot's log tail written since the check `prev`: all of them when the probe read only
    what was written after the cursor of `prev` (`LogInfo.since`), else by the log's line count (the whole tail
    when the log shrank or was replaced, none when the count is unknown)."""
    if snap.log is None or not snap.log.tail:
        return []
    if snap.log.since is not None:
        return list(snap.log.tail)
    tail = list(snap.log.tail)
    now, before = snap.log.lines, prev.log_lines if prev is not None else None
    if now is None or before is None:
        return []
    if now < before:
        return tail
    n = now - before
    return tail[-n:] if n > 0 else []


def phase_times(records: Sequence[CheckRecord], started_at: float, now: float) -> list[tuple[str, float]]:
    """(phase, seconds spent in it) in the order the checks first saw each phase (pure). A phase lasts from
    the first check that saw it to the first check that saw the next one (the last one until `now`)."""
    firsts: list[tuple[str, float]] = []
    for rec in records:
        ph, t = rec.phase, rec.t
        if ph and all(ph != p for p, _ in firsts):
            firsts.append((ph, float(t)))
    out = []
    for i, (ph, t) in enumerate(firsts):
        end = firsts[i + 1][1] if i + 1 < len(firsts) else now
        out.append((ph, max(0.0, end - max(t, started_at))))
    return out


def observation_from_snapshot(snap: Snapshot, la: Launch, prev: CheckRecord | None, *,
                              quiet_since: float | None = None,
                              memo: LineMemo | None = None,
                              earlier: Sequence[CheckRecord] = ()) -> tuple[Observation, CheckRecord]:
    """Turn one probe of a launch into a diagnose() Observation plus the compact record stored for history
    and charts (pure). Log silence is measured from the last line that is not a heartbeat: it resets when
    the newest meaningful line changes. Times are the remote clock, in seconds.

    The launch is alive while its server process (`la.pid`, when known) is. Only the launch's own processes count
    (its tag, its confirmed session and process group, their
    descendants, and the processes earlier checks saw: `la.seen_pids`), and only its own GPUs when it names
    them; other holders are never its evidence. CPU time counts as growing only above
    `CPU_PROGRESS_CORES` over the window since `prev`, or since the newest of the `earlier` checks (oldest first)
    at least CPU_WINDOW_S ago when `prev` is more recent (ps counts CPU time in whole seconds: over a 1 s window a
    core busy all along gains 0 to 2 of them); when the bot itself worked on the launch (a stack dump, at epoch
    `quiet_since`) within that window, whether it grew is unknown (None)."""
    now = snap.clock if snap.clock is not None else time.time()
    raw = list(snap.log.tail) if snap.log and snap.log.tail else []
    # a launch with an exit file is judged by it alone: a line in the log (which the server writes too, and which
    # later lines push out of the tail) is no proof of how it ended
    rc = log_exit_status(snap.log)
    lines = [x for x in raw if not EXIT_LINE_RE.match(x.strip())]  # the wrapper's line is ours, not the engine's
    prev = prev if prev is not None else CheckRecord(t=math.nan)  # a first check: nothing known before
    window = snap.log is not None and snap.log.since is not None  # only what was written since `prev`
    # the newest meaningful line, from each line's facts (matched once per line a launch logs, never rescanned)
    newest, newest_is_last = newest_meaningful(lines, memo=memo)
    marker = newest if newest is not None else (prev.marker if window else None)
    last_progress = prev.last_progress_t
    if marker is not None and marker != prev.marker:
        # new progress: when the newest line IS that progress line, the log's mtime is when it was written
        newest_is_marker = newest is not None and newest_is_last
        mtime = snap.log.mtime if snap.log else None
        last_progress = mtime if newest_is_marker and mtime is not None and mtime <= now else now
    if last_progress is None:
        last_progress = snap.log.mtime if snap.log and snap.log.mtime is not None else now
    size = snap.log.size_bytes if snap.log else None
    procs = own_processes(snap, la)
    cpu = cpu_seconds(procs, snap)
    own = {p.pid for p in procs}
    oldest_s = max((p.elapsed_s for p in procs if p.elapsed_s is not None), default=None)
    if oldest_s is not None and now - last_progress > oldest_s:
        # a log silent since before the launch's oldest process started was last written by an earlier run (a
        # requeued job's): this run's silence starts with it
        last_progress = now - oldest_s
    # without a process table (ps failed or timed out) only the tags in /proc tell: alive when any is tagged,
    # unknown otherwise; never "gone"
    alive: bool | None = bool(own) if snap.table else (True if snap.tagged_pids else None)
    if alive is False and la.pid is None and la.state == LaunchState.STARTING:
        # its process not recorded yet (a check, of another bot too, racing the start): nothing of it is gone yet
        alive = None
    if alive and snap.table and la.pid is not None and la.pid not in own:
        # the server process itself is gone: the launch has ended, even while leftovers (TP workers) still run;
        # they are the launch's leftovers, for /gpu status and /kill, not signs of life
        alive = False
    # only the launch's own GPUs count: other launches on other GPUs of the host are not orphans
    mine = set(la.gpus)
    gpus = [g for g in snap.gpu.gpus if not mine or g.index in mine] if snap.gpu.ok else None
    gpu_procs = [p for p in snap.gpu.processes if p.pid in own] if snap.gpu.ok else None
    log_error = snap.log.error if snap.log else None
    obs = Observation(
        log_lines=lines,
        log_silent_s=None if log_error else max(0.0, now - last_progress),
        notes=[f"the log could not be read: {log_error}"] if log_error else [],
        log_growing=(size is not None and prev.log_bytes is not None and size > prev.log_bytes),
        elapsed_s=max(0.0, now - la.created_at),
        process_alive=alive,
        processes=procs,
        launch_pids=own,
        gpus=gpus,
        gpu_processes=gpu_procs,
        gpu_error_lines=[snap.gpu.error] if not snap.gpu.ok and snap.gpu.error else None,
        gpu_mem_rising=_rising(gpus, prev),
        cpu_time_growing=_cpu_growing(cpu, _cpu_base(prev, earlier, now), now, quiet_since),
        port=la.port,
        port_open=snap.port_listening,
        health=snap.health.status if snap.health else None,
        generate=snap.generate.status if snap.generate else None,
    )
    record = CheckRecord(
        t=now,
        marker=marker,
        last_progress_t=last_progress,
        log_bytes=size,
        log_lines=snap.log.lines if snap.log else None,
        gpu_mem_mib={str(g.index): g.memory_used_mib for g in gpus or []},
        gpu_util_pct={str(g.index): g.utilization_gpu_pct for g in gpus or []},
        gpu_power_w={str(g.index): g.power_draw_w for g in gpus or []},
        cpu_s=cpu,
        alive=alive,
        port_open=snap.port_listening,
        health=snap.health.status if snap.health else None,
        generate=snap.generate.status if snap.generate else None,
        exit_status=rc,
        log_cursor=snap.log.cursor.as_list() if snap.log and snap.log.cursor else None,
    )
    return obs, record



def server_ending(snap: Snapshot, la: Launch, procs: Sequence[ProcessInfo], exit_code: int | None) -> bool:
    """Whether `la`'s server process is gone but its end is still under way (pure): its wrapper shell (the
    session leader, `la.pgid`) still runs and has not written the exit status yet, or GPU memory of the launch's
    GPUs is still held by the server's PID or by a PID that has left the process table (a CUDA process's memory is
    freed seconds after it is killed). `procs` are the launch's live processes in `snap`; `exit_code` the status
    read. False while the server runs, without a process table, or when nothing is known about the server."""
    if la.pid is None or not snap.table or any(p.pid == la.pid for p in procs):
        return False
    if exit_code is None and la.pgid and la.pgid != la.pid and any(p.pid == la.pgid for p in procs):
        return True
    if not snap.gpu.ok:
        return False
    listed = {p.pid for p in snap.table if p.state != "Z"}
    return any((gp.pid == la.pid or gp.pid not in listed) and (gp.used_memory_mib or 0) > 0
               and (not la.gpus or gp.gpu_index in la.gpus) for gp in snap.gpu.processes)


def own_processes(snap: Snapshot, la: Launch) -> list[ProcessInfo]:
    """The live processes of `la` in a snapshot probed with its tag (pure): tagged ones, the members of its
    session and process group when confirmed ours, the processes an earlier check or kill saw (`la.seen_pids`,
    when they started after the launch), and all their descendants."""
    tagged = {pid for pid, tag in snap.launch_tags.items() if la.tag and tag == la.tag} | set(
        snap.tagged_pids if la.tag else ())
    out = launch_processes(snap.table, tagged=tagged, pgid=la.pgid, sid=la.sid, ended_by=ended_by(snap, la))
    if la.seen_pids:
        # a remembered PID counts only while its process carries no other launch's tag and is the process
        # that was seen: the same start time where it was recorded (a reused PID is a younger process),
        # else at least one that started after the launch
        seen = {p.pid for p in snap.table if p.pid in la.seen_pids
                and snap.launch_tags.get(p.pid, la.tag) == la.tag and _same_process(snap, p, la)}
        if seen - {p.pid for p in out}:
            out = launch_processes(snap.table, tagged=seen | {p.pid for p in out})
    return out


#: Start times from `clock - etimes` move by up to a second between probes (both are whole seconds).
START_TIME_SLACK_S = 2.0


def start_time(snap: Snapshot, p: ProcessInfo) -> float | None:
    """When `p` started, in epoch seconds on the host's clock (`snap.clock`, read right before `ps`, which
    counts `etimes` from its own start), or None when either is unknown. Whole-second precision: compare
    with START_TIME_SLACK_S."""
    return None if snap.clock is None or p.elapsed_s is None else float(snap.clock - p.elapsed_s)


def started_after(snap: Snapshot, p: ProcessInfo, t: float) -> bool | None:
    """Whether `p` started after the bot's epoch time `t` (less START_TIME_SLACK_S), by its age against the bot's
    clock when the probe's send time is known (no two clocks mixed), else against the host's; None when its age
    or both clocks are unknown."""
    if p.elapsed_s is None:
        return None
    if snap.local_clock is not None:
        return p.elapsed_s <= snap.local_clock - t + START_TIME_SLACK_S
    started = start_time(snap, p)
    return None if started is None else started >= t - START_TIME_SLACK_S


def _same_process(snap: Snapshot, p: ProcessInfo, la: Launch) -> bool:
    ticks, known = snap.start_ticks.get(p.pid), la.seen_starts.get(p.pid)
    if ticks is not None and known is not None:  # /proc/PID/stat both times: exact
        return ticks == known
    if known is not None:  # recorded exactly, not read now (no longer selected?): not provably ours
        return False
    started = start_time(snap, p)
    if started is None:
        return True
    recorded = la.seen_pids.get(p.pid)
    if recorded is not None:  # both on the host's clock
        return abs(started - recorded) <= START_TIME_SLACK_S
    return started_after(snap, p, la.created_at) is not False


def ended_by(snap: Snapshot, la: Launch) -> float | None:
    """For an ended launch, seconds between its end (the bot's `ended_at`) and the probe of `snap` (the bot's
    `local_clock`; else the host's clock), less START_TIME_SLACK_S: the age a member of its leaderless
    session or group must have to be a leftover and not a stranger's (see bot.core.lifecycle._confirmed);
    None while it is live. An ended launch with no end time or no clock: 0 (any age; nothing better is
    known)."""
    if la.live:
        return None
    clock = snap.local_clock if snap.local_clock is not None else snap.clock
    if la.ended_at is None or clock is None:
        return 0.0
    return max(0.0, clock - la.ended_at - START_TIME_SLACK_S)


def remember_processes(la: Launch, snap: Snapshot, procs: Sequence[ProcessInfo], *,
                       whole_table: bool = False) -> tuple[dict[int, float | None], dict[int, int]] | None:
    """(`la.seen_pids`, `la.seen_starts`) with the processes `procs` (seen in `snap`) added with their start times
    (pure): epoch seconds from `ps`, and clock ticks from /proc/PID/stat where the probe read them; None when
    nothing changed. A recorded start time is kept; an unknown one is filled in. With `whole_table` (`snap` lists
    every process of the host), remembered processes that are no longer in it are forgotten: they ended, and a
    process that gets their PID later is another one (the records of a launch whose server starts short-lived
    children stay bounded)."""
    pids, starts = dict(la.seen_pids), dict(la.seen_starts)
    if whole_table and snap.table:
        alive = {p.pid for p in snap.table}
        pids = {pid: t for pid, t in pids.items() if pid in alive}
        starts = {pid: t for pid, t in starts.items() if pid in alive}
    for p in procs:
        if pids.get(p.pid) is None:
            pids[p.pid] = start_time(snap, p)
        if p.pid not in starts and p.pid in snap.start_ticks:
            starts[p.pid] = snap.start_ticks[p.pid]
    return None if pids == la.seen_pids and starts == la.seen_starts else (pids, starts)


#: The shortest window CPU time growth is measured over (seconds): ps's whole-second CPU time needs a few of them.
CPU_WINDOW_S = 3.0


def _cpu_base(prev: CheckRecord, earlier: Sequence[CheckRecord], now: float) -> CheckRecord:
    """The check CPU time growth is measured from: `prev`, unless it is less than CPU_WINDOW_S old and one of the
    `earlier` checks (with CPU times) is old enough: then the newest of those."""
    if not now - prev.t < CPU_WINDOW_S:  # old enough, or NaN (no previous check)
        return prev
    for r in reversed(earlier):  # newest first: the first check old enough ends the walk
        if r.ok and now - r.t >= CPU_WINDOW_S:
            return r if r.cpu_s else prev
    return prev


#: The suffix of a CheckRecord.cpu_s key that holds a process's ended children's CPU seconds (`123c`), beside its own
#: (`123`): the two are compared apart, so a check that could not read the children's adds no growth.
CHILDREN_KEY = "c"


def cpu_seconds(procs: list, snap: Snapshot) -> dict[str, float | None]:
    """CPU seconds by key: `PID` -> what each process used itself (None where `ps` gave no TIME), `PIDc` -> what its
    ended children used (`Snapshot.children_cpu_s`, where the probe read it: work done in short-lived children, a
    compiler's `ptxas`, is the launch's work too)."""
    kids = snap.children_cpu_s
    out: dict[str, float | None] = {str(p.pid): p.cpu_time_s for p in procs}
    out.update({f"{p.pid}{CHILDREN_KEY}": kids[p.pid] for p in procs if p.pid in kids})
    return out


def _cpu_growing(cpu: dict[str, float | None], prev: CheckRecord, now: float,
                 quiet_since: float | None) -> bool | None:
    before = prev.cpu_s
    t0 = prev.t
    if not t0 < now:  # NaN (no previous check) or a clock that went back
        return None
    if quiet_since is not None and quiet_since >= t0:
        return None  # the bot's own work (a stack dump) is in the window: it cannot tell progress from that
    return cpu_progress([v - before[key] for key, v in cpu.items()
                         if v is not None and before.get(key) is not None], now - t0)


def _rising(gpus: list | None, prev: CheckRecord) -> bool | None:
    before = prev.gpu_mem_mib
    if not gpus or not before:
        return None
    now = sum(g.memory_used_mib or 0.0 for g in gpus)
    return now > sum(v or 0.0 for v in before.values()) + 64.0
