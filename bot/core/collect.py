"""A bundle in the diagnose format (tests/fixtures/cases/README.md), built from live probes of a host (pure).

`gpubot bundle` and `!bundle` (bot.services.bundles) probe a launch or a host twice a few seconds apart and run
`EXTRAS_SCRIPT` once; this module turns what they saw into the bundle's files:

- `server.log` (the launch's log tail), `ps.txt` (the selected processes in the probe's own
  `ps -eo pid,ppid,pgid,sid,stat,pcpu,rss,etimes,time,wchan:32,args` layout, with its header);
- `nvidia-smi.txt` (plain `nvidia-smi`) and `nvidia-smi.csv` (`--query-gpu=...` with header), `ss.txt`
  (`ss -ltnp`, else `netstat -ltnp`), `dmesg.txt` (the kernel log's tail, only when the bot's user may read it);
- `curl.txt` (the health probe: its URL and what it got), `py-spy/LABEL-pid-N.json` (py-spy's JSON per rank);
- `observed.json` from the two probes (`observed_from_probes`) and `collected.md` (what was collected, what not).

Every text is redacted by the caller's Redactor before it is returned. The reader is bot.core.bundle.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from bot.core.diagnose import cpu_progress
from bot.core.lifecycle import log_exit_status
from bot.core.models import HealthResult, ProcessInfo, Snapshot
from bot.core.shell import quote
from bot.core.stackdump import ProcessDump

__all__ = ["EXTRAS_SCRIPT_SECTIONS", "bundle_files", "extras_budget_s", "extras_script", "observed_from_probes",
           "parse_extras", "ps_text", "stack_json"]

#: Sections of the extras script, in order: (name, bundle file it fills).
EXTRAS_SCRIPT_SECTIONS: tuple[tuple[str, str], ...] = (
    ("listen", "ss.txt"),
    ("dmesg", "dmesg.txt"),  # before nvidia-smi: a wedged GPU hangs nvidia-smi, and its Xid lines are in dmesg
    ("nvidia-smi", "nvidia-smi.txt"),
    ("nvidia-smi-csv", "nvidia-smi.csv"),
)
_MARK = "@@BUNDLE"
_CSV_FIELDS = "index,name,memory.used,memory.total,utilization.gpu,power.draw,power.limit,temperature.gpu,pstate"
#: GPU memory in MiB that must be added between the two probes to call it rising (allocator noise is less).
RISING_MIB = 64.0


def extras_script(nvidia_smi: str = "nvidia-smi", timeout_s: int = 10, dmesg_lines: int = 200,
                  env: Sequence[tuple[str, str]] = ()) -> str:
    """The POSIX sh script (run as `sh -s`) printing, per section of EXTRAS_SCRIPT_SECTIONS, a `@@BUNDLE name`
    line, the command's output (stdout and stderr) and `@@BUNDLE name rc=N`. Each command is bounded by
    `timeout -k 2 timeout_s` (a hung nvidia-smi cannot hold the bundle, and runs last); dmesg prints nothing
    when the user may not read the kernel log. `env`: the host's `env:` (name, value), exported first as the
    probe does. Only `shlex.quote`d values, checked names and integers reach the shell."""
    t = f"timeout -k 2 {int(timeout_s)}"
    smi = quote(nvidia_smi)
    cmds = {
        "nvidia-smi": f"{t} {smi}",
        "nvidia-smi-csv": f"{t} {smi} --query-gpu={_CSV_FIELDS} --format=csv",
        "listen": f"{t} ss -ltnp 2>/dev/null || {t} netstat -ltnp 2>/dev/null",
        "dmesg": f"{t} dmesg -T 2>/dev/null | tail -n {int(dmesg_lines)}",
    }
    parts = ["exec 2>&1", "export LC_ALL=C",
             *(f"export {k}={quote(v)}" for k, v in env if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k))]
    for name, _ in EXTRAS_SCRIPT_SECTIONS:
        parts.append(f"echo '{_MARK} {name}'; ( {cmds[name]} ) </dev/null; echo \"{_MARK} {name} rc=$?\"")
    return "\n".join(parts) + "\n"


def extras_budget_s(timeout_s: int) -> int:
    """Seconds the whole extras script may take: four commands at their timeout plus the kill grace, and a
    margin."""
    return 4 * (int(timeout_s) + 2) + 10


def parse_extras(text: str) -> dict[str, tuple[str, int | None]]:
    """The extras script's output -> {section name: (output text, exit status or None when cut short)}.
    Never raises; a section that did not start is absent."""
    out: dict[str, tuple[str, int | None]] = {}
    current: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        m = re.fullmatch(rf"{_MARK} ([\w-]+)(?: rc=(\d+))?", line)
        if m and m.group(2) is None:
            current, lines = m.group(1), []
            out[current] = ("", None)
        elif m and current == m.group(1):
            out[current] = ("\n".join(lines) + ("\n" if lines else ""), int(m.group(2)))
            current = None
        elif current is not None:
            lines.append(line)
            out[current] = ("\n".join(lines) + "\n", None)
    return out


def _ps_time(s: int | None) -> str:
    if s is None:
        return "-"
    d, rest = divmod(int(s), 86400)
    h, rest = divmod(rest, 3600)
    m, sec = divmod(rest, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:{sec:02d}"


def ps_text(processes: Sequence[ProcessInfo]) -> str:
    """`ps -eo pid,ppid,pgid,sid,stat,pcpu,rss,etimes,time,wchan:32,args` text (with its header) of
    `processes`, sorted by pid: the layout bot.core.parse.ps reads back."""
    head = f"{'PID':>7} {'PPID':>7} {'PGID':>7} {'SID':>7} STAT {'%CPU':>5} {'RSS':>9} {'ELAPSED':>8} {'TIME':>11} " \
           f"{'WCHAN':<32} COMMAND"
    rows = [head]
    def n(v: Any) -> str:
        return "-" if v is None else str(v)

    for p in sorted(processes, key=lambda p: p.pid):
        rows.append(f"{p.pid:>7} {n(p.ppid):>7} {n(p.pgid):>7} {n(p.sid):>7} {p.stat or '-':<4} "
                    f"{n(p.pcpu):>5} {n(p.rss_kib):>9} {n(p.elapsed_s):>8} {_ps_time(p.cpu_time_s):>11} "
                    f"{(p.wchan or '-')[:32]:<32} {p.args}")
    return "\n".join(rows) + "\n"


def stack_json(dump: ProcessDump) -> str:
    """One process's dump as py-spy's own `dump --json` list of threads (thread_name, os_thread_id, active,
    owns_gil, frames of name / filename / short_filename / line): the form bot.core.stackdump reads."""
    return json.dumps([{
        "thread_name": t.name, "os_thread_id": t.os_thread_id, "active": t.active, "owns_gil": t.owns_gil,
        "frames": [{"name": f.name, "filename": f.path or f.file, "short_filename": f.file, "line": f.line}
                   for f in t.frames]} for t in dump.threads], indent=1)


def _gpu_mib(snap: Snapshot) -> float | None:
    used = [g.memory_used_mib for g in snap.gpu.gpus if g.memory_used_mib is not None] if snap.gpu.ok else []
    return sum(used) if used else None


def observed_from_probes(first: Snapshot, second: Snapshot, *, pid: int | None = None,
                         started_at: float | None = None, heartbeat: Callable[[str], bool] | None = None,
                         own: Collection[int] = ()) -> dict[str, Any]:
    """observed.json from two probes of one host, `first` then `second` a few seconds later.

    Keys (README of the cases): `elapsed_s` (seconds from `started_at`, epoch on the bot's clock, to the second
    probe), `log_silent_s` (the remote clock minus the log's mtime; seconds), `log_growing` (the log's size grew
    between the probes; a growth made only of `heartbeat` lines counts as growing but not as un-silence),
    `process_alive` (`pid` in the second probe's process table; without a `pid`, whether any of the launch's `own`
    processes is), `exit_code` (the status the launch's wrapper wrote once its server ended,
    bot.core.lifecycle.log_exit_status), `cpu_time_growing` (the `own` processes' CPU time between the probes is
    work: bot.core.diagnose.cpu_progress), `port_open`, `health` (ok, http_NNN, refused, timeout or empty),
    `gpu_mem_rising` (total GPU memory in use grew by more than RISING_MIB MiB). A key is left out when the probes
    cannot tell it."""
    out: dict[str, Any] = {}
    if started_at is not None and second.local_clock is not None:
        out["elapsed_s"] = round(max(0.0, second.local_clock - started_at), 1)
    a, b = first.log, second.log
    if b is not None and b.exists and b.error is None:
        silent = b.seconds_since_write(second.clock)
        if silent is not None:
            out["log_silent_s"] = round(silent, 1)
        if a is not None and a.exists and a.size_bytes is not None and b.size_bytes is not None:
            out["log_growing"] = b.size_bytes > a.size_bytes
            if heartbeat is not None and out["log_growing"] and "log_silent_s" in out:
                new = b.tail[-max(1, (b.lines or 0) - (a.lines or 0)):] if b.lines and a.lines else []
                if new and all(heartbeat(line) for line in new):
                    del out["log_silent_s"]  # the mtime moved for heartbeats only: the silence is not known
    if pid is not None and second.table:
        out["process_alive"] = any(p.pid == pid for p in second.table)
    elif own and second.table:
        out["process_alive"] = any(p.pid in own for p in second.table)
    if (rc := log_exit_status(second.log)) is not None:
        out["exit_code"] = rc
    if own and first.clock is not None and second.clock is not None:
        before = {p.pid: p.cpu_time_s for p in first.table or first.processes if p.pid in own}
        growing = cpu_progress([p.cpu_time_s - before[p.pid] for p in second.table or second.processes
                                if p.pid in own and p.cpu_time_s is not None and before.get(p.pid) is not None],
                               second.clock - first.clock)
        if growing is not None:
            out["cpu_time_growing"] = growing
    if second.port_listening is not None:
        out["port_open"] = second.port_listening
    for key, result in (("health", second.health), ("generate", second.generate)):
        status = result.status if result is not None else ""
        if status in ("ok", "refused", "timeout", "empty") or re.fullmatch(r"http_\d{3}", status):
            out[key] = status
    m1, m2 = _gpu_mib(first), _gpu_mib(second)
    if m1 is not None and m2 is not None:
        out["gpu_mem_rising"] = m2 > m1 + RISING_MIB
    return out


def _curl_text(snap: Snapshot) -> str | None:
    text = "".join(_curl_lines(h, label) for h, label in ((snap.health, "health check"),
                                                          (snap.generate, "generation check")) if h is not None)
    return text or None


def _curl_lines(h: HealthResult, label: str) -> str:
    """One HTTP check (`label`: health or generation) in curl's words: what was asked, then what it got."""
    got = {"ok": f"HTTP/1.1 {h.http_code or 200}", "refused": "curl: (7) Failed to connect: Connection refused",
           "timeout": f"curl: (28) Operation timed out after {h.elapsed_s or 0:.0f} seconds",
           "empty": "curl: (52) Empty reply from server"}.get(h.status)
    if got is None and h.http_code is not None:
        got = f"HTTP/1.1 {h.http_code}"
    took = f" after {h.elapsed_s:.1f} s" if h.elapsed_s is not None else ""
    return f"# {label}: {h.url}{took}\n{got or h.detail or h.status}\n"


def bundle_files(first: Snapshot, second: Snapshot, *, processes: Sequence[ProcessInfo],
                 extras: Mapping[str, tuple[str, int | None]], ranks: Sequence[tuple[str, ProcessDump]] = (),
                 observed: Mapping[str, Any], redact: Callable[[str], str], what: str,
                 not_collected: Sequence[str] = ()) -> dict[str, bytes]:
    """The bundle's files (name -> UTF-8 bytes), every text passed through `redact`.

    `processes`: the rows for ps.txt (the launch's processes and the GPU holders); `extras`: parse_extras of
    the extras script; `ranks`: (label, dump) per rank dumped with py-spy; `observed`: observed_from_probes;
    `what`: one line naming the launch or host and the time; `not_collected`: reasons for what is missing,
    written to collected.md with the list of files."""
    files: dict[str, str] = {}
    missing = list(not_collected)
    if second.log is not None:
        if second.log.exists and second.log.error is None:
            files["server.log"] = "\n".join(second.log.tail) + ("\n" if second.log.tail else "")
        else:
            missing.append(f"server.log: {second.log.error or 'the log file does not exist'}")
    if processes:
        files["ps.txt"] = ps_text(processes)
    for section, name in EXTRAS_SCRIPT_SECTIONS:
        text, rc = extras.get(section, ("", None))
        if rc is None and section in extras:
            missing.append(f"{name}: cut short (the command did not finish in time)")
            if text.strip():
                files[name] = text
        elif section not in extras:
            missing.append(f"{name}: not run (the extras were cut short before it)")
        elif name == "dmesg.txt" and not text.strip():
            missing.append("dmesg.txt: the kernel log is not readable by this user (or empty)")
        elif name == "ss.txt" and rc not in (0, None) and not text.strip():
            missing.append("ss.txt: neither ss nor netstat ran on the host")
        elif text.strip():
            files[name] = text
        else:
            missing.append(f"{name}: no output" + (f" (exit status {rc})" if rc else " (cut short)"))
    if (curl := _curl_text(second)) is not None:
        files["curl.txt"] = curl
    for label, dump in ranks:
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "rank"
        if dump.ok:
            files[f"py-spy/{slug}-pid-{dump.pid}.json"] = stack_json(dump)
        else:
            missing.append(f"py-spy of {label} (pid {dump.pid}): {dump.error}")
    files["observed.json"] = json.dumps(dict(observed), indent=2, sort_keys=True) + "\n"
    listing = "\n".join(f"- `{n}`" for n in sorted(files))
    gaps = "\n".join(f"- {m}" for m in missing) or "- nothing"
    files["collected.md"] = (f"# gpubot bundle\n\n{what}\n\nTwo probes a few seconds apart; `observed.json` is "
                             f"computed from them.\n\n## Files\n{listing}\n\n## Not collected\n{gaps}\n")
    return {name: redact(text).encode("utf-8", "replace") for name, text in files.items()}
