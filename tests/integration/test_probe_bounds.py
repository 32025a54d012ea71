"""Probes at fleet size: at most `probe_concurrency` at once, a deadline per host, and a burst of `/gpu status`
sharing the status probe already running on a host.

The hosts are this machine (`local: true`: real `sh` scripts, real `ps`); the executor in front of each is the real
LocalExecutor with a gate the test opens, so what runs at once can be counted while it runs.
"""

from __future__ import annotations

import asyncio

import pytest

from bot.adapters.remote import CommandResult, LocalExecutor
from bot.config import Config, HostConfig
from bot.core.models import HostFailure, Snapshot
from bot.core.probe import ProbeRequest
from bot.services import hosts as hosts_module
from bot.services.hosts import HostService

pytestmark = pytest.mark.timeout(60)


class GatedLocal(LocalExecutor):
    """LocalExecutor whose scripts wait for `gate`; counts the scripts started and the most running at once."""

    def __init__(self, name: str, cfg: HostConfig, gate: asyncio.Event, counter: dict[str, int]):
        super().__init__(name, cfg)
        self.gate = gate
        self.counter = counter

    async def run_script(self, script: str, *, timeout_s: float | None = None) -> CommandResult:
        c = self.counter
        c["started"] += 1
        c["running"] += 1
        c["peak"] = max(c["peak"], c["running"])
        try:
            await self.gate.wait()
            return await super().run_script(script, timeout_s=timeout_s)
        finally:
            c["running"] -= 1


def _service(n: int, gate: asyncio.Event, **config: object) -> tuple[HostService, dict[str, int], list[str]]:
    names = [f"h{i}" for i in range(n)]
    hc = HostConfig(local=True, use_nvml=False, nvidia_smi="/nonexistent/nvidia-smi", command_timeout_s=10,
                    connect_timeout_s=1, nvidia_smi_timeout_s=1)
    cfg = Config(hosts=dict.fromkeys(names, hc), **config)
    counter = {"started": 0, "running": 0, "peak": 0}
    executors = {nm: GatedLocal(nm, hc, gate, counter) for nm in names}
    return HostService(cfg, executors), counter, names


async def _until(predicate, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_at_most_probe_concurrency_probes_run_at_once():
    gate = asyncio.Event()
    svc, counter, names = _service(10, gate, probe_concurrency=3)
    task = asyncio.ensure_future(svc.status(names))
    try:
        await _until(lambda: counter["running"] == 3)
        await asyncio.sleep(0.2)  # the 7 others stay queued however long the first ones take
        assert counter["started"] == 3
        gate.set()
        results = await task
    finally:
        gate.set()
        await svc.close()
    assert counter["peak"] == 3 and counter["started"] == 10
    assert all(isinstance(r, Snapshot) and r.table for r in results), results
    assert [r.host for r in results] == names


async def test_a_host_past_its_deadline_fails_alone(monkeypatch):
    monkeypatch.setattr(hosts_module, "PROBE_MARGIN_S", 0.5)
    gate = asyncio.Event()
    svc, _counter, names = _service(2, gate)
    open_gate = asyncio.Event()
    open_gate.set()
    svc._executors["h1"].gate = open_gate  # h1 answers; h0 never does
    try:
        limit = svc.probe_deadline_s("h0")
        assert limit == pytest.approx(1 + 10 + 1 + 0.5)
        # a short deadline for the test: h0's executor waits forever
        monkeypatch.setattr(svc, "probe_deadline_s", lambda host: 1.0)
        results = await svc.status(names)
    finally:
        gate.set()
        await svc.close()
    assert isinstance(results[0], HostFailure) and "did not answer within 1 s" in results[0].reason
    assert isinstance(results[1], Snapshot) and results[1].table


async def test_a_burst_of_status_shares_the_probe_running_on_a_host():
    gate = asyncio.Event()
    svc, counter, _names = _service(1, gate)
    try:
        callers = [asyncio.ensure_future(svc.status(["h0"])) for _ in range(5)]
        await _until(lambda: counter["started"] == 1)
        await asyncio.sleep(0.1)
        callers[0].cancel()  # one caller giving up stops nobody else's answer
        gate.set()
        answers = [(await c)[0] for c in callers[1:]]
        assert counter["started"] == 1, "five status calls in flight together ran one probe"
        assert all(isinstance(a, Snapshot) for a in answers)
        assert len({id(a) for a in answers}) == 4 and len({id(a.table) for a in answers}) == 4
        assert len({len(a.table) for a in answers}) == 1
        answers[0].errors.append("changed by one caller")
        assert not answers[1].errors
        # once it has answered, the next status probes the host again
        again = (await svc.status(["h0"]))[0]
        assert isinstance(again, Snapshot) and counter["started"] == 2
    finally:
        gate.set()
        await svc.close()


async def test_probes_that_are_not_status_are_never_shared():
    gate = asyncio.Event()
    svc, counter, _names = _service(1, gate)
    try:
        calls = [asyncio.ensure_future(svc.probe("h0", ProbeRequest(match="sh"))) for _ in range(3)]
        await _until(lambda: counter["started"] == 3)
        gate.set()
        results = await asyncio.gather(*calls)
    finally:
        gate.set()
        await svc.close()
    assert counter["started"] == 3
    assert all(isinstance(r, Snapshot) for r in results), results
    assert len({id(r) for r in results}) == 3


class TwoAgents(GatedLocal):
    """A host that runs 2 scripts at once, the others waiting inside `run_script` (as an SSH host's 2 probe
    agents), each script taking at least 0.5 s there (the host is slow)."""

    def __init__(self, *args: object):
        super().__init__(*args)
        self.agents = asyncio.Semaphore(2)

    def script_slots(self) -> int:
        return 2

    async def run_script(self, script: str, *, timeout_s: float | None = None) -> CommandResult:
        async with self.agents:
            return await super().run_script("sleep 0.5\n" + script, timeout_s=timeout_s)


async def test_probes_queued_for_a_busy_host_do_not_spend_their_deadline_waiting(monkeypatch):
    gate = asyncio.Event()
    gate.set()
    counter = {"started": 0, "running": 0, "peak": 0}
    hc = HostConfig(local=True, use_nvml=False, nvidia_smi="/nonexistent/nvidia-smi", command_timeout_s=10)
    svc = HostService(Config(hosts={"h0": hc}), {"h0": TwoAgents("h0", hc, gate, counter)})
    monkeypatch.setattr(svc, "probe_deadline_s", lambda host: 2.5)
    try:
        # 10 probes of one host, 2 at a time, 0.5 s each: the last start after 2 s, within their own 2.5 s
        results = await asyncio.gather(*(svc.probe("h0", ProbeRequest(match="sleep")) for _ in range(10)))
    finally:
        await svc.close()
    assert all(isinstance(r, Snapshot) for r in results), [getattr(r, "reason", None) for r in results]
    assert counter["peak"] == 2


async def test_a_status_probe_started_too_long_ago_is_not_shared(monkeypatch):
    """A caller arriving after the running probe read the host (past STATUS_SHARE_S) gets a probe of its own."""
    monkeypatch.setattr(hosts_module, "STATUS_SHARE_S", 0.0)
    gate = asyncio.Event()
    svc, counter, _names = _service(1, gate)
    first = second = None
    try:
        first = asyncio.ensure_future(svc.status(["h0"]))
        await _until(lambda: counter["started"] == 1)
        second = asyncio.ensure_future(svc.status(["h0"]))
        await _until(lambda: counter["started"] == 2)
        gate.set()
        answers = [(await first)[0], (await second)[0]]
    finally:
        gate.set()
        await asyncio.gather(*(t for t in (first, second) if t is not None), return_exceptions=True)
        await svc.close()
    assert all(isinstance(a, Snapshot) for a in answers), answers
