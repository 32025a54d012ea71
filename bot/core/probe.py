"""The one-round-trip probe: build ONE shell script, split its output into sections, assemble a Snapshot.

The script is sent on stdin to `timeout -k 5 BUDGET sh -s` over one SSH session channel. It prints
sections between markers that carry a random nonce, so nothing a log line contains can fake a section:

    @@<nonce> BEGIN <name>
    ...output...
    @@<nonce> END <name> rc=<exit status>

Sections: clock (`date +%s`), hostname (`uname -n`), ps (`ps -eww -o ...`, procps-ng), gpu and gpu_apps
(`nvidia-smi --query-gpu=... / --query-compute-apps=... --format=csv,noheader,nounits`, each under its
own `timeout -k`), log_stat and log_tail (GNU coreutils `stat`, `wc -l`, `tail`), tcp4 and tcp6
(listening rows of /proc/net/tcp and /proc/net/tcp6: many GPU hosts have no `ss`), and health
(`curl -sS -o /dev/null -m T -w '%{http_code} %{time_total}'`).

Everything here is pure; `bot.services.hosts` runs the script through an executor.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Callable, Collection
from dataclasses import dataclass

from bot.core.agent import PROBE_NAME as AGENT_PROBE_NAME
from bot.core.commands import strip_markers
from bot.core.models import LOG_MARK_BYTES, GpuSection, LogCursor, LogInfo, Snapshot
from bot.core.parse import health as health_parse
from bot.core.parse import log as log_parse
from bot.core.parse import nvidia_smi, proc_net
from bot.core.parse import ps as ps_parse
from bot.core.redact import CACHE_ENTRIES, CACHE_MAX_CHARS, Redactor
from bot.core.shell import MAX_PID, is_pid, quote

#: Largest log tail read per probe, bytes (a huge or binary log cannot flood the bot).
LOG_TAIL_BYTES = 262_144
#: Most bytes of a log whose lines one probe counts (at about a gigabyte per second, a few milliseconds); a longer
#: log is counted on from its cursor by the next probes, its count meanwhile "at least N".
LOG_COUNT_BYTES = 8 * 1024 * 1024
#: Bytes read before a `log_since` window's start (bytes): the redactor sees the line that the window starts in,
#: and the line above it (a secret's name there, its value in the window), never the window alone.
LOG_SINCE_CONTEXT_BYTES = 4096
#: Most PIDs a probe of chosen processes (`ps_pids`) names.
MAX_PS_PIDS = 4096
#: Widest command line shown, characters.
MAX_LINE_WIDTH = 400

_SAFE_PATH_RE = re.compile(r"/[^\x00-\x1f\x7f]*")
_HEALTH_PATH_RE = re.compile(r"/[A-Za-z0-9_./-]*")


class ProbeRequestError(ValueError):
    """A probe argument is invalid; str() is a user-facing message."""


@dataclass(frozen=True)
class ProbeRequest:
    """What one probe should collect (what was asked; `HostPolicy` is what the host allows).

    Selectors (`pid`, `pgid`, `sid`, `match`) pick processes in addition to every GPU-holding PID;
    `log_path` is an absolute path on the host; `port` a TCP port 1..65535 whose listening state and
    health endpoint (`health_path`) are checked; `tail_lines` lines of log tail (1..500).
    `tags` reads the GPUBOT_LAUNCH=<tag> entry of every process's environment (one `grep -z` over
    /proc/*/environ) so processes are attributed to launches by a tag no other launch shares;
    `select_tag` adds every process carrying that tag to the selection (a launch's processes, even those
    that left its session); `shm` measures free space in /dev/shm (`df -Pk`).
    `gpu` False skips nvidia-smi (used when GPU readings come from NVML). `own_log` says `log_path` is a
    launch's own log, rendered by the bot from the config (not typed by a user): on a host without
    `log_dirs`, its own directory is allowed. `processes` False skips the process table (a log read);
    `ps_pids` lists the only processes to read (a watched launch's own: `ps -p`, their tags too), instead of
    every process on the host. `log_cursor`: where an earlier reading of this log stopped (bot.core.models
    .LogCursor): lines are counted from there when the file is the same, grown; with `log_since`, the tail is
    what was written after it (at most LOG_TAIL_BYTES) instead of the last `tail_lines` lines. With `select_tag`,
    the start time (/proc/PID/stat) of every tagged process and of each of `stat_pids` (the processes a launch
    remembers) is read too (`Snapshot.start_ticks`), and with `own_log` the launch's exit file (`<log>.exit`).
    `generate_path` (with `port`): a generation check beside the health endpoint, a GET or, with `generate_body`
    (JSON text, at most 8192 bytes), a POST of that body, waiting up to `generate_timeout_s` seconds (1..300); it
    runs beside the other parts, so it adds nothing to a probe whose generation answers at once.
    `gpu_max_age_s`: a reading of the host's GPUs another probe took at most this many seconds ago will do (the
    GPUs are the host's, not the launch's: launches checked on one host share it); 0, a fresh one.
    Immutable: derive variants with `dataclasses.replace`.
    """

    pid: int | None = None
    pgid: int | None = None
    sid: int | None = None
    match: str | None = None
    log_path: str | None = None
    port: int | None = None
    health_path: str | None = "/health"
    tail_lines: int = 20
    gpu: bool = True
    tags: bool = True
    select_tag: str | None = None
    shm: bool = False
    own_log: bool = False
    processes: bool = True
    ps_pids: tuple[int, ...] | None = None
    log_cursor: LogCursor | None = None
    log_since: bool = False
    stat_pids: tuple[int, ...] = ()
    generate_path: str | None = None
    generate_body: str | None = None
    generate_timeout_s: float = 20.0
    gpu_max_age_s: float = 0.0

    def validate(self) -> None:
        """Raise ProbeRequestError when a value is out of range or unsafe to send."""
        for name in ("pid", "pgid", "sid"):
            v = getattr(self, name)
            if v is not None and not is_pid(v):
                raise ProbeRequestError(f"{name} must be a process id between 1 and {MAX_PID}")
        if self.port is not None and not (1 <= self.port <= 65535):
            raise ProbeRequestError("port must be 1..65535")
        if self.match is not None and (not self.match or len(self.match) > 200 or "\x00" in self.match):
            raise ProbeRequestError("match must be 1..200 characters")
        for name in ("match", "log_path", "health_path"):
            v = getattr(self, name)
            if v is not None:
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    raise ProbeRequestError(f"{name.replace('_path', '')} contains characters that are not valid "
                                            "text (unpaired surrogates)") from None
        if self.log_path is not None:
            if len(self.log_path) > 4096 or not _SAFE_PATH_RE.fullmatch(self.log_path):
                raise ProbeRequestError("log must be an absolute path like /data/logs/server.log")
            if "/../" in self.log_path + "/" or "/./" in self.log_path + "/":
                raise ProbeRequestError("log path must not contain . or .. components")
        if self.health_path is not None and not _HEALTH_PATH_RE.fullmatch(self.health_path):
            raise ProbeRequestError("health path must look like /health")
        if self.generate_path is not None and (len(self.generate_path) > 256
                                               or not _HEALTH_PATH_RE.fullmatch(self.generate_path)):
            raise ProbeRequestError("generation path must look like /v1/completions")
        if self.generate_body is not None:
            try:
                ok = len(self.generate_body.encode("utf-8")) <= 8192 and "\x00" not in self.generate_body
            except UnicodeEncodeError:
                ok = False
            if not ok:
                raise ProbeRequestError("generation body must be text of at most 8192 bytes")
        if not 0 <= self.gpu_max_age_s <= 300:
            raise ProbeRequestError("GPU reading age must be 0..300 seconds")
        if not 1 <= self.generate_timeout_s <= 300:
            raise ProbeRequestError("generation timeout must be 1..300 seconds")
        if not 1 <= self.tail_lines <= 500:
            raise ProbeRequestError("tail lines must be 1..500")
        for name in ("ps_pids", "stat_pids"):
            pids = getattr(self, name)
            if pids is not None and (len(pids) > MAX_PS_PIDS or not all(is_pid(p) for p in pids)):
                raise ProbeRequestError(f"{name} must be at most {MAX_PS_PIDS} process ids")
        c = self.log_cursor
        if c is not None and not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 62
                                     for v in (c.dev, c.inode, c.offset, c.lines)):
            raise ProbeRequestError("log cursor values must be non-negative integers")


@dataclass(frozen=True)
class HostPolicy:
    """What a host allows and how its tools are called, from its config entry (bot.services.hosts builds it).

    `log_dirs` are the directories `log=` may read (a log is only read when its path, and its resolved path
    on the host, are inside one of them); `nvidia_smi` the command or path, bounded by
    `nvidia_smi_timeout_s` seconds; `health_timeout_s` seconds for the health endpoint (`curl -m`); `env`
    exported before the probe runs (e.g. PATH).
    """

    log_dirs: tuple[str, ...] = ()
    nvidia_smi: str = "nvidia-smi"
    nvidia_smi_timeout_s: float = 10.0
    health_timeout_s: float = 3.0
    env: tuple[tuple[str, str], ...] = ()

    def allowed_log_dirs(self, req: ProbeRequest) -> list[str]:
        """The directories `req.log_path` must lie in: the host's `log_dirs`; on a host without them, the
        launch's own log directory when `req.own_log`; otherwise none (log reads refused)."""
        if self.log_dirs:
            return list(self.log_dirs)
        if req.own_log and req.log_path:
            return [req.log_path.rsplit("/", 1)[0] or "/"]
        return []

    def check(self, req: ProbeRequest) -> None:
        """Raise ProbeRequestError when `req` asks for something this host does not allow (a log outside its
        log directories, or any log read on a host without them), or a value is invalid."""
        req.validate()
        if req.log_path is None:
            return
        dirs = self.allowed_log_dirs(req)
        if not dirs:
            raise ProbeRequestError(
                "this host allows no log= reads: an admin must list the server log directories under "
                "hosts.<host>.log_dirs in the config"
            )
        if not any(req.log_path.startswith(d.rstrip("/") + "/") for d in dirs):
            raise ProbeRequestError(f"log= must be under this host's log directories: {', '.join(dirs)}")


@dataclass
class Section:
    """One section of probe output: raw `body` bytes, the `rc` its command exited with (None when the
    END marker never came, e.g. the whole script was killed), and `complete`."""

    body: bytes
    rc: int | None
    complete: bool


def new_nonce() -> str:
    """A fresh 16-hex-digit marker nonce."""
    return secrets.token_hex(8)


def _preamble(policy: HostPolicy, nonce: str) -> list[str]:
    """The lines every probe script starts with: the C locale, the host's env, the nonce and the section
    markers' functions `b` (BEGIN) and `e` (END with the exit status)."""
    if not re.fullmatch(r"[0-9a-f]{8,64}", nonce):
        raise ValueError("nonce must be hex")
    return [
        "export LC_ALL=C",
        *(f"export {k}={quote(v)}" for k, v in policy.env if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)),
        f"M={nonce}",
        "b() { printf '\\n@@%s BEGIN %s\\n' \"$M\" \"$1\"; }",
        "e() { printf '\\n@@%s END %s rc=%s\\n' \"$M\" \"$1\" \"$2\"; }",
    ]


def _gpu_jobs(policy: HostPolicy) -> list[str]:
    """The shell functions `j_gpu` and `j_gpu_apps`: the two nvidia-smi CSV queries, each under its own
    `timeout -k`, printing sections `gpu` and `gpu_apps`."""
    nv = quote(policy.nvidia_smi)
    nvt = max(1, round(policy.nvidia_smi_timeout_s))
    gpu_fields = ",".join(nvidia_smi.GPU_QUERY_FIELDS)
    app_fields = ",".join(nvidia_smi.APPS_QUERY_FIELDS)
    return [
        f"j_{sec}() {{ b {sec}; if command -v {nv} >/dev/null 2>&1; then "
        f"timeout -k 2 {nvt} {nv} {query} --format=csv,noheader,nounits 2>&1; r=$?; "
        f"else echo 'nvidia-smi: command not found'; r=127; fi; e {sec} $r; }}"
        for sec, query in (("gpu", f"--query-gpu={gpu_fields}"), ("gpu_apps", f"--query-compute-apps={app_fields}"))
    ]


def _ps_part(req: ProbeRequest) -> str:
    """The body of the shell function `j_ps`: the `ps` section (every process, or only `req.ps_pids`), or nothing
    (`:`) when the request wants no process table."""
    if not req.processes or req.ps_pids == ():
        return ":;"
    select = "-eww" if req.ps_pids is None else "-ww -p " + ",".join(str(int(p)) for p in req.ps_pids)
    return f"b ps; timeout -k 1 10 ps {select} -o {ps_parse.PS_COLUMNS} 2>&1 | cut -c1-4096; e ps $?;"


def _log_part(req: ProbeRequest, log_dirs: list[str]) -> list[str]:
    """The log's sections: `log_stat` (`SIZE MTIME -`, or why it cannot be read), `log_count` (`DEV INODE FROM
    NEWLINES BYTES`: the newlines in the BYTES read from byte FROM, at most LOG_COUNT_BYTES: from the cursor when
    the file is the cursor's and has not shrunk, else from 0), `log_window` (`since OFFSET` when the tail is what
    was written after the cursor, else `tail`) and `log_tail`.

    Race-free: the path is opened ONCE (fd 3) and everything after that reads the open file through /proc/self/fd/3
    (the resolved path of what was opened, its type, size, mtime, identity, lines and tail), so a symlink swapped
    in after the open can never make it read another file. A FIFO, device or directory is refused before the open,
    so the open never blocks on a FIFO without a writer."""
    assert req.log_path is not None
    lp = quote(req.log_path)
    allowed = " | ".join(f"{quote(d.rstrip('/'))}/*" if d.rstrip("/") else "/*" for d in log_dirs)
    fd = "/proc/self/fd/3"
    c = req.log_cursor
    # K=1: the file is the cursor's (same device and inode), has not shrunk below where the cursor stopped, and still
    # holds the cursor's mark right before it (`cmp`: 1 = differs; 2 = no cmp or an error: the inode test stands)
    same = ""
    if c:
        verify = ""
        if c.mark and len(c.mark) <= c.offset:
            octal = "".join(f"\\{b:03o}" for b in c.mark)
            verify = (f"printf '{octal}' | cmp -s -n {len(c.mark)} - {fd} 0 {int(c.offset) - len(c.mark)} "
                      "2>/dev/null; [ $? = 1 ] && F=0 && K=0; ")
        same = (f'if [ "$I" = "{int(c.dev)} {int(c.inode)}" ] && [ "$S" -ge {int(c.offset)} ]; then '
                f"F={int(c.offset)}; K=1; {verify}fi; ")
    since = (f'[ "$K" = 1 ] && [ $((S - F)) -le {LOG_TAIL_BYTES} ] && V=1; ' if req.log_since and c else "")
    return [
        f"L={lp}; OK=0; S=0; F=0; K=0; V=0; I=",
        'b log_stat; if [ ! -e "$L" ]; then echo "no such file"; r=2; '
        'elif [ -d "$L" ]; then echo "is a directory"; r=21; '
        'elif [ ! -f "$L" ]; then echo "not a regular file"; r=22; '
        "elif ! { command exec 3< \"$L\"; } 2>/dev/null; then echo \"permission denied\"; r=13; "
        f'else R=$(readlink {fd} 2>/dev/null); case "$R" in {allowed}) OK=1;; esac; '
        'if [ "$OK" != 1 ]; then echo "resolves outside the allowed log directories"; r=13; '
        f'elif [ ! -f {fd} ]; then OK=0; echo "not a regular file"; r=22; '
        # one `stat` for size, mtime (ns) and identity where it can (GNU coreutils); else one call per field
        f"else X=$(stat -L -c '%s %.9Y %d %i' {fd} 2>/dev/null); "
        'case "$X" in *[!0-9.\\ ]*|"") X=;; esac; set -- $X; '
        f'if [ $# = 4 ]; then S=$1; m=$2; I="$3 $4"; '
        f"else m=$(date -r {fd} +%s.%N 2>/dev/null); case \"$m\" in \"\"|*N*) m=$(stat -L -c %Y {fd});; esac; "
        f"S=$(stat -L -c %s {fd}); I=$(stat -L -c '%d %i' {fd}); fi; printf '%s %s -\\n' \"$S\" \"$m\"; r=0; "
        "fi; fi; e log_stat $r",
        f'if [ "$OK" = 1 ]; then {same}{since}N=$((S - F)); [ "$N" -gt {LOG_COUNT_BYTES} ] && N={LOG_COUNT_BYTES}; '
        # nothing new: no reader at all; else one `dd` reading the N bytes from F where it can (GNU, BusyBox)
        f"b log_count; printf '%s %s ' \"$I\" \"$F\"; DD=0; if [ \"$N\" -le 0 ]; then echo '0 0'; "
        "elif dd if=/dev/null iflag=skip_bytes,count_bytes count=0 2>/dev/null; then DD=1; "
        f'dd if={fd} bs=65536 iflag=skip_bytes,count_bytes skip="$F" count="$N" 2>/dev/null | wc -lc; '
        f'else tail -c +$((F + 1)) {fd} | head -c "$N" | wc -lc; fi; '
        "e log_count $?; "
        # the last bytes counted: the new cursor's mark (none when nothing new was counted)
        f'E=$((F + N)); MB={LOG_MARK_BYTES}; [ "$E" -lt "$MB" ] && MB=$E; b log_mark; '
        f'if [ "$N" -gt 0 ] && [ "$MB" -gt 0 ]; then if [ "$DD" = 1 ]; then dd if={fd} bs={LOG_MARK_BYTES} '
        'iflag=skip_bytes,count_bytes skip=$((E - MB)) count="$MB" 2>/dev/null; '
        f'else tail -c +$((E - MB + 1)) {fd} | head -c "$MB"; fi; fi; e log_mark 0; '
        f'B=0; [ "$F" -gt {LOG_SINCE_CONTEXT_BYTES} ] && B=$((F - {LOG_SINCE_CONTEXT_BYTES})); '
        'b log_window; if [ "$V" = 1 ]; then echo "since $F $B"; else echo tail; fi; e log_window 0; fi',
        *(['b log_exit; if [ "$OK" = 1 ] && [ -f "$R.exit" ] && [ ! -L "$R.exit" ]; then head -c 32 -- "$R.exit"; '
            'r=0; else r=2; fi; e log_exit $r'] if req.own_log else []),
        f'b log_tail; if [ "$OK" != 1 ]; then r=2; elif [ "$V" = 1 ] && [ "$S" -le "$F" ]; then r=0; '
        f'elif [ "$V" = 1 ]; then tail -c +$((B + 1)) {fd} | head -c $((S - B)); r=$?; '
        f"else tail -c {LOG_TAIL_BYTES} {fd} | tail -n {int(req.tail_lines) + 1}; "
        "r=$?; fi; e log_tail $r",
        "exec 3<&-",
    ]


def build_gpu_script(nonce: str, policy: HostPolicy | None = None) -> str:
    """A script of the GPU sections alone (`gpu`, `gpu_apps`: the two nvidia-smi queries at once), for a probe
    whose GPU readings were to come from NVML and did not."""
    policy = policy or HostPolicy()
    return "\n".join([*_preamble(policy, nonce), *_gpu_jobs(policy), *_at_once("j_gpu", ["j_gpu_apps"]),
                      "exit 0"]) + "\n"


def _at_once(foreground: str, jobs: list[str]) -> list[str]:
    """Lines that run the shell function `foreground` while the functions `jobs` run beside it, everything written
    to files of a private temporary directory (`mktemp -d`) and printed by ONE `cat` after `wait` (a few large
    writes: every write of a shell is an SSH packet, and each costs the bot a decryption), the directory removed on
    exit (also when the budget's `timeout` kills the script: it signals the whole process group). Without a usable
    temporary directory they run one after another, straight to stdout."""
    files = " ".join(f'"$D/{i}"' for i in range(len(jobs)))
    return [
        'D=$(mktemp -d "${TMPDIR:-/tmp}/gpubot-probe.XXXXXX" 2>/dev/null) || D=',
        'if [ -n "$D" ] && [ -d "$D" ]; then',
        # cut short (the budget's `timeout` signals the whole group): what every part wrote so far still comes back
        f"trap 'rm -rf \"$D\"' EXIT; trap 'cat \"$D/out\" {files} 2>/dev/null; exit 143' HUP INT TERM",
        *(f'{job} > "$D/{i}" 2>&1 &' for i, job in enumerate(jobs)),
        f'{foreground} > "$D/out" 2>&1; wait',
        f'cat "$D/out" {files} 2>/dev/null',
        "else",
        "; ".join([foreground, *jobs]),
        "fi",
    ]


def _generate_job(req: ProbeRequest) -> str:
    """The shell function `j_gen`: the generation check (section `generate`), a curl GET of `generate_path`, or a
    POST of `generate_body` fed on stdin (`--data-binary @-`: the body is never read as a file name or an option)."""
    url = quote(f"http://127.0.0.1:{int(req.port or 0)}{req.generate_path}")
    gt = max(1, round(req.generate_timeout_s))
    curl = f"curl -sS -o /dev/null -m {gt} -w '%{{http_code}} %{{time_total}}'"
    if req.generate_body is not None:
        curl = (f"printf '%s' {quote(req.generate_body)} | {curl} -X POST -H 'Content-Type: application/json' "
                f"--data-binary @- {url}")
    else:
        curl = f"{curl} {url}"
    return ("j_gen() { b generate; if command -v curl >/dev/null 2>&1; then "
            f"{curl} 2>&1; r=$?; else echo 'curl: command not found'; r=127; fi; e generate $r; }}")


def batchable(req: ProbeRequest) -> bool:
    """Whether `req` may share its round trip with other probes of its host (`build_batch_script`): the cheap look
    of a launch that serves (its own processes, its log since the last check), without a generation check (which
    may take its whole timeout, and would hold the others' answers that long)."""
    return req.ps_pids is not None and req.log_since and req.generate_path is None


def build_batch_script(scripts: list[str], nonce: str) -> str:
    """ONE POSIX sh script running each of `scripts` (each from `build_script`, with a nonce of its own) in a subshell
    of its own, all at once, each one's output to a file of a private temporary directory, printed one after another
    when all ended (also when the budget's `timeout` cut them short), each after a line `@@<nonce> MEMBER <i>` and,
    when it ran to its end, followed by `@@<nonce> DONE` (`split_members`): what one part printed, whole or cut short,
    never runs into the next part's. Without a usable
    temporary directory they run one after another, straight to stdout, each after its line. A script's `exit` ends
    only its subshell. Raises ValueError when `nonce` is not 8..64 lower-case hex digits."""
    if not re.fullmatch(r"[0-9a-f]{8,64}", nonce):
        raise ValueError("nonce must be hex")
    funcs = [f"p{i}() (\n{script.rstrip()}\n)" for i, script in enumerate(scripts)]
    show = "; ".join(f"m {i}; cat \"$D/{i}\" 2>/dev/null" for i in range(len(scripts)))
    return "\n".join([
        *funcs,
        f"m() {{ printf '\\n@@%s MEMBER %s\\n' {nonce} \"$1\"; }}",
        f"d() {{ printf '\\n@@%s DONE\\n' {nonce}; }}",
        'D=$(mktemp -d "${TMPDIR:-/tmp}/gpubot-batch.XXXXXX" 2>/dev/null) || D=',
        'if [ -n "$D" ] && [ -d "$D" ]; then',
        f"trap 'rm -rf \"$D\"' EXIT; trap '{show}; exit 143' HUP INT TERM",
        *(f'{{ p{i}; d; }} > "$D/{i}" 2>&1 &' for i in range(len(scripts))),
        "wait",
        show,
        "else",
        "; ".join(f"m {i}; p{i}; d" for i in range(len(scripts))),
        "fi",
        "exit 0",
    ]) + "\n"


def split_members(output: bytes, nonce: str, count: int) -> list[tuple[bytes, bool]]:
    """The output of each of the `count` parts of a `build_batch_script` run, in order, and whether the part ran to its
    end: what follows its `@@<nonce> MEMBER <i>` line up to the next such line, whole when it ends with `@@<nonce>
    DONE` ((b"", False) for a part whose line never came). Never raises."""
    parts: list[tuple[bytes, bool]] = [(b"", False)] * count
    marks = list(re.finditer(rb"\n@@" + nonce.encode() + rb" MEMBER (\d{1,4})\n", output))
    done = b"\n@@" + nonce.encode() + b" DONE\n"
    for k, m in enumerate(marks):
        i = int(m.group(1))
        if 0 <= i < count:
            body = output[m.end(): marks[k + 1].start() if k + 1 < len(marks) else len(output)]
            whole = body.rstrip(b"\n").endswith(done.rstrip(b"\n"))
            parts[i] = (body[: body.rfind(done)] if whole else body, whole)
    return parts


def build_script(req: ProbeRequest, nonce: str, policy: HostPolicy | None = None) -> str:
    """Return the POSIX sh script for `req` on a host with `policy` (default: `HostPolicy()`). Every value
    from a request is validated and shell-quoted.

    The independent parts run at once (`_at_once`), so a probe takes about as long as its slowest part, not the
    sum: the process table in the foreground, straight to the output (the biggest part), beside the GPU queries,
    the launch tags, /dev/shm, and the listening sockets + health endpoint + log (in that order: a line written
    before the health endpoint answered is in the tail). Raises ProbeRequestError for invalid requests and for
    what the policy does not allow.
    """
    policy = policy or HostPolicy()
    policy.check(req)
    log_dirs = policy.allowed_log_dirs(req)
    lines = [
        *_preamble(policy, nonce),
        # the host's clock first (sub-second: GNU date %N; busybox prints a literal N, then whole seconds), right
        # before ps (start times are clock - etimes), then ps, which can block on a process stuck in the kernel:
        # bounded like every other tool; lines capped
        "j_ps() { b clock; d=$(date +%s.%N); case \"$d\" in *N*) date +%s;; *) echo \"$d\";; esac; e clock $?; "
        f"b hostname; uname -n; e hostname $?; b self; echo $$; e self 0; {_ps_part(req)} }}",
    ]
    jobs: list[str] = []  # the parts that run beside ps, each a shell function printing its own sections
    if req.gpu:
        lines += _gpu_jobs(policy)
        jobs += ["j_gpu", "j_gpu_apps"]
    if req.processes and (req.tags or req.select_tag or req.stat_pids) and req.ps_pids != ():
        # printf is a builtin and xargs batches: no argument list limit on a host with 100k processes
        if req.ps_pids is None:
            envs, cgroups = "/proc/[0-9]*/environ", "/proc/[0-9]*/cgroup"
        else:
            envs = " ".join(f"/proc/{int(p)}/environ" for p in req.ps_pids)
            cgroups = " ".join(f"/proc/{int(p)}/cgroup" for p in req.ps_pids)
        # a newline INSIDE a value becomes a space: a value can never forge a line of its own; membership of a
        # launch's cgroup (a systemd scope, or the bot's own `.launch` directory) names its tag too
        tags = (f"printf '%s\\0' {envs} | xargs -0 grep -a -z -H -s '^GPUBOT_LAUNCH=' | tr '\\n\\000' ' \\n'; "
                f"printf '%s\\0' {cgroups} | xargs -0 grep -E -H -s -o '/gpubot-[A-Za-z0-9_-]*[.](scope|launch)$'")
        if req.select_tag or req.stat_pids:
            # the start time of every tagged process and of the PIDs asked for: what tells a reused PID from ours
            extra = " ".join(str(int(p)) for p in req.stat_pids) or "''"
            lines.append(f"j_tags() {{ b tags; t=$({tags}); printf '%s\\n' \"$t\"; e tags 0; b starts; "
                         f"{{ printf '%s\\n' \"$t\" | sed -n 's#^/proc/\\([0-9][0-9]*\\)/.*#\\1#p'; "
                         f"printf '%s\\n' {extra}; }} | grep -x '[0-9][0-9]*' | sort -u | "
                         "sed 's#.*#/proc/&/stat#' | xargs -r cat 2>/dev/null; e starts 0; }")
        else:
            lines.append(f"j_tags() {{ b tags; {tags}; e tags 0; }}")
        jobs.append("j_tags")
    if req.shm:
        lines.append("j_shm() { b shm; df -Pk /dev/shm 2>&1; e shm $?; }")
        jobs.append("j_shm")
    net: list[str] = []
    if req.port is not None:
        net += [
            "b tcp4; awk 'NR==1 || $4==\"0A\"' /proc/net/tcp 2>&1; e tcp4 $?",
            "b tcp6; awk 'NR==1 || $4==\"0A\"' /proc/net/tcp6 2>&1; e tcp6 $?",
        ]
        if req.health_path is not None:
            url = quote(f"http://127.0.0.1:{int(req.port)}{req.health_path}")
            ht = max(1, round(policy.health_timeout_s))
            net.append(
                "b health; if command -v curl >/dev/null 2>&1; then "
                f"curl -sS -o /dev/null -m {ht} -w '%{{http_code}} %{{time_total}}' {url} 2>&1; r=$?; "
                "else echo 'curl: command not found'; r=127; fi; e health $r"
            )
        if req.generate_path is not None:
            lines.append(_generate_job(req))
            jobs.append("j_gen")
    # the log last: a line written before the health endpoint answered is in the tail (no stale evidence)
    if req.log_path is not None:
        net += _log_part(req, log_dirs)
    if net:
        lines.append("j_net() {\n" + "\n".join(net) + "\n}")
        jobs.append("j_net")
    lines += _at_once("j_ps", jobs)
    lines.append("exit 0")
    return "\n".join(lines) + "\n"


#: The rest of a marker after `@@<nonce> ` (its kind, name and exit status); the optional line break after it is
#: part of the marker.
_MARKER_TAIL_RE = re.compile(rb"(BEGIN|END) ([a-z0-9_]+)(?: rc=(-?\d*))?\n?")


def split_sections(output: bytes, nonce: str) -> dict[str, Section]:
    """Split raw script output into sections keyed by name.

    A section whose END marker is missing (script killed mid-way) is returned with rc None and
    complete False, holding whatever came before the next marker. Never raises. The markers are found with
    `bytes.find` of `@@<nonce> ` (a process table is hundreds of kilobytes: a regex trying every position cost
    milliseconds), a line break right before one belonging to it.
    """
    output = strip_markers(output)  # nothing a host prints may pass for a suggested command (bot.core.commands)
    needle = b"@@" + nonce.encode() + b" "
    out: dict[str, Section] = {}
    current: str | None = None
    start = 0
    pos = output.find(needle)
    while pos >= 0:
        m = _MARKER_TAIL_RE.match(output, pos + len(needle))
        if m is None:
            pos = output.find(needle, pos + 1)
            continue
        begin = pos - 1 if pos > 0 and output[pos - 1:pos] == b"\n" else pos
        kind, name = m.group(1).decode(), m.group(2).decode()
        if kind == "BEGIN":
            if current is not None:
                out[current] = Section(output[start:begin], None, False)
            current, start = name, m.end()
        elif current == name:
            rc_text = m.group(3) or b""
            try:
                rc: int | None = int(rc_text)
            except ValueError:
                rc = None
            out[name] = Section(output[start:begin], rc, True)
            current = None
        pos = output.find(needle, m.end())
    if current is not None:
        out[current] = Section(output[start:], None, False)
    return out


#: An `etimes` above this (about 30 years) is a procps glitch, not an age (bot.core.parse.ps drops it).
MAX_PLAUSIBLE_ELAPSED_S = ps_parse.MAX_PLAUSIBLE_ELAPSED_S


def _own_processes(procs: list, self_sec: Section | None, helpers: Collection[int] = ()) -> set[int]:
    """PIDs of the probe itself: its shell (`$$`, printed in the `self` section), every descendant of it
    (`ps`, `cut`, nested `timeout`s), the `timeout -k ... sh -s` wrapper above it (`sh -s gpubot-probe` on the
    probe agent), and the bot's long-lived `helpers` on the host (the probe agent). They are never shown in a
    probe's process tree."""
    own = {pid for pid in helpers if isinstance(pid, int)}
    try:
        me = int(_text(self_sec).split()[0])
    except (ValueError, IndexError):
        return own
    by_pid = {p.pid: p for p in procs}
    own.add(me)
    grew = True
    while grew:
        grew = False
        for p in procs:
            if p.ppid in own and p.pid not in own:
                own.add(p.pid)
                grew = True
    row = by_pid.get(me)
    parent = by_pid.get(row.ppid) if row is not None and row.ppid else None
    while parent is not None and parent.args.startswith("timeout -k ") and (
            parent.args.rstrip().endswith(("sh -s", f"sh -s {AGENT_PROBE_NAME}"))):
        own.add(parent.pid)
        parent = by_pid.get(parent.ppid) if parent.ppid else None
    return own


_TAG_LINE_RE = re.compile(r"^/proc/([0-9]{1,10})/environ:GPUBOT_LAUNCH=([A-Za-z0-9_.-]{1,64})$")
_SCOPE_LINE_RE = re.compile(r"^/proc/([0-9]{1,10})/cgroup:/gpubot-([A-Za-z0-9_-]{1,64})\.(?:scope|launch)$")


def _clock(section: Section | None) -> float | None:
    """Epoch seconds from a `date +%s[.%N]` section, None when the section is missing or empty. Raises
    ValueError for anything else."""
    text = _text(section).strip()
    if not text:
        return None
    value = float(text.splitlines()[0])
    if not math.isfinite(value):
        raise ValueError("non-finite clock")
    return value


def _since_lines(body: bytes, since: int, start: int, redactor: Redactor) -> list[str]:
    """The display-safe lines of a `log_since` window: `body` is the file from byte `start` (up to
    LOG_SINCE_CONTEXT_BYTES before the cursor at `since`) to its end. The lines from the one holding byte `since`
    on are returned, that first one whole (its start before the cursor too), each redacted with the lines above
    it as context; a line that starts before `start` is shown as cut by the read window."""
    context = body[: since - start]
    keep_from = context.count(b"\n")  # the line holding byte `since`: whole lines of context come before it
    text = body[:-1] if body.endswith(b"\n") else body
    total = text.count(b"\n") + 1 if body else 0
    if total <= keep_from:
        return []
    return log_parse.clean_log_lines(body, max_lines=total - keep_from, max_width=MAX_LINE_WIDTH,
                                     redactor=redactor.lines, starts_mid_line=start > 0)


def parse_launch_tags(text: str) -> dict[int, str]:
    """PID -> launch tag from two GNU grep outputs: `grep -a -z -H '^GPUBOT_LAUNCH=' /proc/[0-9]*/environ |
    tr '\\n\\0' ' \\n'` (lines `/proc/PID/environ:GPUBOT_LAUNCH=TAG`; a newline inside a value became a space,
    so no value makes a line of its own) and `grep -E -H -o
    '/gpubot-[A-Za-z0-9_-]*[.](scope|launch)$' /proc/[0-9]*/cgroup` (lines `/proc/PID/cgroup:/gpubot-TAG.scope`
    or `...:/gpubot-TAG.launch`: the process is in the launch's systemd scope, cgroup v1 or v2, or in the cgroup
    v2 directory the bot made for it, whatever its environment says). The
    environment wins where both name a tag. Malformed lines are skipped. Lines end at `\\n` only (a `\\r` or
    another Unicode line break inside a value does not start a line)."""
    env: dict[int, str] = {}
    scope: dict[int, str] = {}
    for line in text.split("\n"):
        line = line.strip()
        if m := _TAG_LINE_RE.match(line):
            env[int(m.group(1))] = m.group(2)
        elif m := _SCOPE_LINE_RE.match(line):
            scope[int(m.group(1))] = m.group(2)
    return {**scope, **env}


def parse_proc_stat_starts(text: str) -> dict[int, int]:
    """PID -> start time in clock ticks after boot (field 22) from /proc/PID/stat lines (proc(5): `PID (COMM) S
    PPID ...`; COMM may hold spaces and parentheses, so the fields after it are counted from its last `)`).
    Malformed lines are skipped."""
    out: dict[int, int] = {}
    for line in text.split("\n"):
        head, sep, rest = line.rpartition(")")
        pid, _, _ = head.partition(" (")
        fields = rest.split()
        if sep and pid.isdigit() and len(pid) <= 10 and len(fields) >= 20 and fields[19].isdigit():
            out[int(pid)] = int(fields[19])
    return out


#: Clock ticks per second of /proc/PID/stat's times (USER_HZ: 100 on every mainstream Linux architecture).
USER_HZ = 100


def parse_proc_stat_children_cpu(text: str) -> dict[int, float]:
    """PID -> seconds of CPU time of its children that ended and were waited for (fields 16 and 17, cutime and cstime,
    in USER_HZ ticks) from /proc/PID/stat lines (proc(5)), counted from the COMM's last `)` as
    `parse_proc_stat_starts` does. Work a launch does in short-lived children (Triton's `ptxas`, one compile after
    another) shows there, not in its own TIME. Malformed lines are skipped."""
    out: dict[int, float] = {}
    for line in text.split("\n"):
        head, sep, rest = line.rpartition(")")
        pid, _, _ = head.partition(" (")
        fields = rest.split()
        if sep and pid.isdigit() and len(pid) <= 10 and len(fields) >= 15 and fields[13].isdigit() \
                and fields[14].isdigit():
            out[int(pid)] = (int(fields[13]) + int(fields[14])) / USER_HZ
    return out


def parse_df_available_mib(text: str) -> float | None:
    """Available MiB from `df -Pk PATH` (POSIX format: header, then `fs 1024-blocks used avail cap% mount`).
    None when the output is not in that format."""
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 6 and cols[3].isascii() and cols[3].isdigit() and len(cols[3]) <= 20:
            return int(cols[3]) / 1024.0
    return None


def shown_command(redactor: Redactor) -> Callable[[str], str]:
    """What a command line from `ps` becomes before anyone reads it: redacted, cut to 4 * MAX_LINE_WIDTH + 1
    characters, Slack mentions broken."""

    memo = redactor.memo  # command lines repeat within a table and from probe to probe
    width = 4 * MAX_LINE_WIDTH + 1

    def shown(args: str) -> str:
        # the memo is looked up at every call: values learnt meanwhile (`add_values`) start a new one, and what
        # was redacted before they were known is not stored into it
        seen = memo("shown_command")
        done = seen.get(args)
        if done is None:
            done = log_parse.no_mentions(redactor.then_cut(args, width))
            if len(args) <= CACHE_MAX_CHARS and memo("shown_command") is seen:
                if len(seen) >= CACHE_ENTRIES:
                    seen.clear()
                seen[args] = done
        return done

    return shown


def _count_lines(info: LogInfo, sec: Section | None, cursor: LogCursor | None, mark: Section | None) -> None:
    """Fill `info.lines`, `lines_exact` and `cursor` from the `log_count` section (`DEV INODE FROM NEWLINES BYTES`,
    bot.core.parse.log.parse_log_count) and the cursor the probe was given: the lines before FROM are the
    cursor's when the count went on from it, none when it started at 0. The count is exact when it reached the size
    `log_stat` read; else `lines` is a lower bound. A missing or unreadable section leaves the count unknown (None),
    never a wrong number. The new cursor's mark is the `log_mark` section (the last bytes counted), or the given
    cursor's when nothing new was counted."""
    got = log_parse.parse_log_count(_text(sec)) if sec is not None and sec.complete and sec.rc == 0 else None
    if got is None:
        info.lines = None
        return
    dev, inode, start, newlines, nbytes = got
    if start == 0:
        before = 0
    elif cursor is not None and (cursor.dev, cursor.inode, cursor.offset) == (dev, inode, start):
        before = cursor.lines
    else:
        info.lines = None
        return
    end = start + nbytes
    tail_bytes = bytes(mark.body) if mark is not None and mark.complete else b""
    if nbytes and len(tail_bytes) == min(LOG_MARK_BYTES, end):
        kept = tail_bytes
    elif not nbytes and cursor is not None and start == cursor.offset:
        kept = cursor.mark
    else:
        kept = b""
    info.cursor = LogCursor(dev, inode, end, before + newlines, kept)
    info.lines = before + newlines
    info.lines_exact = info.size_bytes is not None and start + nbytes >= info.size_bytes


def _text(sec: Section | None) -> str:
    return "" if sec is None else sec.body.decode("utf-8", errors="replace")


def assemble_snapshot(
    host: str,
    req: ProbeRequest,
    sections: dict[str, Section],
    *,
    policy: HostPolicy | None = None,
    gpu_override: GpuSection | None = None,
    gpu_note: str | None = None,
    redactor: Redactor | None = None,
    helper_pids: Collection[int] = (),
) -> Snapshot:
    """Build a Snapshot from split sections (pure).

    `gpu_override` replaces the nvidia-smi sections (readings taken through NVML). Command lines and log
    lines are redacted with `redactor` (default: the built-in rules) BEFORE they are cut, so a cut never
    leaves half a secret. `helper_pids` are the bot's own long-lived processes on the host (the probe agent),
    left out like the probe's own. Missing or failed sections become entries in `Snapshot.errors`, never
    exceptions.
    """
    policy = policy or HostPolicy()
    redactor = redactor or Redactor()
    snap = Snapshot(host=host)
    try:
        snap.clock = _clock(sections.get("clock"))
    except ValueError:
        snap.errors.append("remote clock unreadable")
    hn = _text(sections.get("hostname")).strip()
    snap.hostname = log_parse.no_mentions(hn.splitlines()[0][:255]) if hn else None

    # GPUs
    if gpu_override is not None:
        snap.gpu = gpu_override
    elif req.gpu:
        g, a = sections.get("gpu"), sections.get("gpu_apps")
        if g is None:
            snap.gpu = GpuSection(ok=False, error="GPU readings missing from the probe output (probe cut short)")
        else:
            grc = g.rc if g.complete else 124
            arc = (a.rc if a.complete else 124) if a is not None else None
            snap.gpu = nvidia_smi.gpu_section_from_outputs(
                grc, _text(g), arc, _text(a), timeout_s=policy.nvidia_smi_timeout_s
            )
    else:
        snap.gpu = GpuSection(ok=False, error="GPU readings not requested")
    if gpu_note and snap.gpu.note is None:
        snap.gpu.note = gpu_note

    # Processes: every GPU holder plus the selectors, with descendants.
    ps_sec = sections.get("ps")
    # each command line is redacted (before it is cut, so a cut can never leave half a secret visible) when it is
    # first read: a row that is filtered out, never shown or kept, costs no redaction
    procs = ps_parse.parse_ps(_text(ps_sec), redact=shown_command(redactor)) if ps_sec is not None else []
    if (ps_sec is None or not procs) and req.processes and req.ps_pids is None:
        snap.errors.append("process table unavailable (ps failed or printed nothing)")
    own = _own_processes(procs, sections.get("self"), helper_pids)
    snap.table = [p for p in procs if p.pid not in own]
    snap.all_process_count = len(snap.table)
    tags_sec = sections.get("tags")
    if tags_sec is not None:
        snap.launch_tags = {pid: tag for pid, tag in parse_launch_tags(_text(tags_sec)).items() if pid not in own}
    if req.select_tag:
        snap.tagged_pids = sorted(pid for pid, tag in snap.launch_tags.items() if tag == req.select_tag)
    starts = sections.get("starts")
    if starts is not None:
        stat_text = _text(starts)
        snap.start_ticks = parse_proc_stat_starts(stat_text)
        snap.children_cpu_s = parse_proc_stat_children_cpu(stat_text)
    gpu_pids = [gp.pid for gp in snap.gpu.processes] + snap.tagged_pids
    snap.processes = [
        p
        for p in ps_parse.select_processes(
            procs, pids=gpu_pids, pgid=req.pgid, sid=req.sid, pid=req.pid, match=req.match
        )
        if p.pid not in own
    ]
    for gp in snap.gpu.processes:
        if gp.process_name in (None, "", "[Not Found]"):
            row = next((p for p in procs if p.pid == gp.pid), None)
            if row is not None:
                gp.process_name = row.args.split(" ", 1)[0][:80]

    shm = sections.get("shm")
    if shm is not None:
        snap.shm_free_mib = parse_df_available_mib(_text(shm)) if shm.rc == 0 else None

    # Log
    if req.log_path is not None:
        info = LogInfo(path=req.log_path)
        st = sections.get("log_stat")
        if st is None:
            info.error = "log stat missing from the probe output"
        elif not st.complete:
            info.error = "the log could not be read in time (a FIFO swapped in, or a hung file system?)"
        elif st.rc != 0:
            info.error = _text(st).strip().splitlines()[0] if _text(st).strip() else f"stat failed (rc={st.rc})"
        else:
            info.exists = True
            info.size_bytes, info.mtime, info.lines = log_parse.parse_log_stat(_text(st))
            _count_lines(info, sections.get("log_count"), req.log_cursor, sections.get("log_mark"))
            window = _text(sections.get("log_window")).split()
            since = window[1:] if window[:1] == ["since"] and len(window) == 3 else []
            if since and all(w.isdigit() for w in since) and int(since[1]) <= int(since[0]):
                info.since = int(since[0])
            ex = sections.get("log_exit")
            info.exit_checked = ex is not None and ex.complete
            if ex is not None and ex.complete and ex.rc == 0:
                info.exit_file = True
                word = _text(ex).strip()
                info.exit_status = int(word) if word.isdigit() and int(word) <= 255 else None
            tail = sections.get("log_tail")
            if tail is not None and info.since is not None:  # what was written after the cursor, all of it
                info.tail = _since_lines(tail.body, info.since, int(since[1]), redactor)
            elif tail is not None:
                # one line more than shown is read (context for the redactor: a name on the line above its value);
                # fewer than that from a file longer than the window: the window starts inside its first line
                cut = (info.size_bytes or 0) > LOG_TAIL_BYTES and tail.body.rstrip(b"\n").count(b"\n") < req.tail_lines
                info.tail = log_parse.clean_log_lines(tail.body, max_lines=req.tail_lines, max_width=MAX_LINE_WIDTH,
                                                      redactor=redactor.lines, starts_mid_line=cut)
        snap.log = info

    # Port and health
    if req.port is not None:
        snap.port = req.port
        t4, t6 = sections.get("tcp4"), sections.get("tcp6")
        socks = []
        t4_ok = t4 is not None and t4.rc == 0
        t6_ok = t6 is not None and t6.rc == 0
        if t4_ok:
            socks += proc_net.parse_proc_net_tcp(_text(t4), ipv6=False)
        if t6_ok:
            socks += proc_net.parse_proc_net_tcp(_text(t6), ipv6=True)
        snap.listening = socks
        if not t4_ok and not t6_ok:
            snap.errors.append("listening sockets unavailable (/proc/net/tcp unreadable or awk missing)")
        else:
            snap.port_listening = proc_net.is_listening(socks, req.port)
        h = sections.get("health")
        if h is not None and req.health_path is not None:
            url = f"http://127.0.0.1:{req.port}{req.health_path}"
            snap.health = health_parse.parse_curl(h.rc if h.complete else 124, _text(h), url)
        g = sections.get("generate")
        if g is not None and req.generate_path is not None:
            url = f"http://127.0.0.1:{req.port}{req.generate_path}"
            snap.generate = health_parse.parse_curl(g.rc if g.complete else 124, _text(g), url)
    return snap


def status_snapshot(snap: Snapshot, keep: Collection[int] = ()) -> Snapshot:
    """A copy of `snap` cut to what a GPU status needs (pure; `snap` is not changed): its process `table` keeps only
    the GPU holders' rows (`processes`), the rows tagged as a launch's (`launch_tags`), the rows of `keep` (the
    recorded pids of the host's launches, tagged or not) and every ancestor of those, which is all that labels each
    holder with its launch (bot.core.lifecycle.attribute_holders); the other fields are kept, `all_process_count`
    included. What a probe worker sends the bot: a few rows, not a host's thousands."""
    by_pid = {p.pid: p for p in snap.table}
    kept: set[int] = set()
    for pid in [p.pid for p in snap.processes] + list(snap.launch_tags) + list(keep):
        while pid in by_pid and pid not in kept:
            kept.add(pid)
            parent = by_pid[pid].ppid
            if parent is None or parent == pid:
                break
            pid = parent
    out = snap.shallow_copy()
    out.table = [p for p in snap.table if p.pid in kept]
    return out
