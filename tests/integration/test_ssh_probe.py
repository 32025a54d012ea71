"""Probes over a REAL SSH server on loopback (asyncssh server running commands as local processes).

The fake nvidia-smi replays the real H200 captures; the fake server's workers register fake GPU memory.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from bot.config import Config
from bot.core.agent import AGENT_COMMAND
from bot.core.models import HostFailure, Snapshot
from bot.core.probe import ProbeRequest
from bot.services.hosts import HostService
from tests.support.builders import ssh_host
from tests.support.fakes.ssh_server import LoopbackSSHServer
from tests.support.paths import H200
from tests.support.procs import free_port, wait_until

pytestmark = pytest.mark.timeout(60)


def bot_config(tmp_path: Path, hosts: dict, **fields) -> Config:
    """A config for a whole bot on `hosts`, its database under tmp_path (never the real state_dir)."""
    return Config(hosts=hosts, state_dir=str(tmp_path / "state"), **fields)


def fixture_gpu_row():
    """The replayed GPU row (idle H200 capture): index, name, total MiB, temperature, power."""
    cells = [c.strip() for c in (H200 / "freed.query-gpu.csv").read_text().split(",")]
    return {"name": cells[2], "total": float(cells[4]), "temp": float(cells[7]), "power": float(cells[8])}


async def test_probes_go_to_the_agent_and_open_no_channel(ssh_server, ssh_config, start_fake_server):
    """The first probe starts the probe agent (the one channel it keeps); the next ones open no channel at all, and
    neither the agent nor the probe's own shell shows in the process table."""
    server = start_fake_server(mode="ready", workers=2)
    await asyncio.to_thread(server.wait_ready)
    svc = HostService(ssh_config)
    req = ProbeRequest(pgid=server.pid, log_path=str(server.log_path), port=server.port)
    try:
        before = ssh_server.exec_count
        first = await svc.probe("gpu-host-1", req)
        assert ssh_server.exec_count - before == 1 and ssh_server.commands[-1] == "exec sh -s gpubot-agent 2>&1"
        snap = await svc.probe("gpu-host-1", dataclasses.replace(req, match="gpubot"))
        assert ssh_server.exec_count - before == 1, "a probe on the agent opens no SSH channel"
        agent_pid = next(iter(svc.executor("gpu-host-1").helper_pids()))
    finally:
        await svc.close()
    assert isinstance(first, Snapshot) and isinstance(snap, Snapshot), (first, snap)
    # (other tests' agents run on this machine too: only this one's must be left out)
    assert agent_pid not in {p.pid for p in snap.table}
    assert not [p for p in snap.table if p.ppid == agent_pid], "the probe's own shell is never shown"
    check_everything(first, server)


async def test_without_the_agent_a_probe_is_one_channel_exec(ssh_server, start_fake_server):
    server = start_fake_server(mode="ready", workers=2)
    await asyncio.to_thread(server.wait_ready)
    svc = HostService(Config(hosts={"gpu-host-1": ssh_host(ssh_server, probe_agent=False)}))
    try:
        before = ssh_server.exec_count
        snap = await svc.probe(
            "gpu-host-1", ProbeRequest(pgid=server.pid, log_path=str(server.log_path), port=server.port)
        )
        assert ssh_server.exec_count - before == 1, "one probe must be exactly one SSH channel exec"
        assert ssh_server.commands[-1].endswith("sh -s") and ssh_server.commands[-1].startswith("timeout -k ")
    finally:
        await svc.close()
    assert isinstance(snap, Snapshot), snap
    check_everything(snap, server)


def check_everything(snap: Snapshot, server) -> None:
    """The probe of the ready fake server saw its GPUs, processes, log, port and health."""
    # GPU table = replayed capture, memory = the two workers' fake holdings
    row = fixture_gpu_row()
    assert snap.gpu.ok, snap.gpu.error
    (gpu,) = snap.gpu.gpus
    assert gpu.name == row["name"] == "NVIDIA H200"
    assert gpu.memory_total_mib == row["total"] == 143771
    assert gpu.memory_used_mib == 2 * 8610
    assert gpu.temperature_c == row["temp"]
    assert gpu.power_draw_w == pytest.approx(row["power"])
    holder_pids = sorted(p.pid for p in snap.gpu.processes)
    assert len(holder_pids) == 2 and all(p.gpu_index == 0 for p in snap.gpu.processes)
    # process tree: launcher + 2 workers, all in the launch's process group
    pids = {p.pid for p in snap.processes}
    assert server.pid in pids and set(holder_pids) <= pids
    assert all(p.pgid == server.pid for p in snap.processes)
    # log, port, health
    assert snap.log is not None and snap.log.exists
    assert snap.log.lines == len(server.log_path.read_text().splitlines())
    assert any("fired up and ready to roll" in line for line in snap.log.tail)
    assert snap.port_listening is True
    assert snap.health is not None and snap.health.status == "ok" and snap.health.http_code == 200
    assert snap.clock is not None and snap.log.seconds_since_write(snap.clock) is not None


async def test_connection_is_pooled_and_reconnects_after_drop(ssh_server, ssh_config):
    svc = HostService(ssh_config)
    try:
        for _ in range(3):
            assert isinstance(await svc.probe("gpu-host-1", ProbeRequest()), Snapshot)
        assert ssh_server.connection_count == 1
        assert await ssh_server.drop_connections() == 1  # returns once the server side has closed it
        # The first probe after the drop may still meet the dead connection (the client may not have seen the
        # close yet): it fails with the drop, and the next one reconnects; or it reconnects itself.
        results = [await svc.probe("gpu-host-1", ProbeRequest()) for _ in range(2)]
        assert isinstance(results[-1], Snapshot), results[-1]
        assert all(isinstance(r, Snapshot) or "lost" in r.reason for r in results), results
        assert ssh_server.connection_count == 2
    finally:
        await svc.close()


async def test_channel_cap_keeps_under_max_sessions(tmp_path, fake_gpu):
    env = {"PATH": f"{fake_gpu.bin_dir}:/usr/bin:/bin"}
    async with LoopbackSSHServer(tmp_path / "ssh10", env=env, max_sessions=10) as srv:
        cfg = Config(hosts={"h": ssh_host(srv, max_channels=8)})
        svc = HostService(cfg)
        try:
            results = await asyncio.gather(*(svc.probe("h", ProbeRequest()) for _ in range(24)))
        finally:
            await svc.close()
        assert all(isinstance(r, Snapshot) for r in results), [r for r in results if not isinstance(r, Snapshot)]
        assert srv.peak_open_sessions <= 8
        assert srv.connection_count == 1


async def test_refused_connection_is_a_clear_failure(tmp_path):
    port = free_port()  # nothing listens there
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    cfg = Config(hosts={"dead": {"address": "127.0.0.1", "port": port, "known_hosts": str(kh),
                                 "connect_timeout_s": 3}})
    svc = HostService(cfg)
    try:
        res = await svc.probe("dead", ProbeRequest())
    finally:
        await svc.close()
    assert isinstance(res, HostFailure)
    assert "refused" in res.reason and str(port) in res.reason


async def test_changed_host_key_is_refused(ssh_server, ssh_config):
    svc = HostService(ssh_config)
    try:
        assert isinstance(await svc.probe("gpu-host-1", ProbeRequest()), Snapshot)
        await ssh_server.rotate_host_key()  # new key, same port; config still pins the old known_hosts
        res = await svc.probe("gpu-host-1", ProbeRequest())
        if isinstance(res, Snapshot):  # the drop may be noticed only on the next command
            res = await svc.probe("gpu-host-1", ProbeRequest())
    finally:
        await svc.close()
    assert isinstance(res, HostFailure)
    assert "CHANGED" in res.reason and "Refusing" in res.reason


async def test_unknown_host_key_is_refused(ssh_server, tmp_path):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    cfg = Config(hosts={"h": ssh_host(ssh_server, known_hosts=str(empty))})
    svc = HostService(cfg)
    try:
        res = await svc.probe("h", ProbeRequest())
    finally:
        await svc.close()
    assert isinstance(res, HostFailure) and "unknown" in res.reason
    assert ssh_server.exec_count == 0


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("hang", "did not answer in 10 s"),
        ("exit:9", "driver is not loaded"),
        ("exit:15", "fallen off the bus"),
        ("exit:6", "No devices were found"),
        ("exit:255", "exit 255"),
        ("exit:12", "NVML shared library not found"),
    ],
)
async def test_nvidia_smi_failures_are_findings_not_crashes(ssh_server, ssh_config, fake_gpu, mode, expected):
    fake_gpu.set_mode(mode)
    svc = HostService(ssh_config)
    try:
        snap = await svc.probe("gpu-host-1", ProbeRequest())
    finally:
        await svc.close()
    assert isinstance(snap, Snapshot)
    assert not snap.gpu.ok and expected in (snap.gpu.error or "")
    assert snap.all_process_count > 0, "the rest of the snapshot must still be there"


async def test_nvidia_smi_missing(ssh_server, ssh_config):
    cfg = Config(hosts={"gpu-host-1": ssh_host(ssh_server, nvidia_smi="/nonexistent/nvidia-smi")})
    svc = HostService(cfg)
    try:
        snap = await svc.probe("gpu-host-1", ProbeRequest())
    finally:
        await svc.close()
    assert isinstance(snap, Snapshot) and not snap.gpu.ok
    assert "not found" in (snap.gpu.error or "")


async def test_status_shows_failed_host_and_healthy_host(ssh_server, fake_gpu, make_bot, tmp_path):
    cfg = bot_config(tmp_path, {
        "good": ssh_host(ssh_server),
        "bad": {"address": "127.0.0.1", "port": free_port(), "known_hosts": str(ssh_server.known_hosts_path),
                "connect_timeout_s": 2},
    })
    bot = await make_bot(cfg)
    answer = await bot.chat.say("/gpu status", user="U1")
    assert answer is not None and answer.audit == "ok"
    assert "== good" in answer.text and "H200" in answer.text
    assert "== bad" in answer.text and "FAILED" in answer.text and "refused" in answer.text


INJECTIONS = [
    "match=x; touch {marker}",
    "match=$(touch {marker})",
    "match=`touch {marker}`",
    "log=/tmp/x; touch {marker}",
    "log=/tmp/$(touch {marker})",
    "log='/tmp/a`touch {marker}`'",
    'match="a\'; touch {marker}; echo \'"',
    "health=/h;touch{marker} port=1",
    "gpu-host-1 match=\"x\ntouch {marker}\"",
]


@pytest.mark.parametrize("template", INJECTIONS)
async def test_shell_metacharacters_never_run(ssh_server, make_bot, tmp_path, template):
    marker = tmp_path / "pwned"
    text = template.format(marker=marker)
    bot = await make_bot(bot_config(tmp_path, {"gpu-host-1": ssh_host(ssh_server)}, default_host="gpu-host-1"))
    slash = await bot.chat.say("/probe " + text, user="U1")
    typed = await bot.chat.say("!probe " + text, user="U1")
    # every command the server ran has exited but the probe agent (whose probes have ended: the answers came):
    # nothing started by an injection can still be on its way
    await wait_until(lambda: set(ssh_server.running_commands()) <= {AGENT_COMMAND},
                     what="the SSH server's commands to exit")
    assert not marker.exists(), f"injection ran: {text!r}"
    assert not Path("/tmp/pwned").exists()
    # the only things ever executed remotely are the probe agent and the wrapped probe shell; the probes themselves
    # went to the agent as here-documents (bot.core.agent)
    assert all(c == AGENT_COMMAND or (c.startswith("timeout -k ") and c.endswith(" sh -s"))
               for c in ssh_server.commands)
    assert slash is not None and typed is not None and slash.text and typed.text


async def test_quoted_log_path_reaches_remote_as_data(ssh_server, ssh_config, tmp_path):
    """A path full of metacharacters passes validation, is sent quoted, and is only ever a file name."""
    marker = tmp_path / "pwned2"
    evil = f"/tmp/$(touch {marker})`touch {marker}`;touch {marker}"
    svc = HostService(ssh_config)
    try:
        snap = await svc.probe("gpu-host-1", ProbeRequest(log_path=evil))
    finally:
        await svc.close()
    assert ssh_server.exec_count == 1
    assert isinstance(snap, Snapshot) and snap.log is not None
    assert snap.log.error == "no such file" and snap.log.path == evil
    assert not marker.exists()


async def test_concurrent_probes_share_at_most_two_agents_and_open_no_other_channel(ssh_server, ssh_config):
    svc = HostService(ssh_config)
    try:
        assert isinstance(await svc.probe("gpu-host-1", ProbeRequest()), Snapshot)
        before = ssh_server.exec_count
        snaps = await asyncio.gather(*(svc.probe("gpu-host-1", ProbeRequest()) for _ in range(6)))
        ex = svc.executor("gpu-host-1")
        agents = len(ex.helper_pids())
    finally:
        await svc.close()
    assert all(isinstance(s, Snapshot) and s.gpu.ok for s in snaps), snaps
    assert ex.agent_starts == agents == 2, "a second agent serves while the first is busy; no third"
    assert ssh_server.commands[before:] == ["exec sh -s gpubot-agent 2>&1"], "no probe opened a channel of its own"


async def test_long_lived_commands_hold_at_most_half_the_commands_channels(tmp_path, fake_gpu):
    from bot.adapters.remote import ShellAgent, build_executor

    env = {"PATH": f"{fake_gpu.bin_dir}:/usr/bin:/bin"}
    async with LoopbackSSHServer(tmp_path / "ssh10", env=env, max_sessions=10) as srv:
        ex = build_executor("h", ssh_host(srv, max_channels=8))  # 2 agents: 6 channels for commands, 3 streams
        try:
            streams = [await ex.open_stream(AGENT_COMMAND) for _ in range(4)]
            assert all(s is not None for s in streams[:3]) and streams[3] is None
            agents = [await ShellAgent.start(s, 10) for s in streams[:3]]  # each a shell agent, as in a job's step
            answers = await asyncio.gather(*(a.run("echo $((6 * 7))", 10, "h") for a in agents))
            assert [r.stdout for r in answers] == [b"42\n"] * 3
            # commands still run beside them, within max_channels
            results = await asyncio.gather(*(ex.run("echo ok") for _ in range(8)))
            assert all(r.stdout == b"ok\n" for r in results)
            assert srv.peak_open_sessions <= 8
            agents[0].close()  # its channel goes back
            again = await ex.open_stream(AGENT_COMMAND)
            assert again is not None
            assert await ex.open_stream(AGENT_COMMAND) is None  # the cap again
            # a stream whose process ends by itself (its Slurm step ended) gives its channel back too
            agents[1].stream.write(b"exit 0\n")
            await wait_until(lambda: agents[1].stream.ended, what="the agent's process ended")

            async def reopened():
                return await ex.open_stream(AGENT_COMMAND)

            third = await wait_until(reopened, what="its channel given back")
            third.close()
            again.close()
        finally:
            await ex.close()
