"""Liveness of a launch once it is ready, as data (pure): one check's Observation and the stored records of
the checks since ready in, one Verdict out.

The readiness rules (`bot.core.observe.judge`) answer "is start-up still moving?"; these answer "is the
server still serving?". In order: the launch's processes are gone (`crashed`, `oom`, ... from the log, or
`exited`, with the exit status or signal the launch wrapper logged); a lost GPU; a new OOM / CUDA / NCCL
error in the lines logged since the previous check; the health endpoint failing `failures_needed` checks
in a row, which is a serving hang (`silent_hang` in `serving`) when it times out while the log is silent
and the GPUs sit idle or spin, else `unhealthy`; engine stats lines that show requests running and no token made
several times in a row, and a generation check that keeps failing while /health answers (a serving hang when it
times out with the log silent); otherwise `ready`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from types import MappingProxyType

from bot.core.commands import slash
from bot.core.diagnose import (
    GENERATION_STUCK,
    STALLED_STATS_LINES,
    LineMemo,
    Observation,
    Verdict,
    diagnose,
    nccl_in_play,
    stalled_stats,
)
from bot.core.diagnose.lines import MAX_LINE
from bot.core.diagnose.logscan import line_facts
from bot.core.diagnose.signatures import SIGNATURES
from bot.core.lifecycle import EXIT_LINE_RE, exit_status, is_launch_wrapper
from bot.core.parse.log import strip_control
from bot.core.records import CheckRecord
from bot.core.text import counted

#: Errors that are news while the server keeps running (a request that hit them, or the start of a crash).
LIVE_ERRORS = frozenset({"oom", "cuda_error", "nccl_error", "gpu_lost", "host_oom"})
#: Health states that mean the endpoint did not answer in time (the server may be wedged, not down).
TIMEOUT_HEALTH = frozenset({"timeout", "empty"})


def health_failing(record: CheckRecord) -> bool | None:
    """Whether one stored check record says the server failed its health check: True for any health state
    but `ok` (or, with no health endpoint, a port that does not listen), None when the record has neither
    (a failed check, or no port)."""
    if record.error is not None:
        return None
    if record.health is not None:
        return record.health != "ok"
    return None if record.port_open is None else not record.port_open


#: How a health state reads in chat.
_HEALTH_WORDS = MappingProxyType({"timeout": "timed out", "connect_timeout": "connect timed out",
                                  "refused": "connection refused", "empty": "empty reply"})


def health_words(health: str | None) -> str:
    """A health state (bot.core.parse.health: `ok`, `http_503`, `timeout`, ...) as chat words: `HTTP 503`,
    `timed out`, `connection refused`; `unknown` for None."""
    if health is None:
        return "unknown"
    if health.startswith("http_"):
        return "HTTP " + health[5:]
    return _HEALTH_WORDS.get(health, health)


def failing_streak(records: Sequence[CheckRecord]) -> int:
    """How many of the newest `records` (oldest first) in a row failed their health check (see
    `health_failing`; records without an answer, such as an unreachable host, are skipped)."""
    n = 0
    for rec in reversed(records):
        f = health_failing(rec)
        if f is None:
            continue
        if not f:
            break
        n += 1
    return n


def generation_streak(records: Sequence[CheckRecord], states: frozenset[str] | None = None) -> int:
    """How many of the newest generation checks in `records` (oldest first; records without one are skipped) in a
    row failed: any state but `ok`, or, with `states`, one of those."""
    n = 0
    for rec in reversed(records):
        if rec.error is not None or rec.generate is None:
            continue
        if rec.generate == "ok" or (states is not None and rec.generate not in states):
            break
        n += 1
    return n


def generation_due(records: Sequence[CheckRecord], *, step_s: float, grace_s: float, interval_s: float) -> bool:
    """Whether the next liveness check runs the generation check (pure): on every check once the previous one found
    the log silent for `grace_s` seconds, after a failed one (until it answers again), and otherwise when none ran
    within `interval_s` seconds (by the next check). `records`: the checks since ready, oldest first; `step_s`:
    seconds until the next check (the serving interval). Times are the records' own (the host's clock), so the two
    clocks never mix."""
    prev = next((r for r in reversed(records) if r.ok), None)
    if prev is None:
        return True
    if prev.last_progress_t is not None and prev.t - prev.last_progress_t >= grace_s:
        return True
    last = next((r for r in reversed(records) if r.ok and r.generate is not None), None)
    return last is None or last.generate != "ok" or prev.t - last.t + step_s >= interval_s


def _steps(verdict: str, phase: str | None) -> list[str]:
    steps = list(SIGNATURES.next_steps.get(verdict, []))
    if phase:
        steps += [s for s in SIGNATURES.next_steps.get(f"{verdict}.{phase}", []) if s not in steps]
    return steps


def ended_verdict(obs: Observation, rc: int | None = None, launch_id: int | None = None, *,
                  memo: LineMemo | None = None) -> Verdict:
    """The verdict of a launch whose server is gone (pure): what `diagnose` says of the observation with the server
    gone and its exit status known (`rc`: the status the launch wrapper wrote, bot.core.lifecycle.exit_status; else
    `obs.exit_code`, else the wrapper's line in `obs.log_lines`): the failure the log shows, `exited` for status 0 or
    a stop in order, `crashed` for another status, `unknown` for a SIGKILL without a kernel log or no status at all.
    A bundle of the launch (its observed.json carries the status) is judged the same by `diagnose` offline. Where
    processes of the launch still run, one more evidence line says that `/kill ID` stops them (`launch_id` names
    the launch: `/kill VARIANT` finds live launches only). `memo`: the launch's LineMemo."""
    if rc is None:
        rc = obs.exit_code if obs.exit_code is not None else exit_status(obs.log_lines or [])
    v = diagnose(replace(obs, process_alive=False, exit_code=rc), memo=memo)
    # the launch's own wrapper shell is never a leftover: it ends once it has written the exit status
    left = [p for p in obs.processes or [] if not (p.stat or "").startswith("Z") and not is_launch_wrapper(p.args)]
    if left:
        pids = ", ".join(str(p.pid) for p in left[:6])
        kill = slash("kill", launch_id or "LAUNCH")
        v = replace(v, evidence=[*v.evidence[:1], f"{counted(len(left), 'leftover process')} of the launch still run "
                                 f"(pid {pids}) and may hold GPU memory: `{kill}` stops them", *v.evidence[1:]])
    return v


def _live_error_possible(lines: Sequence[str]) -> bool:
    """Whether any of `lines` carries a failure signature of a kind that is news while a server runs (OOM, CUDA,
    NCCL, a lost GPU, a kill), or starts a traceback: each line's facts say (matched once per line)."""
    for line in lines:
        f = line_facts(strip_control(line)[:MAX_LINE])
        if (f.hit is not None and f.hit[0] in (*LIVE_ERRORS, "killed", "crashed")) or f.severe:
            return True
    return False


def judge_serving(obs: Observation, new_lines: Sequence[str], records: Sequence[CheckRecord], *,
                  failures_needed: int = 3, hang_silence_s: float = 120.0, exit_code: int | None = None,
                  launch_id: int | None = None, generate_failures: int = 2,
                  generate_silence_s: float | None = None) -> Verdict:
    """The verdict of one liveness check of a ready launch (pure).

    - `obs`: this check (bot.core.observe.observation_from_snapshot); `new_lines`: the log lines written
      since the previous check (only they can raise a new error while the server runs).
    - `records`: the stored records of the checks since ready, oldest first, this check's last.
    - `failures_needed`: health checks failed in a row before an alert; `hang_silence_s`: seconds of log
      silence that, with health timeouts and idle or spinning GPUs, make a serving hang; `exit_code` the
      status the launch wrapper logged when the server ended, `launch_id` the launch (see ended_verdict).
    - `generate_failures`: generation checks (`obs.generate`, `CheckRecord.generate`) failed in a row that make an
      alert while the health endpoint answers: a serving hang when they time out and the log has been silent for
      `generate_silence_s` seconds (default `hang_silence_s`), else `unhealthy`.

    Every verdict has phase `serving` (it was serving by then, whatever start-up phase its log names last), except
    an end in `shutdown` (a stop in order, leftovers of it).
    """
    if obs.process_alive is False:
        v = ended_verdict(obs, exit_code, launch_id)
        if v.phase == "shutdown":
            return v
        if v.phase and v.phase != "serving":  # the log's last start-up phase: it was serving by now
            v = replace(v, summary=v.summary.replace(f" during {v.phase}", " while serving"))
        return replace(v, phase="serving")
    fresh_lines = [x for x in new_lines if not EXIT_LINE_RE.match(x.strip())]
    # only new lines that may hold a live error are read as a whole, and a GPU that could not be read (lost?)
    if _live_error_possible(fresh_lines) or obs.gpu_error_lines:
        fresh = diagnose(replace(obs, log_lines=fresh_lines, log_silent_s=None, log_growing=None))
    else:
        fresh = Verdict("ready", "serving", [], [], "")
    if fresh.verdict in LIVE_ERRORS:
        return replace(fresh, phase="serving",
                       summary=fresh.summary + " The server process is still running.")
    stalled = stalled_stats(new_lines)
    if len(stalled) >= STALLED_STATS_LINES:
        ev = [f"{STALLED_STATS_LINES} stats lines in a row with requests running and no token made, the newest: "
              f"`{new_lines[stalled[0]].strip()[:300]}`"]
        if obs.health is not None:
            ev.append(f"health endpoint: {health_words(obs.health)}")
        return Verdict("silent_hang", "serving", ev, _steps("silent_hang", "serving"),
                       "Serving hang: requests are running but the engine makes no tokens (its stats lines say 0 "
                       f"tokens/s {STALLED_STATS_LINES} times in a row)"
                       + (", while the health endpoint answers." if obs.health == "ok" else "."))
    streak = failing_streak(records)
    health = obs.health or ("refused" if obs.port_open is False else None)
    if streak < max(1, failures_needed):
        if obs.health:
            ev = [f"health endpoint: {health_words(obs.health)}"]
        elif obs.port_open:
            ev = ["the port listens"]
        else:
            ev = ["the server process runs (no health endpoint or port to ask)"]
        gen = _generation_verdict(obs, records, generate_failures,
                                  hang_silence_s if generate_silence_s is None else generate_silence_s)
        if gen is not None:
            return gen
        if obs.generate is not None:
            ev.append(f"generation check: {health_words(obs.generate)}")
        summary = "Serving: the health check answers." if obs.health == "ok" else "Serving, as far as can be seen."
        if streak:
            ev.append(f"{streak} failed health check(s) in a row; {failures_needed} make an alert")
            summary = f"Serving, but the health check failed {streak} time(s) in a row (an alert after " \
                      f"{failures_needed})."
        return Verdict("ready", "serving", ev, _steps("ready", "serving"), summary)
    silence = obs.log_silent_s
    gpus = obs.gpus or []
    idle = [g for g in gpus if (g.utilization_gpu_pct or 0) < 5]
    spin = [g for g in gpus if (g.utilization_gpu_pct or 0) >= 95 and (g.power_draw_w is None or
                                                                       g.power_limit_w is None or
                                                                       g.power_draw_w < 0.5 * g.power_limit_w)]
    ev = [f"the health endpoint failed {streak} checks in a row (now: {health_words(health)})"]
    if silence is not None:
        ev.append(f"no new log line for {silence:.0f} s")
    for g in gpus[:4]:
        ev.append(f"GPU {g.index}: {(g.memory_used_mib or 0) / 1024:.1f} GiB used, "
                  f"{g.utilization_gpu_pct if g.utilization_gpu_pct is not None else '?'} % utilization")
    quiet_gpus = not gpus or len(idle) + len(spin) == len(gpus)
    if health in TIMEOUT_HEALTH and silence is not None and silence >= hang_silence_s and quiet_gpus:
        if not spin:
            what = "sit idle"
        elif nccl_in_play(obs):
            what = "spin at 100 % (a collective that never completes)"
        else:
            what = "spin at 100 % (a kernel that never finishes)"
        summary = (f"Serving hang: the health endpoint times out ({streak} checks in a row), the log has been "
                   f"silent for {silence:.0f} s and the GPUs {what if gpus else 'were not readable'}.")
        return Verdict("silent_hang", "serving", ev, _steps("silent_hang", "serving"), summary)
    return Verdict("unhealthy", "serving", ev, _steps("unhealthy", "serving"),
                   f"The health endpoint failed {streak} checks in a row (now: {health_words(health)}); "
                   "the process is alive.")


def _generation_verdict(obs: Observation, records: Sequence[CheckRecord], needed: int,
                        silence_s: float) -> Verdict | None:
    """The verdict when the generation check failed `needed` times in a row, this check's included, while the health
    endpoint is not (yet) failing: `silent_hang` in serving when it got no token in time (GENERATION_STUCK) with the
    log silent for `silence_s` seconds, none while the log moves (a busy server), `unhealthy` for another failure
    (an HTTP error). None otherwise."""
    if obs.generate is None or obs.generate == "ok":
        return None
    stuck = obs.generate in GENERATION_STUCK  # no token in time; else an error answer: each counts its own kind
    streak = generation_streak(records, GENERATION_STUCK if stuck else None)
    if streak < max(1, needed):
        return None
    silence = obs.log_silent_s
    health = f"the health endpoint answers ({health_words(obs.health)})" if obs.health == "ok" else \
        f"health endpoint: {health_words(obs.health or ('refused' if obs.port_open is False else None))}"
    ev = [f"the generation check failed {streak} checks in a row (now: {health_words(obs.generate)})", health]
    if silence is not None:
        ev.append(f"no new log line for {silence:.0f} s")
    for g in (obs.gpus or [])[:4]:
        ev.append(f"GPU {g.index}: {(g.memory_used_mib or 0) / 1024:.1f} GiB used, "
                  f"{g.utilization_gpu_pct if g.utilization_gpu_pct is not None else '?'} % utilization")
    if stuck:
        if silence is None or silence < silence_s:
            return None  # a slow answer while the log moves: a busy server, not a hang
        return Verdict("silent_hang", "serving", ev, _steps("silent_hang", "serving"),
                       f"Serving hang: {'the health endpoint answers, but ' if obs.health == 'ok' else ''}"
                       f"generation times out ({streak} checks in a row) and the log has been silent for "
                       f"{silence:.0f} s: the engine behind the HTTP front makes no tokens.")
    steps = ["The health endpoint answers but a one-token request fails: read the newest log lines for the request's "
             "error (the engine rejected it: a wrong model name or body, an API key, or a failing engine).",
             "Check the variant's `generate:` (path, body, model) against what the server serves (`/v1/models`)."]
    return Verdict("unhealthy", "serving", ev, steps,
                   f"The generation check failed {streak} checks in a row (now: {health_words(obs.generate)}) while "
                   "the process is alive" + (" and the health endpoint answers." if obs.health == "ok" else "."))
