"""The runner of a launch on one host: one process tree, started over SSH (or locally) by the launch script in its
own systemd scope or cgroup where the host allows (bot.core.lifecycle.launch_script), its server's PID and its
wrapper's process group (= session) returned to be recorded; looked at, logged, dumped and bundled on that host;
stopped by the verified kill (bot.services.runners.kill).

Guarantees: a start never raises for a host that cannot be reached (`Begun.failed` says why, with at most 500
characters of the script's output); what it started is looked at once more after `start_check_s` (its early exit).
It has no ranks: asked for them it raises Unsupported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bot.adapters.remote import RemoteError
from bot.config import Config, render_launch
from bot.core.lifecycle import KillOutcome, RenderedLaunch, Started, launch_script, parse_launch_output
from bot.core.models import Launch, LaunchKind, Snapshot
from bot.core.ranks import NodeLook
from bot.services.hosts import HostService
from bot.services.runners import Begun, Rank, Unsupported
from bot.services.runners.kill import ProcessKiller


async def run_launch_script(config: Config, hosts: HostService, host: str, r: RenderedLaunch
                            ) -> tuple[Started | None, str | None]:
    """Start `r`'s process tree on `host` with the launch script (bot.core.lifecycle.launch_script: its own
    systemd scope or cgroup where the host allows). Returns (what it printed, None), or (None, why it did not
    start: its output, at most 500 characters, or the host's error). Never raises RemoteError."""
    try:
        cfg = config.hosts[host]
        script = launch_script(r, systemd=cfg.systemd == "auto", cgroup=cfg.cgroup == "auto")
        res = await hosts.executor(host).run("sh -s", input=script.encode(), timeout_s=30)
    except RemoteError as e:
        return None, str(e)
    out = res.stdout.decode("utf-8", "replace")
    started = parse_launch_output(out)
    if started is not None:
        return started, None
    return None, (out + res.stderr.decode("utf-8", "replace")).strip()[:500] or f"exit {res.exit_status}"


def started_fields(started: Started) -> dict[str, Any]:
    """The fields a started process tree is recorded with: its server, its wrapper's group = session, its unit."""
    return {"pid": started.pid, "pgid": started.pgid or started.pid, "sid": started.pgid or started.pid,
            "unit": started.unit, "unit_manager": started.manager}


class HostRunner:
    """Launches that are one process tree on one host of `config`."""

    kind = LaunchKind.HOST
    spans = False
    placed = True
    scheduled = False

    def __init__(self, config: Config, hosts: HostService, killer: ProcessKiller) -> None:
        self.config = config
        self.hosts = hosts
        self.killer = killer

    def plan(self, variant: str, params: Mapping[str, str]) -> list[RenderedLaunch]:
        """The variant rendered on its own host (a placed variant's host and GPUs are picked by LaunchService)."""
        return [render_launch(self.config, variant, dict(params), launch_id=0)]

    def decides_on(self, previews: Sequence[RenderedLaunch]) -> list[str]:
        """Its host."""
        return [previews[0].host]

    def shown_host(self, previews: Sequence[RenderedLaunch]) -> str:
        """Its host."""
        return previews[0].host

    def row(self, variant: str, previews: Sequence[RenderedLaunch]) -> dict[str, Any]:
        """Its host, port and GPUs."""
        r = previews[0]
        return {"host": r.host, "port": r.port, "gpus": r.gpus}

    def audit_args(self, variant: str, previews: Sequence[RenderedLaunch], params: Mapping[str, Any]
                   ) -> dict[str, Any]:
        """variant, host, params."""
        return {"variant": variant, "host": previews[0].host, "params": params}

    def render(self, variant: str, params: Mapping[str, str], la: Launch) -> list[RenderedLaunch]:
        """The launch on its host with its GPUs, tagged."""
        return [render_launch(self.config, variant, dict(params), launch_id=la.id, host=la.host, tag=la.tag,
                              gpus=la.gpus)]

    async def start(self, la: Launch, rendered: Sequence[RenderedLaunch]) -> Begun:
        """Run the launch script on its host."""
        r = rendered[0]
        started, why = await run_launch_script(self.config, self.hosts, la.host, r)
        if started is None:
            return Begun(failed=why, error=f"could not start: {why}")
        return Begun(fields=started_fields(started), detail=f"pid {started.pid} log {r.log_path}", first_look=True)

    async def undo(self, la: Launch, out: KillOutcome) -> KillOutcome:
        """Stop its process tree."""
        return await self.killer.stop(la, out)

    async def stop(self, la: Launch, out: KillOutcome) -> KillOutcome:
        """Stop its process tree, verified."""
        return await self.killer.stop(la, out)

    def rank0(self, la: Launch) -> Launch:
        """The launch itself."""
        return la

    def ranks(self, la: Launch) -> list[Rank]:
        """None: one process tree."""
        return []

    def where(self, la: Launch) -> str:
        """Its host."""
        return la.host

    def stack_targets(self, la: Launch) -> list[Rank] | None:
        """The launch itself."""
        return None

    async def look_ranks(self, la: Launch, ranks: Sequence[Rank]) -> list[NodeLook]:
        """A launch on one host has no ranks to look at."""
        raise Unsupported(f"{la.name} runs on one host: it has no ranks")

    def node_look(self, view: Launch, rank: int, node: str, snap: Snapshot, verdict: str | None = None) -> NodeLook:
        """A launch on one host has no ranks to look at."""
        raise Unsupported(f"{view.name} runs on one host: it has no ranks")

    async def bundle_parts(self, la: Launch) -> tuple[dict[str, str], list[str]]:
        """No files beyond its own."""
        return {}, []

    def unreachable_rank0(self, la: Launch, node: str) -> str:
        """Its host is always a host of the config."""
        raise Unsupported(f"{la.name} runs on one host: it has no ranks")
