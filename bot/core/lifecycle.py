"""Launch, kill and relaunch, the pure part: command rendering, the shell scripts, pre-launch checks.

A launch runs `setsid nohup sh -c WRAPPER > LOG 2>&1 < /dev/null &` on the host: the wrapper shell leads
its own session and process group (PGID = SID) and runs the server (PID) in its foreground, so when the
server ends the wrapper appends its exit status to the log (`[gpubot] the server process exited with status
137`). The environment carries `GPUBOT_LAUNCH=<tag>` (the launch id plus random hex, unique across bots and
databases), which every child inherits, so even a child that started its own session is found again by
reading /proc/PID/environ, and a process of another bot's launch is never mistaken for ours. On a host whose
systemd allows it, the wrapper starts in the transient scope `gpubot-<tag>.scope`: its cgroup holds every
process the launch forks, even one that cleared its environment, and a kill signals the whole cgroup. Nothing a user
typed reaches a shell unquoted: every value is validated against the variant's declared params, then
`shlex.quote`d before the (sandboxed) template renders it.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from types import MappingProxyType
from typing import Any

from bot.core.commands import slash
from bot.core.models import TERMINAL_STATES, GpuSection, Launch, LaunchState, LogInfo, ProcessInfo, Snapshot
from bot.core.ranks import base_tag
from bot.core.text import counted

#: Environment variable that tags every process of a launch (inherited by all children).
LAUNCH_ENV = "GPUBOT_LAUNCH"
#: A GPU counts as free below this much used memory (MiB) unless the config says otherwise.
DEFAULT_GPU_FREE_MIB = 1024.0
_CTRL_RE = re.compile(r"[\x00-\x1f\x7f]")


class LaunchError(ValueError):
    """A launch request is invalid (unknown variant or param, bad value); str() is user-facing."""


@dataclass
class RenderedLaunch:
    """Everything needed to start one launch: the final shell-safe `command`, the log path, port, GPU
    list, environment (values not yet quoted), working directory and the validated params; `log_dirs` the
    directories the log must resolve into on the host (empty: the log's own directory)."""

    variant: str
    host: str
    command: str
    log_path: str
    port: int | None
    gpus: list[int]
    env: dict[str, str]
    workdir: str | None
    params: dict[str, Any]
    health_path: str | None = None
    log_dirs: list[str] = field(default_factory=list)


#: The line the launch's wrapper shell appends to the log when the server process ends (`$?` of sh: 128+N
#: when it was killed by signal N).
EXIT_LINE_FORMAT = "[gpubot] the server process exited with status {rc}"
EXIT_LINE_RE = re.compile(r"^\[gpubot\] the server process exited with status (\d{1,3})\s*$")
_WRAPPER_FIRST_LINE = "exec 3>&2 2>/dev/null"
#: How a launch's wrapper shell shows in `ps` (is_launch_wrapper).
_WRAPPER_ARGS = f"sh -c {_WRAPPER_FIRST_LINE}"
#: How long the launch script waits for the server's PID file, in 50 ms steps (10 s).
_PID_WAIT_STEPS = 200
#: Transient systemd scope units of launches are named `gpubot-<tag>.scope`; the cgroup v2 directories the bot makes
#: itself (where no systemd takes the launch) `<cgroup2 mount>/gpubot/gpubot-<tag>.launch`.
SCOPE_PREFIX = "gpubot-"
_SCOPE_TAG_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: A launch's own cgroup: its name (the `unit` recorded with manager `cgroup`) and where it lives under the cgroup v2
#: mount.
CGROUP_SUFFIX = ".launch"
CGROUP_PARENT = "gpubot"
#: The unit managers a launch may run under: systemd's (system or user) or the bot's own cgroup v2 directory.
UNIT_MANAGERS = ("system", "user", "cgroup")
_UNIT_RE = re.compile(rf"{re.escape(SCOPE_PREFIX)}[A-Za-z0-9_-]{{1,64}}\.(?:scope|launch)")
#: The file beside a launch's log that its wrapper writes the server's exit status into (`<log>.exit`): created
#: empty at launch, so a launch that has one is judged by it alone, never by a line in its log.
EXIT_FILE_SUFFIX = ".exit"


def scope_unit(tag: str) -> str | None:
    """The transient systemd scope unit a launch with this tag runs in (`gpubot-<tag>.scope`), or None for a
    tag that is no valid unit name part."""
    return f"{SCOPE_PREFIX}{tag}.scope" if _SCOPE_TAG_RE.fullmatch(tag or "") else None


def cgroup_name(tag: str) -> str | None:
    """The name of the cgroup v2 directory a launch with this tag runs in where no systemd scope takes it
    (`gpubot-<tag>.launch`, under `<cgroup2 mount>/gpubot/`), or None for a tag that is no valid name part."""
    return f"{SCOPE_PREFIX}{tag}{CGROUP_SUFFIX}" if _SCOPE_TAG_RE.fullmatch(tag or "") else None


#: Shell lines that set `m` to the cgroup v2 mount point (the first `cgroup2` line of /proc/mounts: /sys/fs/cgroup
#: on a pure v2 host, /sys/fs/cgroup/unified on a hybrid one), empty when there is none or its path is unusual.
_CGROUP_MOUNT = ("m=$(awk '$3 == \"cgroup2\" { print $2; exit }' /proc/mounts 2>/dev/null); "
                 'case "$m" in /*) ;; *) m= ;; esac; case "$m" in *[!A-Za-z0-9/_.-]*) m= ;; esac')


def _cgroup_detect(name: str) -> list[str]:
    """Shell lines that set `cg` to a fresh cgroup v2 directory for the launch (`$m/gpubot/<name>`) when no systemd
    scope takes it and the host lets this user make one and move a process into it (root, or a `gpubot` directory
    delegated to the user): a trial shell moves itself in first. Anything else leaves `cg` empty: the launch runs
    without a cgroup of its own. Empty directories of earlier launches (their wrapper killed too) are removed
    first."""
    return [
        "cg=",
        'if [ -z "$sd" ]; then',
        f"  {_CGROUP_MOUNT}",
        '  if [ -n "$m" ] && [ -f "$m/cgroup.procs" ]; then',
        f'    mkdir -p -- "$m/{CGROUP_PARENT}" 2>/dev/null',
        # the empty directories of earlier launches whose wrapper was killed too (rmdir refuses a cgroup that still
        # has processes; a minute old at least, so a launch being made beside this one is left alone)
        f'    find "$m/{CGROUP_PARENT}" -mindepth 1 -maxdepth 1 -type d -name "{SCOPE_PREFIX}*{CGROUP_SUFFIX}" '
        "-mmin +1 -exec rmdir {} \\; 2>/dev/null",
        f'    if mkdir -- "$m/{CGROUP_PARENT}/{name}" 2>/dev/null; then',
        f'      if sh -c \'echo 0 > "$1/cgroup.procs"\' gpubot-cgroup "$m/{CGROUP_PARENT}/{name}" 2>/dev/null; then',
        f'        cg="$m/{CGROUP_PARENT}/{name}"',
        f'      else rmdir -- "$m/{CGROUP_PARENT}/{name}" 2>/dev/null; fi',
        "    fi",
        "  fi",
        "fi",
    ]


@dataclass(frozen=True)
class Started:
    """What launch_script printed: the server `pid`, its wrapper's process group = session `pgid`, and the
    `unit` the launch runs in with its `manager`: a systemd scope (`system` or `user`), or the bot's own cgroup v2
    directory (`cgroup`); both None when the launch runs in no cgroup of its own."""

    pid: int
    pgid: int
    unit: str | None = None
    manager: str | None = None


def _systemd_detect(unit: str) -> list[str]:
    """Shell lines that set `sd` to a `systemd-run ... --scope` prefix when the host's systemd can hold the
    launch in a transient scope: the system manager for root, the user's own manager only when lingering is
    on (otherwise the manager, and every unit in it, stops with the user's last login session). A trial
    scope (`true`) must start first, each call within 5 s; anything else leaves `sd` empty: the launch runs
    as without systemd."""
    name = unit.removesuffix(".scope")
    return [
        "sd=; mgr=; sdx=",
        # a wedged systemd or D-Bus answers after 25 s: give each call 5 s, then launch without a scope
        "if command -v systemd-run >/dev/null 2>&1 && command -v systemctl >/dev/null 2>&1 && "
        "command -v timeout >/dev/null 2>&1; then",
        '  if [ "$(id -u)" = 0 ]; then',
        "    if timeout -k 1 5 systemctl show-environment >/dev/null 2>&1; then mgr=system; sdx=systemd-run; fi",
        "  else",
        '    rtd="${XDG_RUNTIME_DIR:-/run/user/$(id -u)}"',
        '    case "$rtd" in *[!A-Za-z0-9/_.-]*) rtd= ;; esac',
        '    linger=$(timeout -k 1 5 loginctl show-user "$(id -u)" -p Linger --value 2>/dev/null)',
        '    if [ -n "$rtd" ] && [ "$linger" = yes ] &&'
        ' timeout -k 1 5 env XDG_RUNTIME_DIR="$rtd" systemctl --user show-environment >/dev/null 2>&1; then',
        '      mgr=user; sdx="env XDG_RUNTIME_DIR=$rtd systemd-run --user"',
        "    fi",
        "  fi",
        '  if [ -n "$mgr" ] && timeout -k 1 5 $sdx --scope --quiet --collect true >/dev/null 2>&1; then',
        f'    sd="$sdx --scope --quiet --collect --unit={name} --"',
        "  fi",
        "fi",
    ]


#: Shell builtins a command cannot start with: the launch `exec`s the command as the server process.
_NOT_EXECUTABLE = MappingProxyType({"cd": "use the variant's workdir", "export": "use the variant's env", "source": "",
                   ".": "", "ulimit": "", "umask": "", "set": "", "eval": "", "exec": "drop it: gpubot execs it"})


def exec_problems(command: str) -> list[str]:
    """Why a command (a variant's template, or the command rendered from it) cannot run as `exec COMMAND`,
    the server process whose PID is recorded (pure): more than one line (YAML `|` keeps line breaks; `>-`
    folds them), a trailing `&` (the server would leave its wrapper at once), an environment assignment
    first (`FOO=1 cmd`: use the variant's env) or a shell builtin first (`cd`: use workdir; `ulimit`: a
    wrapper script). A template's first word may still come from a `{{ param }}` or `{% if %}`: the
    rendered command is checked again at launch. Returns messages; empty when it can be exec'ed."""
    text = command.strip()
    problems = []
    if "\n" in text or "\r" in text:
        problems.append("spans more than one line: only the first would run (write it on one line, or fold it "
                        "with YAML `>-`)")
    if re.search(r"(?<![&>|])&\s*$", text):
        problems.append("ends with `&`: the server would be left in the background and its launch would end at "
                        "once; gpubot runs it detached already")
    m = re.match(r"([^\s{]+)", text)
    word = m.group(1) if m else ""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word):
        problems.append(f"starts with the environment assignment {word.split('=')[0]}=...: the command is "
                        "exec'ed as the server process, so put the variable under the variant's env")
    elif word in _NOT_EXECUTABLE:
        fix = _NOT_EXECUTABLE[word] or "put it in a wrapper script that ends with `exec` of the server"
        problems.append(f"starts with the shell builtin {word!r}, which cannot be exec'ed as the server "
                        f"process: {fix}")
    return problems


def launch_script(r: RenderedLaunch, *, systemd: bool = False, cgroup: bool = False) -> str:
    """The POSIX sh script that starts `r` detached in its own session and prints `PGID=<n>` and `PID=<n>`
    (and `UNIT=<scope> MANAGER=<system|user>` in a systemd scope, `UNIT=<name> MANAGER=cgroup` in a cgroup of its
    own); see parse_launch_output.

    The session leader (PGID = SID) is a small wrapper shell that runs the server in its foreground and, when it
    ends, writes its exit status into the launch's exit file (`<log>.exit`, opened by this script and never by the
    server, which cannot fake it by printing a line) and appends `EXIT_LINE_FORMAT` to the log for people; the
    server itself (PID, the wrapper's child) is `exec`ed by an inner shell that first writes its PID to a temporary
    file the script reads back. With `systemd` (and a tag in `r.env`) the wrapper starts through `systemd-run
    --scope` (which execs it, so its PID stays the PGID) in the transient scope `gpubot-<tag>.scope` when the host's
    systemd allows (see `_systemd_detect`), so every process the launch forks stays in that cgroup whatever it does
    to its session or environment. Without a scope (and with `cgroup`), the launch runs in a cgroup v2 directory of
    its own when the host allows (see `_cgroup_detect`): the wrapper moves itself in before it starts the server,
    and when the server ends it leaves and removes the directory (which stays, for /kill, while leftovers of the
    launch run in it). Exits 3 when the working directory or the log directory cannot be used (and says why).
    """
    lines = ["export LC_ALL=C"]
    for k, val in r.env.items():
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            lines.append(f"export {k}={shlex.quote(val)}")
    lines += _open_log_lines(r)
    if r.workdir:
        lines.append(f"cd -- {shlex.quote(r.workdir)} || {{ echo 'cannot cd to the workdir'; exit 3; }}")
    # the server gets neither the log's extra descriptor nor the exit file's (fd 5): only its wrapper writes there
    inner = 'exec 2>&3 3>&- 5>&-; echo "$$" > "$1"; shift; exec ' + r.command  # the command sees no $1
    # the wrapper's own stderr goes nowhere (sh reports a child killed by a signal with a bare `Killed`, which
    # is no line of the server's); the server's stderr is the log (fd 3)
    # the exit line starts a line of its own even when the server's last line had no newline (fd 3 is the
    # log, opened once by this script: never its path again)
    # $2: the launch's own cgroup (empty: none); the wrapper moves itself in before the server starts, and out
    # (then removes it, which fails while leftovers still run there) once the status is written
    wrapper = (f"{_WRAPPER_FIRST_LINE}\n"
               'if [ -n "$2" ]; then echo 0 > "$2/cgroup.procs"; fi\n'
               f"sh -c {shlex.quote(inner)} gpubot-server \"$1\"\nrc=$?\n"
               '{ echo "$rc" >&5; exec 5>&-; } 2>/dev/null\n'
               'if [ -s /proc/self/fd/3 ] && [ "$(tail -c 1 /proc/self/fd/3 | wc -l)" -eq 0 ]; then echo; fi\n'
               f"echo \"{EXIT_LINE_FORMAT.format(rc='$rc')}\"\n"
               'if [ -n "$2" ]; then echo 0 > "${2%/*}/cgroup.procs"; rmdir -- "$2"; fi\n'
               "exit $rc")
    tag = r.env.get(LAUNCH_ENV, "")
    unit = scope_unit(tag) if systemd else None
    lines += _systemd_detect(unit) if unit else ["sd=; mgr="]
    cg_name = cgroup_name(tag) if cgroup else None
    lines += _cgroup_detect(cg_name) if cg_name else ["cg="]
    lines += [
        'pf=$(mktemp "${TMPDIR:-/tmp}/gpubot-pid.XXXXXX") || { echo \'cannot create a temporary file\'; exit 3; }',
        # setsid in a non-interactive shell's background job: not a group leader, so no extra fork and
        # $! is the wrapper's PID = PGID = SID. The wait for the PID file ends early when the start is
        # already gone (the shell reaps its background child while it waits, so kill -0 tells).
        "start() {",
        f"  setsid nohup $1 sh -c {shlex.quote(wrapper)} gpubot-launch \"$pf\" \"$cg\" >&4 2>&4 < /dev/null &",
        "  pg=$!; i=0",
        f'  while [ ! -s "$pf" ] && [ $i -lt {_PID_WAIT_STEPS} ]; do',
        '    kill -0 "$pg" 2>/dev/null || break',
        "    sleep 0.05 2>/dev/null || sleep 1; i=$((i + 1))",
        "  done",
        "}",
        'start "$sd"',
        # a scope that started for `true` but not for the server (a unit name taken, a policy): without a
        # scope, but only once the first start is gone: a slow one may still start its server
        'if [ -n "$sd" ] && [ ! -s "$pf" ] && ! kill -0 "$pg" 2>/dev/null; then sd=; start ""; fi',
        'echo "PGID=$pg"',
        *([f'if [ -n "$sd" ]; then echo "UNIT={unit}"; echo "MANAGER=$mgr"; fi'] if unit else []),
        *([f'if [ -z "$sd" ] && [ -n "$cg" ]; then echo "UNIT={cg_name}"; echo "MANAGER=cgroup"; fi']
          if cg_name else []),
        'echo "PID=$(cat -- "$pf" 2>/dev/null)"; rm -f -- "$pf"',
        "exec 4>&- 5>&-",
    ]
    return "\n".join(lines) + "\n"


def _open_log_lines(r: RenderedLaunch) -> list[str]:
    """Shell lines that create the launch's log exclusively as fd 4, race-free: the deepest existing part of
    the log directory's path is resolved and checked first (inside or above `r.log_dirs`, the log's own
    directory when none), so `mkdir -p` never follows a symlink out; the directory is then made, entered
    with `cd -P` and its real path checked under `r.log_dirs`; an existing name or symlink is refused, then
    the name is created with noclobber (`set -C`) and the open file checked to be a regular file at that
    path (`/proc/self/fd/4`); the exit file beside it (`<log>.exit`) likewise as fd 5 when it can be. Nothing outside
    the directories is ever written. Exits 3 with the reason. The
    script's working directory is restored afterwards."""
    d, n = os.path.split(r.log_path)
    d = d or "/"
    dirs = [x.rstrip("/") or "/" for x in (r.log_dirs or [d])]
    allowed = " | ".join("/*" if x == "/" else f"{shlex.quote(x)} | {shlex.quote(x)}/*" for x in dirs)
    qd, qn, qx = shlex.quote(d), shlex.quote("./" + n), shlex.quote(f"./{n}{EXIT_FILE_SUFFIX}")
    # the directories above an allowed one (where `mkdir -p` may start creating it)
    parents = sorted({str(p) for x in dirs if x != "/" for p in PurePosixPath(x).parents})
    above = " | ".join([allowed, *map(shlex.quote, parents)])
    exists = shlex.quote(f"the log file {r.log_path} already exists (or is a symbolic link, or cannot be "
                         "created): refusing to overwrite it")
    outside = ('echo "the log directory resolves outside the allowed log directories: refusing to write there"; '
               "exit 3")
    return [
        'wd0=$(pwd)',
        # before anything is created: the deepest part of the path that exists must resolve inside (or above)
        # the allowed directories, so `mkdir -p` never follows a symlink out of them
        f't={qd}; while [ ! -d "$t" ]; do t=$(dirname -- "$t"); done',
        'cd -P -- "$t" || { echo \'cannot enter the log directory\'; exit 3; }',
        f'case "$(pwd -P)" in {above}) ;; *) {outside} ;; esac',
        'cd -- "$wd0" 2>/dev/null || cd /',
        f"mkdir -p -- {qd} || {{ echo 'cannot create the log directory'; exit 3; }}",
        f"cd -P -- {qd} || {{ echo 'cannot enter the log directory'; exit 3; }}",
        f'case "$(pwd -P)" in {allowed}) ;; *) {outside} ;; esac',
        # noclobber refuses an existing regular file; a symlink to a device or FIFO it would open: refused here
        f"if [ -e {qn} ] || [ -L {qn} ]; then echo {exists}; exit 3; fi",
        "set -C",
        f"if ! {{ command exec 4> {qn}; }} 2>/dev/null; then echo {exists}; exit 3; fi",
        f'if [ ! -f /proc/self/fd/4 ] || [ "$(readlink /proc/self/fd/4)" != "$(pwd -P)/{n}" ]; then '
        f"exec 4>&-; echo {exists}; exit 3; fi" if "'" not in n and '"' not in n and "$" not in n and "`" not in n
        and "\\" not in n else f"if [ ! -f /proc/self/fd/4 ]; then exec 4>&-; echo {exists}; exit 3; fi",
        # the exit file (fd 5), best effort: a launch without one is judged by its log's exit line
        f"if [ ! -e {qx} ] && [ ! -L {qx} ]; then {{ command exec 5> {qx}; }} 2>/dev/null; fi",
        "set +C",
        'cd -- "$wd0" 2>/dev/null || cd /',
    ]


def is_launch_wrapper(args: str) -> bool:
    """Whether a `ps` command line (args) is a launch's wrapper shell (see launch_script)."""
    return args.startswith(_WRAPPER_ARGS)


def parse_launch_output(text: str) -> Started | None:
    """What launch_script printed (`PGID=1233`, `PID=1234`, optionally `UNIT=gpubot-<tag>.scope` with
    `MANAGER=system|user`, or `UNIT=gpubot-<tag>.launch` with `MANAGER=cgroup`), or None without a PGID. A PID that
    never showed (the server's shell had not started in 10 s) is the PGID; a UNIT without a matching MANAGER is
    ignored."""
    g = re.search(r"^PGID=(\d+)$", text, re.M)
    if not g:
        return None
    m = re.search(r"^PID=(\d+)$", text, re.M)
    u = re.search(rf"^UNIT=({_UNIT_RE.pattern})$", text, re.M)
    mgr = re.search(r"^MANAGER=(system|user|cgroup)$", text, re.M)
    unit, manager = (u.group(1), mgr.group(1)) if u and mgr else (None, None)
    if unit is not None and unit.endswith(CGROUP_SUFFIX) != (manager == "cgroup"):
        unit, manager = None, None
    return Started(int(m.group(1)) if m else int(g.group(1)), int(g.group(1)), unit, manager)


def log_exit_status(log: LogInfo | None) -> int | None:
    """The server's exit status as one read of a launch's log shows it: its exit file's when the probe looked for
    one (a launch's own log: the wrapper writes it alone; missing or replaced, no status is known, whatever exit line
    the log shows, since the server can print one); else the wrapper's line in the tail (exit_status)."""
    if log is None:
        return None
    if log.exit_file or log.exit_checked:
        return log.exit_status if log.exit_file else None
    return exit_status(log.tail)


def exit_status(lines: Sequence[str]) -> int | None:
    """The server's exit status from the wrapper's last `EXIT_LINE_FORMAT` line in a log tail (0..255; 128+N
    means killed by signal N), or None when the tail has no such line (still running, the wrapper was
    killed too, or the host went down)."""
    for line in reversed(lines):
        m = EXIT_LINE_RE.match(line.strip())
        if m and int(m.group(1)) <= 255:  # a shell's status is a byte
            return int(m.group(1))
    return None


def signal_script(pids: list[int], pgid: int | None, sig: str, *, unit: str | None = None,
                  manager: str | None = None, starts: Mapping[int, int] | None = None) -> str:
    """Send `sig` (TERM, KILL, INT or QUIT) to the process group `pgid`, every PID in `pids`, then every
    process of the launch's `unit`: a systemd scope through its `manager` (`system` or `user`: the whole cgroup;
    at most 5 s, so a wedged systemd cannot stop the plain kills), or with manager `cgroup` the bot's own cgroup
    v2 directory (SIGKILL through its `cgroup.kill` where the kernel has it, else to each PID of its
    `cgroup.procs`). A PID with a start time in `starts` (clock ticks after boot, field 22 of /proc/PID/stat) is
    signalled only while /proc/PID/stat still says that start time: a PID reused by a stranger since the probe
    is left alone. Prints nothing; failures (a scope already gone) are ignored. Raises ValueError for another
    signal, unit name or manager."""
    if sig not in ("TERM", "KILL", "INT", "QUIT"):
        raise ValueError(sig)
    parts = []
    tail = None
    if unit:
        if manager not in UNIT_MANAGERS or not _UNIT_RE.fullmatch(unit) or \
                unit.endswith(CGROUP_SUFFIX) != (manager == "cgroup"):
            raise ValueError(unit)
        if manager == "cgroup":
            cg = f'"$m/{CGROUP_PARENT}/{unit}"'
            via_kill = f"[ -f {cg}/cgroup.kill ] && echo 1 > {cg}/cgroup.kill || " if sig == "KILL" else ""
            tail = (f'{_CGROUP_MOUNT}; if [ -n "$m" ] && [ -d {cg} ]; then {{ {via_kill}'
                    f"kill -{sig} $(cat {cg}/cgroup.procs) ; }} 2>/dev/null; fi")
        else:
            ctl = 'env XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/run/user/$(id -u)}" systemctl --user' \
                if manager == "user" else "systemctl"
            # after the plain kills, bounded: a wedged systemd must not keep them from running
            tail = f"timeout -k 1 5 {ctl} --no-ask-password kill --signal=SIG{sig} -- {unit} >/dev/null 2>&1"
    starts = starts or {}
    plain = sorted({int(p) for p in pids if p not in starts})
    checked = sorted({int(p) for p in pids if p in starts})
    if checked or (pgid and pgid in starts):
        # field 22 of /proc/PID/stat: what follows the last `) ` (the command name may hold any character) is field 3
        parts.append('st() { s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; set -- $s; '
                     'echo "${20}"; }')
    if pgid:
        # `kill -SIG -PGID` (no `--`: dash's kill takes `--` for a number and signals nothing). With the group
        # leader's start time known, the group is signalled only while its leader is gone (Linux reuses no PID
        # that still names a process group) or is still that process: a stranger that took the PID as a group
        # of its own between two rounds is left alone
        g = int(pgid)
        guard = f'{{ [ ! -e /proc/{g} ] || [ "$(st {g})" = {int(starts[pgid])} ]; }} && ' if pgid in starts else ""
        parts.append(f"{guard}kill -{sig} -{g} 2>/dev/null")
    if plain:
        parts.append(f"kill -{sig} {' '.join(map(str, plain))} 2>/dev/null")
    if checked:
        parts += [f'[ "$(st {p})" = {int(starts[p])} ] && kill -{sig} {p} 2>/dev/null' for p in checked]
    if tail:
        parts.append(tail)
    parts.append("exit 0")
    return "; ".join(parts) + "\n"


def unit_cleanup_script(unit: str | None, manager: str | None) -> str | None:
    """A script that removes the launch's own cgroup v2 directory once nothing runs in it (`rmdir` fails while
    anything does; a systemd scope is collected by systemd itself), or None when there is nothing to remove."""
    if manager != "cgroup" or not unit or not _UNIT_RE.fullmatch(unit) or not unit.endswith(CGROUP_SUFFIX):
        return None
    return f'{_CGROUP_MOUNT}; [ -n "$m" ] && rmdir -- "$m/{CGROUP_PARENT}/{unit}" 2>/dev/null; exit 0\n'


# ---------------------------------------------------------------------------------------------------------
# Who owns which process, and pre-launch checks


@dataclass
class Holder:
    """A process holding GPU memory, attributed: `owner` is a launch name (`base#12`), `orphan of base#12`
    (the launch's launcher is gone but this process lives), or `foreign` (no launch of ours); `label` adds who:
    the Slack user who launched it, or the foreign process's user on the host."""

    pid: int
    gpu_index: int | None
    mib: float | None
    command: str
    state: str
    owner: str
    launch_id: int | None = None
    #: The process's user on the host (ps USER), None when its row was not read.
    user: str | None = None
    #: The Slack user ID that launched its launch (None for a foreign holder).
    launched_by: str | None = None
    #: Its launch's launcher is gone or the launch has ended (`owner` is `orphan of NAME`).
    orphan: bool = False

    @property
    def label(self) -> str:
        """Who holds it, for tables: `base#12 by U0ALICE`, `orphan of base#12 by U0ALICE`, `foreign · bob` (its
        user on the host), or `foreign`."""
        if self.launch_id is None:
            return f"foreign · {self.user}" if self.user else "foreign"
        return f"{self.owner} by {self.launched_by}" if self.launched_by else self.owner


def holder_labels(holders: Sequence[Holder]) -> dict[int, str]:
    """pid -> Holder.label of each holder (what GPU tables show beside a holder)."""
    return {h.pid: h.label for h in holders}


def launch_processes(procs: list[ProcessInfo], *, tagged: list[int] | tuple[int, ...] | set[int],
                     pgid: int | None = None, sid: int | None = None,
                     ended_by: float | None = None) -> list[ProcessInfo]:
    """Live processes of one launch (pure): those carrying its tag, plus the members of its session or
    process group when that session/group is confirmed ours (see `_confirmed`; `ended_by`: for a launch
    that has ended, the latest start time, in seconds before the probe, that a member of its leaderless
    session or group may have), plus descendants of all of those. Zombies are left out: they hold nothing
    and cannot be killed."""
    tagged = set(tagged)
    sid_ok = _confirmed(procs, tagged, "sid", sid, ended_by=ended_by)
    pgid_ok = _confirmed(procs, tagged, "pgid", pgid, ended_by=ended_by)
    chosen = {p.pid for p in procs
              if p.pid in tagged or (sid_ok and p.sid == sid) or (pgid_ok and p.pgid == pgid)}
    grew = True
    while grew:
        grew = False
        for p in procs:
            if p.pid not in chosen and p.ppid in chosen:
                chosen.add(p.pid)
                grew = True
    return [p for p in procs if p.pid in chosen and p.state != "Z"]


def _confirmed(procs: list[ProcessInfo], tagged: set[int], attr: str, value: int | None, *,
               ended_by: float | None = None) -> bool:
    """Whether the session (`attr="sid"`) or process group (`"pgid"`) `value` is the launch's own: a member
    carries the launch's tag, or its leader is gone. Linux never hands out a PID that is still some live
    process's session or group id, so members of a leaderless session/group are what is left of ours, as
    long as the group never emptied. Once the launch has ended it may have, and its number may have gone to
    a stranger who started a session of its own later: then some member must be older than `ended_by`
    seconds (its ps `etimes`; the time since the launch ended), else only the tag counts."""
    if not value:
        return False
    members = [p for p in procs if getattr(p, attr) == value and p.state != "Z"]
    if any(p.pid in tagged for p in members):
        return True
    leader_alive = any(p.pid == value and p.state != "Z" for p in procs)
    if not members or leader_alive:
        return False
    return ended_by is None or any(p.elapsed_s is not None and p.elapsed_s >= ended_by for p in members)


def group_confirmed(procs: list[ProcessInfo], tagged: list[int] | set[int], pgid: int | None, *,
                    ended_by: float | None = None) -> bool:
    """True when the process group `pgid` is confirmed the launch's own (see `_confirmed` for `ended_by`),
    so signalling the whole group cannot hit a stranger that reused the number."""
    return _confirmed(procs, set(tagged), "pgid", pgid, ended_by=ended_by)


def attribute_holders(gpu: GpuSection, procs: list[ProcessInfo], launches: Sequence[Launch],
                      tags: dict[int, str]) -> list[Holder]:
    """Label every GPU-holding process (pure): by the launch tag in its environment (`tags`: PID -> tag),
    `base#12` while the launch is live and its launcher runs, `orphan of base#12` when the launcher is gone
    or the launch was ended, `foreign` without a tag of ours. `launches` are store Launch objects."""
    by_pid = {p.pid: p for p in procs}
    by_tag = {la.tag: la for la in launches if getattr(la, "tag", None)}
    out = []
    for gp in gpu.processes:
        row = by_pid.get(gp.pid)
        owner, lid, orphan = "foreign", None, False
        tag = tags.get(gp.pid, "")
        la = by_tag.get(tag) or (by_tag.get(base_tag(tag)) if tag else None)  # a rank's tag: its launch's
        if la is not None:
            leader = by_pid.get(la.pid)
            leader_alive = leader is not None and leader.state != "Z"  # a zombie launcher is dead
            if la.spans_nodes:  # its ranks on other nodes have no launcher here: live is live
                leader_alive = True
            lid = la.id
            orphan = not (la.live and leader_alive)
            owner = f"orphan of {la.name}" if orphan else la.name
        out.append(Holder(pid=gp.pid, gpu_index=gp.gpu_index, mib=gp.used_memory_mib,
                          command=(row.args if row else gp.process_name or "?"), state=row.stat if row else "?",
                          owner=owner, launch_id=lid, user=row.user if row else None, orphan=orphan,
                          launched_by=getattr(la, "created_by", None) if la is not None else None))
    return out


@dataclass
class PreflightResult:
    """Outcome of the pre-launch checks: `problems` (each says what holds what and what to do) and
    human-readable `passed` lines."""

    problems: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing blocks the launch."""
        return not self.problems


def prelaunch_checks(snap: Snapshot, r: RenderedLaunch, holders: list[Holder], *, live_same_variant: list[Launch],
                     other_live: Sequence[Launch] = (), gpu_free_mib: float = DEFAULT_GPU_FREE_MIB,
                     shm_free_mib: float | None = None, min_shm_free_mib: float = 1024.0) -> PreflightResult:
    """Decide whether `r` may start on the host seen in `snap` (pure).

    Checks: no live launch of the same variant; no other live launch of ours on the same GPUs (a launch
    that names no GPUs may use all of them) or port, even before its memory shows; the port is not
    listening; each of the variant's GPUs (all GPUs when it names none) uses less than `gpu_free_mib` MiB;
    /dev/shm has at least `min_shm_free_mib` MiB free (when measured). Refusals name the holders (pid,
    command, GiB, launch or foreign) and the command that frees them.
    """
    res = PreflightResult()
    for la in live_same_variant:
        res.problems.append(f"{la.name} of {r.variant} is still live on {r.host} (pid {la.pid}); "
                            f"`{slash('kill', la.id)}` or `{slash('relaunch', la.id)}` first")
    for la in other_live:
        shared = ",".join(map(str, sorted(set(la.gpus) & set(r.gpus)))) if la.gpus and r.gpus else "all"
        if shared:
            gpus = "GPU" if shared.isdigit() else "GPUs"  # one index, or several, or all
            res.problems.append(f"{gpus} {shared} {'belongs' if gpus == 'GPU' else 'belong'} to {la.name} "
                                f"({la.state}); `{slash('kill', la.id)}` first")
        if la.port and la.port == r.port:
            res.problems.append(f"port {la.port} belongs to {la.name} ({la.state}); `{slash('kill', la.id)}` first")
    if r.port is not None:
        if snap.port_listening:
            res.problems.append(f"port {r.port} is already listening on {r.host}; find its owner with "
                                f"`{slash('probe', r.host, f'port={r.port}')}`")
        elif snap.port_listening is False:
            res.passed.append(f"port {r.port} free")
    if snap.gpu.ok:
        wanted = r.gpus or [g.index for g in snap.gpu.gpus]
        have = sorted(g.index for g in snap.gpu.gpus)
        missing = [i for i in wanted if i not in have]
        if missing and have:  # a typo in `gpus:`, or a host with fewer GPUs than the variant was written for
            res.problems.append(f"{'GPU' if len(missing) == 1 else 'GPUs'} {','.join(map(str, missing))} "
                                f"{'does' if len(missing) == 1 else 'do'} not exist on {r.host} (it has GPU "
                                f"{','.join(map(str, have))}); fix the variant's `gpus:`")
        for g in snap.gpu.gpus:
            if g.index not in wanted or g.memory_used_mib is None:
                continue
            if g.memory_used_mib >= gpu_free_mib:
                hs = [h for h in holders if h.gpu_index == g.index]
                who = "; ".join(f"pid {h.pid} {short(h.command)} {fmt_gib(h.mib)} GiB ({h.owner})" for h in hs) \
                    or "no process listed (memory held by the driver or another container)"
                fix = _kill_hint(hs)
                res.problems.append(f"GPU {g.index} already uses {g.memory_used_mib / 1024:.1f} GiB: {who}{fix}")
        if not any(p.startswith("GPU") for p in res.problems):
            res.passed.append(f"GPUs {','.join(map(str, wanted))} free (< {gpu_free_mib / 1024:.1f} GiB used)")
    elif r.gpus:
        res.problems.append(f"cannot verify that GPUs {','.join(map(str, r.gpus))} are free: {snap.gpu.error}")
    else:
        res.passed.append(f"GPU check skipped (the variant names no GPUs): {snap.gpu.error}")
    if shm_free_mib is not None:
        if shm_free_mib < min_shm_free_mib:
            res.problems.append(f"/dev/shm has only {shm_free_mib:.0f} MiB free (needs {min_shm_free_mib:.0f}); "
                                "stale NCCL/SGLang segments are a common cause: look for nccl-* files")
        else:
            res.passed.append(f"/dev/shm {shm_free_mib / 1024:.1f} GiB free")
    return res


def _kill_hint(holders: list[Holder]) -> str:
    ids = sorted({h.launch_id for h in holders if h.launch_id is not None})
    foreign = [h.pid for h in holders if h.launch_id is None]
    hints = [f"`{slash('kill', i)}`" for i in ids] + [f"`{slash('kill', f'pid={p}')}`" for p in foreign]
    return f". Free it with {' and '.join(hints)}" if hints else ""


def short(command: str, width: int = 60) -> str:
    """A command line with its program shortened to the base name, cut to `width` characters."""
    prog, _, rest = command.partition(" ")
    s = (os.path.basename(prog) + " " + rest).strip() if "/" in prog else command
    return s if len(s) <= width else s[: width - 1] + "…"


def fmt_gib(mib: float | None) -> str:
    """MiB -> GiB with one decimal, '?' when unknown."""
    return "?" if mib is None else f"{mib / 1024:.1f}"


def gpu_memory(gpu: GpuSection, indexes: list[int] | None) -> float | None:
    """Total used MiB on the given GPUs (all when None/empty); None when unknown."""
    if not gpu.ok:
        return None
    vals = [g.memory_used_mib for g in gpu.gpus if (not indexes or g.index in indexes)]
    if any(v is None for v in vals):
        return None
    return float(sum(v for v in vals if v is not None))


# ---------------------------------------------------------------------------------------------------------
# Outcomes of launches and kills, and how a kill ends a launch


@dataclass
class LaunchOutcome:
    """Result of a launch: `launch` (None when refused before recording), the pre-launch `checks`, `error`
    when starting failed, `exited_early` (its last log lines) when it was gone at the first check, `placement`
    where a placed launch went and why."""

    launch: Launch | None
    checks: PreflightResult = field(default_factory=PreflightResult)
    error: str | None = None
    exited_early: list[str] = field(default_factory=list)
    host: str | None = None
    #: Where a placed launch went and why (bot.core.placement.PlacementNote.describe), None for a fixed host.
    placement: str | None = None

    @property
    def ok(self) -> bool:
        """True when the server process was started and still ran at the first check."""
        return self.launch is not None and self.error is None and self.checks.ok and not self.exited_early


@dataclass
class KillOutcome:
    """Result of a kill: processes signalled, the ones left (with their state), GPU holders left, GPU memory
    before/after (MiB over the launch's GPUs), whether the memory was released, whether SIGKILL was needed,
    `seconds` it took, and `error` / `gpu_error` when the host or its GPUs could not be read; `cancelled_job`: the
    Slurm job the kill cancelled and Slurm then said ended (None for a launch without a job, or one still active);
    `partial`: with `error`, part of the launch was stopped (a rank's host reached and its processes signalled, or
    its Slurm job's scancel accepted) before another part could not be."""

    target: str
    signalled: list[ProcessInfo] = field(default_factory=list)
    remaining: list[ProcessInfo] = field(default_factory=list)
    still_holding: list[Holder] = field(default_factory=list)
    mem_before_mib: float | None = None
    mem_after_mib: float | None = None
    released: bool = False
    used_sigkill: bool = False
    error: str | None = None
    nothing_to_kill: bool = False
    seconds: float = 0.0
    gpu_error: str | None = None
    host: str | None = None
    cancelled_job: str | None = None
    partial: bool = False

    @property
    def memory_left(self) -> bool:
        """True when the kill ended with GPU memory still held on the launch's GPUs (the release was waited for
        and did not come), whoever holds it: never called simply "killed"."""
        return not (self.error or self.nothing_to_kill or self.released or self.gpu_error) and (
            bool(self.still_holding) or self.mem_after_mib is not None)

    @property
    def needs_reboot(self) -> bool:
        """True when a remaining process is in uninterruptible sleep (D) or still running in the driver."""
        return any(p.state in ("D", "R") for p in self.remaining)

    @property
    def clean(self) -> bool:
        """True when nothing is left: no error, no surviving process, no GPU memory still held."""
        return not self.error and not self.remaining and not self.still_holding

    def describe(self) -> str:
        """One line for the audit trail and the root message."""
        if self.error and self.partial:
            stopped = f"Slurm job {self.cancelled_job} cancelled" if self.cancelled_job else \
                f"{counted(len(self.signalled), 'process')} stopped" if self.signalled else "part of it stopped"
            return f"kill incomplete: {stopped}, but {self.error}"
        if self.error:
            return f"kill failed: {self.error}"
        if self.nothing_to_kill:
            return "no process was left"
        mem = ""
        if self.mem_before_mib is not None and self.mem_after_mib is not None:
            mem = f"; GPU memory {self.mem_before_mib / 1024:.1f} -> {self.mem_after_mib / 1024:.1f} GiB"
        if self.remaining or self.still_holding:
            return (f"{counted(len(self.remaining), 'process')} survived, {len(self.still_holding)} still "
                    f"{'holds' if len(self.still_holding) == 1 else 'hold'} GPU memory{mem}: not all memory released")
        if self.memory_left:
            return f"{counted(len(self.signalled), 'process')} stopped{mem}: not all memory released"
        sigkill = " (SIGKILL needed)" if self.used_sigkill else ""
        return f"{counted(len(self.signalled), 'process')} stopped{sigkill}{mem}"


@dataclass
class KillPreview:
    """What a kill would stop, shown before a typed `/kill` is confirmed: the `host`, the launch's
    process group `pgid` (None for a single pid), the processes (pid, state, command), the GPU indexes
    `gpus` and `gpu_mib` MiB of GPU memory they hold (None when unknown). `error` says why the host
    could not be read (the kill may still be tried); `refusal` (pid kills) why there is nothing to confirm."""

    target: str
    host: str
    launch_id: int | None = None
    pid: int | None = None
    pgid: int | None = None
    processes: list[ProcessInfo] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)
    gpu_mib: float | None = None
    error: str | None = None
    refusal: str | None = None


def kill_end(out: KillOutcome, before: LaunchState, before_detail: str | None) -> tuple[LaunchState, str, str]:
    """How a kill ends a launch that was in state `before` (pure): (new state, state detail, audit result).

    An error before anything was stopped keeps the old state (`error`); an error after part of it was stopped
    (processes signalled, its Slurm job cancelled; a rank's host that could not be reached) -> `kill_failed`
    (`incomplete`): never left running or ready with part of it gone; processes or GPU memory left (named
    holders, or memory on the launch's GPUs that was not released in time) -> `kill_failed` (`incomplete`);
    GPUs unreadable -> `killed` (`unverified`); otherwise `killed` (`released` when the memory was seen
    released). An ended launch (failed, exited) keeps how it ended: with nothing left to kill (a stale
    button, a second kill) as it was (`nothing`), with leftovers stopped cleanly with that said after its
    detail (`failed`, "crashed in serving; its leftovers were stopped: ...")."""
    detail = out.describe()
    if out.error and out.partial and before not in TERMINAL_STATES:
        return LaunchState.KILL_FAILED, detail, "incomplete"
    if out.error:
        return before, detail, "error"
    if out.nothing_to_kill and before in TERMINAL_STATES:
        return before, before_detail or detail, "nothing"
    if out.remaining or out.still_holding or out.memory_left:
        return LaunchState.KILL_FAILED, detail, "incomplete"
    result = "unverified" if out.gpu_error else "released" if out.released else "killed"
    if before in TERMINAL_STATES:  # leftovers of a launch that had ended: how it ended stays its state
        said = (before_detail or before.value).rstrip().rstrip(".;")
        return before, f"{said}; its leftovers were stopped: {detail}", result
    return LaunchState.KILLED, detail, result
