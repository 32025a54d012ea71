"""Slurm, the cluster's own scheduler (pure): a launch's batch script, and what Slurm says of its job.

Formats, from Slurm 22.05 (`slurm-wlm` on Debian 12, a two-node cluster on one host, 2026-12-06):

- `sbatch --parsable` prints `JOBID` (or `JOBID;CLUSTER`) on success.
- `scontrol show job -o JOBID` prints one line per job of `Key=Value` pairs separated by spaces, e.g.
  `JobId=2 JobName=job.sh ... JobState=PENDING Reason=Resources Dependency=(null) ... ExitCode=0:0 RunTime=00:00:00
  TimeLimit=UNLIMITED ... NodeList= ... StdOut=/tmp/sl/job-2.out ...`; keys may hold `:` and `/` (`AllocNode:Sid`,
  `CPUs/Task`); an unknown job prints `slurm_load_jobs error: Invalid job id specified` on stderr.
- Job states (`JobState`): PENDING, CONFIGURING, RUNNING, COMPLETING, SUSPENDED, REQUEUED, and the ends COMPLETED,
  FAILED (`Reason=NonZeroExitCode`, `ExitCode=3:0`), CANCELLED (`ExitCode=0:15`: signal 15), TIMEOUT, NODE_FAIL,
  PREEMPTED, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE. `ExitCode=CODE:SIGNAL`.
- Durations (`RunTime`, `TimeLimit`): `[DD-]HH:MM:SS`, `MM:SS`, or `UNLIMITED`.
- `sacct -X -n -P -j JOBID -o JobID,State,ExitCode,Reason,NodeList,Elapsed,Timelimit,JobName` (sacct(1): `-X` the
  allocation only, `-n` no header, `-P` fields split by `|`) prints one line per job, e.g.
  `12|CANCELLED by 0|0:15|None|n[1-2]|00:01:07|01:00:00|base`; `State` may carry ` by UID`; an unknown job prints
  nothing; with accounting off it prints `Slurm accounting storage is disabled` and exits 1.
- `squeue -a -h --states=all -j ID,ID,... -O JobID:|,State:|,exit_code:|,NodeList:|,TimeUsed:|,TimeLimit:|,Reason:`
  (squeue(1) `--Format`, `:|` a field's suffix, no blank in the list; `-a` hidden partitions too) prints one line
  per job the controller still has, e.g.
  `2|FAILED|768|n1|0:00|365-00:00:00|NonZeroExitCode`; `exit_code` is the raw wait status
  (768: exit 3; 15: signal 15), as `ExitCode=3:0` / `0:15` says it; jobs it no longer has are left out, and when it
  has none of them it prints `slurm_load_jobs error: Invalid job id specified` on stderr and exits 1.

User-controlled fields (the job's name, its comment) are free text that may hold `Key=`, `|` and newlines (`scontrol
update JobName=...` by the job itself or anyone on its account): `squeue` is asked for Slurm's own fields only, the
reason (free text only where a plugin or an admin writes one) last; a `scontrol show job` record in which a field
gpubot reads appears twice, that lacks its `JobState`, or whose job id another record claims too, is ambiguous and
skipped; sacct's name comes last and its first line counts. Reasons are redacted before they are kept.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from bot.core.hostlist import expand_hostlist

if TYPE_CHECKING:  # the diagnosis compiles its signatures on import; check-config needs none of it
    from bot.core.diagnose import Verdict

__all__ = [
    "ACTIVE_STATES",
    "NODE_FAILED_STATES",
    "NodeState",
    "SbatchSpec",
    "SlurmError",
    "SlurmJob",
    "batch_script",
    "ended_verdict",
    "job_line",
    "job_verdict",
    "parse_sacct",
    "parse_sbatch",
    "parse_show_job",
    "parse_sinfo_nodes",
    "parse_squeue",
    "pending_text",
    "sbatch_problems",
    "sinfo_format",
]

#: States of a job that has not ended (it may still start or run).
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
                           "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED"})
#: `--name=value` options of `extra_sbatch` that gpubot sets itself or that would run something else.
_OWN_OPTIONS = frozenset({"wrap", "output", "error", "input", "job-name", "nodes", "gres", "gpus-per-node",
                          "ntasks-per-node", "partition", "time", "account", "uid", "gid", "chdir", "parsable",
                          "export", "export-file", "get-user-env", "test-only", "wait", "hold", "array"})
_OPTION_RE = re.compile(r"--([a-z][a-z0-9-]{0,40})(?:=([^\x00-\x1f\x7f]{1,200}))?")
_TIME_RE = re.compile(r"(?:(\d{1,3})-)?(?:(\d{1,2}):)?(\d{1,4})(?::(\d{1,2}))?")
#: Where a `Key=` begins (at the start or after whitespace): a value runs to the next one (it may hold spaces).
_KEY_RE = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_:/]*)=")


def _pairs(line: str) -> list[tuple[str, str]]:
    """`Key=value` pairs of one `scontrol show job -o` line, in order; each value up to the next key, its trailing
    spaces cut (one pass: linear in the line, whatever runs of spaces a job's comment holds)."""
    keys = list(_KEY_RE.finditer(line))
    return [(m.group(1), line[m.end():keys[i + 1].start() if i + 1 < len(keys) else len(line)].rstrip())
            for i, m in enumerate(keys)]
_JOB_ID_RE = re.compile(r"([0-9]{1,12})(?:;\S+)?")


class SlurmError(ValueError):
    """Slurm answered something gpubot cannot use; str() says what, with Slurm's own words."""


@dataclass(frozen=True)
class SbatchSpec:
    """A Slurm launch's allocation: `nodes`, `gpus_per_node` (one task per node), and the optional `partition`,
    `time` (Slurm's `[DD-]HH:MM:SS` or minutes), `account` and `extra_sbatch` (`--name=value` options, checked by
    `sbatch_problems`)."""

    nodes: int = 1
    gpus_per_node: int = 0
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    extra_sbatch: tuple[str, ...] = ()


def sbatch_problems(spec: SbatchSpec) -> list[str]:
    """Why `spec` cannot become sbatch options (empty when it can): nodes 1..1024, gpus_per_node 0..64, a partition
    or account that is a plain name, a time Slurm reads, and extra options that are `--name[=value]`, one line,
    and not one gpubot sets itself or one that would run another command (`--wrap`, `--output`, ...)."""
    out = []
    if not 1 <= spec.nodes <= 1024:
        out.append("nodes must be 1..1024")
    if not 0 <= spec.gpus_per_node <= 64:
        out.append("gpus_per_node must be 0..64")
    for name, value in (("partition", spec.partition), ("account", spec.account)):
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", value):
            out.append(f"{name} must be a plain name (letters, digits, _ . -)")
    if spec.time is not None and (spec.time == "UNLIMITED" or not _TIME_RE.fullmatch(spec.time)):
        out.append("time must be minutes or [DD-]HH:MM:SS, like 4:00:00 or 1-00:00:00")
    for opt in spec.extra_sbatch:
        m = _OPTION_RE.fullmatch(opt)
        if m is None:
            out.append(f"extra_sbatch: {opt[:60]!r} is not one --name or --name=value option on one line")
        elif m.group(1).startswith("container"):  # --container (OCI), pyxis' --container-image/-mounts/-name...
            out.append(f"extra_sbatch: --{m.group(1)} would run the job's steps in another container than the one "
                       f"the variant's command was checked for; set the image in the variant's command instead")
        elif any(own.startswith(m.group(1)) for own in _OWN_OPTIONS) or (m.group(2) and re.search(r"\s", m.group(2))):
            # sbatch takes any unambiguous prefix of a long option (`--out=` is `--output=`) and splits a #SBATCH
            # line at blanks (`--comment=x --output=y` sets both)
            out.append(f"extra_sbatch: --{m.group(1)} is (a prefix of) an option gpubot sets or one that would run "
                       f"something else, or its value has blanks; use the variant's own keys")
    return out


def batch_script(spec: SbatchSpec, command: str, *, job_name: str, output: str, env: Mapping[str, str],
                 master_port: int, log_path: str | None = None, rank_logs: tuple[str, str] | None = None,
                 tag_var: str | None = None, workdir: str | None = None) -> str:
    """The batch script of one launch (POSIX sh): the `#SBATCH` lines of `spec` (one task per node, its GPUs with
    `--gres=gpu:N`), `env` exported, then one `srun` step across the allocation that runs `command` (already
    rendered and quoted) on every node, with `GPUBOT_NODE_RANK` (`SLURM_NODEID`), `GPUBOT_NNODES`,
    `GPUBOT_MASTER_ADDR` (the address of the allocation's first node, its NodeAddr) and `GPUBOT_MASTER_PORT` set
    for it. `output` is the batch script's own `--output` (`%j` the job id). With `log_path`, rank 0 appends its
    output there and rank K to `<rank_logs[0]>K<rank_logs[1]>` (bot.core.ranks.rank_log); without, every rank's
    output goes to `output`. With `tag_var`, ranks above 0 get `-rK` appended to that variable
    (bot.core.ranks.rank_tag). `workdir`: the directory the step runs in. `--kill-on-bad-exit` ends the step when
    one rank fails. Raises SlurmError for a spec that `sbatch_problems` refuses."""
    problems = sbatch_problems(spec)
    if problems:
        raise SlurmError("; ".join(problems))
    lines = ["#!/bin/sh", f"#SBATCH --job-name={shlex.quote(job_name)}", f"#SBATCH --nodes={spec.nodes}",
             "#SBATCH --ntasks-per-node=1", f"#SBATCH --output={shlex.quote(output)}"]
    if spec.gpus_per_node:
        lines.append(f"#SBATCH --gres=gpu:{spec.gpus_per_node}")
    for key, value in (("partition", spec.partition), ("time", spec.time), ("account", spec.account)):
        if value is not None:
            lines.append(f"#SBATCH --{key}={value}")
    lines += [f"#SBATCH {opt}" for opt in spec.extra_sbatch]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items() if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
    if workdir:
        lines.append(f"cd {shlex.quote(workdir)} || exit 1")
    step = ["GPUBOT_NODE_RANK=$SLURM_NODEID; export GPUBOT_NODE_RANK"]
    if tag_var and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", tag_var):
        step.append(f'[ "$SLURM_NODEID" = 0 ] || {tag_var}="${{{tag_var}}}-r$SLURM_NODEID"; export {tag_var}')
    if log_path:
        stem, ext = rank_logs or (log_path + ".rank", "")
        step.append(f'if [ "$SLURM_NODEID" = 0 ]; then exec >>{shlex.quote(log_path)} 2>&1; else exec '
                    f'>>{shlex.quote(stem)}"$SLURM_NODEID"{shlex.quote(ext) if ext else ""} 2>&1; fi')
    step.append(f"exec {command}")
    lines += [
        'GPUBOT_MASTER_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        # the node's address as Slurm reaches it (NodeAddr), else its name
        "GPUBOT_MASTER_ADDR=$(scontrol show node -o \"$GPUBOT_MASTER_NODE\" 2>/dev/null | "
        "sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')",
        '[ -n "$GPUBOT_MASTER_ADDR" ] || GPUBOT_MASTER_ADDR=$GPUBOT_MASTER_NODE',
        f"export GPUBOT_MASTER_ADDR GPUBOT_MASTER_PORT={int(master_port)} GPUBOT_NNODES=$SLURM_JOB_NUM_NODES",
        "exec srun --kill-on-bad-exit=1 sh -c " + shlex.quote("; ".join(step)),
    ]
    return "\n".join(lines) + "\n"


def parse_sbatch(stdout: str) -> str:
    """The job id `sbatch --parsable` printed (`1234` or `1234;cluster`). Raises SlurmError otherwise, with the
    output's first line."""
    line = (stdout or "").strip().splitlines()[-1:] or [""]
    m = _JOB_ID_RE.fullmatch(line[0].strip())
    if m is None:
        raise SlurmError(f"sbatch did not print a job id: {line[0][:200]!r}")
    return m.group(1)


def _seconds(text: str | None) -> int | None:
    """Seconds of a Slurm duration (`1-02:03:04`, `02:03:04`, `03:04`), None for UNLIMITED or anything else."""
    if not text:
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if m is None:
        return None
    d, h, mi, s = (int(x) if x else 0 for x in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


@dataclass(frozen=True)
class SlurmJob:
    """One job as `scontrol show job -o` gives it: `state` (JobState), `reason` (None for `None`), `nodes` (NodeList
    expanded; empty while it is pending), `exit_code` and `signal` (from `ExitCode=CODE:SIGNAL`), `run_time_s` and
    `time_limit_s` (seconds; None for UNLIMITED), `restarts` (how often Slurm requeued it: scontrol's `Restarts`,
    squeue's `RestartCnt`; None where not read), `stdout` (StdOut), `fields` every pair as printed (scontrol's keys),
    `source` the command that said it (`scontrol show job`, or `sacct -j` for a job scontrol had forgotten)."""

    job_id: str
    name: str = ""
    state: str = "UNKNOWN"
    reason: str | None = None
    nodes: tuple[str, ...] = ()
    exit_code: int | None = None
    signal: int | None = None
    run_time_s: int | None = None
    time_limit_s: int | None = None
    restarts: int | None = None
    stdout: str | None = None
    fields: Mapping[str, str] = field(default_factory=dict)
    source: str = "scontrol show job"

    @property
    def active(self) -> bool:
        """True while the job has not ended (pending, starting, running, completing, suspended, requeued)."""
        return self.state in ACTIVE_STATES

    @property
    def pending(self) -> bool:
        """True while Slurm has not started it (it waits in the queue: never a hang)."""
        return self.state == "PENDING"


def _job_records(text: str) -> list[str]:
    """One record per job: `scontrol show job -o` prints a job per line, plain `scontrol show job` (Slurm 22.05 and
    later, as a user pastes it) a first line at column 0 (`JobId=...`) and indented lines that go on with it. A line
    that does not begin with `JobId=` goes on with the record before it (a newline inside a job's name or comment
    cannot start a record of its own where it does not say `JobId=`). Lines are split at `\n` only (Slurm's own);
    linear in the text."""
    records: list[list[str]] = []
    for line in (text or "").split("\n"):
        line = line.rstrip("\r")
        if records and not line.lstrip().startswith("JobId="):
            if line.strip():
                records[-1].append(line.strip())
        else:
            records.append([line])
    return [" ".join(r) for r in records]


def _digits(text: str) -> bool:
    """True for ASCII digits only (`"²".isdigit()` is True, and int() refuses it), at most 18 of them (Slurm's
    numbers fit in 64 bits; int() refuses more than 4300 digits)."""
    return text.isascii() and text.isdigit() and len(text) <= 18


#: The keys of a `scontrol show job` record gpubot reads: each must appear once (a second one came from free text).
_READ_KEYS = ("JobId", "JobState", "Reason", "ExitCode", "RunTime", "TimeLimit", "NodeList", "Restarts")


def _redacted(reason: str | None) -> str | None:
    """Slurm's reason as kept: None for `None`/`(null)`/empty, else with secrets masked (bot.core.redact; imported
    here: check-config imports this module and needs none of it)."""
    if reason in (None, "", "None", "(null)"):
        return None
    from bot.core.redact import redact
    return redact(reason)


def _job(pairs: dict[str, str], source: str) -> SlurmJob:
    """A SlurmJob of scontrol's keys (`JobId`, `JobState`, `ExitCode=CODE:SIGNAL`, ...), its reason redacted."""
    code, _, sig = pairs.get("ExitCode", "").partition(":")
    state = pairs.get("JobState", "").split()[0] if pairs.get("JobState", "").split() else "UNKNOWN"
    reason = _redacted(pairs.get("Reason"))
    if "Reason" in pairs:
        pairs["Reason"] = reason or "None"
    return SlurmJob(
        job_id=pairs["JobId"], name=pairs.get("JobName", ""), state=state, reason=reason,
        nodes=tuple(expand_hostlist(pairs.get("NodeList", ""))),
        exit_code=int(code) if _digits(code) else None, signal=int(sig) if _digits(sig) else None,
        run_time_s=_seconds(pairs.get("RunTime")), time_limit_s=_seconds(pairs.get("TimeLimit")),
        restarts=int(pairs["Restarts"]) if _digits(pairs.get("Restarts", "")) else None,
        stdout=pairs.get("StdOut") or None, fields=pairs, source=source)


def parse_show_job(text: str) -> list[SlurmJob]:
    """The jobs of `scontrol show job -o` output (one line each), or of plain `scontrol show job` (each job's indented
    lines joined to it); lines without `JobId=` are skipped, and so is what is ambiguous: a record without a
    `JobState`, one in which a key gpubot reads (_READ_KEYS) appears twice (a job name or comment holding `JobState=`
    or a newline), and every record of a job id that more than one record claims. Never raises."""
    jobs: list[SlurmJob] = []
    claimed: dict[str, int] = {}
    for line in _job_records(text):
        pairs: dict[str, str] = {}
        seen: dict[str, int] = {}
        for key, value in _pairs(line):  # the first of a key wins: a later `StdOut=` path cannot forge one
            pairs.setdefault(key, value)
            seen[key] = seen.get(key, 0) + 1
        job_id = pairs.get("JobId", "")
        if _digits(job_id):
            claimed[job_id] = claimed.get(job_id, 0) + 1
        if not _digits(job_id) or "JobState" not in pairs or any(seen.get(k, 0) > 1 for k in _READ_KEYS):
            continue
        jobs.append(_job(pairs, "scontrol show job"))
    return [j for j in jobs if claimed[j.job_id] == 1]


#: The fields gpubot asks `squeue -O` for, in order: Slurm's own only (no name, no comment: nothing a job's user
#: writes), the reason last (Slurm's code, but free text where a plugin or an admin sets one: a `|` or a newline in
#: it can only add text after the job's own fields).
SQUEUE_FIELDS = ("JobID", "State", "exit_code", "NodeList", "TimeUsed", "TimeLimit", "RestartCnt", "Reason")
_SQUEUE_AS_SCONTROL: Mapping[str, str] = MappingProxyType(
    {"JobID": "JobId", "State": "JobState", "TimeUsed": "RunTime", "RestartCnt": "Restarts"})
_STATE_RE = re.compile(r"[A-Z][A-Z_]{1,30}")


def squeue_format() -> str:
    """The `-O` argument that prints SQUEUE_FIELDS split by `|` (parse_squeue reads it)."""
    return ",".join(f"{f}:|" for f in SQUEUE_FIELDS[:-1]) + f",{SQUEUE_FIELDS[-1]}:"


def parse_squeue(text: str, job_ids: Sequence[str]) -> dict[str, SlurmJob]:
    """Job id -> the job, of `squeue -h --states=all -j ... -O squeue_format()` output, for the jobs of `job_ids` it
    lists (a job the controller no longer has is left out), each under scontrol's keys (`JobState`, `ExitCode=3:0`
    from the wait status 768, `RunTime`), `source` `squeue -j`. A line not of that shape (a field count, a job id, a
    state, a status) is skipped; the first line of a job counts (its reason comes last: a newline in it can only add
    lines after the job's own). Lines split at `\n` only. Never raises."""
    wanted = {str(j) for j in job_ids}
    found: dict[str, SlurmJob] = {}
    for line in (text or "").split("\n"):
        parts = line.rstrip("\r").split("|", len(SQUEUE_FIELDS) - 1)
        if len(parts) != len(SQUEUE_FIELDS):
            continue
        raw = dict(zip(SQUEUE_FIELDS, (x.strip() for x in parts), strict=True))
        job_id, status = raw["JobID"], raw.pop("exit_code")
        if job_id not in wanted or job_id in found or not _STATE_RE.fullmatch(raw["State"]) or not _digits(status):
            continue
        pairs = {_SQUEUE_AS_SCONTROL.get(k, k): v for k, v in raw.items()}
        pairs["ExitCode"] = f"{int(status) >> 8 & 0xFF}:{int(status) & 0x7F}"
        found[job_id] = _job(pairs, "squeue -j")
    return found


#: The fields gpubot asks `sacct` for, in order (the job's name last: it may hold the `|` that splits them).
SACCT_FIELDS = ("JobID", "State", "ExitCode", "Reason", "NodeList", "Elapsed", "Timelimit", "JobName")
#: scontrol's key for each sacct field, so that a job read from either says the same (`job_line`, `ended_verdict`).
_SACCT_AS_SCONTROL: Mapping[str, str] = MappingProxyType(
    {"JobID": "JobId", "State": "JobState", "Elapsed": "RunTime", "Timelimit": "TimeLimit"})


def parse_sacct(text: str, job_id: str) -> SlurmJob | None:
    """Job `job_id` as `sacct -X -n -P -o` SACCT_FIELDS prints it (without `-D`, one line: a requeued job's latest
    run), its fields under scontrol's keys (`JobState`, `RunTime`, ...) and `source` `sacct -j`; None when sacct
    printed no line of it. `State` loses its ` by UID`. The first line of the job counts: its name comes last, so a
    newline in it can only add lines after the real one. Never raises."""
    found = None
    for line in (text or "").split("\n"):
        if found is not None:
            break
        parts = line.rstrip("\r").split("|", len(SACCT_FIELDS) - 1)
        if len(parts) != len(SACCT_FIELDS) or parts[0].strip() != job_id:
            continue
        raw = dict(zip(SACCT_FIELDS, (x.strip() for x in parts), strict=True))
        fields = {_SACCT_AS_SCONTROL.get(k, k): v for k, v in raw.items()}
        fields["JobState"] = fields["JobState"].split()[0] if fields["JobState"] else "UNKNOWN"
        if fields["NodeList"].startswith("None"):  # `None assigned`: it never ran
            fields["NodeList"] = ""
        found = fields
    if found is None:
        return None
    found["JobId"] = job_id
    return replace(_job(found, "sacct -j"), name=found["JobName"])


#: What common pending reasons mean (Slurm's `squeue --help`/`man squeue` JOB REASON CODES), for the thread.
_PENDING_REASONS: Mapping[str, str] = MappingProxyType({
    "Resources": "waiting for nodes or GPUs to free up",
    "Priority": "higher-priority jobs are ahead of it",
    "Dependency": "waiting for a job it depends on",
    "BeginTime": "its start time has not come",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
    "PartitionTimeLimit": "its time limit is over the partition's: it will never start",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows: it will never start",
    "PartitionConfig": "it asks for more than the partition has (nodes, GPUs): it will never start",
    "QOSMaxGRESPerUser": "the user's GPU quota (QOS) is used up",
    "AssocGrpGRES": "the account's GPU quota is used up",
    "JobHeldUser": "held by its user",
    "JobHeldAdmin": "held by an administrator",
    "Reservation": "waiting for its reservation",
    "launch failed requeued held": "its start failed and Slurm held it",
})


#: The fields gpubot asks `sinfo -N -O` for, in order (the reason last: an admin's free text).
SINFO_FIELDS = ("NodeList", "StateLong", "Reason")
#: Node states (sinfo's StateLong, each part of a `+` compound) that take a node out of its jobs: its jobs are
#: killed or requeued (slurm.conf ReturnToService, sinfo(1) NODE STATE CODES, Slurm 22.05).
NODE_FAILED_STATES = frozenset({"down", "drain", "drained", "draining", "fail", "failing", "not_responding",
                                "inval", "reboot_issued", "reboot_requested", "power_down", "powered_down"})
_NODE_STATE_RE = re.compile(r"[a-z_]+(?:\+[a-z_]+)*")


@dataclass(frozen=True)
class NodeState:
    """One node as `sinfo -N` says it: `state` (StateLong without its flag suffix: `down`, `idle+drain`, ...),
    `reason` (an admin's or Slurm's reason, redacted; None when none)."""

    node: str
    state: str
    reason: str | None = None

    @property
    def failed(self) -> bool:
        """True when the state takes the node out of its jobs (NODE_FAILED_STATES)."""
        return any(part in NODE_FAILED_STATES for part in self.state.split("+"))

    def text(self) -> str:
        """`n2 is down (Slurm's reason: `maintenance`)`."""
        reason = (self.reason or "")[:120].replace("`", "'")  # a backtick would end the quote
        return f"{self.node} is {self.state}" + (f" (Slurm's reason: `{reason}`)" if reason else "")


def sinfo_format() -> str:
    """The `-O` argument that prints SINFO_FIELDS split by `|` (parse_sinfo_nodes reads it)."""
    return ",".join(f"{f}:|" for f in SINFO_FIELDS[:-1]) + f",{SINFO_FIELDS[-1]}:"


def parse_sinfo_nodes(text: str, nodes: Sequence[str]) -> dict[str, NodeState]:
    """Node -> its state, of `sinfo -h -N -n NODES -O sinfo_format()` output, for the `nodes` asked for: a line not
    of that shape (a field count, an asked node, a state of lowercase words joined by `+`, after its flag suffix
    `*~#!%$@^-` is dropped) is skipped, the first line of a node counts (a node in two partitions is listed twice),
    the reason is redacted. Never raises."""
    wanted = set(nodes)
    found: dict[str, NodeState] = {}
    for line in (text or "").split("\n"):
        parts = line.rstrip("\r").split("|", len(SINFO_FIELDS) - 1)
        if len(parts) != len(SINFO_FIELDS):
            continue
        node, state, reason = (x.strip() for x in parts)
        state = state.rstrip("*~#!%$@^-")
        if node not in wanted or node in found or not _NODE_STATE_RE.fullmatch(state):
            continue
        found[node] = NodeState(node, state, None if reason == "none" else _redacted(reason))
    return found


def pending_text(job: SlurmJob) -> str:
    """`PENDING (Resources: waiting for nodes or GPUs to free up)`: Slurm's reason and what it means."""
    reason = job.reason or "not looked at by the scheduler yet"
    meaning = _PENDING_REASONS.get(reason.split(",")[0])
    return f"PENDING ({reason}{': ' + meaning if meaning else ''})"


def ended_verdict(job: SlurmJob) -> tuple[str, str]:
    """(verdict, summary) of a job that ended by itself or was ended by Slurm: `time_limit`, `node_fail`,
    `preempted`, `host_oom`, `cancelled`, `crashed` (a non-zero exit or a signal), `exited` (exit 0), `boot_fail`,
    `deadline`; ("unknown", ...) for a state gpubot does not know. Summaries quote Slurm's state, reason and exit
    code."""
    code = "" if job.exit_code is None else f", exit code {job.exit_code}"
    sig = f", signal {job.signal}" if job.signal else ""
    said = f"Slurm says {job.state}" + (f" ({job.reason})" if job.reason else "") + code + sig
    limit = f" of {job.fields.get('TimeLimit')}" if job.fields.get("TimeLimit") else ""
    table: Mapping[str, tuple[str, str]] = {
        "TIMEOUT": ("time_limit", f"Slurm ended the job at its time limit{limit}"),
        "DEADLINE": ("deadline", "Slurm ended the job at its deadline"),
        "NODE_FAIL": ("node_fail", "a node of the job failed and Slurm ended it"),
        "BOOT_FAIL": ("boot_fail", "a node of the job failed to boot"),
        "PREEMPTED": ("preempted", "a job of higher priority preempted it"),
        # host memory: Slurm's cgroup limit on RAM, never GPU memory (`oom` is the GPU's)
        "OUT_OF_MEMORY": ("host_oom", "Slurm killed it for using more host memory than it was allocated"),
        "CANCELLED": ("cancelled", "the job was cancelled (scancel)"),
        "COMPLETED": ("exited", "the job ended by itself with exit code 0"),
    }
    if job.state in table:
        verdict, what = table[job.state]
        return verdict, f"{what}: {said}"
    if job.state == "FAILED":
        return "crashed", f"the job's command failed: {said}"
    return "unknown", said


def job_nodes_text(job: SlurmJob, shown: Sequence[str] | None = None) -> str:
    """`RUNNING on n1, n2` (at most 8 nodes named, then a count), or the pending text."""
    if job.pending:
        return pending_text(job)
    nodes = list(shown if shown is not None else job.nodes)
    named = ", ".join(nodes[:8]) + (f" +{len(nodes) - 8}" if len(nodes) > 8 else "")
    return f"{job.state} on {named}" if named else job.state


#: What to do after a Slurm job ended by each verdict (ended_verdict).
SLURM_NEXT_STEPS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "time_limit": ("Relaunch with a longer `time:` in the variant (or a partition that allows it)",
                   "Read the ranks' logs to see how far it got"),
    "node_fail": ("Relaunch: Slurm places it on nodes that work", "Tell the cluster's admins which node failed"),
    "boot_fail": ("Relaunch: Slurm places it on nodes that work", "Tell the cluster's admins which node failed"),
    "preempted": ("Relaunch, or use a partition or QOS that is not preempted",),
    "host_oom": ("Ask Slurm for more host memory (`extra_sbatch: [--mem=...]`) and relaunch",),
    "cancelled": ("Someone cancelled the job outside gpubot (scancel): ask in the channel before relaunching",),
    "deadline": ("Relaunch with a later deadline",),
    "exited": ("Relaunch when you want it serving again",),
    "crashed": ("Read the ranks' logs (`/logs`) for the error, fix it and relaunch",),
    "unknown": ("Read the ranks' logs (`/logs`) and `scontrol show job` on the login node",),
})
_SHOWN_FIELDS = ("JobState", "Reason", "ExitCode", "RunTime", "TimeLimit", "NodeList")


def job_line(job: SlurmJob) -> str:
    """One evidence line: `` `scontrol show job 12`: JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15 ...``."""
    return f"`{job.source} {job.job_id}`: " + " ".join(
        f"{k}={job.fields[k]}" for k in _SHOWN_FIELDS if k in job.fields)


def job_verdict(job: SlurmJob | None, job_id: str, evidence: Sequence[str] = ()) -> Verdict:
    """The verdict of a job Slurm ended (ended_verdict; None: Slurm forgot it and sacct has no record, `unknown`),
    with its `scontrol` (or `sacct`) line and `evidence` (the ranks' last looks), and what to do next
    (SLURM_NEXT_STEPS)."""
    from bot.core.diagnose import Verdict
    if job is None:
        name, summary, said = "unknown", (f"Slurm no longer knows job {job_id} (it ended longer ago than the "
                                          "controller keeps jobs) and has no accounting of it: how it ended is "
                                          "unknown"), []
    else:
        (name, summary), said = ended_verdict(job), [job_line(job)]
    return Verdict(verdict=name, phase=None, evidence=[*said, *evidence],
                   next_steps=list(SLURM_NEXT_STEPS.get(name, SLURM_NEXT_STEPS["crashed"])), summary=summary)
