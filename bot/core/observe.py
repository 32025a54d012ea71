"""One readiness check of a launch, as data (pure): a probe Snapshot -> a diagnose() Observation plus the
compact record stored for history and charts; phase durations from those records.

A record is a JSON-ready dict with keys: `t` (remote clock, epoch s), `marker` (the newest meaningful log
line), `last_progress_t` (epoch s), `log_bytes`, `log_lines`, `gpu_mem_mib` / `gpu_util_pct` / `gpu_power_w`
(per GPU index as a string: MiB, percent, W), `cpu_s` (per pid: CPU seconds), `alive`, `port_open`,
`health`, and after diagnosis `verdict` and `phase`; a failed check is `{"t": ..., "error": reason}`.
"""

from __future__ import annotations

import time
from typing import Any

from bot.core.diagnose import Observation, Verdict, diagnose, scan_log
from bot.core.models import Launch, Snapshot

#: Verdicts that end the readiness watch (the launch is no longer starting).
FINAL_VERDICTS = frozenset({"ready", "crashed", "oom", "host_oom", "nccl_error", "cuda_error", "port_in_use",
                            "gpu_lost", "exited"})
#: Verdicts that are not news by themselves (a change into `loading` is only posted when leaving a problem).
QUIET_VERDICTS = frozenset({"loading", "unknown"})


def judge(obs: Observation, prev: dict[str, Any] | None, *, grace_s: dict[str, float] | None,
          silence_after_s: float) -> Verdict:
    """The verdict of one check: `diagnose(obs)`, except that a launch that ran at the previous check
    (`prev["alive"]`) and has no process left, with nothing in the log to explain it, has `exited` (killed
    from outside, the host's OOM killer, ...)."""
    verdict = diagnose(obs, grace_s=grace_s or None, silence_after_s=silence_after_s)
    if verdict.verdict == "unknown" and obs.process_alive is False and (prev or {}).get("alive"):
        return Verdict("exited", verdict.phase,
                       ["no process of the launch is alive any more, and the log gives no reason", *verdict.evidence],
                       ["Check the kernel log on the host: `dmesg | tail` (OOM killer?)",
                        "Look at who stopped it: the thread's history and the events table", *verdict.next_steps],
                       "The launch's processes are gone without an error in the log.")
    return verdict


def is_news(verdict: str, posted: str | None) -> bool:
    """Whether a check's `verdict` is posted, given the verdict `posted` last (None: nothing yet): only a
    change is news, and a quiet verdict (loading, unknown) only when it leaves a problem."""
    if verdict == posted:
        return False
    return not (verdict in QUIET_VERDICTS and posted in (None, "", *QUIET_VERDICTS))


def phase_times(records: list[dict[str, Any]], started_at: float, now: float) -> list[tuple[str, float]]:
    """(phase, seconds spent in it) in the order the checks first saw each phase (pure). A phase lasts from
    the first check that saw it to the first check that saw the next one (the last one until `now`)."""
    firsts: list[tuple[str, float]] = []
    for rec in records:
        ph, t = rec.get("phase"), rec.get("t")
        if ph and isinstance(t, (int, float)) and all(ph != p for p, _ in firsts):
            firsts.append((ph, float(t)))
    out = []
    for i, (ph, t) in enumerate(firsts):
        end = firsts[i + 1][1] if i + 1 < len(firsts) else now
        out.append((ph, max(0.0, end - max(t, started_at))))
    return out


def observation_from_snapshot(snap: Snapshot, la: Launch, prev: dict[str, Any] | None
                              ) -> tuple[Observation, dict[str, Any]]:
    """Turn one probe of a launch into a diagnose() Observation plus the compact record stored for history
    and charts (pure). Log silence is measured from the last line that is not a heartbeat: it resets when
    the newest meaningful line changes. Times are the remote clock, in seconds."""
    now = snap.clock if snap.clock is not None else time.time()
    lines = list(snap.log.tail) if snap.log and snap.log.tail else []
    scan = scan_log(lines)
    marker = lines[scan.meaningful[-1]] if scan.meaningful else None
    prev = prev or {}
    last_progress = prev.get("last_progress_t")
    if marker is not None and marker != prev.get("marker"):
        # new progress: when the newest line IS that progress line, the log's mtime is when it was written
        newest_is_marker = bool(scan.meaningful) and scan.meaningful[-1] == len(scan.lines) - 1
        mtime = snap.log.mtime if snap.log else None
        last_progress = mtime if newest_is_marker and mtime is not None and mtime <= now else now
    if last_progress is None:
        last_progress = snap.log.mtime if snap.log and snap.log.mtime is not None else now
    size = snap.log.size_bytes if snap.log else None
    procs = [p for p in snap.table if p.pid in set(snap.tagged_pids)] or snap.processes
    # only the launch's own GPUs count: other launches on other GPUs of the host are not orphans
    mine = set(la.gpus)
    gpus = [g for g in snap.gpu.gpus if not mine or g.index in mine] if snap.gpu.ok else None
    gpu_procs = [p for p in snap.gpu.processes if not mine or p.gpu_index in mine] if snap.gpu.ok else None
    log_error = snap.log.error if snap.log else None
    obs = Observation(
        log_lines=lines,
        log_silent_s=None if log_error else max(0.0, now - last_progress),
        notes=[f"the log could not be read: {log_error}"] if log_error else [],
        log_growing=(size is not None and prev.get("log_bytes") is not None and size > prev["log_bytes"]),
        elapsed_s=max(0.0, now - la.created_at),
        process_alive=bool(snap.tagged_pids),
        processes=procs,
        launch_pids=set(snap.tagged_pids),
        gpus=gpus,
        gpu_processes=gpu_procs,
        gpu_error_lines=[snap.gpu.error] if not snap.gpu.ok and snap.gpu.error else None,
        gpu_mem_rising=_rising(gpus, prev),
        cpu_time_growing=_cpu_growing(procs, prev),
        port=la.port,
        port_open=snap.port_listening,
        health=snap.health.status if snap.health else None,
    )
    record = {
        "t": now,
        "marker": marker,
        "last_progress_t": last_progress,
        "log_bytes": size,
        "log_lines": snap.log.lines if snap.log else None,
        "gpu_mem_mib": {str(g.index): g.memory_used_mib for g in gpus or []},
        "gpu_util_pct": {str(g.index): g.utilization_gpu_pct for g in gpus or []},
        "gpu_power_w": {str(g.index): g.power_draw_w for g in gpus or []},
        "cpu_s": {str(p.pid): p.cpu_time_s for p in procs},
        "alive": bool(snap.tagged_pids),
        "port_open": snap.port_listening,
        "health": snap.health.status if snap.health else None,
    }
    return obs, record


def _cpu_growing(procs: list, prev: dict[str, Any]) -> bool | None:
    before = prev.get("cpu_s") or {}
    grew = [p.cpu_time_s > before[str(p.pid)] for p in procs
            if p.cpu_time_s is not None and before.get(str(p.pid)) is not None]
    return any(grew) if grew else None


def _rising(gpus: list | None, prev: dict[str, Any]) -> bool | None:
    before = prev.get("gpu_mem_mib")
    if not gpus or not before:
        return None
    now = sum(g.memory_used_mib or 0.0 for g in gpus)
    return now > sum(v or 0.0 for v in before.values()) + 64.0
