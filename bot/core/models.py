"""Plain data models shared by parsers, probe, handlers and templates.

Everything here is a frozen-ish dataclass with no I/O. Units are in the field names or docstrings:
memory in MiB, time in seconds, utilization in percent, power in watts, temperature in Celsius.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any


class GpuSource(StrEnum):
    """Where a GPU reading came from."""

    NVIDIA_SMI = "nvidia-smi"
    NVML = "nvml"


@dataclass
class GpuReading:
    """One GPU as reported by `nvidia-smi --query-gpu` or NVML.

    Numeric fields are None when the tool printed `[N/A]`, `[Not Supported]` or anything that is not a
    number. Memory is MiB, utilization percent, temperature Celsius, power watts, clocks MHz.
    """

    index: int
    uuid: str | None = None
    name: str | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    utilization_gpu_pct: float | None = None
    utilization_memory_pct: float | None = None
    temperature_c: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    pstate: str | None = None
    clocks_sm_mhz: float | None = None
    ecc_uncorrected: float | None = None

    @property
    def memory_used_gib(self) -> float | None:
        """Memory in use in GiB (MiB / 1024), or None when unknown."""
        return None if self.memory_used_mib is None else self.memory_used_mib / 1024.0

    @property
    def memory_total_gib(self) -> float | None:
        """Total memory in GiB (MiB / 1024), or None when unknown."""
        return None if self.memory_total_mib is None else self.memory_total_mib / 1024.0


@dataclass
class GpuProcess:
    """A compute process holding GPU memory (`nvidia-smi --query-compute-apps` or NVML).

    `used_memory_mib` is MiB (None when not reported). `gpu_index` is filled in by matching `gpu_uuid`
    against the GPU table; None when the UUID is unknown.
    """

    pid: int
    used_memory_mib: float | None = None
    gpu_uuid: str | None = None
    gpu_index: int | None = None
    process_name: str | None = None

    @property
    def used_memory_gib(self) -> float | None:
        """GPU memory held in GiB, or None when unknown."""
        return None if self.used_memory_mib is None else self.used_memory_mib / 1024.0


@dataclass
class GpuSection:
    """The GPU part of a snapshot.

    `ok` is False when the readings could not be taken; `error` then says exactly why (e.g.
    "nvidia-smi did not answer in 10 s", "nvidia-smi not found on the host", "NVIDIA driver is not
    loaded (nvidia-smi exit 9)"). `note` is an informational label such as "replayed sample GPU data".
    """

    ok: bool
    gpus: list[GpuReading] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)
    source: GpuSource = GpuSource.NVIDIA_SMI
    error: str | None = None
    note: str | None = None
    processes_error: str | None = None


class ProcessInfo:
    """One row of `ps -eo pid,ppid,pgid,sid,stat,pcpu,rss,etimes,time,wchan:32,user:32,args` (procps-ng).

    `rss_kib` is KiB as ps prints it, `elapsed_s` seconds since start, `cpu_time_s` cumulative CPU
    seconds (parsed from ps `TIME`, `[[DD-]HH:]MM:SS`), `pcpu` percent of one core averaged over the
    process lifetime, `user` the effective user's name (or number). Fields ps could not print are None.

    A host's table holds thousands of rows and a probe keeps only a few, so a parser may hand a row over half
    read: `pid`, `ppid`, `pgid`, `sid` and `stat` (what selecting and walking the tree need), with the function
    that reads the rest from the row's text (`pending_rest`) the first time one of the other fields is read; and
    `args` unredacted with the function that redacts it (`pending_redaction`), applied the first time it is read.
    Either way the fields read like plain attributes, a row filtered out costs neither, and no unredacted command
    line can be read (pickling or comparing a row reads it). A plain class with slots, not a dataclass.
    """

    __slots__ = ("_args", "_cpu_time_s", "_elapsed_s", "_pcpu", "_redact", "_rest", "_rss_kib", "_user", "_wchan",
                 "pgid", "pid", "ppid", "sid", "stat")
    FIELDS = ("pid", "ppid", "pgid", "sid", "stat", "pcpu", "rss_kib", "elapsed_s", "cpu_time_s", "wchan", "args",
              "user")

    def __init__(self, pid: int, ppid: int | None = None, pgid: int | None = None, sid: int | None = None,
                 stat: str = "", pcpu: float | None = None, rss_kib: int | None = None,
                 elapsed_s: int | None = None, cpu_time_s: int | None = None, wchan: str | None = None,
                 args: str = "", user: str | None = None):
        self.pid = pid
        self.ppid = ppid
        self.pgid = pgid
        self.sid = sid
        self.stat = stat
        self._pcpu = pcpu
        self._rss_kib = rss_kib
        self._elapsed_s = elapsed_s
        self._cpu_time_s = cpu_time_s
        self._wchan = wchan
        self._args = args
        self._user = user
        self._redact: Any = None
        self._rest: Any = None

    def pending_rest(self, fill: Any, *args: Any) -> ProcessInfo:
        """Have `fill(self, *args)` set the fields after `stat` (with `set_rest`) when one is first read; returns
        self."""
        self._rest = (fill, *args)
        return self

    @classmethod
    def half_read(cls, pid: int, ppid: int, pgid: int, sid: int, stat: str, rest: tuple[Any, ...],
                  redact: Any) -> ProcessInfo:
        """A row whose fields after `stat` are still to be read: `rest` is `(fill, *args)` as `pending_rest` takes
        them, `redact` what `pending_redaction` takes (or None). What a parser makes of each of a table's thousands
        of rows: the other fields are only set when one is read."""
        self = cls.__new__(cls)
        self.pid, self.ppid, self.pgid, self.sid, self.stat = pid, ppid, pgid, sid, stat
        self._rest, self._redact, self._args = rest, redact, ""
        return self

    def set_rest(self, pcpu: float | None, rss_kib: int | None, elapsed_s: int | None, cpu_time_s: int | None,
                 wchan: str | None, args: str, user: str | None = None) -> None:
        """Set the fields after `stat` (a parser's `pending_rest` function does); a pending redaction stays."""
        self._pcpu, self._rss_kib, self._elapsed_s, self._cpu_time_s, self._wchan, self._user = (
            pcpu, rss_kib, elapsed_s, cpu_time_s, wchan, user)
        self._args = args

    def _read_rest(self) -> None:
        rest, self._rest = self._rest, None
        rest[0](self, *rest[1:])

    @property
    def pcpu(self) -> float | None:
        """Percent of one core over the process's life."""
        if self._rest is not None:
            self._read_rest()
        return self._pcpu

    @pcpu.setter
    def pcpu(self, value: float | None) -> None:
        if self._rest is not None:
            self._read_rest()
        self._pcpu = value

    @property
    def rss_kib(self) -> int | None:
        """Resident memory, KiB."""
        if self._rest is not None:
            self._read_rest()
        return self._rss_kib

    @rss_kib.setter
    def rss_kib(self, value: int | None) -> None:
        if self._rest is not None:
            self._read_rest()
        self._rss_kib = value

    @property
    def elapsed_s(self) -> int | None:
        """Seconds since the process started."""
        if self._rest is not None:
            self._read_rest()
        return self._elapsed_s

    @elapsed_s.setter
    def elapsed_s(self, value: int | None) -> None:
        if self._rest is not None:
            self._read_rest()
        self._elapsed_s = value

    @property
    def cpu_time_s(self) -> int | None:
        """Cumulative CPU seconds."""
        if self._rest is not None:
            self._read_rest()
        return self._cpu_time_s

    @cpu_time_s.setter
    def cpu_time_s(self, value: int | None) -> None:
        if self._rest is not None:
            self._read_rest()
        self._cpu_time_s = value

    @property
    def wchan(self) -> str | None:
        """The kernel function the process sleeps in, or None."""
        if self._rest is not None:
            self._read_rest()
        return self._wchan

    @wchan.setter
    def wchan(self, value: str | None) -> None:
        if self._rest is not None:
            self._read_rest()
        self._wchan = value

    @property
    def user(self) -> str | None:
        """The effective user's name (its number when ps could not name it), or None when not read."""
        if self._rest is not None:
            self._read_rest()
        return self._user

    @user.setter
    def user(self, value: str | None) -> None:
        if self._rest is not None:
            self._read_rest()
        self._user = value

    @property
    def args(self) -> str:
        """The command line (redacted, when the row was parsed with a redactor)."""
        if self._rest is not None:
            self._read_rest()
        redact = self._redact
        if redact is not None:
            self._redact = None
            self._args = redact(self._args)
        return self._args

    @args.setter
    def args(self, value: str) -> None:
        if self._rest is not None:
            self._read_rest()
        self._args = value
        self._redact = None

    def pending_redaction(self, redact: Any) -> ProcessInfo:
        """Have `args` redacted by `redact` (str -> str) when it is first read; returns self."""
        self._redact = redact
        return self

    @property
    def state(self) -> str:
        """The one-letter process state (R, S, D, Z, T, ...), first letter of STAT; '?' if empty."""
        return self.stat[:1] or "?"

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in self.FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProcessInfo):
            return NotImplemented
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclass it replaces

    def __repr__(self) -> str:
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS)
        return f"ProcessInfo({inner})"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled with every field read and its command line redacted (never the raw one, never the redactor)."""
        return (ProcessInfo, self._values())


#: Bytes a LogCursor keeps of what comes right before its offset (its `mark`), to tell the same file grown from
#: one truncated (or copied over) and written past the old offset again: enough to reach into the line before in
#: most logs (its time stamp, its numbers), so a constant line ending alone does not make two files look alike.
LOG_MARK_BYTES = 64


@dataclass(frozen=True)
class LogCursor:
    """Where a reading of a log stopped: the first `offset` bytes of the file `dev`/`inode` (stat's `%d %i`) hold
    `lines` newlines, and end with `mark` (the last LOG_MARK_BYTES of them, or fewer; empty when unknown). A probe
    given a cursor counts lines from there on (the same file, grown, and still ending in `mark` there: not
    truncated and written again, not copied over, not a new file on a reused inode) instead of from the start, and
    can read what was written after it (`ProbeRequest.log_since`). Immutable."""

    dev: int
    inode: int
    offset: int
    lines: int
    mark: bytes = b""

    def as_list(self) -> list[int | str]:
        """[dev, inode, offset, lines, mark as hex], for a JSON record."""
        return [self.dev, self.inode, self.offset, self.lines, self.mark.hex()]

    @classmethod
    def from_list(cls, value: Any) -> LogCursor | None:
        """The cursor `as_list` wrote (or an older bot's, without its mark), or None for anything else."""
        if not isinstance(value, list) or len(value) not in (4, 5):
            return None
        ints, mark = value[:4], value[4] if len(value) == 5 else ""
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63 for v in ints):
            return None
        if (not isinstance(mark, str) or len(mark) > 2 * LOG_MARK_BYTES or len(mark) % 2
                or any(ch not in "0123456789abcdef" for ch in mark)):
            return None
        return cls(*ints, mark=bytes.fromhex(mark))


@dataclass
class LogInfo:
    """Stat and tail of a log file.

    `size_bytes` bytes, `mtime` seconds since the epoch (remote clock), `lines` newline count, exact when
    `lines_exact`, else a lower bound (the count stops at a read budget per probe and goes on from `cursor` at
    the next one: "at least N lines"); `cursor` where the count stopped. `tail` the last lines (decoded with
    replacement, each cut to a bounded width), or, when `since` is set, the lines written after byte `since` (a
    check that asked for what is new: `ProbeRequest.log_since`). `error` is set when the file could not be read
    (missing, permission denied). `exit_file`: the launch's exit file (`<log>.exit`, written by its wrapper alone)
    exists, so its `exit_status` (0..255, 128+N: killed by signal N; None while the server runs, or when the
    wrapper was killed too) is the only truth about how the server ended. `exit_checked`: the exit file was looked
    for (a launch's own log); when it was and is missing or not a plain file (removed, replaced by a link), no
    status is known, whatever exit line the log shows (the server can print one).
    """

    path: str
    exists: bool = False
    size_bytes: int | None = None
    mtime: float | None = None
    lines: int | None = None
    tail: list[str] = field(default_factory=list)
    error: str | None = None
    lines_exact: bool = True
    cursor: LogCursor | None = None
    since: int | None = None
    exit_file: bool = False
    exit_status: int | None = None
    exit_checked: bool = False

    def seconds_since_write(self, now: float | None) -> float | None:
        """Seconds between the last write and `now` (remote clock, epoch seconds); None if unknown."""
        if now is None or self.mtime is None:
            return None
        return max(0.0, now - self.mtime)


@dataclass
class ListenSocket:
    """A listening TCP socket from /proc/net/tcp or /proc/net/tcp6 (state 0A)."""

    address: str
    port: int
    inode: int | None = None
    ipv6: bool = False


@dataclass
class HealthResult:
    """The result of `curl -m` against a health endpoint.

    `status` is one of ok (2xx), http_NNN (other code), refused, timeout, error, unavailable
    (curl missing). `http_code` is the HTTP status (None when no response), `elapsed_s` seconds.
    """

    url: str
    status: str
    http_code: int | None = None
    elapsed_s: float | None = None
    detail: str | None = None


@dataclass
class Snapshot:
    """Everything one probe of one host saw, taken in one round trip.

    `clock` is the remote epoch time in seconds when the probe began (procps counts `etimes` from its own
    start, right after), `local_clock` the bot's epoch time when it sent the probe (None when not
    recorded): ages compared with the bot's own times (a launch's end) use it, so the two clocks never
    mix; `processes` the selected process rows (GPU holders
    plus whatever the probe asked for); `port_listening` is None when no port was asked for.
    `generate` is the generation check's result (when asked: bot.core.probe.ProbeRequest.generate_path).
    `errors` lists section-level problems (missing tools, timeouts) as human-readable strings.
    `launch_tags` maps PID -> the GPUBOT_LAUNCH tag in its environment; `tagged_pids` are the PIDs carrying
    the tag a probe selected; `start_ticks` PID -> start time in clock ticks after boot (/proc/PID/stat), read for
    the tagged processes and the ones a launch remembers, and `children_cpu_s` PID -> seconds of CPU its ended
    children used (from the same lines); `shm_free_mib` is free MiB in
    /dev/shm (when asked). `table` is the host's whole process table minus the probe's own processes
    (used to attribute GPU holders to launches and to find every process of a launch).
    """

    host: str
    clock: float | None = None
    local_clock: float | None = None
    hostname: str | None = None
    processes: list[ProcessInfo] = field(default_factory=list)
    all_process_count: int = 0
    gpu: GpuSection = field(default_factory=lambda: GpuSection(ok=False, error="not probed"))
    log: LogInfo | None = None
    listening: list[ListenSocket] = field(default_factory=list)
    port: int | None = None
    port_listening: bool | None = None
    health: HealthResult | None = None
    generate: HealthResult | None = None
    errors: list[str] = field(default_factory=list)
    duration_s: float | None = None
    tagged_pids: list[int] = field(default_factory=list)
    launch_tags: dict[int, str] = field(default_factory=dict)
    start_ticks: dict[int, int] = field(default_factory=dict)
    children_cpu_s: dict[int, float] = field(default_factory=dict)  # PID -> CPU s of its reaped children (stat)
    shm_free_mib: float | None = None
    table: list[ProcessInfo] = field(default_factory=list, repr=False)

    def shallow_copy(self) -> Snapshot:
        """A copy with lists and dicts of its own (their items shared): one caller of a shared probe may append to
        its errors or sort its rows without changing another caller's answer."""
        return replace(self, **{f.name: type(v)(v) for f in fields(self)
                                if isinstance(v := getattr(self, f.name), list | dict)})


@dataclass
class HostFailure:
    """A host that could not be probed at all (unreachable, host key refused, auth failed, timeout)."""

    host: str
    reason: str


# --- launches, the audit trail and confirmations: what the store keeps, as the rest of the bot sees it ---


class LaunchKind(StrEnum):
    """How a launch runs, as its row records it (the one reading of that record: `Launch.kind`; the services ask
    the runner of the kind, bot.services.runners): `host`, one process tree on `host`; `hosts`, one per host of a
    multi-host SSH variant (`nodes`); `slurm`, a Slurm job (`job_id`) submitted on the login node `host`."""

    HOST = "host"
    HOSTS = "hosts"
    SLURM = "slurm"


class LaunchState(StrEnum):
    """The life of a launch. `starting` until its process is confirmed, `running` while it lives,
    `stopping` while a kill runs (not watched, not live for new commands), then one of the terminal states.
    `kill_failed` means processes still hold GPU memory after a kill (live again: it can be killed again)."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    KILL_FAILED = "kill_failed"
    KILLED = "killed"
    EXITED = "exited"
    FAILED = "failed"

    @property
    def live(self) -> bool:
        """True while the launch may still have processes and is followed (not stopping, not ended)."""
        return self in LIVE_STATES

    @property
    def ended(self) -> bool:
        """True for killed, exited and failed."""
        return self in TERMINAL_STATES


#: States in which a launch may still have processes and is watched.
LIVE_STATES = frozenset({LaunchState.STARTING, LaunchState.RUNNING, LaunchState.KILL_FAILED})
#: States a launch ends in.
TERMINAL_STATES = frozenset({LaunchState.KILLED, LaunchState.EXITED, LaunchState.FAILED})


@dataclass
class Launch:
    """One launch of a variant on a host (a detached copy of its database row). Times are epoch seconds;
    `tag` is the GPUBOT_LAUNCH value in its processes' environment; `thread_ts` its incident thread (a Slack
    ts, or an outbox `q:<id>` reference until the root message is sent); `alert_state` the last verdict
    posted; `snoozed_until` epoch seconds until which alerts are held back; `ready_at` when a check first
    found it ready (from then on it gets liveness checks); `unreachable_since` when its thread was told
    that the host cannot be reached (None once it is back); `seen_pids` every process of the launch a check
    or kill has seen, remembered so a kill stops even those that cleared their environment: PID -> its
    start time (epoch seconds on the host's clock, None when unknown), so a reused PID is not taken for
    ours; `seen_starts` the same processes' start times in clock ticks after boot (/proc/PID/stat, where it was
    read): exact, so a remembered PID counts only while the process holding it started at that very tick; `unit`
    the cgroup it runs in and `unit_manager`: a transient systemd scope (`system` or `user`) or the bot's own cgroup
    v2 directory (`cgroup`), both None when it runs in no cgroup of its own. `job_id`: its Slurm job (then `host` is
    the login node sbatch ran on); `nodes`: where its ranks run, rank order (a Slurm job's allocated nodes once it
    runs, or a multi-host variant's hosts; empty for a launch on `host` alone); `job_restarts`: how often Slurm had
    requeued its job when a check last read it (None before the first read)."""

    id: int
    host: str
    variant: str
    params: dict[str, Any]
    command: str
    log_path: str | None
    port: int | None
    gpus: list[int]
    pid: int | None
    pgid: int | None
    sid: int | None
    state: LaunchState
    state_detail: str | None
    created_by: str
    created_at: float
    ended_at: float | None
    channel: str | None
    thread_ts: str | None
    relaunch_of: int | None = None
    tag: str = ""
    alert_state: str | None = None
    snoozed_until: float | None = None
    ready_at: float | None = None
    unreachable_since: float | None = None
    seen_pids: dict[int, float | None] = field(default_factory=dict)
    seen_starts: dict[int, int] = field(default_factory=dict)
    unit: str | None = None
    unit_manager: str | None = None
    job_id: str | None = None
    nodes: list[str] = field(default_factory=list)
    job_restarts: int | None = None

    @property
    def spans_nodes(self) -> bool:
        """True for a launch that runs on nodes of its own (`nodes`: a Slurm job's allocation, or a multi-host SSH
        variant's hosts) rather than as one process tree on `host`."""
        return bool(self.job_id or self.nodes)

    @property
    def kind(self) -> LaunchKind:
        """How the launch runs, as its row records it (LaunchKind): a Slurm job once it has a job id, ranks on its
        `nodes`, else one process tree on `host` (a Slurm launch whose sbatch has not answered yet, too)."""
        return LaunchKind.SLURM if self.job_id else LaunchKind.HOSTS if self.nodes else LaunchKind.HOST

    @property
    def live(self) -> bool:
        """True while the launch may still have processes (starting, running or kill_failed)."""
        return self.state in LIVE_STATES

    @property
    def name(self) -> str:
        """Short display name, e.g. `base#12`."""
        return f"{self.variant}#{self.id}"


@dataclass
class Event:
    """One row of the audit trail: who (Slack user ID), when (epoch s), which `action` with which `args`,
    the `result` and its `detail`, and where (launch, host, channel)."""

    id: int
    at: float
    user_id: str
    action: str
    args: dict[str, Any] = field(default_factory=dict)
    result: str = "ok"
    detail: str | None = None
    launch_id: int | None = None
    host: str | None = None
    channel: str | None = None


class ConfirmationState(StrEnum):
    """A typed kill's confirmation: pending until the first operator's click decides it."""

    PENDING = "pending"
    CONFIRMED = "confirmed"
    CANCELLED = "cancelled"


@dataclass
class Confirmation:
    """A typed kill waiting for [Kill] / [Cancel]: the launch (or the host and pid of a foreign process,
    with the `command` line it ran when asked, so a reused pid is refused), who asked and who decided.
    Times are epoch seconds."""

    id: int
    launch_id: int | None
    host: str
    pid: int | None
    command: str | None
    asked_by: str
    state: ConfirmationState
    decided_by: str | None
    created_at: float
