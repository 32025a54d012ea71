"""SSH failure modes: a connection dropped mid-probe, a host that never speaks SSH, bad key files, and what
the probe shows of itself."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from bot.adapters.remote import LocalExecutor
from bot.config import Config, HostConfig
from bot.core.models import HostFailure, Snapshot
from bot.core.probe import ProbeRequest
from bot.services.hosts import HostService
from tests.support.builders import ssh_host
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(60)


def nvidia_smi_running(fake_gpu) -> bool:
    """True while a fake nvidia-smi of `fake_gpu` runs on this machine (its command line names its state)."""
    needle = str(fake_gpu.state_dir).encode()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if b"fake_nvidia_smi" in cmdline and needle in cmdline:
                return True
    return False


async def test_connection_dropped_mid_probe_is_not_blamed_on_nvidia_smi(ssh_server, ssh_config, fake_gpu):
    fake_gpu.set_mode("slow:3")
    svc = HostService(ssh_config)
    try:
        task = asyncio.create_task(svc.probe("gpu-host-1", ProbeRequest()))
        # drop the connection while the probe waits for the (slow) nvidia-smi
        await wait_until(lambda: nvidia_smi_running(fake_gpu) or task.done(), what="nvidia-smi to start")
        assert not task.done(), task.result()
        await ssh_server.drop_connections()
        res = await task
    finally:
        await svc.close()
    assert isinstance(res, HostFailure), res
    assert "lost" in res.reason and "nvidia-smi" not in res.reason


async def test_silent_host_connect_failure_is_shared_by_queued_probes(tmp_path):
    """A host that accepts TCP but never speaks SSH: one connect attempt, every queued probe gets its failure."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(50)
    port = listener.getsockname()[1]
    kh = tmp_path / "kh"
    kh.write_text("")
    cfg = Config(hosts={"mute": {"address": "127.0.0.1", "port": port, "known_hosts": str(kh),
                                 "connect_timeout_s": 1}})
    svc = HostService(cfg)
    try:
        results = await asyncio.gather(*(svc.probe("mute", ProbeRequest()) for _ in range(8)))
    finally:
        await svc.close()
        accepted = 0
        listener.setblocking(False)
        while True:
            try:
                conn, _ = listener.accept()
                conn.close()
                accepted += 1
            except BlockingIOError:
                break
        listener.close()
    assert all(isinstance(r, HostFailure) and "did not answer within 1 s" in r.reason for r in results)
    assert accepted == 1, f"{accepted} connect attempts for 8 queued probes"


async def test_unusable_key_file_is_named(ssh_server, tmp_path):
    bad = tmp_path / "garbage_key"
    bad.write_text("not a key\n")
    for path, expect in ((bad, "cannot be used"), (tmp_path / "missing_key", "No such file")):
        svc = HostService(Config(hosts={"h": ssh_host(ssh_server, key_file=str(path))}))
        try:
            res = await svc.probe("h", ProbeRequest())
        finally:
            await svc.close()
        assert isinstance(res, HostFailure) and f"key_file {path}" in res.reason and expect in res.reason


async def test_probe_never_lists_its_own_processes(ssh_server, ssh_config):
    svc = HostService(ssh_config)
    try:
        snap = await svc.probe("gpu-host-1", ProbeRequest(match="sh"))
    finally:
        await svc.close()
    assert isinstance(snap, Snapshot)
    # the probe's own processes: what the SSH server started for this exec, and their descendants (other
    # probes running on this machine at the same time may legitimately show up)
    own = set(ssh_server.pids)
    grew = True
    while grew:
        grew = False
        for p in snap.table:
            if p.ppid in own and p.pid not in own:
                own.add(p.pid)
                grew = True
    assert own, "the SSH server recorded the probe's process"
    assert [p for p in snap.processes if p.pid in own] == []
    assert [p for p in snap.table if p.pid in own] == []


async def test_local_commands_do_not_inherit_slack_tokens(monkeypatch):
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-should-not-leak")
    monkeypatch.setenv("SLACK_APP_TOKEN", "xapp-should-not-leak")
    ex = LocalExecutor("me", HostConfig(local=True))
    res = await ex.run("env")
    assert res.exit_status == 0
    assert b"should-not-leak" not in res.stdout and b"PATH=" in res.stdout
