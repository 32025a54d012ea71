"""Probes of a launch: what a probe of one launch asks (its tag, its own log, its port and health path, its variant's
generation check, the PIDs whose start times it reads) and which processes of a snapshot are the launch's. The narrow
collaborator that every runner, check and kill shares instead of `LaunchService`.

Guarantees: a variant's probe parts are worked out once (the config is fixed); a generation check the probe could not
send is left out alone (logged), never the whole probe; `snapshot` raises RemoteError for a host that cannot be
read, `probe` never raises for one (a HostFailure).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from bot.adapters.remote import RemoteError
from bot.config import Config, GenerateCheck
from bot.core.models import HostFailure, Launch, ProcessInfo, Snapshot
from bot.core.observe import own_processes
from bot.core.probe import MAX_PS_PIDS, ProbeRequest, ProbeRequestError
from bot.services.hosts import HostService

log = logging.getLogger("bot.services.launches")


@dataclass
class _ProbeParts:
    """What probes of one variant's launches ask: `health_path`, the variant's generation `check` (None: none) and,
    once checked sendable, `generate`: (path, JSON body or None, timeout in seconds) as the probe sends it."""

    health_path: str
    check: GenerateCheck | None
    generate: tuple[str, str | None, float] | None = None


class LaunchProbes:
    """Probe requests of launches and what their snapshots say of them, for `config`'s variants on `hosts`."""

    def __init__(self, config: Config, hosts: HostService) -> None:
        self.config = config
        self.hosts = hosts
        self._probe_parts: dict[str, _ProbeParts] = {}  # variant -> what a probe of its launches asks

    def request(self, la: Launch, *, tail_lines: int = 20, gpu: bool = True, port: bool = True,
                generate: bool = False) -> ProbeRequest:
        """A probe of one launch: its session/process group, its tagged processes, its log (its own, rendered
        from the config: allowed even on a host without log_dirs) and its port and health endpoint; with
        `generate`, also its variant's generation check (when it names one; its timeout kept 2 s under the host's
        command timeout, so the probe still answers)."""
        parts = self._parts(la)
        req = ProbeRequest(select_tag=la.tag or None, log_path=la.log_path, own_log=True,
                           port=la.port if port else None, health_path=parts.health_path,
                           tail_lines=max(1, min(500, tail_lines)), gpu=gpu, stat_pids=self.stat_pids(la))
        if not (generate and port and la.port and parts.generate):
            return req
        path, body, timeout_s = parts.generate
        return replace(req, generate_path=path, generate_body=body, generate_timeout_s=timeout_s)

    def generation_check(self, la: Launch) -> GenerateCheck | None:
        """The generation check of the launch's variant (bot.config.schema.GenerateCheck), or None when it names none
        (or the variant is gone from the config)."""
        return self._parts(la).check

    def _parts(self, la: Launch) -> _ProbeParts:
        """What a probe of `la` asks of its variant, worked out once per variant (the config is fixed): its health
        path, and its generation check as sent (path, JSON body, timeout under the host's command timeout) once
        checked sendable; a check the probe could not send is left out alone (logged), never the whole probe."""
        parts = self._probe_parts.get(la.variant)
        if parts is not None:
            return parts
        v = self.config.resolved_variant(la.variant) if la.variant in self.config.variants else None
        parts = _ProbeParts((v.health if v else None) or "/health", v.generate if v else None)
        try:
            host = self.hosts.host_config(la.host)  # a host of the config, or a node of a Slurm job
        except KeyError:
            host = None
        if parts.check is not None and host is not None:
            path, body = parts.check.request()
            timeout_s = parts.check.timeout_under(host.command_timeout_s)
            try:
                ProbeRequest(port=1, generate_path=path, generate_body=body, generate_timeout_s=timeout_s).validate()
                parts.generate = (path, body, timeout_s)
            except ProbeRequestError as e:
                log.warning("variant %s: generation check left out: %s", la.variant, e)
        self._probe_parts[la.variant] = parts
        return parts

    @staticmethod
    def stat_pids(la: Launch) -> tuple[int, ...]:
        """The PIDs whose start times a probe of `la` reads: its server, its wrapper and every process it remembers
        (newest last, at most MAX_PS_PIDS)."""
        pids = dict.fromkeys([*(p for p in (la.pid, la.pgid) if p), *la.seen_pids])
        return tuple(pids)[-MAX_PS_PIDS:]

    @staticmethod
    def processes_of(la: Launch, snap: Snapshot) -> list[ProcessInfo]:
        """The live processes of `la` in a snapshot taken with `select_tag=la.tag`: see
        bot.core.observe.own_processes (tag, confirmed session/group, processes seen before, descendants)."""
        return own_processes(snap, la)

    @staticmethod
    def tagged(la: Launch, snap: Snapshot) -> list[int]:
        """The PIDs of `snap` that carry `la`'s tag."""
        return [pid for pid, tag in snap.launch_tags.items() if la.tag and tag == la.tag]

    async def probe(self, host: str, req: ProbeRequest) -> Snapshot | HostFailure:
        """One probe of `host`; never raises for a host that cannot be read (a HostFailure)."""
        return await self.hosts.probe(host, req)

    async def snapshot(self, host: str, req: ProbeRequest) -> Snapshot:
        """One probe of `host`. Raises RemoteError when it cannot be read."""
        res = await self.hosts.probe(host, req)
        if isinstance(res, HostFailure):
            raise RemoteError(host, res.reason)
        return res
