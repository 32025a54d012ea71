"""Launches checked on one host share its GPU reading: a probe that takes a reading of a given age
(ProbeRequest.gpu_max_age_s, the watcher's cheap checks) runs no nvidia-smi when another probe of the host read the
GPUs recently enough, and a reading that failed is never shared. Real shell, this machine as the host, the replaying
fake nvidia-smi."""

from __future__ import annotations

import pytest

from bot.config import Config, HostConfig
from bot.core.models import Snapshot
from bot.core.probe import ProbeRequest
from bot.services import hosts as hosts_module
from bot.services.hosts import HostService

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def svc(fake_gpu):
    return HostService(Config(hosts={"me": HostConfig(local=True, use_nvml=False,
                                                      nvidia_smi=str(fake_gpu.nvidia_smi))}))


@pytest.fixture
def scripts(monkeypatch):
    """The scripts the host service sends, in order."""
    sent: list[str] = []
    real = hosts_module.build_script

    def spy(req, nonce, policy=None):
        script = real(req, nonce, policy)
        sent.append(script)
        return script

    monkeypatch.setattr(hosts_module, "build_script", spy)
    return sent


def _reads_gpus(script: str) -> bool:
    return "--query-gpu=" in script


async def _probe(svc: HostService, **kw) -> Snapshot:
    snap = await svc.probe("me", ProbeRequest(processes=False, **kw))
    assert isinstance(snap, Snapshot), snap
    return snap


async def test_a_recent_reading_of_the_host_is_shared_and_an_old_one_is_not(svc, scripts, monkeypatch):
    first = await _probe(svc, gpu_max_age_s=30)
    assert _reads_gpus(scripts[-1]) and first.gpu.ok and first.gpu.gpus
    second = await _probe(svc, gpu_max_age_s=30)
    assert not _reads_gpus(scripts[-1])  # the host's GPUs were read a moment ago
    assert [(g.index, g.memory_used_mib) for g in second.gpu.gpus] == [(g.index, g.memory_used_mib)
                                                                        for g in first.gpu.gpus]
    await _probe(svc)  # a probe that wants a fresh reading (a user's /probe) reads
    assert _reads_gpus(scripts[-1])
    later = hosts_module.time.monotonic() + 31
    monkeypatch.setattr(hosts_module.time, "monotonic", lambda: later)
    await _probe(svc, gpu_max_age_s=30)
    assert _reads_gpus(scripts[-1])  # older than asked for


async def test_a_failed_reading_is_never_shared(svc, scripts, fake_gpu):
    fake_gpu.set_mode("exit:9")  # nvidia-smi's "Failed to initialize NVML" (exit 9), as a driver in trouble says it
    bad = await _probe(svc, gpu_max_age_s=30)
    assert not bad.gpu.ok
    await _probe(svc, gpu_max_age_s=30)
    assert _reads_gpus(scripts[-1])  # nothing good to share: read again
    fake_gpu.set_mode("normal")
    good = await _probe(svc, gpu_max_age_s=30)
    assert good.gpu.ok and _reads_gpus(scripts[-1])
    fake_gpu.set_mode("exit:9")
    shared = await _probe(svc, gpu_max_age_s=30)
    assert shared.gpu.ok and not _reads_gpus(scripts[-1])  # a good reading a moment old stands for the host


def test_the_reading_age_is_bounded():
    from bot.core.probe import ProbeRequestError

    with pytest.raises(ProbeRequestError):
        ProbeRequest(gpu_max_age_s=301).validate()
    with pytest.raises(ProbeRequestError):
        ProbeRequest(gpu_max_age_s=-1).validate()


async def test_a_fresh_failure_is_never_hidden_by_an_older_good_reading(svc, scripts, fake_gpu):
    good = await _probe(svc, gpu_max_age_s=30)  # launch A's cheap check: a good reading, kept
    assert good.gpu.ok
    fake_gpu.set_mode("exit:9")
    fresh = await _probe(svc)  # launch B's full look reads afresh: the driver fails
    assert not fresh.gpu.ok
    cheap = await _probe(svc, gpu_max_age_s=30)  # launch C's cheap check a moment later
    assert _reads_gpus(scripts[-1]) and not cheap.gpu.ok  # reads again, and sees the failure
