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
from bot.core.probe import ProbeRequest, batchable, build_batch_script, build_script, new_nonce, split_sections
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
    with pytest.raises(asyncio.CancelledError):
        await waiting


def test_only_the_cheap_look_of_a_serving_launch_is_batched():
    assert batchable(ProbeRequest(ps_pids=(1,), log_since=True))
    assert not batchable(ProbeRequest(ps_pids=(1,), log_since=True, port=80, generate_path="/v1/models"))
    assert not batchable(ProbeRequest(log_since=True))  # the whole process table: a full look
    assert not batchable(ProbeRequest(ps_pids=(1,)))


def test_the_scripts_of_a_batch_run_in_one_shell_and_each_finds_only_its_own_sections():
    reqs = [ProbeRequest(pid=1, ps_pids=(1,), gpu=False, tags=False), ProbeRequest(gpu=False, processes=False)]
    nonces = [new_nonce() for _ in reqs]
    out = subprocess.run(["sh", "-s"], input=build_batch_script([build_script(r, n) for r, n in zip(reqs, nonces,
                                                                                                      strict=True)]),
                         capture_output=True, text=True, timeout=20).stdout.encode()
    first, second = (split_sections(out, n) for n in nonces)
    assert first["ps"].complete and first["ps"].rc == 0 and b"PID" in first["ps"].body  # its own `ps -p 1`
    assert "ps" not in second and second["clock"].complete  # the second asked for no process table
    assert first["clock"].body != b"" and first["hostname"].body == second["hostname"].body
    assert nonces[1].encode() not in b"".join(s.body for s in first.values())


def test_the_launches_of_a_host_come_due_together_and_hosts_spread_over_the_interval():
    for now in (0.0, 1234.5, 1.7e9 + 0.3):
        d = aligned_delay("gpu-host-1", 10.0, now)
        assert 0 <= d < 10.0
        assert aligned_delay("gpu-host-1", 10.0, now + 3.0) == pytest.approx((d - 3.0) % 10.0)
    phases = {round((aligned_delay(f"gpu-host-{i}", 10.0, 0.0)), 3) for i in range(64)}
    assert len(phases) > 50  # 64 hosts: nearly all at moments of their own
    assert aligned_delay("h", 0.0, 5.0) == 0.0
