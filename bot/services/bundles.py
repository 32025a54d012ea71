"""Collect a bundle in the diagnose format from a live host (`gpubot bundle`, `!bundle`): two probes a few seconds
apart, the extras (nvidia-smi table and CSV, listening sockets, dmesg), py-spy dumps of the launch's ranks, all
redacted; written to a directory or packed as a tar.gz. The files themselves are bot.core.collect."""

from __future__ import annotations

import asyncio
import io
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bot.adapters.remote import RemoteError
from bot.config import WatchPolicy
from bot.core.collect import bundle_files, extras_budget_s, extras_script, observed_from_probes, parse_extras
from bot.core.diagnose import SIGNATURES
from bot.core.models import HostFailure, Launch
from bot.core.probe import ProbeRequest
from bot.core.ranks import NODE_DIR_PREFIX, RANKS_FILE, rank_view
from bot.core.redact import Redactor
from bot.services.audit import Audit
from bot.services.hosts import HostService
from bot.services.launches import LaunchService
from bot.services.runners import Runner
from bot.services.stacks import StackDumpError, StackService

#: Seconds between the two probes: long enough for a moving log or GPU memory to show it.
PROBE_GAP_S = 3.0


class CollectError(Exception):
    """The bundle could not be collected at all (host unreachable at the first probe); str() is user-facing."""


@dataclass
class Bundle:
    """A collected bundle: `name` (`base-12-20261201T213005Z`), `files` (relative path -> bytes, redacted), and
    the target it came from (`host`, `launch` or None for a host bundle)."""

    name: str
    host: str
    launch: Launch | None
    files: dict[str, bytes]

    def write(self, directory: str | Path) -> Path:
        """Write the files under `directory` (created, also `py-spy/`); returns the directory. Refuses (raises
        FileExistsError) a directory that already holds bundle files, so no earlier bundle is overwritten;
        raises OSError when it cannot be written."""
        root = Path(directory)
        if root.exists() and any(root.iterdir()):
            raise FileExistsError(f"{root} is not empty: name a new directory for the bundle")
        root.mkdir(parents=True, exist_ok=True)
        for rel, data in self.files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "xb") as f:
                f.write(data)
        return root

    def tar_gz(self) -> bytes:
        """The bundle as a tar.gz (members under `name/`, mode 0644, the collection time as mtime)."""
        buf = io.BytesIO()
        now = int(time.time())
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for rel, data in sorted(self.files.items()):
                info = tarfile.TarInfo(f"{self.name}/{rel}")
                info.size, info.mode, info.mtime = len(data), 0o644, now
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()


class BundleService:
    """Collects bundles of a launch or of a host (py-spy dumps only for a live launch)."""

    def __init__(self, hosts: HostService, launches: LaunchService, stacks: StackService, audit: Audit,
                 redactor: Redactor, *, gap_s: float = PROBE_GAP_S,
                 policy_for: Callable[[Launch], WatchPolicy] | None = None):
        self._hosts = hosts
        self._launches = launches
        self._stacks = stacks
        self._audit = audit
        self._redact = redactor
        self._gap_s = gap_s
        self._policy_for = policy_for

    async def collect(self, *, launch: Launch | None = None, host: str | None = None, user: str,
                      channel: str | None = None, tail_lines: int = 500) -> Bundle:
        """Collect a bundle of `launch` (its processes, log, port, health and generation checks, ranks' stacks) or
        of `host` (its GPU holders, GPUs, sockets, dmesg). Raises CollectError when the host cannot be probed;
        anything that could not be collected later is listed in the bundle's collected.md. Audited as `bundle`."""
        runner = self._launches.runner(launch) if launch is not None else None
        if launch is not None and runner is not None and runner.spans:
            return await self._collect_ranks(launch, runner, user=user, channel=channel, tail_lines=tail_lines)
        if launch is not None:
            host = launch.host
            req = self._launches.launch_probe_request(launch, tail_lines=tail_lines)
        else:
            assert host is not None
            req = ProbeRequest(tail_lines=1)
        first = await self._hosts.probe(host, req)
        if isinstance(first, HostFailure):
            self._audit.record(user_id=user, action="bundle", args={"target": launch.name if launch else host},
                               result="error", detail=first.reason, host=host, channel=channel,
                               launch_id=launch.id if launch else None)
            raise CollectError(f"{host} cannot be probed: {first.reason}")
        extras_task = asyncio.ensure_future(self._extras(host))
        await asyncio.sleep(self._gap_s)
        # the second probe also runs the variant's generation check, if it names one: observed.json records it
        # (a live launch only: an ended one's port may now belong to another server)
        second = await self._hosts.probe(host, self._launches.launch_probe_request(launch, tail_lines=tail_lines,
                                                                                    generate=True)
                                         if launch is not None and launch.live else req)
        missing: list[str] = []
        if isinstance(second, HostFailure):
            missing.append(f"second probe failed ({second.reason}): observed.json holds what one probe shows")
            second = first
        extras, why = await extras_task
        if why:
            missing.append(why)
        ranks = []
        own = []
        # a launch's bundle: the GPU holders and the launch's processes; a host's: every process on it (the GPU
        # holders alone leave nothing when no GPU is held, and a hung engine may hold none)
        processes = list(second.processes) if launch is not None else list(second.table or second.processes)
        if launch is not None:
            own = self._launches.launch_processes_of(launch, second)
            known = {p.pid for p in processes}
            processes += [p for p in own if p.pid not in known]
            if own:
                try:
                    dump = await self._stacks.dump_processes(launch, own, native=False, user=user,
                                                             channel=channel)
                    ranks = dump.ranks()
                except StackDumpError as e:
                    missing.append(f"py-spy: {e}")
            else:
                missing.append("py-spy: no process of the launch is alive")
        observed = observed_from_probes(first, second, pid=launch.pid if launch else None,
                                        started_at=launch.created_at if launch else None,
                                        heartbeat=lambda line: SIGNATURES.heartbeat.first(line) is not None,
                                        own={p.pid for p in own})
        if launch is not None and self._policy_for is not None:  # judged offline as the watcher judges it live
            policy = self._policy_for(launch)
            observed["grace_s"] = {**SIGNATURES.default_grace_s, **policy.phase_grace_s}
            observed["silence_after_s"] = policy.silence_after_s
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = f"{launch.name} on {host}" if launch else f"host {host}"
        name = f"{launch.variant}-{launch.id}-{stamp}" if launch else f"{host}-{stamp}"
        files = bundle_files(first, second, processes=processes, extras=extras, ranks=ranks, observed=observed,
                             redact=self._redact, what=f"{target}, collected {stamp}", not_collected=missing)
        self._audit.record(user_id=user, action="bundle", args={"target": launch.name if launch else host},
                           result="ok", detail=f"{len(files)} files", host=host, channel=channel,
                           launch_id=launch.id if launch else None)
        return Bundle(name=name, host=host, launch=launch, files=files)

    async def _collect_ranks(self, launch: Launch, runner: Runner, *, user: str, channel: str | None,
                             tail_lines: int) -> Bundle:
        """The bundle of a launch across nodes: rank 0's at the top level, every other rank's (each collected on its
        node, at the same time) in `node-NAME/`, `ranks.txt` (`K NAME` lines) and, for a Slurm job, `scontrol.txt`
        (`scontrol show job -o`). A rank whose node cannot be probed is listed in collected.md. Raises
        CollectError when rank 0 cannot be collected (the job has not started, or its node is no host of the
        config or cannot be probed)."""
        ranks = runner.ranks(launch)
        if not ranks or ranks[0][2] is None:
            where = runner.unreachable_rank0(launch, ranks[0][1]) if ranks else "it runs on no node yet"
            raise CollectError(f"{launch.name}: rank 0 cannot be collected: {where}")

        async def one(rank: int, host: str) -> Bundle:
            return await self.collect(launch=rank_view(launch, rank, host), user=user, channel=channel,
                                      tail_lines=tail_lines)

        got = await asyncio.gather(*(one(k, h) for k, _, h in ranks if h is not None), return_exceptions=True)
        if isinstance(got[0], BaseException):
            raise got[0]
        main = got[0]
        files = dict(main.files)
        missing = [f"rank {k} on {node}: not a host of the config, so not probed" for k, node, h in ranks if h is None]
        for (k, node, _), res in zip([r for r in ranks if r[2] is not None][1:], got[1:], strict=True):
            if isinstance(res, BaseException):
                missing.append(f"rank {k} on {node}: {res}")
                continue
            files.update({f"{NODE_DIR_PREFIX}{node}/{rel}": data for rel, data in res.files.items()})
        files[RANKS_FILE] = "".join(f"{k} {node}\n" for k, node, _ in ranks).encode()
        extra, not_collected = await runner.bundle_parts(launch)  # a Slurm job's scontrol record
        files.update({name: self._redact(text).encode() for name, text in extra.items()})
        missing += not_collected
        if missing:
            files["collected.md"] = files.get("collected.md", b"") + (
                "\n## Ranks not collected\n\n" + "".join(f"- {m}\n" for m in missing)).encode()
        return Bundle(name=main.name, host=launch.host, launch=launch, files=files)

    async def _extras(self, host: str) -> tuple[dict[str, tuple[str, int | None]], str | None]:
        cfg = self._hosts.host_config(host)
        timeout = max(1, int(cfg.nvidia_smi_timeout_s))
        script = extras_script(cfg.nvidia_smi, timeout_s=timeout, env=list(cfg.env.items()))
        try:
            res = await self._hosts.executor(host).run("sh -s", input=script.encode(),
                                                       timeout_s=extras_budget_s(timeout))
        except RemoteError as e:
            return {}, f"nvidia-smi, sockets and dmesg: the host did not run them ({e})"
        return parse_extras(res.stdout.decode("utf-8", "replace")), None

