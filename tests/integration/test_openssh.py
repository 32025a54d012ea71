"""The same probes through a real OpenSSH sshd on loopback (installed by .ci/run; skipped elsewhere)."""

from __future__ import annotations

import asyncio
import os

import pytest

from bot.config import Config
from bot.core.models import HostFailure, Snapshot
from bot.core.probe import ProbeRequest
from bot.services.hosts import HostService
from tests.support.builders import ssh_host
from tests.support.fakes.sshd import OpenSSHServer, OpenSSHUnavailable, sshd_available

pytestmark = [
    pytest.mark.sshd,
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sshd_available(), reason="OpenSSH sshd not installed (apt-get install openssh-server)"),
]


@pytest.fixture
def sshd(tmp_path):
    try:
        with OpenSSHServer(tmp_path / "sshd", max_sessions=10) as s:
            yield s
    except OpenSSHUnavailable as e:
        pytest.skip(f"sshd could not start here: {e}")


async def test_probe_over_openssh_is_one_exec_with_replayed_gpu(sshd, fake_gpu, start_fake_server):
    server = start_fake_server(mode="ready", workers=2)
    await asyncio.to_thread(server.wait_ready)
    cfg = Config(hosts={"real-sshd": ssh_host(sshd, nvidia_smi=str(fake_gpu.nvidia_smi))})
    svc = HostService(cfg)
    try:
        snap = await svc.probe("real-sshd", ProbeRequest(pgid=server.pid, log_path=str(server.log_path),
                                                          port=server.port))
        ex = svc.executor("real-sshd")
    finally:
        await svc.close()
    assert isinstance(snap, Snapshot), snap
    assert ex.execs == 1 and ex.connects == 1
    assert snap.gpu.ok and snap.gpu.gpus[0].memory_used_mib == 2 * 8610
    assert {p.pid for p in snap.processes} >= {server.pid}
    assert snap.port_listening and snap.health is not None and snap.health.status == "ok"
    assert snap.log is not None and snap.log.lines and snap.log.lines >= 5
    # sshd itself saw exactly one session for that probe
    assert sshd.log_text().count("Accepted publickey") == 1


async def test_openssh_max_sessions_respected_with_channel_cap(sshd, fake_gpu):
    cfg = Config(hosts={"real-sshd": ssh_host(sshd, nvidia_smi=str(fake_gpu.nvidia_smi), max_channels=8)})
    svc = HostService(cfg)
    try:
        results = await asyncio.gather(*(svc.probe("real-sshd", ProbeRequest()) for _ in range(20)))
    finally:
        await svc.close()
    failures = [r for r in results if not isinstance(r, Snapshot)]
    assert not failures, failures


async def test_openssh_wrong_known_hosts_refused(sshd, tmp_path):
    other = tmp_path / "other_known_hosts"
    # a valid line for the right host:port but the wrong key: the CHANGED-key case
    line = sshd.known_hosts_line.split()
    fake_key = "AAAAC3NzaC1lZDI1NTE5AAAAIBx0rWtLIAcbLJH7CSLpC9wvmAqHWkMkeG3pL2Q4bmCW"
    other.write_text(f"{line[0]} ssh-ed25519 {fake_key}\n")
    cfg = Config(hosts={"h": ssh_host(sshd, known_hosts=str(other))})
    svc = HostService(cfg)
    try:
        res = await svc.probe("h", ProbeRequest())
    finally:
        await svc.close()
    assert isinstance(res, HostFailure) and "CHANGED" in res.reason
    assert os.path.exists(sshd.log_path)
