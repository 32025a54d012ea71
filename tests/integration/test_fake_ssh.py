"""Self-tests of the SSH test fakes, using the real asyncssh client with host-key verification."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import asyncssh
import pytest

from tests.support.fakes.ssh_server import LoopbackSSHServer
from tests.support.fakes.sshd import OpenSSHServer, OpenSSHUnavailable, require_sshd, sshd_available
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(60)

CONN_ERRORS = (asyncssh.DisconnectError, asyncssh.ChannelOpenError, ConnectionError)


async def _connect(srv, **kw):
    return await asyncio.wait_for(asyncssh.connect(**srv.connect_kwargs(**kw)), 10)


def _pid_alive(pid: int) -> bool:
    """True while /proc/<pid> exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def _wait_gone(pid: int, timeout: float = 20.0) -> None:
    await wait_until(lambda: not _pid_alive(pid), timeout, what=f"pid {pid} to exit")


async def _wait_file(path: Path, timeout: float = 20.0) -> str:
    def written() -> str:
        return path.read_text().strip() if path.exists() else ""

    return await wait_until(written, timeout, what=f"{path} to be written")


def _held(release: Path, then: str = "echo ok") -> str:
    """A command that keeps its session open until `release` exists (no timing assumptions), then runs `then`."""
    return f"while [ ! -e {release} ]; do sleep 0.05; done; {then}"


# --------------------------------------------------------------------------- LoopbackSSHServer


async def test_exec_stdout_stderr_exit_status(tmp_path):
    async with LoopbackSSHServer(tmp_path) as srv, await _connect(srv) as conn:
        assert srv.host == "127.0.0.1" and srv.port > 0
        assert (os.stat(srv.client_key_path).st_mode & 0o777) == 0o600
        line = Path(srv.known_hosts_path).read_text().strip()
        assert line.startswith(f"[127.0.0.1]:{srv.port} ssh-ed25519 AAAA")
        res = await conn.run("echo hi; echo err >&2; exit 3", encoding=None)
        assert res.stdout == b"hi\n"
        assert res.stderr == b"err\n"
        assert res.exit_status == 3
        assert srv.exec_count == 1
        assert srv.commands == ["echo hi; echo err >&2; exit 3"]
        assert srv.connection_count == 1


async def test_script_on_stdin(tmp_path):
    async with LoopbackSSHServer(tmp_path) as srv, await _connect(srv) as conn:
        res = await conn.run("sh -s", input=b"echo $((1+2))\n", encoding=None)
        assert res.stdout == b"3\n" and res.exit_status == 0
        # the bot's actual wrapper form
        res = await conn.run("timeout -k 5 30 sh -s", input="echo wrapped; exit 4\n")
        assert res.stdout == "wrapped\n" and res.exit_status == 4


async def test_large_stdin_and_stdout_flow_control(tmp_path):
    async with LoopbackSSHServer(tmp_path) as srv, await _connect(srv) as conn:
        res = await conn.run("wc -c", input=b"x" * (1 << 20), encoding=None)
        assert res.stdout.strip() == b"1048576"
        res = await conn.run("head -c 3000000 /dev/zero", encoding=None)
        assert len(res.stdout) == 3_000_000 and res.exit_status == 0


async def test_env_puts_fake_tool_first_on_path(tmp_path):
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    tool = fakebin / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho FAKE-SMI \"$@\"\n")
    tool.chmod(0o755)
    env = {"PATH": f"{fakebin}:{os.environ.get('PATH', '/usr/bin:/bin')}", "GPUBOT_FAKE": "1"}
    async with LoopbackSSHServer(tmp_path, env=env) as srv, await _connect(srv) as conn:
        res = await conn.run("command -v nvidia-smi; nvidia-smi -L; echo $GPUBOT_FAKE", check=True)
        assert res.stdout.splitlines() == [str(tool), "FAKE-SMI -L", "1"]


async def test_exit_signal_and_interactive_shell_rejected(tmp_path):
    async with LoopbackSSHServer(tmp_path) as srv, await _connect(srv) as conn:
        res = await conn.run("kill -TERM $$")
        assert res.exit_signal is not None and res.exit_signal[0] == "TERM"
        shell = await conn.run()  # no command: interactive shell request
        assert shell.exit_status == 1
        assert "not supported" in shell.stderr
        assert srv.exec_count == 1


async def test_max_sessions_refuses_and_semaphore_avoids_it(tmp_path):
    release = tmp_path / "release"
    async with LoopbackSSHServer(tmp_path, max_sessions=10) as srv, await _connect(srv) as conn:
        runs = [asyncio.ensure_future(conn.run(_held(release))) for _ in range(20)]
        # 10 sessions stay open until released: the other 10 channel opens must be refused
        await wait_until(lambda: srv.refused_channels == 10 and srv.open_sessions == 10,
                         what="10 open sessions and 10 refusals")
        release.touch()
        results = await asyncio.gather(*runs, return_exceptions=True)
        refused = [r for r in results if isinstance(r, asyncssh.ChannelOpenError)]
        ok = [r for r in results if isinstance(r, asyncssh.SSHCompletedProcess)]
        assert len(refused) == 10 and len(ok) == 10, results
        assert all(r.stdout == "ok\n" for r in ok)
        assert srv.refused_channels == len(refused)
        assert refused[0].code == asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED
        assert srv.peak_open_sessions == 10

        sem = asyncio.Semaphore(8)

        async def limited():
            async with sem:
                return await conn.run("sleep 0.05; echo ok", check=True)

        before = srv.refused_channels
        results = await asyncio.gather(*(limited() for _ in range(20)))
        assert all(r.stdout == "ok\n" for r in results)
        assert srv.refused_channels == before
        # the connection survived the refusals
        assert (await conn.run("echo still")).stdout == "still\n"


async def test_max_sessions_refusal_code_like_openssh(tmp_path):
    release = tmp_path / "release"
    async with LoopbackSSHServer(tmp_path, max_sessions=1, refusal_code=asyncssh.OPEN_CONNECT_FAILED) as srv:
        async with await _connect(srv) as conn:
            runs = [asyncio.ensure_future(conn.run(_held(release))) for _ in range(2)]
            await wait_until(lambda: srv.refused_channels == 1, what="the second channel to be refused")
            release.touch()
            results = await asyncio.gather(*runs, return_exceptions=True)
            errors = [r for r in results if isinstance(r, asyncssh.ChannelOpenError)]
            assert len(errors) == 1 and errors[0].code == asyncssh.OPEN_CONNECT_FAILED


async def test_exec_delay(tmp_path):
    async with LoopbackSSHServer(tmp_path, exec_delay_s=0.3) as srv, await _connect(srv) as conn:
        t0 = time.monotonic()
        res = await conn.run("echo slow")
        assert res.stdout == "slow\n"
        # a lower bound only (the delay the fake promises): load can make it longer, never shorter
        assert time.monotonic() - t0 >= 0.3


async def test_drop_connections_then_reconnect(tmp_path):
    async with LoopbackSSHServer(tmp_path) as srv:
        conn = await _connect(srv)
        try:
            assert (await conn.run("echo one")).stdout == "one\n"
            assert await srv.drop_connections() == 1
            with pytest.raises(CONN_ERRORS):
                await asyncio.wait_for(conn.run("echo two"), 5)
        finally:
            conn.close()
        async with await _connect(srv) as conn2:
            assert (await conn2.run("echo three")).stdout == "three\n"
        assert srv.connection_count == 2


async def test_stop_start_same_port_same_key(tmp_path):
    async with LoopbackSSHServer(tmp_path) as srv:
        port = srv.port
        kh = Path(srv.known_hosts_path).read_text()
        await srv.stop()
        with pytest.raises(OSError):
            await _connect(srv)
        await srv.start()
        assert srv.port == port and Path(srv.known_hosts_path).read_text() == kh
        async with await _connect(srv) as conn:
            assert (await conn.run("echo back")).stdout == "back\n"


async def test_rotate_host_key_is_refused_by_old_known_hosts(tmp_path):
    async with LoopbackSSHServer(tmp_path) as srv:
        old_kh = str(srv.known_hosts_path)
        port = srv.port
        new_kh = await srv.rotate_host_key()
        assert srv.port == port and str(new_kh) != old_kh
        with pytest.raises(asyncssh.HostKeyNotVerifiable):
            await _connect(srv, known_hosts=old_kh)
        async with await _connect(srv) as conn:  # the new known_hosts_path works
            assert (await conn.run("echo new")).stdout == "new\n"


async def test_wrong_client_key_is_denied(tmp_path):
    other = asyncssh.generate_private_key("ssh-ed25519")
    async with LoopbackSSHServer(tmp_path) as srv:
        with pytest.raises(asyncssh.PermissionDenied):
            await _connect(srv, client_keys=[other])


async def test_client_timeout_then_close_kills_subprocess(tmp_path):
    pidfile = tmp_path / "pid"
    async with LoopbackSSHServer(tmp_path) as srv:
        conn = await _connect(srv)
        try:
            with pytest.raises(asyncssh.TimeoutError):
                await conn.run(f"echo $$ > {pidfile}; exec sleep 30", timeout=0.5)
            pid = int(await _wait_file(pidfile))
            assert _pid_alive(pid)  # run() timing out does not close the channel
        finally:
            conn.close()
            await asyncio.wait_for(conn.wait_closed(), 5)
        await _wait_gone(pid)
        assert srv.running_pids() == []


async def test_channel_close_kills_process_group(tmp_path):
    pidfile = tmp_path / "bgpid"
    async with LoopbackSSHServer(tmp_path) as srv, await _connect(srv) as conn:
        proc = await conn.create_process(f"sleep 30 & echo $! > {pidfile}; wait")
        bg = int(await _wait_file(pidfile))
        proc.close()
        await _wait_gone(bg)
        assert (await conn.run("echo alive")).stdout == "alive\n"


async def test_aexit_kills_running_commands(tmp_path):
    pidfile = tmp_path / "pid"
    srv = LoopbackSSHServer(tmp_path)
    async with srv:
        conn = await _connect(srv)
        proc = await conn.create_process(f"echo $$ > {pidfile}; exec sleep 30")
        pid = int(await _wait_file(pidfile))
    await _wait_gone(pid)
    proc.close()
    conn.close()


async def test_signal_request_reaches_process_group(tmp_path):
    async with LoopbackSSHServer(tmp_path) as srv, await _connect(srv) as conn:
        proc = await conn.create_process("echo started; exec sleep 30")
        assert await asyncio.wait_for(proc.stdout.readline(), 5) == "started\n"
        proc.send_signal("TERM")
        res = await asyncio.wait_for(proc.wait(), 5)
        assert res.exit_signal is not None and res.exit_signal[0] == "TERM"
        assert srv.signals_received == ["TERM"]


# --------------------------------------------------------------------------- OpenSSH sshd


@pytest.fixture(scope="module")
def openssh(tmp_path_factory):
    require_sshd()
    try:
        with OpenSSHServer(tmp_path_factory.mktemp("sshd"), max_sessions=10) as server:
            yield server
    except OpenSSHUnavailable as exc:
        pytest.skip(f"OpenSSH sshd could not start: {exc}")


def test_sshd_available_is_bool():
    assert isinstance(sshd_available(), bool)


@pytest.mark.sshd
async def test_openssh_echo_and_stdin_script(openssh):
    line = Path(openssh.known_hosts_path).read_text().strip()
    assert line.startswith(f"[127.0.0.1]:{openssh.port} ssh-ed25519 AAAA")
    async with await _connect(openssh) as conn:
        res = await conn.run("echo ok")
        assert res.stdout == "ok\n" and res.exit_status == 0
        res = await conn.run("timeout -k 5 30 sh -s", input=b"echo $((2+3)); exit 7\n", encoding=None)
        assert res.stdout == b"5\n" and res.exit_status == 7


@pytest.mark.sshd
async def test_openssh_wrong_known_hosts_refused(openssh, tmp_path):
    other = asyncssh.generate_private_key("ssh-ed25519")
    pub = other.export_public_key("openssh").decode().split()
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"[127.0.0.1]:{openssh.port} {pub[0]} {pub[1]}\n")
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        await _connect(openssh, known_hosts=str(wrong))


@pytest.mark.sshd
async def test_openssh_max_sessions_refuses(openssh, tmp_path):
    release = tmp_path / "release"
    async with await _connect(openssh) as conn:
        runs = [asyncio.ensure_future(conn.run(_held(release, "true"))) for _ in range(20)]
        try:
            # sshd's MaxSessions=10: with 10 sessions held open, the other 10 are refused
            await wait_until(lambda: sum(r.done() for r in runs) >= 10, what="10 refused channel opens")
        finally:
            release.touch()
        results = await asyncio.gather(*runs, return_exceptions=True)
        refused = [r for r in results if isinstance(r, asyncssh.ChannelOpenError)]
        assert len(refused) == 10, results
        assert refused[0].code == asyncssh.OPEN_CONNECT_FAILED  # OpenSSH: code 2, "open failed"
        assert all(isinstance(r, asyncssh.SSHCompletedProcess | asyncssh.ChannelOpenError)
                   for r in results)


@pytest.fixture
def openssh_with_fake_tool(tmp_path):
    """An sshd whose sessions find a fake `nvidia-smi` first on PATH: (server, tool). Stopped at teardown."""
    require_sshd()
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    tool = fakebin / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho FAKE\n")
    tool.chmod(0o755)
    server = OpenSSHServer(tmp_path, env={"PATH": f"{fakebin}:/usr/bin:/bin"})
    try:
        server.start()
    except OpenSSHUnavailable as exc:
        pytest.skip(str(exc))
    yield server, tool
    server.stop()


@pytest.mark.sshd
async def test_openssh_env_setenv(openssh_with_fake_tool):
    server, tool = openssh_with_fake_tool
    pid = server.pid
    async with await _connect(server) as conn:
        res = await conn.run("command -v nvidia-smi; nvidia-smi")
    assert res.stdout.splitlines() == [str(tool), "FAKE"]
    server.stop()  # (again at teardown: stop is idempotent)
    assert not _pid_alive(pid)
