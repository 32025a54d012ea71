"""A launch across nodes (pure): its ranks, one per node (a Slurm job's allocation, or a multi-host SSH variant's
hosts), each seen as a launch of its own on its node, and the verdict that weighs every node's evidence and names
the node and rank that is odd.

Rank K's processes carry the launch tag `<tag>-rK` (rank 0: the launch's own tag), so two ranks on one machine are
still told apart; rank K writes its log to `<stem>-rankK<ext>` beside the launch's log (rank 0: the launch's log).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from bot.core.models import Launch
from bot.core.parse.log import strip_control
from bot.core.slurm import SlurmJob, job_line, job_verdict, parse_show_job, pending_text

if TYPE_CHECKING:  # the diagnosis compiles its signatures on import; rendering a launch needs none of it
    from bot.core.diagnose import Observation, Verdict

__all__ = [
    "NodeLook",
    "base_tag",
    "job_end_verdict",
    "look_of",
    "most_specific_failure",
    "odd_rank",
    "parse_ranks",
    "rank_log",
    "rank_log_parts",
    "rank_tag",
    "rank_view",
    "weigh_bundle",
    "weigh_nodes",
]

#: A bundle of a launch across nodes: rank 0's files at its top, every other rank's in `node-NAME/`, which rank
#: is on which node in `ranks.txt` (`K NAME` lines), and a Slurm job's `scontrol show job -o` in `scontrol.txt`.
NODE_DIR_PREFIX = "node-"
RANKS_FILE = "ranks.txt"
SCONTROL_FILE = "scontrol.txt"


def _secs(s: float) -> str:
    """`42s`, `3m12s`, `1h05m`: a duration for an evidence line."""
    s = int(max(0.0, s))
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


_RANK_TAG_RE = re.compile(r"^(.+)-r[0-9]{1,4}$")
#: Seconds by which one rank's log must have gone silent before the others' for it to be named as the odd one.
ODD_SILENCE_GAP_S = 1.0


def rank_tag(tag: str, rank: int) -> str:
    """The launch tag rank `rank`'s processes carry: `tag` for rank 0, `<tag>-rK` for rank K."""
    return tag if rank == 0 or not tag else f"{tag}-r{rank}"


def base_tag(tag: str) -> str:
    """The launch's own tag of a rank's tag (`12-ab..-r3` -> `12-ab..`); any other tag as it is."""
    m = _RANK_TAG_RE.match(tag)
    return m.group(1) if m else tag


def rank_log_parts(log_path: str) -> tuple[str, str]:
    """(prefix, suffix) of the ranks' logs beside `log_path`: rank K's is prefix + K + suffix."""
    head, _, name = log_path.rpartition("/")
    stem, dot, ext = name.rpartition(".") if "." in name.lstrip(".") else (name, "", "")
    return f"{head}/{stem}-rank", f"{dot}{ext}"


def rank_log(log_path: str | None, rank: int) -> str | None:
    """Rank `rank`'s log: the launch's log for rank 0, `<stem>-rankK<ext>` beside it for rank K."""
    if not log_path or rank == 0:
        return log_path
    prefix, suffix = rank_log_parts(log_path)
    return f"{prefix}{rank}{suffix}"


def rank_view(la: Launch, rank: int, host: str) -> Launch:
    """Rank `rank` of a launch across nodes as a launch on `host` (the node's host in the config): its tag, its log,
    the port only on rank 0 (where the server answers), and none of the launch's recorded processes but rank 0's
    of a multi-host SSH launch (its server and wrapper). Same id: what a check learns is the launch's."""
    own = rank == 0 and not la.job_id
    return replace(la, host=host, tag=rank_tag(la.tag, rank), log_path=rank_log(la.log_path, rank),
                   port=la.port if rank == 0 else None, pid=la.pid if own else None, pgid=la.pgid if own else None,
                   sid=la.sid if own else None, seen_pids=dict(la.seen_pids) if own else {},
                   seen_starts=dict(la.seen_starts) if own else {}, unit=la.unit if own else None,
                   unit_manager=la.unit_manager if own else None, job_id=None, nodes=[])


@dataclass(frozen=True)
class NodeLook:
    """What one check saw of one rank: `rank`, `node` (its node name), `alive` (processes of the rank run; None:
    the node could not be read, `error` says why), `silent_s` (seconds since its log last grew; None: unknown),
    `last_line` (its log's last line), `gpu_util` (mean % over the GPUs its processes hold; None: unknown) and
    `verdict` (its own verdict by the single-host rules, for rank 0 the launch's)."""

    rank: int
    node: str
    alive: bool | None
    silent_s: float | None = None
    last_line: str | None = None
    gpu_util: float | None = None
    verdict: str | None = None
    error: str | None = None

    def line(self) -> str:
        """One evidence line: `rank 1 on n2: running, log silent for 42s (last: `...`), GPU 0 %`."""
        if self.alive is None:
            return f"rank {self.rank} on {self.node}: could not be read ({(self.error or '?')[:120]})"
        parts = ["running" if self.alive else "no process left"]
        if self.silent_s is not None:
            parts.append(f"log silent for {_secs(self.silent_s)}")
        if self.last_line:
            parts.append(f"last line `{self.last_line.strip()[:160]}`")
        if self.gpu_util is not None:
            parts.append(f"GPU {self.gpu_util:.0f} %")
        return f"rank {self.rank} on {self.node}: " + ", ".join(parts)


def look_of(obs: Observation, rank: int, node: str, verdict: str | None = None) -> NodeLook:
    """What one rank's Observation (a bundle's `node-NAME/` folder, or its top level for rank 0) says of it: whether
    its processes run, its log's silence, its last line and its GPUs' mean utilisation (the GPUs its processes
    hold, else every GPU the observation lists)."""
    held = {gp.gpu_index for gp in obs.gpu_processes or ()
            if gp.gpu_index is not None and (obs.launch_pids is None or gp.pid in obs.launch_pids)}
    utils = [g.utilization_gpu_pct for g in obs.gpus or () if (not held or g.index in held)
             and g.utilization_gpu_pct is not None]
    last = next((ln for ln in reversed(obs.log_lines or []) if ln.strip()), None)
    return NodeLook(rank, node, obs.process_alive, silent_s=obs.log_silent_s, last_line=last,
                    gpu_util=sum(utils) / len(utils) if utils else None, verdict=verdict,
                    error=None if obs.process_alive is not None else "its processes are not in the bundle")


def odd_rank(looks: Sequence[NodeLook]) -> tuple[NodeLook, str] | None:
    """The rank that is odd among `looks` and why, or None when none stands out: a rank with no process left while
    others run; else a rank whose own verdict is a failure while rank 0's is not; else the rank whose log went silent
    first, ODD_SILENCE_GAP_S or more before every other rank's."""
    if len(looks) < 2:
        return None
    gone = [x for x in looks if x.alive is False]
    if gone and len(gone) < len(looks):
        return gone[0], "its processes are gone while the other ranks run"
    unread = [x for x in looks if x.alive is None]
    if unread and len(unread) < len(looks):
        return unread[0], "its node could not be read"
    quiet = sorted((x for x in looks if x.silent_s is not None), key=lambda x: -(x.silent_s or 0.0))
    if len(quiet) == len(looks) and (quiet[0].silent_s or 0.0) - (quiet[1].silent_s or 0.0) >= ODD_SILENCE_GAP_S:
        return quiet[0], f"its log went silent first, {_secs((quiet[0].silent_s or 0) - (quiet[1].silent_s or 0))} " \
                         "before the other ranks'"
    return None


def weigh_nodes(verdict: Verdict, looks: Sequence[NodeLook], failed: tuple[int, str, Verdict] | None = None
                ) -> Verdict:
    """Rank 0's verdict (`verdict`, by the single-host rules) weighed with every rank's evidence (`looks`, rank
    order): one evidence line per rank first, and for any verdict but ready or loading the odd rank named in the
    summary (`rank 1 on node n2 went silent first ...`) with a next step to look at its node. A rank whose processes
    are gone while rank 0 still looks fine (or hangs, waiting for it) makes the launch fail: by that rank's own
    verdict where its log says why
    (`failed`: rank, node and the verdict of its own log, one of RANK_FAILURES: its OOM, its crash, with its phase),
    else `crashed`. Returns a new Verdict."""
    if len(looks) < 2:
        return verdict
    lines = [x.line() for x in looks]
    odd = odd_rank(looks)
    summary, steps, name = verdict.summary, list(verdict.next_steps), verdict.verdict
    own = _own_failure(failed)
    gone = {x.rank for x in looks if x.alive is False}
    # rank 0 fine, or hung waiting for the rank that is gone (in a collective, a barrier): the gone rank's own
    # failure is why
    if own is not None and own[0] != 0 and own[0] in gone and 0 not in gone and \
            name in ("ready", "loading", "unknown", "silent_hang"):
        rank, node, v = own
        return replace(v, summary=f"Rank {rank} on node {node}: {v.summary.rstrip()} Its processes are gone while "
                                  f"rank 0 still runs.",
                       evidence=[*lines, *v.evidence],
                       next_steps=[f"Look at node {node} (rank {rank}): its log and GPUs", *v.next_steps])
    if name in RANK_FAILURES and name != "nccl_error" and verdict.confidence != "low":
        # rank 0's own log shows the failure: it is named, and the ranks that went down after it are its echo (an
        # NCCL error is often the echo of another rank's end: there the odd rank is named below)
        summary = f"Rank 0 on node {looks[0].node}: {summary.rstrip()}"
        steps.insert(0, f"Look at node {looks[0].node} (rank 0): its log and GPUs")
        return replace(verdict, summary=summary, evidence=[*lines, *verdict.evidence], next_steps=steps)
    if odd is not None and odd[0].rank != 0 and odd[0].alive is False and name in ("ready", "loading", "unknown"):
        name = "crashed"
        summary = f"rank {odd[0].rank} on node {odd[0].node} is gone while rank 0 still runs."
    if odd is not None and name not in ("ready", "loading"):
        look, why = odd
        summary = f"{summary.rstrip()} Odd one out: rank {look.rank} on node {look.node} ({why})."
        steps.insert(0, f"Look at node {look.node} (rank {look.rank}): its log and `py-spy dump` of its ranks")
    return replace(verdict, verdict=name, summary=summary, evidence=[*lines, *verdict.evidence], next_steps=steps)


#: Ends that are Slurm's own doing: what the ranks' logs show then (NCCL errors, a SIGTERM) is its consequence.
SLURM_OWN_ENDS = frozenset({"time_limit", "deadline", "node_fail", "boot_fail", "preempted", "cancelled",
                            "host_oom"})
#: A rank's own verdict that says why a job ended (a failure its log shows), where Slurm only records an exit: the
#: most specific first (the other ranks see one rank's OOM as a crash of theirs or an NCCL timeout).
RANK_FAILURE_ORDER = ("oom", "host_oom", "gpu_lost", "cuda_error", "port_in_use", "crashed", "nccl_error")
RANK_FAILURES = frozenset(RANK_FAILURE_ORDER)


def job_end_verdict(job: SlurmJob | None, job_id: str, looks: Sequence[NodeLook] = (),
                    failed: tuple[int, str, Verdict] | None = None) -> Verdict:
    """The verdict of a job Slurm has ended: Slurm's (job_verdict: a time limit, a preemption, a node failure, a
    cancel, its host-memory limit), unless Slurm only records that the job failed or exited while a rank's own log
    says why (`failed`: rank, node and that rank's verdict, one of RANK_FAILURES): then the rank's verdict and phase,
    its summary naming the rank and node, with Slurm's line as evidence beside the ranks' `looks`. The same for the
    watcher (a job it saw end) and a bundle of the job read offline."""
    lines = [x.line() for x in looks] if len(looks) > 1 else []
    slurm = job_verdict(job, job_id, lines)
    if failed is None or slurm.verdict in SLURM_OWN_ENDS:
        return slurm
    own = _own_failure(failed)
    if own is None:
        return slurm
    rank, node, v = own
    said = f" Slurm then ended the job: {slurm.summary[0].lower()}{slurm.summary[1:]}" if job is not None else ""
    return replace(v, summary=f"Rank {rank} on node {node}: {v.summary.rstrip()}{said}",
                   evidence=[*lines, *slurm.evidence[:1 if job is not None else 0], *v.evidence],
                   next_steps=[*v.next_steps, f"Look at node {node} (rank {rank}): its log and GPUs"])


def _own_failure(failed: tuple[int, str, Verdict] | None) -> tuple[int, str, Verdict] | None:
    """`failed` where its verdict says why a rank ended (one of RANK_FAILURES, not a low-confidence guess)."""
    if failed is None or failed[2].verdict not in RANK_FAILURES or failed[2].confidence == "low":
        return None
    return failed


def most_specific_failure(failures: Sequence[tuple[int, str, Verdict] | None]) -> tuple[int, str, Verdict] | None:
    """Of the ranks' own verdicts (rank, node, verdict; None: a rank not read), the one that says most about why the
    job ended: the most specific failure (RANK_FAILURE_ORDER: a rank's OOM before the other ranks' crashes and NCCL
    timeouts, which are its echo), the lowest rank among equals; else rank 0's verdict (failure or not), else None."""
    own = [f for f in failures if _own_failure(f) is not None]
    if own:
        return min(own, key=lambda f: (RANK_FAILURE_ORDER.index(f[2].verdict), f[0]))  # type: ignore[index]
    return next((f for f in failures if f is not None and f[0] == 0), None)


def node_label(name: str) -> str:
    """A node's name as shown in text (an alert, a verdict): no escape sequence, control character or line break
    (bot.core.parse.log.strip_control), trimmed, at most 100 characters; "?" when nothing is left."""
    return strip_control(name).strip()[:100] or "?"


def parse_ranks(text: str) -> dict[int, str]:
    """Rank -> node of a bundle's `ranks.txt` (`0 n1` lines; others skipped). Never raises."""
    out: dict[int, str] = {}
    for line in (text or "").splitlines():
        rank, _, node = line.strip().partition(" ")
        if rank.isdigit() and len(rank) <= 4 and node.strip():
            out[int(rank)] = node_label(node)
    return out


def weigh_bundle(verdict: Verdict, top: Observation, rank0: str, others: Sequence[tuple[int, str, Observation]],
                 scontrol: str | None = None) -> Verdict:
    """The verdict of a bundle of a launch across nodes: `verdict` (rank 0's, from the bundle's top level `top`)
    weighed with every other rank's evidence (`others`: rank, node, observation; weigh_nodes), then Slurm's word
    when `scontrol` (`scontrol show job -o`) is there: a job Slurm ended gets Slurm's verdict (job_verdict), a
    pending one is `loading` (never a hang), a running one gets its line as evidence."""
    from bot.core.diagnose import Verdict, diagnose
    ranked = sorted(others, key=lambda x: x[0])
    looks = [look_of(top, 0, rank0, verdict.verdict), *(look_of(o, k, n) for k, n, o in ranked)]
    # the rank whose own log says most about the failure (most_specific_failure)
    failed = most_specific_failure([(0, rank0, verdict), *((k, n, diagnose(o)) for k, n, o in ranked)])
    out = weigh_nodes(verdict, looks, failed) if others else verdict
    jobs = parse_show_job(scontrol or "")
    if not jobs:
        return out
    job = jobs[0]
    if not job.active:
        return job_end_verdict(job, job.job_id, looks if others else [], failed)
    if job.pending:
        return Verdict("loading", None, [job_line(job)],
                       [f"Wait for Slurm to run it, or cancel it (`scancel {job.job_id}`)"],
                       f"Slurm job {job.job_id} waits in Slurm's queue: {pending_text(job)}. Not a hang.")
    n = len(looks) if others else 0
    return replace(out, evidence=[*out.evidence[:n], job_line(job), *out.evidence[n:]])
