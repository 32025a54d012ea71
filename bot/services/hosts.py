"""Host service: turns a host name and a ProbeRequest into a Snapshot (or a HostFailure).

This is the I/O edge for probes: it picks the executor, reads NVML for local GPU hosts, sends the probe
script in ONE command over ONE channel, and hands the output to the pure assembler in `bot.core.probe`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable

from bot.adapters.nvml import read_nvml_async
from bot.adapters.remote import Executor, RemoteError, build_executor
from bot.config import Config, HostConfig
from bot.core.models import GpuSection, HostFailure, Snapshot
from bot.core.probe import HostPolicy, ProbeRequest, assemble_snapshot, build_script, new_nonce, split_sections
from bot.core.redact import Redactor

log = logging.getLogger(__name__)

NvmlReader = Callable[[], Awaitable[GpuSection]]


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
    `redactor` masks secrets in command lines and log lines before they are cut (bot.core.probe)."""

    def __init__(
        self,
        config: Config,
        executors: dict[str, Executor] | None = None,
        *,
        redactor: Redactor | None = None,
        nvml_reader: NvmlReader | None = None,
        extra_path: list[str] | None = None,
    ):
        self.config = config
        self.redactor = redactor or Redactor(config.redact_patterns)
        self._executors: dict[str, Executor] = dict(executors or {})
        self._nvml_reader = nvml_reader or read_nvml_async
        self._extra_path = extra_path

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

    def executor(self, host: str) -> Executor:
        """The pooled executor of `host` (created on first use)."""
        ex = self._executors.get(host)
        if ex is None:
            ex = build_executor(host, self.config.hosts[host], extra_path=self._extra_path)
            self._executors[host] = ex
        return ex

    async def probe(self, host: str, req: ProbeRequest) -> Snapshot | HostFailure:
        """Take one snapshot of `host`: one command, one channel. Returns Snapshot or HostFailure.

        Raises ProbeRequestError for an invalid request, or one the host's policy refuses (a log outside
        its log_dirs), before anything is sent. `req` is not modified.
        """
        cfg = self.config.hosts[host]
        policy = host_policy(cfg)
        policy.check(req)
        gpu_override = None
        if cfg.local and cfg.use_nvml and req.gpu:
            reading = await self._nvml_reader()
            if reading.ok:
                gpu_override = reading
                req = dataclasses.replace(req, gpu=False)
        nonce = new_nonce()
        script = build_script(req, nonce, policy)
        start = time.monotonic()
        sent_at = time.time()
        try:
            res = await self.executor(host).run("sh -s", input=script.encode(), timeout_s=cfg.command_timeout_s)
        except RemoteError as e:
            log.warning("probe of %s failed: %s", host, e)
            return HostFailure(host=host, reason=str(e))
        sections = split_sections(res.stdout, nonce)
        if not sections:
            err = res.stderr.decode("utf-8", "replace").strip()[:300]
            if res.exit_status in (124, 137):
                reason = f"probe did not finish within {cfg.command_timeout_s:g} s"
            else:
                reason = f"probe script failed (exit {res.exit_status}){': ' + err if err else ''}"
            return HostFailure(host=host, reason=reason)
        snap = assemble_snapshot(host, req, sections, policy=policy, gpu_override=gpu_override,
                                 gpu_note=cfg.gpu_note, redactor=self.redactor)
        if res.exit_status in (124, 137):
            snap.errors.append(f"probe cut short after {cfg.command_timeout_s:g} s; some sections are missing")
        snap.duration_s = time.monotonic() - start
        snap.local_clock = sent_at
        return snap

    async def status(self, hosts: list[str]) -> list[Snapshot | HostFailure]:
        """Probe `hosts` in parallel for GPU status (GPU table + GPU holders). One result per host, in order;
        a failing host yields a HostFailure while the others still answer."""

        async def one(h: str) -> Snapshot | HostFailure:
            try:
                return await self.probe(h, ProbeRequest())
            except Exception as e:  # a bug for one host must not hide the others
                log.exception("status of %s failed", h)
                return HostFailure(host=h, reason=f"internal error: {type(e).__name__}")

        return list(await asyncio.gather(*(one(h) for h in hosts)))

    async def close(self) -> None:
        """Close every executor (SSH connections)."""
        for ex in self._executors.values():
            await ex.close()
