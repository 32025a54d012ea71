"""Cross-rank stack analysis (pure): where each rank of a hung launch waits, ranks grouped by it, and the odd one
out named ("TP1 is in sleep (<string>:18) while TP0 waits in all_reduce").

Input: one ProcessDump per rank (bot.core.stackdump, parsed from `py-spy dump --json`, plain or `--native`),
labelled (`TP0`, `pid 123`). For each rank, its main thread's frames (innermost first) are matched against
FRAME_RULES, a table of what a frame means (data, not code): the first rule that matches any frame says where
the rank is, in which phase and why (a sleep inside the TCPStore is a rendezvous wait); with no match, the
innermost frame. Ranks are grouped by that place; the smallest
group (at a tie: the one that is not waiting on the others) is the odd one out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from bot.core.stackdump import Frame, ProcessDump, telling_thread

__all__ = [
    "FRAME_RULES",
    "RANK_LABELS",
    "CrossRankSummary",
    "RankPlace",
    "StackGroup",
    "rank_label",
    "rank_place",
    "summarize_ranks",
]


@dataclass(frozen=True)
class FrameRule:
    """Frames whose function name (or, for native frames, their library) matches `pattern` (a regex, searched)
    mean: `what` (shown), the launch `phase` (None: any), the `cause` (a short reason), and whether the rank is
    `waiting` on other ranks there."""

    pattern: str
    what: str
    phase: str | None
    cause: str
    waiting: bool
    files: str | None = None  # the frame's file must match this too (a regex, searched); None: any file

    def matches(self, frame: Frame) -> bool:
        """Whether `frame` is one this rule speaks of: its function name, and its file where the rule names one."""
        return re.search(self.pattern, frame.name) is not None and (
            self.files is None or re.search(self.files, frame.file or "") is not None)


#: Files whose functions run collectives: torch.distributed (distributed_c10d.py), the engines' own communicators
#: (vllm/distributed, sglang/srt/distributed, pynccl, custom all-reduce), DeepSpeed's and Megatron's comm modules,
#: and the native libraries that run them (py-spy --native: libnccl.so, libtorch_cuda.so, MPI, UCC, NVSHMEM); not
#: libc (a socket's `recv` there is any program's).
COLLECTIVE_FILES = (r"(?i)distributed|nccl|c10d|gloo|comm|collective|parallel_state|libtorch_cuda|libmpi|libucc|"
                    r"libnvshmem")

#: Any file but the compiler's own modules (Dynamo, Inductor, functorch, FX, Triton), which lower and trace
#: collectives (`all_reduce`) without running them.
NOT_COMPILER_FILES = r"^(?!.*(?:torch/_inductor|torch/_dynamo|torch/_functorch|torch/fx|triton)/)"

#: What a frame means, most specific first. torch 2.x function names (torch/distributed/*), NCCL/c10d native
#: symbols (py-spy --native), vLLM/SGLang loader and CUDA-graph names.
FRAME_RULES: tuple[FrameRule, ...] = (
    FrameRule(r"waitForWorkers|TCPStore|_create_c10d_store|_store_based_barrier|rendezvous", "rendezvous (TCPStore)",
              "comm_init", "waiting for the other ranks to join the rendezvous", True),
    FrameRule(r"ncclCommInit|init_process_group|_new_process_group_helper|new_group|ProcessGroupNCCL::getNCCLComm",
              "communicator init", "comm_init", "waiting in NCCL communicator init", True),
    # a collective's own name anywhere but in the compiler; a generic name (`broadcast`, `gather`, `send`) only where
    # communication code runs it: Inductor's lowering of `broadcast_tensors` or a model's `gather` is no collective
    FrameRule(r"^(?:all_reduce|all_gather\w*|reduce_scatter\w*|all_to_all\w*|barrier|monitored_barrier)$",
              "a collective", None, "waiting on a collective the other ranks have not entered", True,
              files=NOT_COMPILER_FILES),
    FrameRule(r"^(?:broadcast\w*|reduce|gather|scatter|send|recv|isend|irecv)$",
              "a collective", None, "waiting on a collective the other ranks have not entered", True,
              files=COLLECTIVE_FILES),
    FrameRule(r"ncclAllReduce|ncclAllGather|ncclBroadcast|ncclReduceScatter|ncclGroupEnd",
              "a collective", None, "waiting on a collective the other ranks have not entered", True),
    FrameRule(r"capture|cuda_graph|CUDAGraph|graph_capture", "CUDA graph capture", "cuda_graph_capture",
              "capturing CUDA graphs", False),
    FrameRule(r"load_weights|load_model|safe_open|safetensors|load_state_dict|_load_shard|weight_loader",
              "weight loading", "weight_loading", "loading weights", False),
    FrameRule(r"^(?:sleep|clock_nanosleep|nanosleep)$", "sleep", None, "sleeping", False),
)


#: How a process's command line (ps `args`, with the process title an engine sets) names its rank, most specific
#: first: (regex with a `n` group, label format). SGLang `sglang::scheduler_TP3` / `..._DP0_TP3`, vLLM V1
#: `VLLM::Worker_TP3` / `VllmWorker-3`, TensorRT-LLM / torchrun `--rank 3` / `--local-rank=3`, the demo server's
#: `--worker-rank 3`.
RANK_LABELS: tuple[tuple[str, str, bool], ...] = (
    # (regex with `dp`/`pp`/`n` groups, label format, searched in the process title only)
    (r"^[\w.-]*::\w*?(?:DP(?P<dp>\d{1,4})_)?(?:PP(?P<pp>\d{1,4})_)?TP(?P<n>\d{1,4})(?!\d)", "TP{n}", True),
    (r"^VllmWorker[-_ ](?:rank=)?(?P<n>\d{1,4})$", "TP{n}", True),
    (r"(?:^|\s)--(?:worker[-_])?rank[= ](?P<n>\d{1,4})\b", "rank {n}", False),
    (r"(?:^|\s)--local[-_]rank[= ](?P<n>\d{1,4})\b", "local rank {n}", False),
)


def rank_label(args: str) -> str | None:
    """The rank a process is, from its command line (`TP3`, `DP1 TP3`, `PP1 TP0`, `rank 3`), by RANK_LABELS: an
    engine's process title (`sglang::scheduler_DP1_TP3`, `VLLM::Worker_PP1_TP0`; the first word, never a path
    or a model name further on) or a rank flag. None when it names none."""
    words = (args or "").split()
    title = words[0] if words else ""
    for pattern, fmt, title_only in RANK_LABELS:
        if m := re.search(pattern, title if title_only else args or ""):
            groups = m.groupdict()
            prefix = "".join(f"{k.upper()}{int(groups[k])} " for k in ("dp", "pp") if groups.get(k))
            return prefix + fmt.format(n=int(m.group("n")))
    return None


@dataclass
class RankPlace:
    """Where one rank is: `label`, the matched `rule` (None: no rule matched), the `frame` it matched on (or the
    innermost frame), and `gil` when a thread of the rank holds the GIL. `error` when it could not be dumped."""

    label: str
    rule: FrameRule | None = None
    frame: Frame | None = None
    gil: bool = False
    error: str | None = None

    @property
    def key(self) -> str:
        """What ranks are grouped by: the frame's function name and file (no line: ranks differ in lines)."""
        if self.error is not None:
            return "not dumped"
        if self.frame is None:
            return "no frames"
        return f"{self.frame.name} ({self.frame.file})"

    @property
    def waiting(self) -> bool:
        """True when the rank waits on the others there (rendezvous, communicator init, a collective)."""
        return self.rule is not None and self.rule.waiting


@dataclass
class StackGroup:
    """Ranks at the same place: `where` (the frame, e.g. `all_reduce (torch/distributed/distributed_c10d.py:3075)`),
    the rule's meaning (`what`, `phase`, `cause`; None when no rule matched), `waiting`, and their `labels`."""

    where: str
    what: str | None
    phase: str | None
    cause: str | None
    waiting: bool
    labels: list[str] = field(default_factory=list)


@dataclass
class CrossRankSummary:
    """All ranks' places: `groups` (largest first), the `odd` group out (None when all ranks are at one place or
    the groups are the same size and all wait), the launch `phase` and `cause` the stacks show (the odd
    group's, else the largest group's), and `line`, the one evidence line for an alert."""

    groups: list[StackGroup]
    odd: StackGroup | None
    phase: str | None
    cause: str | None
    line: str


def rank_place(label: str, dump: ProcessDump) -> RankPlace:
    """Where rank `label` is, from its dump: the frame of its main thread matched by the first FRAME_RULES entry
    that matches any of its frames (innermost first within a rule), else its innermost frame."""
    if not dump.ok:
        return RankPlace(label, error=dump.error or "not dumped")
    main = telling_thread(dump.threads)
    gil = any(t.owns_gil for t in dump.threads)
    if main is None or not main.frames:
        return RankPlace(label, gil=gil)
    for rule in FRAME_RULES:  # the most telling rule anywhere in the stack (a sleep inside TCPStore is a wait)
        for frame in main.frames:
            if rule.matches(frame):
                return RankPlace(label, rule=rule, frame=frame, gil=gil)
    return RankPlace(label, frame=main.frames[0], gil=gil)


def _where(p: RankPlace) -> str:
    if p.frame is None:
        return p.key
    return f"{p.frame.name} ({p.frame.file}:{p.frame.line})" if p.frame.line else p.key


def _names(labels: list[str]) -> str:
    if len(labels) == 1:
        return labels[0]
    return f"{len(labels)} ranks ({', '.join(labels[:4])}{', ...' if len(labels) > 4 else ''})"


def _at(g: StackGroup) -> str:
    """`TP0 waits in X` / `7 ranks (...) wait in X` / `TP2 is in X` / `TP1 could not be dumped`."""
    one = len(g.labels) == 1
    if g.where == "not dumped":  # py-spy could not attach (a stopped, a D-state or a vanished process)
        return f"{_names(g.labels)} could not be dumped"
    verb = ("waits" if one else "wait") if g.waiting else ("is" if one else "are")
    return f"{_names(g.labels)} {verb} in {g.where}"


def summarize_ranks(ranks: list[tuple[str, ProcessDump]]) -> CrossRankSummary:
    """Group `ranks` ((label, dump) pairs, e.g. ("TP0", dump)) by where they are and name the odd one out.

    The odd group is the smallest one; at a tie, the one that is not waiting on the others (a rank that never
    entered a collective, while the rest wait in it), a rank py-spy could not attach to first. Returns a
    CrossRankSummary; `line` reads like
    "TP1 is in sleep (<string>:18) while TP0 waits in all_reduce (torch/distributed/distributed_c10d.py:3075)" or
    "all 8 ranks wait in all_reduce (...): waiting on a collective ...". Never raises."""
    places = [rank_place(label, dump) for label, dump in ranks]
    by_key: dict[str, list[RankPlace]] = {}
    for p in places:
        by_key.setdefault(p.key, []).append(p)
    groups = []
    for members in by_key.values():
        first = members[0]
        rule = first.rule
        groups.append(StackGroup(where=_where(first), what=rule.what if rule else None,
                                 phase=rule.phase if rule else None, cause=rule.cause if rule else None,
                                 waiting=first.waiting, labels=[m.label for m in members]))
    groups.sort(key=lambda g: (-len(g.labels), g.where))
    if not groups:
        return CrossRankSummary([], None, None, None, "no rank could be dumped")
    odd = None
    if len(groups) > 1:
        smallest = min(len(g.labels) for g in groups)
        # at a tie, a rank py-spy could not attach to (stopped, in D state) is the odder one
        candidates = sorted((g for g in groups if len(g.labels) == smallest), key=lambda g: g.where != "not dumped")
        not_waiting = [g for g in candidates if not g.waiting]
        if len(candidates) < len(groups) or not_waiting:
            odd = (not_waiting or candidates)[0]
    main = next(g for g in groups if g is not odd)
    shown = odd if odd is not None and (odd.phase or odd.cause) else main
    phase = next((g.phase for g in (odd, main) if g is not None and g.phase), None)
    verb = "wait" if main.waiting else "are"  # (all ranks: plural)
    if len(groups) == 1:
        line = f"all {len(main.labels)} ranks {verb} in {main.where}" if len(main.labels) > 1 else \
            f"{main.labels[0]} is in {main.where}"
        if main.cause:
            line += f": {main.cause}"
    elif odd is not None:
        others = [g for g in groups if g is not odd]
        rest = "; ".join(_at(g) for g in others)
        line = f"{_at(odd) if odd.where == 'not dumped' else _names(odd.labels) + ' is in ' + odd.where} while {rest}"
    else:
        line = "; ".join(_at(g) for g in groups)
    return CrossRankSummary(groups=groups, odd=odd, phase=phase, cause=shown.cause, line=line)
