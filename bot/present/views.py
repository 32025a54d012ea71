"""Pure view models: Snapshot / HostFailure -> plain dicts the templates render.

No formatting of units happens here beyond grouping and selection; templates format numbers.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from bot.core.commands import OPEN, SLASH, for_launch, slash
from bot.core.fleet import FleetSummary
from bot.core.fleet import HostLine as FleetLine
from bot.core.lifecycle import CGROUP_PARENT, Holder, holder_labels, is_launch_wrapper
from bot.core.models import GpuSection, HostFailure, Launch, LaunchKind, LaunchState, ProcessInfo, Snapshot
from bot.core.parse.log import no_mentions
from bot.core.parse.ps import process_tree
from bot.core.redact import RedactedLines, redact, redact_lines
from bot.present.actions import SNOOZE_BUTTON_MIN, ActionId
from bot.present.render import fmt_duration, mrkdwn_escape

if TYPE_CHECKING:  # an annotation only: importing bot.core.diagnose compiles its signatures
    from bot.core.diagnose import Verdict

COMMAND_WIDTH = 90


def short_command(args: str, width: int = COMMAND_WIDTH) -> str:
    """A command line cut to `width` characters, with the program path shortened to its base name; a launch's
    wrapper shell (bot.core.lifecycle.launch_script) is shown as `sh (gpubot launch wrapper)`. Remembered per
    distinct (args, width) up to 4096 characters: command lines repeat within a table and from probe to probe."""
    if not args:
        return "?"
    return _short_command(args, width) if len(args) <= 4096 else _shorten(args, width)


@functools.lru_cache(maxsize=4096)
def _short_command(args: str, width: int) -> str:
    return _shorten(args, width)


def _shorten(args: str, width: int) -> str:
    if not args:
        return "?"
    if is_launch_wrapper(args):
        return "sh (gpubot launch wrapper)"
    args = redact(args)
    prog, _, rest = args.partition(" ")
    if "/" in prog and not prog.endswith("/"):
        prog = os.path.basename(prog)
    script, sep, tail = rest.partition(" ")
    if script.startswith("/") and script.endswith(".py"):
        rest = os.path.basename(script) + sep + tail  # python3 /long/path/server.py -> python3 server.py
    s = f"{prog} {rest}".strip()
    return s if len(s) <= width else s[: width - 1] + "…"


def gpu_view(gpu: GpuSection, procs_by_pid: dict[int, ProcessInfo],
             owners: dict[int, str] | None = None) -> dict[str, Any]:
    """GPU table rows with their holders. Returns {ok, error, note, source, processes_error, gpus: [...],
    unassigned: [...]}; each GPU row has index, name, used_mib, total_mib, util_pct, temp_c, power_w,
    holders: [{pid, name, mib, gpu}] (memory in MiB)."""
    holders_by_gpu: dict[int | None, list[dict[str, Any]]] = {}
    for p in gpu.processes:
        row = procs_by_pid.get(p.pid)
        name = short_command(row.args, 64) if row else redact(p.process_name or "?")
        holders_by_gpu.setdefault(p.gpu_index, []).append(
            {"pid": p.pid, "name": name, "mib": p.used_memory_mib, "gpu": p.gpu_index, "alive": row is not None,
             "owner": (owners or {}).get(p.pid)}
        )
    gpus = []
    for g in gpu.gpus:
        gpus.append(
            {
                "index": g.index,
                "name": (g.name or "?").replace("NVIDIA ", ""),
                "used_mib": g.memory_used_mib,
                "total_mib": g.memory_total_mib,
                "util_pct": g.utilization_gpu_pct,
                "temp_c": g.temperature_c,
                "power_w": g.power_draw_w,
                "holders": holders_by_gpu.get(g.index, []),
            }
        )
    known = {g.index for g in gpu.gpus}
    unassigned = [h for k, hs in holders_by_gpu.items() if k not in known for h in hs]
    return {
        "ok": gpu.ok,
        "error": no_mentions(gpu.error) if gpu.error else gpu.error,  # nvidia-smi's own words: host text
        "note": gpu.note,
        "source": gpu.source.value,
        "processes_error": gpu.processes_error,
        "gpus": gpus,
        "unassigned": unassigned,
        "holder_count": len(gpu.processes),
    }


def status_view(results: list[Snapshot | HostFailure],
                holders: Mapping[str, Sequence[Holder]] | None = None) -> dict[str, Any]:
    """Context for templates/status.*: {hosts: [{name, failed, reason, hostname, gpu, errors}]}.

    `holders`: host -> its GPU holders, attributed (each shown with Holder.label: `base#12 by U0ALICE`,
    `orphan of base#12 by U0ALICE`, `foreign · bob`)."""
    hosts = []
    for r in results:
        if isinstance(r, HostFailure):
            hosts.append({"name": r.host, "failed": True, "reason": no_mentions(redact(r.reason))})
            continue
        by_pid = {p.pid: p for p in r.processes}
        hosts.append(
            {
                "name": r.host,
                "failed": False,
                "reason": None,
                "hostname": r.hostname,
                "gpu": gpu_view(r.gpu, by_pid, holder_labels((holders or {}).get(r.host, ()))),
                "errors": [no_mentions(e) for e in r.errors],
            }
        )
    return {"hosts": hosts, "failed": sum(1 for h in hosts if h["failed"])}


#: The process table's columns (templates/probe.*): pid, ppid, state, %CPU, CPU time, RSS MiB, elapsed, command.
TABLE_FORMAT = "%7s %7s %-4s %5s %8s %7s %8s  %s"
TABLE_HEADER = TABLE_FORMAT % ("PID", "PPID", "STAT", "%CPU", "CPU time", "RSS MiB", "Elapsed", "Command")


def process_rows(processes: list[ProcessInfo]) -> list[tuple[ProcessInfo, str]]:
    """The processes in tree order (parents before their children, bot.core.parse.ps.process_tree), each with the
    command to show: shortened (`short_command`), indented two spaces per level of depth (at most 6 levels),
    never wider than COMMAND_WIDTH."""
    out = []
    for depth, p in process_tree(processes):
        d = min(depth, 6)
        out.append((p, "  " * d + short_command(p.args, COMMAND_WIDTH - 2 * d)))
    return out


def process_table(processes: list[ProcessInfo]) -> list[str]:
    """The process table as text lines, TABLE_HEADER first, one line per process (`process_rows`): pid, ppid,
    state ('?' when unknown), %CPU (one decimal), CPU time and elapsed (fmt_duration), RSS in MiB (whole), the
    command (redacted: `short_command`); '-' for a value ps did not give. RedactedLines: the renderer redacts them
    once, in the message. Formatted here, not in the template, and all rows with one `%` (TABLE_FORMAT once per
    row): a table may have thousands of lines."""
    durations: dict[int | None, str] = {}  # ages and CPU times repeat within a table
    cells: list[Any] = []
    add = cells.extend
    for p, command in process_rows(processes):
        pcpu, rss, cpu, age = p.pcpu, p.rss_kib, p.cpu_time_s, p.elapsed_s
        cpu_text = durations.get(cpu)
        if cpu_text is None:
            cpu_text = durations[cpu] = fmt_duration(cpu)
        age_text = durations.get(age)
        if age_text is None:
            age_text = durations[age] = fmt_duration(age)
        add((p.pid, "-" if p.ppid is None else p.ppid, p.stat or "?",
             "-" if pcpu is None or pcpu != pcpu else f"{pcpu:.1f}", cpu_text,
             "-" if rss is None else f"{rss / 1024.0:.0f}", age_text, command))
    rows = len(cells) // 8
    if not rows:
        return RedactedLines([TABLE_HEADER])
    text = "\n".join([TABLE_FORMAT] * rows) % tuple(cells)
    lines = text.split("\n")
    if len(lines) != rows:  # a command with a line break of its own (never from ps's args): row by row
        lines = [TABLE_FORMAT % tuple(cells[i:i + 8]) for i in range(0, len(cells), 8)]
    return RedactedLines([TABLE_HEADER, *lines])


def probe_view(snap: Snapshot, selector: str, owners: dict[int, str] | None = None) -> dict[str, Any]:
    """Context for templates/probe.*: host, selector text, the process table (`table`: text lines, header
    first, see `process_table`; `process_count` processes), log, gpu, port/health."""
    by_pid = {p.pid: p for p in snap.processes}
    log = None
    if snap.log is not None:
        lg = snap.log
        log = {
            "path": lg.path,
            "exists": lg.exists,
            "error": lg.error,
            "lines": lg.lines,
            "lines_exact": lg.lines_exact,
            "size_bytes": lg.size_bytes,
            "since_write_s": lg.seconds_since_write(snap.clock),
            "tail": redact_lines(list(lg.tail)),
        }
    health = None
    if snap.health is not None:
        h = snap.health
        health = {"url": h.url, "status": h.status, "code": h.http_code, "elapsed_s": h.elapsed_s, "detail": h.detail}
    return {
        "host": snap.host,
        "hostname": snap.hostname,
        "selector": selector,
        "table": process_table(snap.processes) if snap.processes else [],
        "process_count": len(snap.processes),
        "all_process_count": snap.all_process_count,
        "log": log,
        "gpu": gpu_view(snap.gpu, by_pid, owners),
        "port": snap.port,
        "port_listening": snap.port_listening,
        "health": health,
        "errors": snap.errors,
        "duration_s": snap.duration_s,
    }


_SLACK_USER_RE = re.compile(r"[UW][A-Z0-9]{2,}")


def user_mention(user_id: str, fallback: str | None = None) -> str:
    """`<@U123>` (Slack mention markup) for a real Slack user ID; otherwise `fallback` (default: the text
    itself, or "?"), escaped for mrkdwn so it cannot mention anyone (`<!channel>`)."""
    if _SLACK_USER_RE.fullmatch(user_id or ""):
        return f"<@{user_id}>"
    return mrkdwn_escape((user_id or "?") if fallback is None else fallback)


#: The emoji in front of a launch's state on its root message.
STATE_EMOJI: Mapping[LaunchState, str] = MappingProxyType({
    LaunchState.STARTING: ":hourglass_flowing_sand:", LaunchState.RUNNING: ":large_green_circle:",
    LaunchState.STOPPING: ":hourglass_flowing_sand:", LaunchState.KILL_FAILED: ":red_circle:",
    LaunchState.KILLED: ":black_square_for_stop:", LaunchState.EXITED: ":white_circle:", LaunchState.FAILED: ":x:"})


def launch_view(la: Launch, verdict: Verdict | None = None) -> dict[str, Any]:
    """Context for templates/launch_root.*: the launch's identity, who, params, processes (and the systemd
    scope `unit` it runs in, if any), state; with a `verdict`, the state detail says the verdict and phase
    (`silent_hang in weight_loading`)."""
    params = ", ".join(f"{k}={v}" for k, v in sorted(la.params.items())) or "(defaults)"
    job_id = la.job_id  # shown only: what kind of launch it is, `la.kind` says
    where, gpus = _where(la, job_id)
    detail = la.state_detail or ""
    if verdict is not None:
        detail = verdict.verdict + (f" in {verdict.phase}" if verdict.phase else "")
    return {
        "name": la.name,
        "id": la.id,
        "variant": la.variant,
        "host": la.host,
        "state": str(la.state),
        "state_emoji": STATE_EMOJI.get(la.state, ""),
        "state_detail": redact(detail),
        "who": user_mention(la.created_by),
        "params": redact(params),
        "pid": la.pid,
        "pgid": la.pgid,
        "port": la.port,
        "gpus": gpus,
        "log": la.log_path,
        "command": redact(short_command(la.command, 300)) if la.command else "",
        "relaunch_of": la.relaunch_of,
        "unit": (f"{CGROUP_PARENT}/{la.unit}" if la.unit_manager == "cgroup" else
                 f"{la.unit}{' (user manager)' if la.unit_manager == 'user' else ''}") if la.unit else None,
        "unit_kind": "cgroup" if la.unit_manager == "cgroup" else "systemd scope",
        "job_id": job_id,
        "nodes": ", ".join(la.nodes[:8]) + (f" +{len(la.nodes) - 8}" if len(la.nodes) > 8 else ""),
        "where": where,
    }


def _where(la: Launch, job_id: str | None) -> tuple[str, str]:
    """Where a launch runs and which GPUs, for its root: (`Slurm job 12 on n1, n2` or `Slurm job 12 (not running
    yet)`, `Slurm's`), (`2 hosts: a, b (rank 0: pid 123)`, `0,1 on each host`), or the pid and process group of a
    launch on one host and its GPUs (`all` when it names none). The one place a view reads the launch's kind."""
    nodes = ", ".join(la.nodes[:8]) + (f" +{len(la.nodes) - 8}" if len(la.nodes) > 8 else "")
    gpus = ",".join(map(str, la.gpus))
    if la.kind == LaunchKind.SLURM:
        return f"Slurm job {job_id}" + (f" on {nodes}" if nodes else " (not running yet)"), gpus or "Slurm's"
    if la.kind == LaunchKind.HOSTS:
        return (f"{len(la.nodes)} hosts: {nodes}" + (f" (rank 0: pid {la.pid})" if la.pid else ""),
                f"{gpus} on each host" if gpus else "all")
    return f"{la.pid} ({la.pgid})" if la.pid else "(not started yet)", gpus or "all"


def launch_outcome_view(outcome: Any, variant: str, host: str | None) -> dict[str, Any]:
    """Context for templates/launch_result.*: started / refused / failed / exited early."""
    la = outcome.launch
    return {
        "variant": variant,
        "host": host or getattr(outcome, "host", None) or (la.host if la else "?"),
        "launch": launch_view(la) if la else None,
        "refused": list(outcome.checks.problems),
        "passed": list(outcome.checks.passed),
        "error": redact(outcome.error) if outcome.error else None,
        "exited_early": [redact(x) for x in outcome.exited_early],
        "ok": outcome.ok,
        "placement": getattr(outcome, "placement", None),
    }


def kill_confirm_view(pv: Any, *, confirm_command: str, value: str, action_id: ActionId) -> dict[str, Any]:
    """Context for templates/kill_confirm.*: what a kill would stop (a bot.services.launches.KillPreview), the
    typed command that confirms it, and the [Kill] button's `action_id` and `value` (the confirmation id).
    GPU memory in GiB."""
    return {
        "target": pv.target,
        "host": pv.host,
        "pgid": pv.pgid,
        "count": len(pv.processes),
        "processes": [{"pid": p.pid, "stat": p.stat or "?", "command": short_command(p.args)}
                      for p in pv.processes[:8]],
        "more": max(0, len(pv.processes) - 8),
        "gpus": ",".join(map(str, pv.gpus)) if pv.gpus else "-",
        "gib": None if pv.gpu_mib is None else pv.gpu_mib / 1024,
        "error": redact(pv.error) if pv.error else None,
        "confirm_command": confirm_command,
        "value": value,
        "action_id": str(action_id),
    }


def kill_view(out: Any, gpus: list[int] | None = None) -> dict[str, Any]:
    """Context for templates/kill_result.*: what was signalled, what is left (with states), GPU memory
    before/after in MiB, released or not, and whether the host needs a reboot."""
    return {
        "target": out.target,
        "error": redact(out.error) if out.error else None,
        "nothing": out.nothing_to_kill,
        "signalled": len(out.signalled),
        "sigkill": out.used_sigkill,
        "remaining": [{"pid": p.pid, "stat": p.stat, "wchan": p.wchan, "command": short_command(p.args, 60)}
                      for p in out.remaining],
        "holding": [{"pid": h.pid, "gpu": h.gpu_index, "mib": h.mib, "state": h.state,
                     "command": short_command(h.command, 60)} for h in out.still_holding],
        "before_mib": out.mem_before_mib,
        "after_mib": out.mem_after_mib,
        "released": out.released,
        "memory_left": out.memory_left,
        # every holder that is not the launch's own process: stopped by pid (a child that escaped the launch)
        "kill_hints": [slash("kill", f"pid={h.pid}", *([f"host={out.host}"] if out.host else []))
                       for h in out.still_holding if h.launch_id is None][:8],
        "reboot": out.needs_reboot or any(h.state[:1] in ("D",) for h in out.still_holding),
        "seconds": out.seconds,
        "gpus": ",".join(map(str, gpus)) if gpus else "all",
        "gpu_error": getattr(out, "gpu_error", None),
        "pid_target": out.target.startswith("pid "),
        "cancelled_job": getattr(out, "cancelled_job", None),
        "partial": getattr(out, "partial", False),
    }


#: Evidence lines shown in an alert itself; the rest is in the attached evidence file.
ALERT_KEY_EVIDENCE = 5
#: Next steps the bot takes itself when a button is pressed: a step containing the key is replaced by a
#: pointer to the button (the buttons sit right under the headline). Suggestions are tokens (bot.core.commands).
BUTTON_STEPS = MappingProxyType({
    "py-spy dump": "Press *Stack dump* to get every rank's Python stack (py-spy, in this thread).",
    f"{OPEN}{SLASH}probe HOST": "Press *Probe* for processes, log, GPUs and port in one look.",
})


_GPU_LINE = re.compile(r"GPU \d+: ")
_PORT_LINE = re.compile(r"(port \d+|the server port) is |health probe: |the health endpoint ")


def key_evidence(evidence: list[str], n: int = ALERT_KEY_EVIDENCE) -> list[str]:
    """The `n` evidence lines an alert shows, in their order: the first three (the verdict's own reasons),
    then the first line about a GPU and the first about the port or health endpoint (what on-call checks
    next), then the next ones."""
    chosen = list(range(min(3, len(evidence))))
    for pattern in (_GPU_LINE, _PORT_LINE):
        i = next((i for i, e in enumerate(evidence) if i not in chosen and pattern.match(e)), None)
        if i is not None and len(chosen) < n:
            chosen.append(i)
    for i in range(len(evidence)):
        if len(chosen) >= n:
            break
        if i not in chosen:
            chosen.append(i)
    return [evidence[i] for i in sorted(chosen)]


#: The first next step of a launch's ready alert: the watch goes on, nothing to do.
WATCHING_STEP = ("Nothing to do: gpubot keeps checking it while it serves (process, health endpoint, log, GPUs) "
                 "and posts here when that changes.")
_PLACEHOLDER_RE = re.compile(r"\b(PORT|HOST|PID)\b")


def fill_placeholders(step: str, la: Launch) -> str:
    """A next step with the placeholders PORT, HOST and PID (whole words) replaced by the launch's port, host
    and server PID where it has one (`MASTER_PORT` is left alone)."""
    values = {"PORT": la.port, "HOST": la.host, "PID": la.pid}
    return _PLACEHOLDER_RE.sub(lambda m: str(values[m.group(1)]) if values[m.group(1)] else m.group(1), step)


def _button_steps(steps: list[str]) -> list[str]:
    out: list[str] = []
    for step in steps:
        text = next((v for k, v in BUTTON_STEPS.items() if k in step), step)
        if text not in out:
            out.append(text)
    return out


def alert_view(la: Launch, verdict: Verdict, *, elapsed_s: float, phases: list[tuple[str, float]],
               recovered: bool = False, max_steps: int = 4) -> dict[str, Any]:
    """Context for templates/alert.* (short, action first): the headline (launch, verdict, phase, seconds since
    the launch `elapsed_s`), the summary, ALERT_KEY_EVIDENCE key evidence lines (`evidence`, see
    key_evidence; all of them in `all_evidence`, for the attached file), then the buttons (not for ready), then at most
    `max_steps` next steps, steps the buttons do replaced by a pointer to them, PORT/HOST/PID filled in (a
    ready launch: WATCHING_STEP and the local health probe). `recovered`: a ready verdict
    after a problem while serving (one "recovered" message). Time per phase for ready only. `sureness`: how sure the
    verdict is (Verdict.sureness: confidence, runner-up, the fact that would decide), for every verdict but ready."""
    buttons = verdict.verdict != "ready"
    steps = _button_steps(verdict.next_steps) if buttons else [WATCHING_STEP, *verdict.next_steps[:1]]
    steps = [for_launch(fill_placeholders(s, la), la.id) for s in steps]
    return {
        "name": la.name, "host": la.host, "verdict": verdict.verdict, "phase": verdict.phase,
        "summary": verdict.summary, "evidence": key_evidence(verdict.evidence),
        "all_evidence": verdict.evidence, "more_evidence": max(0, len(verdict.evidence) - ALERT_KEY_EVIDENCE),
        "next_steps": steps[:max_steps], "who_mention": user_mention(la.created_by, ""),
        "elapsed_s": elapsed_s, "phases": phases if verdict.verdict == "ready" and not recovered else [],
        "launch_id": la.id, "pgid": la.pgid, "buttons": buttons, "snooze_min": SNOOZE_BUTTON_MIN,
        "recovered": recovered, "ended": not la.live,
        "sureness": verdict.sureness if verdict.verdict != "ready" else "",
    }


#: One host of a fleet view (templates/fleet.*): name, GPUs, free, mean util, memory, launches, foreign holders.
FLEET_FORMAT = "%-*s %3s GPUs %3s free  util %4s  mem %11s  %s"


def _fleet_row(h: FleetLine, width: int, show_free: bool = False) -> str:
    if h.failed:
        # redacted with its lines' context (a key on one line, its value on the next) before they are joined
        return f"{h.name:<{width}} DOWN: {no_mentions(' '.join(redact(h.reason).split()))}"
    util = f"{h.util_pct:.0f}%" if h.util_pct is not None else "?"
    mem = f"{h.used_mib / 1024:.0f}/{h.total_mib / 1024:.0f} GiB"
    who = ", ".join(h.launches[:4]) + (f" +{len(h.launches) - 4}" if len(h.launches) > 4 else "")
    if h.foreign:
        users = no_mentions(redact(f" ({', '.join(h.foreign_users[:3])}{' +' if len(h.foreign_users) > 3 else ''})")) \
            if h.foreign_users else ""  # users' names are host text
        who = f"{who}{', ' if who else ''}{h.foreign} foreign{users}"
    row = (FLEET_FORMAT % (width, h.name, h.gpus, len(h.free), util, mem, who or "-")).rstrip()
    if show_free:
        row += f"  free GPUs: {','.join(map(str, h.free))}"
    return row


def fleet_view(summary: FleetSummary, *, title: str, hint: str = "", show_free: bool = False,
               totals: str | None = None) -> dict[str, Any]:
    """Context for templates/fleet.*: {title, totals (one line; `totals` replaces it), rows, hint}: `rows` are
    fixed-width text lines (FLEET_FORMAT; with `show_free`, the free GPUs' indexes too), one per host, under a
    `== GROUP (N hosts) ==` line per host group ("" last, as `other hosts` when there are groups)."""
    width = max((len(h.name) for hs in summary.groups.values() for h in hs), default=4)
    named = [g for g in summary.groups if g]
    order = named + ([""] if "" in summary.groups else [])
    rows: list[str] = []
    for g in order:
        name, count = g or ("other hosts" if named else ""), len(summary.groups[g])
        if name:
            rows += [*([""] if rows else []), f"== {name} ({count} host{'' if count == 1 else 's'}) =="]
        rows += [_fleet_row(h, width, show_free) for h in summary.groups[g]]
    down = f" ({summary.up} up, {summary.down} down)" if summary.down else ""
    totals = totals or (f"{summary.hosts} host{'' if summary.hosts == 1 else 's'}{down} · {summary.gpus} GPUs, "
              f"{summary.free} free · {summary.launches} live launch{'' if summary.launches == 1 else 'es'}")
    return {"title": title, "totals": totals, "rows": rows, "hint": hint}


def whois_view(w: Any) -> dict[str, Any]:
    """Context for templates/whois.*: one GPU (a bot.services.holders.GpuWhois) and who holds it. `status` one line
    (its reading, or why it could not be read), `holders` [{pid, gib, who (mrkdwn: the launch and a mention of the
    Slack user who launched it, or `[foreign]` and its user on the host), command, age (text), kill (a command)}],
    `claims` the live launches that claim it without memory showing, `free` True when it is free (under
    `gpu_free_mib` and claimed by no live launch). Host text is redacted and cannot mention anyone."""
    holders = []
    held_by = {h.launch_id for h in w.holders if h.launch_id is not None}
    for h in w.holders:
        la = w.launches.get(h.launch_id) if h.launch_id is not None else None
        if la is not None:
            ended = "" if la.live else f", {la.state.value}"
            who = f"*{mrkdwn_escape(h.owner)}*{ended}, launched by {user_mention(la.created_by)}"
            kill = slash("kill", la.id)
        else:
            user = no_mentions(redact(h.user)) if h.user else "unknown user"
            who = f"[foreign] user *{mrkdwn_escape(user)}*"
            kill = slash("kill", f"pid={h.pid}", f"host={w.host}")
        holders.append({"pid": h.pid, "gib": None if h.mib is None else h.mib / 1024, "who": who,
                        "command": short_command(h.command, 100), "age": fmt_duration(w.elapsed_s.get(h.pid)),
                        "kill": kill})
    claims = [{"name": la.name, "state": la.state.value, "who": user_mention(la.created_by),
               "all": not la.gpus} for la in w.claims if la.id not in held_by]
    if w.error:
        status = f"could not be read: {no_mentions(' '.join(redact(w.error).split()))[:300]}"
    elif w.gpu is None:
        status = f"{w.host} has no GPU {w.index} (its GPUs: {', '.join(map(str, w.gpus)) or 'none'})"
    else:
        g = w.gpu
        util = f", util {g.utilization_gpu_pct:.0f}%" if g.utilization_gpu_pct is not None else ""
        used = "?" if g.memory_used_mib is None else f"{g.memory_used_mib / 1024:.1f}"
        total = "?" if g.memory_total_mib is None else f"{g.memory_total_mib / 1024:.0f}"
        status = f"{no_mentions((g.name or 'GPU').replace('NVIDIA ', ''))}, {used} / {total} GiB used{util}"
    free = (not w.error and w.gpu is not None and w.gpu.memory_used_mib is not None
            and w.gpu.memory_used_mib < w.gpu_free_mib and not w.claims)
    return {"host": w.host, "index": w.index, "status": status, "holders": holders, "claims": claims,
            "free": free, "readable": not w.error and w.gpu is not None}


#: Lines a digest note section shows at most (the rest are counted).
DIGEST_NOTE_LINES = 15


def digest_notes_view(notes: Any) -> dict[str, Any]:
    """Context for templates/digest_notes.*: the fleet digest's notes (a bot.core.fleet.DigestNotes) as `sections`
    [{title, icon, lines, more}] (only those with lines; host text redacted, mentions broken)."""
    sections = []
    for title, icon, lines in (("Idle GPUs held for over an hour", ":zzz:", notes.idle),
                               ("Failed launches not cleaned up", ":warning:", notes.uncleaned),
                               ("Hosts unreachable", ":x:", notes.unreachable)):
        if lines:
            sections.append({"title": f"{title} ({len(lines)})", "icon": icon,
                             "lines": [no_mentions(redact(x)) for x in lines[:DIGEST_NOTE_LINES]],
                             "more": max(0, len(lines) - DIGEST_NOTE_LINES)})
    return {"sections": sections}
