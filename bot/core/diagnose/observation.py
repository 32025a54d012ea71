"""The diagnosis engine's data models: what one look at a launch saw (`Observation`) and the answer (`Verdict`).

Also the vocabularies: VERDICTS, PHASES and HEALTH_STATES. Plain dataclasses; no logic beyond `to_dict`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bot.core.models import GpuProcess, GpuReading, ProcessInfo
from bot.core.stackdump import ProcessDump

__all__ = [
    "CONFIDENCES",
    "CPU_PROGRESS_CORES",
    "HEALTH_STATES",
    "PHASES",
    "VERDICTS",
    "ContainerObs",
    "ListenObs",
    "Observation",
    "ShmSegment",
    "Verdict",
    "cpu_progress",
]

VERDICTS: tuple[str, ...] = (
    "loading",
    "ready",
    "silent_hang",
    "unhealthy",
    "crashed",
    "oom",
    "host_oom",
    "nccl_error",
    "port_in_use",
    "cuda_error",
    "gpu_lost",
    "orphans_hold_gpu",
    "exited",
    "time_limit",
    "node_fail",
    "preempted",
    "cancelled",
    "boot_fail",
    "deadline",
    "unknown",
)
"""Every verdict `diagnose` can return (tests/fixtures/cases/README.md)."""

PHASES: tuple[str, ...] = (
    "comm_init",
    "weight_loading",
    "kv_cache_alloc",
    "cuda_graph_capture",
    "warmup",
    "serving",
    "shutdown",
)
"""Every phase `diagnose` can return besides None (start-up order, then `shutdown`)."""

HEALTH_STATES: tuple[str, ...] = ("ok", "http_503", "refused", "timeout", "empty", "connect_timeout")
"""Values of `Observation.health`: `http_NNN` for any other HTTP status; `connect_timeout` means the TCP
connect itself timed out (a client-side path problem when the port is known to listen)."""


@dataclass
class ListenObs:
    """One listening socket from `netstat -tlnp` / `ss -ltnp`: address, port, owner (`1/python3`), raw line."""

    address: str
    port: int
    owner: str | None = None
    line: str = ""


@dataclass
class ShmSegment:
    """One `ipcs -m` row. `status` holds flags such as `dest` (marked for deletion); `nattch` attached processes."""

    key: str
    shmid: int | None = None
    owner: str | None = None
    size_bytes: int | None = None
    nattch: int | None = None
    status: str = ""
    line: str = ""


@dataclass
class ContainerObs:
    """One `docker ps` row: name, status (`Up 26 minutes`, `Exited (137) 2 minutes ago`), ports, raw line."""

    name: str
    status: str
    ports: str = ""
    line: str = ""


@dataclass
class Observation:
    """What one look at a launch saw. Every field is optional: None means UNKNOWN, never "empty".

    Units: seconds for `*_s`, MiB for GPU memory (in `GpuReading`). Lists of raw text lines are kept so the
    verdict can quote them verbatim.

    - `log_lines`: the server log (or its tail), oldest first.
    - `log_silent_s`: seconds since the log last grew with a line that is not a heartbeat.
    - `log_growing`: whether the log file still grows (heartbeat lines included).
    - `elapsed_s`: seconds since the launch started.
    - `process_alive`: whether the launch's main process runs; `exit_code` its exit status when it ended
      (shell convention: 137 = killed by SIGKILL; negative = killed by that signal, as Python reports it).
    - `processes`: `ps` rows (GPU holders and the launch's tree); `process_lines` the raw row text per PID.
    - `launch_pids`: PIDs that belong to the launch (a watcher knows them; bundles do not).
    - `cpu_time_growing`: whether the launch's CPU time grew since the previous look.
    - `gpus`: per-GPU readings; `gpu_lines` the raw `nvidia-smi` text per GPU index; `gpu_processes` the
      compute processes; `gpu_error_lines` error text nvidia-smi printed instead of (or besides) readings.
    - `gpu_mem_rising`: whether GPU memory in use went up between samples.
    - `progress_advancing`: whether a progress counter (`74/163`) advanced since the previous look.
    - `port`: the server's HTTP port; `port_open` whether it listens; `listening` all listening sockets.
    - `health`: the result of a local probe of `/health` or `/v1/models` (see HEALTH_STATES);
      `probe_lines` the raw text of a probe (commands and what they printed), judged when `health` is None.
    - `generate`: the result of a generation check (SGLang `/health_generate`, a one-token completion), in the
      states of `health`; None when none ran.
    - `dmesg_lines`, `stack_lines` (`/proc/PID/stack`), `shm_segments` (`ipcs -m`), `containers`
      (`docker ps`): host evidence.
    - `rank_stacks`: py-spy dumps of the ranks, (label, ProcessDump) per rank (`("TP0", dump)`); a hang's
      verdict then says where each rank waits (bot.core.diagnose.stacks).
    - `policy_grace_s`, `policy_silence_after_s`: the watch policy the observer judged under (seconds; a bundle
      gpubot collected carries them, so it diagnoses offline as it did live); `diagnose`'s own arguments win.
    - `notes`: problems met while collecting (an unreadable file, bad JSON), shown with the evidence.
    """

    log_lines: list[str] | None = None
    log_silent_s: float | None = None
    log_growing: bool | None = None
    elapsed_s: float | None = None
    process_alive: bool | None = None
    exit_code: int | None = None
    processes: list[ProcessInfo] | None = None
    process_lines: dict[int, str] = field(default_factory=dict)
    launch_pids: set[int] | None = None
    cpu_time_growing: bool | None = None
    gpus: list[GpuReading] | None = None
    gpu_lines: dict[int, str] = field(default_factory=dict)
    gpu_processes: list[GpuProcess] | None = None
    gpu_error_lines: list[str] | None = None
    gpu_mem_rising: bool | None = None
    progress_advancing: bool | None = None
    port: int | None = None
    port_open: bool | None = None
    listening: list[ListenObs] | None = None
    health: str | None = None
    generate: str | None = None
    probe_lines: list[str] | None = None
    dmesg_lines: list[str] | None = None
    stack_lines: list[str] | None = None
    shm_segments: list[ShmSegment] | None = None
    containers: list[ContainerObs] | None = None
    rank_stacks: list[tuple[str, ProcessDump]] | None = None
    policy_grace_s: dict[str, float] | None = None
    policy_silence_after_s: float | None = None
    notes: list[str] = field(default_factory=list)


#: A launch whose processes together use more than this many cores between two looks is working (cpu_progress).
CPU_PROGRESS_CORES = 0.1


def cpu_progress(deltas: Sequence[float], seconds: float | None) -> bool | None:
    """Whether the CPU time a launch's processes gained between two looks (`deltas`: seconds per process seen in
    both) is work: a rate above CPU_PROGRESS_CORES over the `seconds` between the looks, with more than one second
    gained by one process (ps TIME ticks in whole seconds: a tick or two is a polling thread); without the seconds,
    more than 2 s in all. None when no process was seen in both looks. One rule for the watcher, a bundle's two
    probes and diagnose's history."""
    if not deltas:
        return None
    total = sum(max(0.0, d) for d in deltas)
    if seconds is None or not seconds > 0:
        return total > 2
    return total / seconds > CPU_PROGRESS_CORES and max(deltas) > 1


CONFIDENCES: tuple[str, ...] = ("high", "medium", "low")
"""How sure a verdict is: `high` (the evidence says it in so many words: an exception's type, a kernel's OOM kill, a
silence far past its grace), `medium` (one reading of the evidence, with another one close: `runner_up`), `low` (thin
evidence; `missing` names the fact that would decide)."""


@dataclass
class Verdict:
    """The diagnosis: `verdict` (one of VERDICTS), `phase` (one of PHASES, or None when the evidence cannot
    pin it down), `evidence` (strings that quote log lines, GPU rows, process rows, port and probe results
    verbatim in backticks), `next_steps` (what to do) and a one-paragraph `summary`; how sure it is
    (`confidence`, one of CONFIDENCES), the verdict next in line (`runner_up`, e.g. `silent_hang in comm_init`), and the
    one fact that would decide between them when it is not known (`missing`, a question: "is the log still
    growing?")."""

    verdict: str
    phase: str | None
    evidence: list[str]
    next_steps: list[str]
    summary: str
    confidence: str = "medium"
    runner_up: str | None = None
    missing: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with keys verdict, phase, summary, evidence, next_steps, confidence, runner_up, missing."""
        return {
            "verdict": self.verdict,
            "phase": self.phase,
            "summary": self.summary,
            "evidence": list(self.evidence),
            "next_steps": list(self.next_steps),
            "confidence": self.confidence,
            "runner_up": self.runner_up,
            "missing": self.missing,
        }

    @property
    def sureness(self) -> str:
        """One line: `confidence medium; runner-up silent_hang in comm_init; would decide: is the log growing?`."""
        parts = [f"confidence {self.confidence}"]
        if self.runner_up:
            parts.append(f"runner-up {self.runner_up}")
        if self.missing:
            parts.append(f"would decide: {self.missing}")
        return "; ".join(parts)
