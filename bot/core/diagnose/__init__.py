"""The diagnosis engine: one `Observation` of a launch in, one `Verdict` out. Pure: no I/O.

`diagnose(obs)` decides what state a GPU inference server launch is in (`loading`, `ready`, `silent_hang`,
`crashed`, `oom`, ...; the vocabulary of `tests/fixtures/cases/README.md` and of docs/watching.md,
"Diagnosing a stuck launch"), in which start-up phase, and quotes the evidence verbatim. Every engine-specific string it
knows (phase markers, progress bars, heartbeats, failure signatures, known-benign warnings, readiness lines,
next steps) is DATA in `bot/core/diagnose/signatures.yaml`, loaded once when this package is imported; the rules
are engine-agnostic:

- the FIRST specific failure decides the verdict, and the first failure of any kind is quoted; a watchdog
  timeout is an echo of an earlier failure, so it only decides the verdict when nothing specific came first;
- a known-benign warning is never a failure; a traceback that ends in KeyboardInterrupt is not a crash;
- slow is not hung: an advancing progress bar, rising GPU memory, growing CPU time or a new non-heartbeat log
  line within the phase's grace period is progress; repeated heartbeat lines are not;
- 100 % GPU utilization at low power with little memory is an NCCL spin, not work;
- silence is judged against a per-phase grace period (`grace_s`), not one blanket timeout.

A watcher builds one `Observation` per tick (from a probe `Snapshot`) and may pass the earlier ones as
`history`: trends it has not set itself (GPU memory rising, CPU time growing, progress counter advancing)
are then derived from them.

The package, by responsibility (a module imports only modules above it in this list):

- `observation`: the models (Observation, Verdict, ListenObs, ShmSegment, ContainerObs) and vocabularies;
- `signatures`: the compiled signature model and its loader (signatures.yaml -> Signatures);
- `logscan`: the log scanner (scan_log -> LogScan);
- `evidence`: evidence strings quoting what an observation and a scan show;
- `blocks`: multi-line error blocks (their head lines, the phase their words and frames name);
- `stacks`: what the ranks' py-spy dumps add to a hang (the cross-rank summary, the phase the frames show);
- `rules`: the decision rules (diagnose) and the verdict's terminal text (format_verdict).

Import the public names from here, `bot.core.diagnose`.
"""

from bot.core.diagnose.evidence import nccl_in_play
from bot.core.diagnose.logscan import LineMemo, LogScan, line_facts, scan_log
from bot.core.diagnose.observation import (
    CPU_PROGRESS_CORES,
    HEALTH_STATES,
    PHASES,
    VERDICTS,
    ContainerObs,
    ListenObs,
    Observation,
    ShmSegment,
    Verdict,
    cpu_progress,
)
from bot.core.diagnose.rules import (
    GENERATION_STUCK,
    STALLED_STATS_LINES,
    diagnose,
    format_verdict,
    stalled_stats,
)
from bot.core.diagnose.signatures import SIGNATURES, Signatures, load_signatures

__all__ = [
    "CPU_PROGRESS_CORES",
    "GENERATION_STUCK",
    "HEALTH_STATES",
    "PHASES",
    "SIGNATURES",
    "STALLED_STATS_LINES",
    "VERDICTS",
    "ContainerObs",
    "LineMemo",
    "ListenObs",
    "LogScan",
    "Observation",
    "ShmSegment",
    "Signatures",
    "Verdict",
    "cpu_progress",
    "diagnose",
    "format_verdict",
    "line_facts",
    "load_signatures",
    "nccl_in_play",
    "scan_log",
    "stalled_stats",
]
