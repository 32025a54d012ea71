"""Host service: turns a host name and a ProbeRequest into a Snapshot (or a HostFailure).

This is the I/O edge for probes: it picks the executor, reads NVML for local GPU hosts, sends the probe
script in ONE command (on the host's probe agent, or over one channel), reads the GPUs through the host's NVML
reader beside it when the host has one (`nvml_python`), and hands the output to the pure assembler in
`bot.core.probe`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING

from bot.adapters.nvml import LocalNvml
from bot.adapters.probe_pool import POOL_MIN_HOSTS, ProbePool, WorkerGone, probe_worker_count
from bot.adapters.remote import (
    CommandResult,
    Executor,
    NvmlUnavailable,
    RemoteError,
    SSHExecutor,
    build_executor,
)
from bot.adapters.slurm import SrunExecutor
from bot.config import Config, HostConfig
from bot.core.clock import SYSTEM_CLOCK, Clock
from bot.core.models import GpuSection, HostFailure, LogCursor, Snapshot
from bot.core.parse.nvml import gpu_section_from_reading
from bot.core.probe import (
    HostPolicy,
    ProbeRequest,
    Section,
    assemble_snapshot,
    batchable,
    build_batch_script,
    build_gpu_script,
    build_script,
    new_nonce,
    shown_command,
    split_members,
    split_sections,
)
from bot.core.redact import Redactor
from bot.services.probe_batch import BATCH_GATHER_S, ProbeBatches

if TYPE_CHECKING:
    from bot.adapters.metrics import Metrics  # only the type: prometheus_client is imported by the wiring

log = logging.getLogger(__name__)

NvmlReader = Callable[[], Awaitable[GpuSection]]
#: Logs whose line count's cursor a HostService keeps (see `HostService._remember_cursor`).
LOG_CURSORS = 4096
#: Seconds a probe may take beyond its host's timeouts before it is given up (`HostService.probe_deadline_s`).
PROBE_MARGIN_S = 5.0
#: Nodes of Slurm jobs (HostService.job_node) kept at most, with their executors: 64 jobs of 16 nodes.
JOB_NODES_KEPT = 1024
#: Seconds a running `/gpu status` probe of a host may have been started before a new caller joins it instead of
#: starting another (`HostService.status_here`): an answer is never older than that when it is asked for.
STATUS_SHARE_S = 0.25


def split_concurrency(total: int, sizes: dict[int, int]) -> dict[int, int]:
    """`total` probes at once split among the shards of a status, in proportion to their hosts (`sizes`: shard ->
    hosts): each gets all its hosts when they fit in `total`, else its share by largest remainder, at least 1 (so
    the shares add up to `total`, or to one per shard where there are more shards than that)."""
    hosts = sum(sizes.values())
    if hosts <= total:
        return dict(sizes)
    exact = {k: total * n / hosts for k, n in sizes.items()}
    share = {k: max(1, int(x)) for k, x in exact.items()}
    left = total - sum(share.values())
    for k in sorted(exact, key=lambda k: exact[k] - int(exact[k]), reverse=True)[:max(0, left)]:
        share[k] += 1
    return share


@dataclasses.dataclass
class _Prepared:
    """One probe's script and what its answer is assembled with (HostService._prepare)."""

    req: ProbeRequest
    nonce: str
    script: str
    gpu_override: GpuSection | None
    nvml_task: asyncio.Task | None
    shared: bool  # the GPUs are another probe's recent reading


class UnknownHost(KeyError):
    """Raised for a host name not in the config; `.known` lists the configured names."""

    def __init__(self, name: str, known: list[str]):
        self.name = name
        self.known = known
        super().__init__(name)


def host_policy(cfg: HostConfig) -> HostPolicy:
    """What a configured host allows and how its tools are called (see HostPolicy)."""
    return HostPolicy(log_dirs=tuple(cfg.log_dirs), nvidia_smi=cfg.nvidia_smi,
                      nvidia_smi_timeout_s=cfg.nvidia_smi_timeout_s, env=tuple(cfg.env.items()))


class HostService:
    """Probes configured hosts. Executors are created lazily, one per host, and reused (pooled SSH).
    `redactor` masks secrets in command lines and log lines before they are cut (bot.core.probe). A `status` of
    POOL_MIN_HOSTS SSH hosts or more is spread over `probe_workers` worker processes (default: from the config,
    `probe_worker_count`), each with SSH connections of its own (bot.adapters.probe_pool)."""

    def __init__(
        self,
        config: Config,
        executors: dict[str, Executor] | None = None,
        *,
        redactor: Redactor | None = None,
        nvml_reader: NvmlReader | None = None,
        extra_path: list[str] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        metrics: Metrics | None = None,
        probe_workers: int | None = None,
        batch_gather_s: float | None = BATCH_GATHER_S,
    ):
        self.config = config
        self._workers = probe_worker_count(config) if probe_workers is None else probe_workers
        self._pool: ProbePool | None = None
        self._pool_calls: set[asyncio.Task[None]] = set()
        self._injected = frozenset(executors or {})  # hosts whose executor was given: probed in this process
        # per host, the probe worker's own long-lived processes there (its probe agents): left out of this bot's probes
        self._remote_helpers: dict[str, tuple[int, ...]] = {}
        self._metrics = metrics
        self._clock = clock  # the bot's one clock: when a probe was sent (Snapshot.local_clock)
        self.redactor = redactor or Redactor(config.redact_patterns)
        self._executors: dict[str, Executor] = dict(executors or {})
        # nodes of Slurm jobs that the config has no host for, reached through their login node (job_node)
        self._job_nodes: dict[str, tuple[HostConfig, str, str, str]] = {}
        # where the line count of each log read so far stopped: the next probe counts on from there
        self._log_cursors: dict[tuple[str, str], LogCursor] = {}
        #: host -> (monotonic time, its last whole GPU reading): what a request with gpu_max_age_s may reuse
        self._gpu_readings: dict[str, tuple[float, GpuSection]] = {}
        self._nvml_reader = nvml_reader or LocalNvml().read_async
        self._extra_path = extra_path
        self._slots = asyncio.Semaphore(config.probe_concurrency)
        # per host, as many probes as its executor runs at once: the others queue here, before their deadline runs
        self._host_slots: dict[str, asyncio.Semaphore] = {}
        # status probes in flight, by host, with when they started: a burst of `/gpu status` shares them
        self._status_in_flight: dict[str, tuple[asyncio.Future[Snapshot | HostFailure], float]] = {}
        # the cheap looks of one host asked for within `batch_gather_s` of each other share a round trip (None: never)
        self._batches = ProbeBatches(self._batch, gather_s=batch_gather_s) if batch_gather_s is not None else None

    def resolve_host(self, name: str | None) -> str:
        """Return a configured host name: `name`, else the default host, else the only host.

        Raises UnknownHost (with the known names) for an unknown or missing name.
        """
        hosts = self.config.host_names()
        if name is None:
            if self.config.default_host:
                return self.config.default_host
            if len(hosts) == 1:
                return hosts[0]
            raise UnknownHost("", hosts)
        if name not in self.config.hosts:
            raise UnknownHost(name, hosts)
        return name

    def job_node(self, login: str, job_id: str, node: str) -> str:
        """The host name (`NODE@LOGIN:jobJOB`) under which node `node` of Slurm job `job_id`, submitted on host
        `login`, is probed, dumped and bundled when the config has no host of that name: its commands run there as
        steps that overlap the job's own (bot.adapters.slurm.SrunExecutor, started on the login node), with the login
        node's settings (timeouts, nvidia-smi, py-spy, log_dirs, env) but never the bot's own NVML nor a probe agent.
        The last JOB_NODES_KEPT are kept. Raises KeyError for a login node the config does not have."""
        name = f"{node}@{login}:job{job_id}"
        if name not in self._job_nodes:
            cfg = self.config.hosts[login].model_copy(update={
                "local": False, "use_nvml": False, "nvml_python": None, "probe_agent": False, "address": None})
            self._job_nodes[name] = (cfg, login, str(job_id), node)
            while len(self._job_nodes) > JOB_NODES_KEPT:  # the oldest jobs' nodes go (made again if asked for)
                gone = next(iter(self._job_nodes))
                del self._job_nodes[gone]
                if isinstance(ex := self._executors.pop(gone, None), SrunExecutor):
                    ex.discard()
                self._host_slots.pop(gone, None)
        return name

    def host_config(self, host: str) -> HostConfig:
        """The settings of `host`: a host of the config, or a node of a Slurm job (job_node). Raises KeyError."""
        cfg = self.config.hosts.get(host)
        return cfg if cfg is not None else self._job_nodes[host][0]

    def executor(self, host: str) -> Executor:
        """The pooled executor of `host` (created on first use); for a node of a Slurm job (job_node), its steps
        through the login node's executor."""
        ex = self._executors.get(host)
        if ex is None:
            if host in self._job_nodes:
                _cfg, login, job_id, node = self._job_nodes[host]
                ex = SrunExecutor(self.executor(login), job_id, node, conf=self.config.hosts[login].slurm_conf)
            else:
                ex = build_executor(host, self.config.hosts[host], extra_path=self._extra_path)
            self._executors[host] = ex
        return ex

    @property
    def worker_pids(self) -> list[int]:
        """The pids of the probe workers running now (none before the first status of a fleet)."""
        return self._pool.pids if self._pool is not None else []

    def probe_deadline_s(self, host: str) -> float:
        """Seconds a probe of `host` may take in all: its connect, command and nvidia-smi timeouts (a probe whose
        NVML reader fails asks nvidia-smi in a second round trip) and PROBE_MARGIN_S."""
        cfg = self.host_config(host)
        return cfg.connect_timeout_s + cfg.command_timeout_s + cfg.nvidia_smi_timeout_s + PROBE_MARGIN_S

    async def probe(self, host: str, req: ProbeRequest) -> Snapshot | HostFailure:
        """Take one snapshot of `host` in one round trip: one script (on the host's probe agent, or one channel),
        and, on a host with `nvml_python`, one NVML reading beside it. Returns Snapshot or HostFailure; a
        HostFailure too when the host has not answered within `probe_deadline_s` of its start. At most
        `probe_concurrency` probes run at once (the config), and on one host no more than it runs at once (its
        probe agents): the others wait for a slot first, and their deadline starts once they have it. A watcher's
        cheap look (bot.core.probe.batchable) waits up to `batch_gather_s` for the other looks of the host asked for
        meanwhile, and shares their round trip (bot.services.probe_batch).

        Raises ProbeRequestError for an invalid request, or one the host's policy refuses (a log outside
        its log_dirs), before anything is sent. `req` is not modified.
        """
        cfg = self.host_config(host)
        policy = host_policy(cfg)
        policy.check(req)
        if self._batches is not None and batchable(req):
            return await self._batches.probe(host, req)
        return (await self._batch(host, [req]))[0]

    async def _probe(self, host: str, cfg: HostConfig, policy: HostPolicy,
                     req: ProbeRequest) -> Snapshot | HostFailure:
        """`probe` once it has its slot, without its deadline."""
        prep = await self._prepare(host, cfg, policy, req)
        started, sent_at = time.monotonic(), self._clock.time()
        try:
            res = await self.executor(host).run_script(prep.script, timeout_s=cfg.command_timeout_s)
        except RemoteError as e:
            return self._failed(host, prep, e)
        return await self._finish(host, cfg, policy, prep, res, started, sent_at)

    async def _prepare(self, host: str, cfg: HostConfig, policy: HostPolicy, req: ProbeRequest, *,
                       gpu: bool = True) -> _Prepared:
        """The script of one probe of `host` with `req`, and what its answer is assembled with: the GPUs from NVML
        in this process, from another probe's recent reading (`gpu_max_age_s`) or from the host's NVML reader
        (started now, to run beside the script); the log's cursor where the request has none. Without `gpu`, the
        GPUs are left to another probe of the same round trip (`_probe_together`)."""
        gpu_override = None
        if not gpu and req.gpu:
            req = dataclasses.replace(req, gpu=False)
        if cfg.local and cfg.use_nvml and req.gpu:
            reading = await self._nvml_reader()
            if reading.ok:
                gpu_override = reading
                req = dataclasses.replace(req, gpu=False)
        if req.log_path is not None and req.log_cursor is None:
            req = dataclasses.replace(req, log_cursor=self._log_cursors.get((host, req.log_path)))
        shared = self._shared_gpu(host, req, cfg)
        if shared is not None:  # another probe's reading of this host's GPUs, recent enough
            gpu_override, req = shared, dataclasses.replace(req, gpu=False)
        nvml_task = self._start_nvml(host, cfg, self.executor(host)) if req.gpu else None
        nonce = new_nonce()
        script = build_script(dataclasses.replace(req, gpu=False) if nvml_task else req, nonce, policy)
        return _Prepared(req, nonce, script, gpu_override, nvml_task, shared is not None)

    def _failed(self, host: str, prep: _Prepared, error: RemoteError) -> HostFailure:
        """The HostFailure of a probe whose script could not be run (`error`)."""
        if prep.nvml_task is not None:
            prep.nvml_task.cancel()
        log.warning("probe of %s failed: %s", host, error)
        self._keep_gpu_reading(host, None)
        return HostFailure(host=host, reason=str(error))

    async def _finish(self, host: str, cfg: HostConfig, policy: HostPolicy, prep: _Prepared, res: CommandResult,
                      started: float, sent_at: float, *, gpu_from: GpuSection | None = None,
                      batched: bool = False) -> Snapshot | HostFailure:
        """The Snapshot of one probe from the output `res` of its script (its sections found by its own nonce), or the
        HostFailure that output shows. `gpu_from`: the GPUs as another probe of the same round trip read them.
        `batched`: `res` is this probe's part of a batch's output (bot.core.probe.split_members; exit status 0 when
        the part ran to its end, the batch's otherwise), and its raw output is never quoted in a failure's reason."""
        req, gpu_override, nvml_task = prep.req, prep.gpu_override if gpu_from is None else gpu_from, prep.nvml_task
        sections = split_sections(res.stdout, prep.nonce)
        cut_short = res.exit_status in (124, 137)
        if not sections:
            if nvml_task is not None:
                nvml_task.cancel()
            err = "" if batched else (res.stderr or res.stdout).decode("utf-8", "replace").strip()[-300:]
            if cut_short:
                reason = f"probe did not finish within {cfg.command_timeout_s:g} s"
            elif batched:
                reason = "probe script failed: this launch's part of the host's probe printed nothing"
            else:
                reason = f"probe script failed (exit {res.exit_status}){': ' + err if err else ''}"
            return HostFailure(host=host, reason=reason)
        gpu_note = cfg.gpu_note
        executor = self.executor(host)
        if nvml_task is not None:
            gpu_override, problem = await nvml_task
            if gpu_override is None:  # the reader did not answer: nvidia-smi, as without it
                sections.update(await self._nvidia_smi_sections(host, cfg, policy, executor))
                gpu_note = gpu_note or f"from nvidia-smi: {problem}"
            else:
                req = dataclasses.replace(req, gpu=False)
        helpers = [*executor.helper_pids(), *self._remote_helpers.get(host, ())]
        snap = assemble_snapshot(host, req, sections, policy=policy, gpu_override=gpu_override,
                                 gpu_note=gpu_note, redactor=self.redactor, helper_pids=helpers)
        if cut_short:
            snap.errors.append(f"probe cut short after {cfg.command_timeout_s:g} s; some sections are missing")
        if snap.log is not None and snap.log.cursor is not None:
            self._remember_cursor(host, snap.log.path, snap.log.cursor)
        if not prep.shared and gpu_from is None and (req.gpu or gpu_override is not None):
            # a fresh reading: kept, or a failed one's forgotten
            self._keep_gpu_reading(host, snap.gpu if snap.gpu.ok and snap.gpu.gpus else None)
        snap.duration_s = time.monotonic() - started
        snap.local_clock = sent_at
        return snap

    async def _batch(self, host: str, reqs: list[ProbeRequest]) -> list[Snapshot | HostFailure]:
        """Answer the batched probes `reqs` of `host` (ProbeBatches' `run`): with the host's slot and one of
        `probe_concurrency`, as one probe; a batch of one is sent as it would be alone."""
        host_slots = self._host_slots.get(host)
        if host_slots is None:
            host_slots = self._host_slots[host] = asyncio.Semaphore(max(1, self.executor(host).script_slots()))
        async with host_slots, self._slots:
            started = time.monotonic()
            if len(reqs) == 1:
                limit = self.probe_deadline_s(host)
                cfg = self.host_config(host)
                try:
                    results = [await asyncio.wait_for(self._probe(host, cfg, host_policy(cfg), reqs[0]), limit)]
                except TimeoutError:
                    log.warning("probe of %s: no answer within %g s", host, limit)
                    results = [HostFailure(host=host, reason=f"{host} did not answer within {limit:g} s")]
            else:
                results = await self._probe_together(host, reqs)
            if self._metrics is not None:
                label = self._job_nodes[host][1] if host in self._job_nodes else host
                for r in results:
                    self._metrics.observe_probe(label, time.monotonic() - started, not isinstance(r, HostFailure))
            return results

    async def _probe_together(self, host: str, reqs: list[ProbeRequest]) -> list[Snapshot | HostFailure]:
        """Probe `host` with each of `reqs` in ONE round trip (bot.core.probe.build_batch_script: each request's
        script in a subshell of its own, its sections under its own nonce), within one probe's deadline; one result
        per request, in order. The host's GPUs are read once, by the first request that wants them, for all.
        Never raises (a host that did not answer is a HostFailure for each)."""
        cfg = self.host_config(host)
        policy = host_policy(cfg)
        preps: list[_Prepared] = []
        reader: int | None = None  # the request that reads the GPUs for the others
        for req in reqs:
            prep = await self._prepare(host, cfg, policy, req, gpu=reader is None)
            if reader is None and (prep.req.gpu or prep.nvml_task is not None):
                reader = len(preps)
            preps.append(prep)
        started, sent_at = time.monotonic(), self._clock.time()
        nonce, limit = new_nonce(), self.probe_deadline_s(host)
        try:
            res = await asyncio.wait_for(
                self.executor(host).run_script(build_batch_script([p.script for p in preps], nonce),
                                               timeout_s=cfg.command_timeout_s), limit)
        except (RemoteError, TimeoutError) as e:
            error = e if isinstance(e, RemoteError) else RemoteError(host, f"{host} did not answer within {limit:g} s")
            return [self._failed(host, p, error) for p in preps]
        # each part's own output: a part cut short never runs into the next one's
        parts = [dataclasses.replace(res, stdout=b, stderr=b"", exit_status=0 if whole else res.exit_status)
                 for b, whole in split_members(res.stdout, nonce, len(preps))]
        out: list[Snapshot | HostFailure | None] = [None] * len(preps)
        gpus: GpuSection | None = None
        if reader is not None:
            first = out[reader] = await self._finish(host, cfg, policy, preps[reader], parts[reader], started,
                                                     sent_at, batched=True)
            gpus = first.gpu if isinstance(first, Snapshot) else GpuSection(
                ok=False, error=f"GPU readings missing: the probe that read them failed ({first.reason})")
        for k, prep in enumerate(preps):
            if out[k] is None:
                wants = reqs[k].gpu and not prep.shared and prep.gpu_override is None
                out[k] = await self._finish(host, cfg, policy, prep, parts[k], started, sent_at,
                                            gpu_from=gpus if wants and gpus is not None else None, batched=True)
        return [r for r in out if r is not None]

    def _keep_gpu_reading(self, host: str, reading: GpuSection | None) -> None:
        """Keep `host`'s newest whole GPU reading for others to share; None (a reading that failed, a host that did
        not answer) forgets the one kept, so no probe is handed a good reading older than a failure. At most
        LOG_CURSORS hosts are kept (the oldest go)."""
        self._gpu_readings.pop(host, None)
        if reading is not None:
            self._gpu_readings[host] = (time.monotonic(), reading)
            while len(self._gpu_readings) > LOG_CURSORS:
                self._gpu_readings.pop(next(iter(self._gpu_readings)))

    def _shared_gpu(self, host: str, req: ProbeRequest, cfg: HostConfig) -> GpuSection | None:
        """The last whole GPU reading of `host`, when `req` takes one of its age (`gpu_max_age_s`); else None. A
        failed reading forgets the one kept (see _keep_gpu_reading), so a GPU that fell off the bus is seen by the
        next probe. A host read through NVML in this process reads at once: nothing to share."""
        if not req.gpu or req.gpu_max_age_s <= 0 or (cfg.local and cfg.use_nvml):
            return None
        got = self._gpu_readings.get(host)
        if got is None or time.monotonic() - got[0] > req.gpu_max_age_s:
            return None
        return got[1]

    def _remember_cursor(self, host: str, path: str, cursor: LogCursor) -> None:
        """Keep where the line count of `path` on `host` stopped (at most LOG_CURSORS of them: the oldest go)."""
        key = (host, path)
        self._log_cursors.pop(key, None)
        self._log_cursors[key] = cursor
        while len(self._log_cursors) > LOG_CURSORS:
            self._log_cursors.pop(next(iter(self._log_cursors)))

    def _start_nvml(self, host: str, cfg: HostConfig, executor: Executor) -> asyncio.Task | None:
        """The NVML reading of an SSH host with `nvml_python` (its reader ready), started now to run beside the
        script: a task giving (GpuSection, None) when the reader answered with readings, (None, why) otherwise.
        None when the host reads its GPUs with nvidia-smi."""
        if cfg.local or not cfg.nvml_python or not isinstance(executor, SSHExecutor) or not executor.nvml_ready():
            return None

        async def read() -> tuple[GpuSection | None, str | None]:
            try:
                section = gpu_section_from_reading(await executor.nvml_reading(cfg.nvml_python or "",
                                                                               cfg.nvidia_smi_timeout_s))
            except NvmlUnavailable as e:
                return None, str(e)
            except RemoteError as e:
                return None, f"the NVML reader could not be reached ({e})"
            if not section.ok:  # a driver error: nvidia-smi says it in its own words, the reader starts again
                return None, section.error
            return section, None

        return asyncio.ensure_future(read())

    async def _nvidia_smi_sections(self, host: str, cfg: HostConfig, policy: HostPolicy,
                                   executor: Executor) -> dict[str, Section]:
        """The `gpu` and `gpu_apps` sections from nvidia-smi, in a second round trip (the NVML reader failed);
        empty when that failed too (the snapshot then says the GPU readings are missing)."""
        nonce = new_nonce()
        try:
            res = await executor.run_script(build_gpu_script(nonce, policy), timeout_s=cfg.command_timeout_s)
        except RemoteError as e:
            log.warning("GPU readings of %s failed: %s", host, e)
            return {}
        return split_sections(res.stdout, nonce)

    async def status(self, hosts: list[str], *,
                     keep_pids: Mapping[str, Collection[int]] | None = None) -> list[Snapshot | HostFailure]:
        """Probe `hosts` in parallel for GPU status (GPU table + GPU holders). One result per host, in order;
        a failing host yields a HostFailure while the others still answer. A host whose status probe started at
        most STATUS_SHARE_S ago (another `/gpu status` of a burst) answers from that probe (`status_here`). With
        POOL_MIN_HOSTS SSH hosts or more and probe workers, those hosts are probed in the workers (`_pooled`): a
        Snapshot from there carries only the rows a status needs (bot.core.probe.status_snapshot), and the rows of
        `keep_pids` (host -> pids: its launches' recorded processes)."""
        pooled = self._poolable(hosts)
        if pooled:
            self._start_pooled(pooled, keep_pids or {})

        async def one(h: str) -> Snapshot | HostFailure:
            try:
                return await self.status_here(h)
            except Exception as e:  # a bug for one host must not hide the others
                log.exception("status of %s failed", h)
                return HostFailure(host=h, reason=f"internal error: {type(e).__name__}")

        return list(await asyncio.gather(*(one(h) for h in hosts)))

    async def status_here(self, host: str) -> Snapshot | HostFailure:
        """The status probe of `host` started at most STATUS_SHARE_S ago (here or in a probe worker), or a new one in
        this process; each caller gets its own Snapshot (a shallow copy with its own lists), and one caller giving
        up (cancelled) stops nobody else's answer."""
        now = asyncio.get_running_loop().time()
        entry = self._status_in_flight.get(host)
        if entry is not None and now - entry[1] <= STATUS_SHARE_S:
            running = entry[0]
        else:
            running = asyncio.ensure_future(self.probe(host, ProbeRequest()))
            self._share(host, running, now)
        result = await asyncio.shield(running)
        if isinstance(result, Snapshot):
            return result.shallow_copy()
        return result

    def _share(self, host: str, running: asyncio.Future[Snapshot | HostFailure], now: float) -> None:
        """Let status callers of `host` for the next STATUS_SHARE_S join `running`."""
        self._status_in_flight[host] = (running, now)

        def done(fut: asyncio.Future[Snapshot | HostFailure], host: str = host) -> None:
            if (got := self._status_in_flight.get(host)) is not None and got[0] is fut:
                del self._status_in_flight[host]
            if not fut.cancelled():
                fut.exception()  # seen: a caller that gave up leaves no "never retrieved" warning behind

        running.add_done_callback(done)

    def _poolable(self, hosts: list[str]) -> list[str]:
        """The hosts of a status that go to the probe workers: the configured SSH hosts whose executor was not
        given, when there are POOL_MIN_HOSTS of them and workers; else none."""
        if self._workers < 1:
            return []
        names = [h for h in dict.fromkeys(hosts)
                 if (cfg := self.config.hosts.get(h)) is not None and not cfg.local and h not in self._injected]
        return names if len(names) >= POOL_MIN_HOSTS else []

    def _start_pooled(self, hosts: list[str], keep: Mapping[str, Collection[int]]) -> None:
        """Start the worker probes of those `hosts` not already being probed (STATUS_SHARE_S), each shared as its
        host's status probe until it is done."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        fresh = [h for h in hosts
                 if (e := self._status_in_flight.get(h)) is None or now - e[1] > STATUS_SHARE_S]
        if not fresh:
            return
        futures: dict[str, asyncio.Future[Snapshot | HostFailure]] = {}
        for h in fresh:
            futures[h] = loop.create_future()
            self._share(h, futures[h], now)
        task = asyncio.ensure_future(self._pooled(futures, keep))
        self._pool_calls.add(task)
        task.add_done_callback(self._pool_calls.discard)

    async def _pooled(self, futures: dict[str, asyncio.Future[Snapshot | HostFailure]],
                      keep: Mapping[str, Collection[int]]) -> None:
        """Probe the hosts of `futures` in the probe workers, one call per worker, and resolve each future with its
        host's result. A worker that fails (ended, no answer in time) has its hosts probed here instead. A secret
        value learnt while the workers probed is masked here in what they sent."""
        if self._pool is None:
            self._pool = ProbePool(self._workers, (self.config, self._extra_path))
        pool = self._pool
        shards: dict[int, list[str]] = {}
        for h in futures:
            shards.setdefault(pool.shard(h), []).append(h)
        values = self.redactor.given_values
        # probe_concurrency over the whole status: each worker's call gets its hosts' share of it
        share = split_concurrency(self.config.probe_concurrency, {k: len(names) for k, names in shards.items()})

        async def here(h: str) -> None:
            result = await self.probe(h, ProbeRequest())
            if not futures[h].done():
                futures[h].set_result(result)

        async def shard(k: int, names: list[str]) -> None:
            deadline = max(self.probe_deadline_s(h) for h in names) * math.ceil(len(names) / share[k]) + PROBE_MARGIN_S
            try:
                got = await pool.call(k, names, values, deadline, limit=share[k], keep=keep)
            except WorkerGone as e:
                log.warning("probe worker %d failed (%s); probing its %d hosts here", k, e, len(names))
                got = {}
            missed = []
            learnt = len(self.redactor.given_values) != len(values)  # values learnt while the worker probed
            for h in names:
                entry = got.get(h)
                if entry is None:
                    missed.append(h)
                    continue
                result, seconds, helpers = entry
                self._remote_helpers[h] = tuple(helpers)
                if isinstance(result, Snapshot) and learnt:
                    redact = shown_command(self.redactor)  # the worker did not know them
                    for row in (*result.processes, *result.table):
                        row.args = redact(row.args)
                if isinstance(result, HostFailure):
                    log.warning("probe of %s failed: %s", h, result.reason)
                if self._metrics is not None:
                    self._metrics.observe_probe(h, seconds, not isinstance(result, HostFailure))
                if not futures[h].done():
                    futures[h].set_result(result)
            await asyncio.gather(*(here(h) for h in missed))

        try:
            await asyncio.gather(*(shard(k, names) for k, names in shards.items()))
        finally:  # never leave a caller waiting: a bug or a cancel gives its host an error
            for h, fut in futures.items():
                if not fut.done():
                    fut.set_exception(RuntimeError(f"the status probe of {h} was not finished"))

    async def close(self) -> None:
        """Close every executor (SSH connections) and end the probe workers."""
        if self._batches is not None:
            await self._batches.close()
        for task in list(self._pool_calls):
            task.cancel()
        if self._pool is not None:
            await self._pool.close()
        for ex in self._executors.values():
            await ex.close()
