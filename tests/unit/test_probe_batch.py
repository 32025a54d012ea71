"""The watcher's cheap looks of one host share a round trip (bot.services.probe_batch, bot.core.probe
.build_batch_script): looks asked for within the gather window go in one batch, each answered with its own result;
a look that gives up does not stop the others; a failing batch fails each look; the scripts of a batch run in one
shell and each one's sections are found by its own nonce only. The checks of a host's serving launches come due at
the same moments (bot.core.clock.aligned_delay)."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from bot.core.clock import aligned_delay
from bot.core.models import HostFailure, Snapshot
from bot.core.probe import (
    ProbeRequest,
    batchable,
    build_batch_script,
    build_script,
    new_nonce,
    split_members,
    split_sections,
)
from bot.services.probe_batch import ProbeBatches

pytestmark = pytest.mark.timeout(30)


class _Runs:
    """A `run` for ProbeBatches that records each batch and answers each request with a Snapshot naming its pid."""

    def __init__(self, fail: Exception | None = None, gate: asyncio.Event | None = None):
        self.batches: list[tuple[str, list[ProbeRequest]]] = []
        self.fail, self.gate = fail, gate

    async def __call__(self, host: str, reqs: list[ProbeRequest]) -> list[Snapshot | HostFailure]:
        self.batches.append((host, list(reqs)))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return [Snapshot(host=host, hostname=str(r.pid)) for r in reqs]


def _req(pid: int) -> ProbeRequest:
    return ProbeRequest(pid=pid, ps_pids=(pid,), log_since=True)


async def test_looks_of_one_host_asked_within_the_window_share_one_batch_and_get_their_own_answers():
    runs = _Runs()
    batches = ProbeBatches(runs, gather_s=0.05)
    got = await asyncio.gather(*(batches.probe("h1", _req(p)) for p in (11, 12, 13)), batches.probe("h2", _req(21)))
    assert [s.hostname for s in got] == ["11", "12", "13", "21"]
    assert sorted((h, [r.pid for r in reqs]) for h, reqs in runs.batches) == [("h1", [11, 12, 13]), ("h2", [21])]
    again = await batches.probe("h1", _req(14))  # after the batch was sent: a batch of its own
    assert again.hostname == "14" and len(runs.batches) == 3


async def test_a_full_batch_is_sent_and_the_next_look_starts_another():
    runs = _Runs()
    batches = ProbeBatches(runs, gather_s=0.05, max_size=2)
    got = await asyncio.gather(*(batches.probe("h", _req(p)) for p in (1, 2, 3)))
    assert [s.hostname for s in got] == ["1", "2", "3"]
    assert sorted(len(reqs) for _, reqs in runs.batches) == [1, 2]


async def test_a_look_that_gives_up_leaves_the_others_their_answers():
    runs = _Runs(gate=asyncio.Event())
    batches = ProbeBatches(runs, gather_s=0.01)
    patient = asyncio.ensure_future(batches.probe("h", _req(1)))
    hasty = asyncio.ensure_future(batches.probe("h", _req(2)))
    while not runs.batches:
        await asyncio.sleep(0.01)
    hasty.cancel()
    runs.gate.set()
    assert (await patient).hostname == "1"
    assert hasty.cancelled()


async def test_a_batch_that_fails_fails_each_look_and_close_cancels_looks_still_gathered():
    runs = _Runs(fail=RuntimeError("boom"))
    batches = ProbeBatches(runs, gather_s=0.01)
    results = await asyncio.gather(batches.probe("h", _req(1)), batches.probe("h", _req(2)), return_exceptions=True)
    assert [type(r) for r in results] == [RuntimeError, RuntimeError]
    slow = ProbeBatches(_Runs(), gather_s=30)
    waiting = asyncio.ensure_future(slow.probe("h", _req(3)))
    await asyncio.sleep(0.01)
    await slow.close()
    stopped = await waiting
    assert isinstance(stopped, HostFailure) and "shutting down" in stopped.reason


def test_only_the_cheap_look_of_a_serving_launch_is_batched():
    assert batchable(ProbeRequest(ps_pids=(1,), log_since=True))
    assert not batchable(ProbeRequest(ps_pids=(1,), log_since=True, port=80, generate_path="/v1/models"))
    assert not batchable(ProbeRequest(log_since=True))  # the whole process table: a full look
    assert not batchable(ProbeRequest(ps_pids=(1,)))


def _run_batch(scripts: list[str], batch_nonce: str, *, budget_s: int = 20) -> bytes:
    """Run a batch script as the host does: under `timeout`, through `sh -s`."""
    return subprocess.run(["timeout", "-k", "2", str(budget_s), "sh", "-s"],
                          input=build_batch_script(scripts, batch_nonce).encode(), capture_output=True,
                          timeout=budget_s + 20).stdout


def test_the_scripts_of_a_batch_run_in_one_shell_and_each_finds_only_its_own_sections():
    reqs = [ProbeRequest(pid=1, ps_pids=(1,), gpu=False, tags=False), ProbeRequest(gpu=False, processes=False)]
    nonces, batch = [new_nonce() for _ in reqs], new_nonce()
    parts = split_members(_run_batch([build_script(r, n) for r, n in zip(reqs, nonces, strict=True)], batch),
                          batch, 2)
    assert [whole for _, whole in parts] == [True, True]
    first, second = (split_sections(out, n) for (out, _), n in zip(parts, nonces, strict=True))
    assert first["ps"].complete and first["ps"].rc == 0 and b"PID" in first["ps"].body  # its own `ps -p 1`
    assert "ps" not in second and second["clock"].complete  # the second asked for no process table
    assert first["hostname"].body == second["hostname"].body
    assert nonces[1].encode() not in parts[0][0] and nonces[0].encode() not in parts[1][0]


def test_a_part_cut_short_keeps_what_it_printed_and_never_runs_into_the_next_parts():
    """A part that hangs inside a section (a log on a dead mount) is stopped by the budget's `timeout`: its open
    section ends where its own output ends; the parts that ran to their end are whole."""
    nonces, batch = [new_nonce() for _ in range(3)], new_nonce()
    hung = f"printf '\\n@@%s BEGIN log_tail\\nhung line\\n' {nonces[0]}; sleep 60"
    quick = [f"printf '\\n@@%s BEGIN log_tail\\nline of part {k}\\n@@%s END log_tail rc=0\\n' {n} {n}"
             for k, n in enumerate(nonces[1:], start=1)]
    parts = split_members(_run_batch([hung, *quick], batch, budget_s=3), batch, 3)
    assert [whole for _, whole in parts] == [False, True, True]
    cut = split_sections(parts[0][0], nonces[0])["log_tail"]
    assert not cut.complete and cut.body.strip() == b"hung line"  # nothing of parts 1 and 2
    for k in (1, 2):
        sec = split_sections(parts[k][0], nonces[k])["log_tail"]
        assert sec.complete and sec.body.strip() == f"line of part {k}".encode()


def test_the_launches_of_a_host_come_due_together_and_hosts_spread_over_the_interval():
    for now in (0.0, 1234.5, 1.7e9 + 0.3):
        d = aligned_delay("gpu-host-1", 10.0, now)
        assert 0 <= d < 10.0
        assert aligned_delay("gpu-host-1", 10.0, now + 3.0) == pytest.approx((d - 3.0) % 10.0)
    phases = {round((aligned_delay(f"gpu-host-{i}", 10.0, 0.0)), 3) for i in range(64)}
    assert len(phases) > 50  # 64 hosts: nearly all at moments of their own
    assert aligned_delay("h", 0.0, 5.0) == 0.0
