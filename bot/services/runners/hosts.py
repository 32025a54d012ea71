"""The runner of a multi-host SSH variant (`hosts:`): one launch, one process tree per host, rank K on the K-th host
with `{{ node_rank }}` K, `{{ nnodes }}`, `{{ master_addr }}` rank 0's address, tag `<tag>-rK` and log
`<stem>-rankK<ext>`. Its row has `host` = its first host (rank 0, with its PID) and `nodes` = its hosts.

Guarantees: every host's launch decision is taken and checked before anything starts (LaunchService, `decides_on`);
the ranks above 0 start first and rank 0 last (its PID is the launch's; the watch starts with it); a rank that does not
start, or a kill while they start, stops the ranks already started (verified, as any kill) before the start answers.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from bot.adapters.remote import RemoteError
from bot.config import Config, render_launch
from bot.core.lifecycle import KillOutcome, RenderedLaunch
from bot.core.models import Launch, LaunchKind, LaunchState
from bot.core.ranks import rank_tag, rank_view
from bot.services.hosts import HostService
from bot.services.probes import LaunchProbes
from bot.services.runners import Begun
from bot.services.runners.host import run_launch_script, started_fields
from bot.services.runners.kill import ProcessKiller
from bot.services.runners.ranks import RankedRunner

log = logging.getLogger("bot.services.launches")


class RowReader(Protocol):
    """What a start across nodes reads of its launch: whether it is still `starting` (a kill meanwhile)."""

    def get(self, launch_id: int) -> Launch | None: ...


class MultiHostRunner(RankedRunner):
    """Launches of multi-host SSH variants: one process tree per host."""

    kind = LaunchKind.HOSTS
    spans = True
    placed = False
    scheduled = False

    def __init__(self, config: Config, hosts: HostService, probes: LaunchProbes, killer: ProcessKiller,
                 rows: RowReader) -> None:
        super().__init__(config, hosts, probes, killer)
        self.rows = rows

    def plan(self, variant: str, params: Mapping[str, str]) -> list[RenderedLaunch]:
        """One preview per host, rank order. Raises LaunchError for bad params."""
        hosts = list(self.config.resolved_variant(variant).hosts or [])
        return [render_launch(self.config, variant, dict(params), launch_id=0, host=h, rank=k)
                for k, h in enumerate(hosts)]

    def decides_on(self, previews: Sequence[RenderedLaunch]) -> list[str]:
        """Every host: each is locked and checked."""
        return [r.host for r in previews]

    def shown_host(self, previews: Sequence[RenderedLaunch]) -> str:
        """Its hosts."""
        return ", ".join(r.host for r in previews)

    def row(self, variant: str, previews: Sequence[RenderedLaunch]) -> dict[str, Any]:
        """Rank 0's host and GPUs, the variant's port, every host as its nodes."""
        return {"host": previews[0].host, "port": self.config.resolved_variant(variant).port,
                "gpus": previews[0].gpus, "nodes": [r.host for r in previews]}

    def audit_args(self, variant: str, previews: Sequence[RenderedLaunch], params: Mapping[str, Any]
                   ) -> dict[str, Any]:
        """variant, hosts, params."""
        return {"variant": variant, "hosts": [r.host for r in previews], "params": params}

    def render(self, variant: str, params: Mapping[str, str], la: Launch) -> list[RenderedLaunch]:
        """Each rank on its host, tagged `<tag>-rK`."""
        return [render_launch(self.config, variant, dict(params), launch_id=la.id, host=h, tag=rank_tag(la.tag, k),
                              rank=k) for k, h in enumerate(la.nodes)]

    async def start(self, la: Launch, rendered: Sequence[RenderedLaunch]) -> Begun:
        """The ranks above 0, then rank 0; a kill meanwhile stops those started; a rank that does not start has
        those started stopped once the failure is recorded (`then`: the launch is no longer live meanwhile)."""
        hosts = [r.host for r in rendered]
        where = ", ".join(hosts)
        for k in range(1, len(hosts)):
            why = await self._start_rank(rendered[k], hosts[k])
            current = self.rows.get(la.id)
            if why is None and (current is None or current.state != LaunchState.STARTING):
                await self._stop_ranks(la, range(1, k + 1))  # killed while its ranks started
                return Begun(cancelled="killed while its ranks were starting", host=where)
            if why is not None:
                why = f"rank {k} on {hosts[k]} could not start: {why}"
                # rank k too: it may have started half way
                return Begun(failed=why, error=why, host=where, audit_host=hosts[k],
                             then=self._stopping(la, range(1, k + 1)))
        r = rendered[0]
        started, why = await run_launch_script(self.config, self.hosts, hosts[0], r)
        if started is None:
            return Begun(failed=why, error=f"could not start: {why}", then=self._stopping(la, range(1, len(hosts))))
        return Begun(fields=started_fields(started), detail=f"pid {started.pid} log {r.log_path}", first_look=True)

    async def _start_rank(self, r: RenderedLaunch, host: str) -> str | None:
        """Start one rank's process tree on `host` (the launch script, as for any launch). Returns why it did not
        start, or None."""
        return (await run_launch_script(self.config, self.hosts, host, r))[1]

    def _stopping(self, la: Launch, ranks: Sequence[int]) -> Callable[[Launch], Awaitable[dict[str, Any]]]:
        """`_stop_ranks(la, ranks)` as a Begun's `then` (nothing to record)."""
        async def stop(_: Launch) -> dict[str, Any]:
            await self._stop_ranks(la, ranks)
            return {}

        return stop

    async def _stop_ranks(self, la: Launch, ranks: Sequence[int]) -> None:
        """Stop ranks `ranks` of `la` (a start that failed part way), verified like any kill; never raises."""
        for k in ranks:
            host = la.nodes[k]
            try:
                await self.killer.stop(rank_view(la, k, host), KillOutcome(target=f"{la.name} rank {k}", host=host))
            except RemoteError as e:
                log.warning("%s: rank %d on %s could not be stopped: %s", la.name, k, host, e)

    async def undo(self, la: Launch, out: KillOutcome) -> KillOutcome:
        """Stop rank 0's process tree (the kill that cancelled the launch stops every rank)."""
        return await self.killer.stop(la, out)

    async def stop(self, la: Launch, out: KillOutcome) -> KillOutcome:
        """Stop every rank on its host, verified."""
        return await self.stop_ranks(la, out, [])

    def where(self, la: Launch) -> str:
        """`ranks on a, b`."""
        return f"ranks on {', '.join(la.nodes[:8])}" if la.nodes else ""
