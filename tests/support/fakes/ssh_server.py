"""A real SSH server (asyncssh) on loopback that runs exec requests as local subprocesses.

Used by integration tests of the bot's SSH executor: the client side talks the real SSH
protocol (host-key verification, public-key auth, channel multiplexing), while the "remote
host" is this machine.

Typical use::

    async with LoopbackSSHServer(tmp_path, env={"PATH": f"{fakebin}:{os.environ['PATH']}"}) as srv:
        async with asyncssh.connect(**srv.connect_kwargs()) as conn:
            result = await conn.run("timeout -k 5 30 sh -s", input=script, encoding=None)

Behaviour summary (see the class docstring for details):

* every exec request is run with ``asyncio.create_subprocess_shell`` in a new session/process group;
  the channel's stdin is pumped into the child's stdin (EOF from the client closes it), stdout and
  stderr are pumped back as bytes, and the channel exits with the child's exit status or signal;
* if the channel closes (or the connection drops) before the child finished, the child's whole
  process group is SIGKILLed and reaped;
* ``max_sessions`` emulates OpenSSH ``MaxSessions`` (extra session channels on one connection are
  refused with ``ChannelOpenError``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import pwd
import signal
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import asyncssh
from asyncssh.stream import SSHServerStreamSession

log = logging.getLogger(__name__)

_READ_CHUNK = 65536
_REAP_TIMEOUT_S = 5.0
_DRAIN_TIMEOUT_S = 10.0


def _current_username() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def _killpg(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a process group we created, ignoring 'already gone' errors."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)


def _public_line(key: asyncssh.SSHKey) -> str:
    """``"ssh-ed25519 AAAA..."`` without comment."""
    parts = key.export_public_key("openssh").decode().split()
    return f"{parts[0]} {parts[1]}"


class _ConnState(asyncssh.SSHServer):
    """Per-connection asyncssh ``SSHServer``: tracks the connection and its open sessions."""

    def __init__(self, owner: LoopbackSSHServer) -> None:
        self.owner = owner
        self.conn: asyncssh.SSHServerConnection | None = None
        self.username: str | None = None
        self.open_sessions = 0
        self.closed = asyncio.Event()

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        self.owner._connections.add(self)
        self.owner.connection_count += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner._connections.discard(self)
        self.closed.set()

    def begin_auth(self, username: str) -> bool:
        self.username = username
        return True  # authentication required; only public keys are configured

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def session_requested(self) -> Any:
        return self.owner._session_requested(self)


class _Session(SSHServerStreamSession):
    """Stream session that frees its MaxSessions slot on channel close and forwards signals."""

    def __init__(self, owner: LoopbackSSHServer, state: _ConnState) -> None:
        super().__init__(self._handle)
        self._owner = owner
        self._state = state
        self._released = False
        self.proc: asyncio.subprocess.Process | None = None

    async def _handle(self, stdin: asyncssh.SSHReader, stdout: asyncssh.SSHWriter,
                      stderr: asyncssh.SSHWriter) -> None:
        await self._owner._run_session(self, stdin, stdout, stderr)

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            if not self._released:
                self._released = True
                self._state.open_sessions -= 1

    def signal_received(self, signal_name: str) -> None:
        # Emulates OpenSSH for a non-root login: the signal goes to the session's process group.
        self._owner.signals_received.append(signal_name)
        proc = self.proc
        sig = getattr(signal, "SIG" + signal_name, None)
        if proc is not None and proc.returncode is None and isinstance(sig, int):
            _killpg(proc.pid, sig)


class LoopbackSSHServer:
    """Real SSH server on ``127.0.0.1`` (random port) that executes commands as local subprocesses.

    ``async with LoopbackSSHServer(tmp_path, env=None, max_sessions=None, exec_delay_s=0.0) as srv:``

    Args:
        tmp_path: directory in which a private sub-directory holds the client key and known_hosts.
        env: extra environment for every command, merged over ``os.environ`` (a ``None`` value removes
            the variable). E.g. ``{"PATH": f"{fakebin}:{os.environ['PATH']}"}`` to shadow ``nvidia-smi``.
        max_sessions: emulate OpenSSH ``MaxSessions``: more than this many concurrently open session
            channels on ONE connection are refused with ``asyncssh.ChannelOpenError`` (default code
            ``OPEN_ADMINISTRATIVELY_PROHIBITED`` = 1, see ``refusal_code``). ``None`` = unlimited.
            A slot is freed when the channel is fully closed (like sshd), slightly after the client
            sees the exit status.
        exec_delay_s: sleep this long before starting every command (a slow host).
        refusal_code: keyword-only; the ``ChannelOpenError`` code for MaxSessions refusals. Real
            OpenSSH 9.2 sends ``asyncssh.OPEN_CONNECT_FAILED`` (2) with reason "open failed"; pass that
            to mimic it exactly. Executor code should retry on any ``ChannelOpenError`` code.

    Attributes (after start):
        host ("127.0.0.1"), port, username (current user; any username is accepted, auth is
        public-key only with the generated client key), client_key_path (0600 OpenSSH private key),
        client_key (``asyncssh.SSHKey``), known_hosts_path, known_hosts_line, host_key (private
        ``SSHKey``), exec_count, commands (list of command strings), pids (spawned child pids),
        refused_channels, connection_count (accepted TCP connections), peak_open_sessions (max
        concurrently open sessions seen on one connection), signals_received, usernames.
    """

    def __init__(self, tmp_path: str | os.PathLike[str], env: Mapping[str, str | None] | None = None,
                 max_sessions: int | None = None, exec_delay_s: float = 0.0, *,
                 refusal_code: int = asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED) -> None:
        base = Path(tmp_path)
        base.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="loopback-ssh-", dir=base))
        self.env: dict[str, str | None] = dict(env or {})
        self.max_sessions = max_sessions
        self.exec_delay_s = float(exec_delay_s)
        self.refusal_code = refusal_code

        self.host = "127.0.0.1"
        self.port = 0
        self.username = _current_username()

        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key = asyncssh.generate_private_key("ssh-ed25519", comment="gpubot-test-client")
        self.client_key_path = self.dir / "client_ed25519"
        _write_private(self.client_key_path, self.client_key.export_private_key("openssh"))
        (self.dir / "client_ed25519.pub").write_text(_public_line(self.client_key) + "\n")
        self._authorized = asyncssh.import_authorized_keys(_public_line(self.client_key) + "\n")
        self.known_hosts_path = self.dir / "known_hosts"
        self.known_hosts_line = ""
        self._host_key_generation = 0

        self.exec_count = 0
        self.commands: list[str] = []
        self._command_of: dict[int, str] = {}
        self.pids: list[int] = []
        self.refused_channels = 0
        self.connection_count = 0
        self.peak_open_sessions = 0
        self.signals_received: list[str] = []

        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._connections: set[_ConnState] = set()
        self._live: dict[int, asyncio.subprocess.Process] = {}
        self._pgids: set[int] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> LoopbackSSHServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def usernames(self) -> list[str]:
        """Usernames presented by the currently open connections."""
        return [c.username for c in self._connections if c.username]

    @property
    def listening(self) -> bool:
        """True while the listener is open."""
        return self._acceptor is not None

    async def start(self) -> None:
        """Start listening (again) on the same port with the current host key.

        The first start binds port 0 and remembers the port; later starts rebind that port (retrying
        briefly on ``EADDRINUSE``) and rewrite ``known_hosts_path`` for the current host key.
        """
        if self._acceptor is not None:
            return
        last_exc: OSError | None = None
        for _ in range(20):
            try:
                self._acceptor = await asyncssh.listen(
                    self.host, self.port,
                    server_host_keys=[self.host_key],
                    authorized_client_keys=self._authorized,
                    server_factory=lambda: _ConnState(self),
                    encoding=None,
                    allow_scp=False,
                    x11_forwarding=False,
                    agent_forwarding=False,
                    allow_pty=True,
                )
                break
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or self.port == 0:
                    raise
                last_exc = exc
                await asyncio.sleep(0.1)
        else:
            raise RuntimeError(f"cannot rebind {self.host}:{self.port}") from last_exc
        self.port = self._acceptor.get_port()
        self.known_hosts_line = f"[{self.host}]:{self.port} {_public_line(self.host_key)}"
        self.known_hosts_path.write_text(self.known_hosts_line + "\n")

    async def stop(self, drop_connections: bool = True) -> None:
        """Stop listening (new connects get ``ConnectionRefusedError``).

        With ``drop_connections=True`` (default, like a host reboot) open client connections are
        aborted too; with False they stay up (like restarting only the sshd listener).
        """
        acceptor, self._acceptor = self._acceptor, None
        if acceptor is not None:
            acceptor.close()
        if drop_connections:
            await self.drop_connections()
        if acceptor is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(acceptor.wait_closed(), _REAP_TIMEOUT_S)

    async def drop_connections(self) -> int:
        """Abort every open client connection from the server side (no SSH disconnect message).

        Returns the number of connections dropped. Waits until the server has processed the close; the
        running commands of those connections are killed (process group) and reaped.
        """
        states = list(self._connections)
        for st in states:
            if st.conn is not None:
                st.conn.abort()
        for st in states:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(st.closed.wait(), _REAP_TIMEOUT_S)
        await self._wait_tasks(_REAP_TIMEOUT_S)
        return len(states)

    async def rotate_host_key(self, drop_connections: bool = True) -> Path:
        """Restart on the same port with a NEW host key (for "host key changed" tests).

        The old known_hosts file is left untouched (clients pinned to it must now fail with
        ``HostKeyNotVerifiable``); the new key is written to a NEW file and ``known_hosts_path`` /
        ``known_hosts_line`` are updated to it. Returns the new known_hosts path.
        """
        await self.stop(drop_connections=drop_connections)
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        self._host_key_generation += 1
        self.known_hosts_path = self.dir / f"known_hosts.{self._host_key_generation}"
        await self.start()
        return self.known_hosts_path

    async def close(self) -> None:
        """Full shutdown: stop listening, drop connections, kill and reap every child process group."""
        await self.stop(drop_connections=True)
        await self._wait_tasks(_REAP_TIMEOUT_S)
        for task in list(self._tasks):
            task.cancel()
        await self._wait_tasks(1.0)
        for proc in list(self._live.values()):
            _killpg(proc.pid)
            with contextlib.suppress(asyncio.TimeoutError, ProcessLookupError):
                await asyncio.wait_for(proc.wait(), _REAP_TIMEOUT_S)
        self._live.clear()
        # Background grandchildren left by commands that exited normally (same process group).
        for pgid in self._pgids:
            _killpg(pgid)
        self._pgids.clear()

    async def _wait_tasks(self, timeout: float) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)

    # ------------------------------------------------------------------ helpers for tests

    def connect_kwargs(self, **overrides: Any) -> dict[str, Any]:
        """Keyword arguments for ``asyncssh.connect`` that verify the host key and use the client key."""
        kwargs: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "username": self.username,
            "client_keys": [str(self.client_key_path)],
            "known_hosts": str(self.known_hosts_path),
            "config": None,
            "agent_path": None,
        }
        kwargs.update(overrides)
        return kwargs

    def connect(self, **overrides: Any) -> Any:
        """``asyncssh.connect(**self.connect_kwargs(**overrides))`` (awaitable / async context manager)."""
        return asyncssh.connect(**self.connect_kwargs(**overrides))

    def running_pids(self) -> list[int]:
        """Pids of command subprocesses that have not exited yet."""
        return [pid for pid, p in self._live.items() if p.returncode is None]

    def running_commands(self) -> list[str]:
        """The commands of the subprocesses that have not exited yet (the bot's probe agent among them while its
        connection is open)."""
        return [self._command_of[pid] for pid in self.running_pids()]

    @property
    def open_sessions(self) -> int:
        """Session channels currently open, summed over all connections."""
        return sum(c.open_sessions for c in self._connections)

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        for key, value in self.env.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = str(value)
        return env

    # ------------------------------------------------------------------ SSH side

    def _session_requested(self, state: _ConnState) -> _Session:
        if self.max_sessions is not None and state.open_sessions >= self.max_sessions:
            self.refused_channels += 1
            raise asyncssh.ChannelOpenError(
                self.refusal_code, f"open failed: MaxSessions={self.max_sessions} reached")
        state.open_sessions += 1
        self.peak_open_sessions = max(self.peak_open_sessions, state.open_sessions)
        return _Session(self, state)

    async def _run_session(self, session: _Session, stdin: asyncssh.SSHReader,
                           stdout: asyncssh.SSHWriter, stderr: asyncssh.SSHWriter) -> None:
        """Run one session. Never raises: an escaping exception would kill the whole connection."""
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        chan = stdin.channel
        closed = asyncio.ensure_future(chan.wait_closed())
        proc: asyncio.subprocess.Process | None = None
        helpers: list[asyncio.Future[Any]] = []
        finished = False
        try:
            command = chan.get_command()
            if command is None:
                what = f"subsystem {chan.get_subsystem()!r}" if chan.get_subsystem() else "interactive shell"
                stderr.write(f"LoopbackSSHServer: {what} not supported, send a command\n".encode())
                chan.exit(1)
                finished = True
                return
            self.exec_count += 1
            self.commands.append(command)
            if self.exec_delay_s > 0:
                await asyncio.wait({closed}, timeout=self.exec_delay_s)
                if closed.done():
                    return
            proc = await asyncio.create_subprocess_shell(
                command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                env=self._child_env(),
            )
            session.proc = proc
            self.pids.append(proc.pid)
            self._live[proc.pid] = proc
            self._command_of[proc.pid] = command
            self._pgids.add(proc.pid)
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

            helpers.append(asyncio.ensure_future(self._pump_stdin(stdin, proc.stdin)))
            out_t = asyncio.ensure_future(self._pump_out(proc.stdout, stdout))
            err_t = asyncio.ensure_future(self._pump_out(proc.stderr, stderr))
            wait_t = asyncio.ensure_future(proc.wait())
            everything = asyncio.gather(out_t, err_t, wait_t)
            helpers += [out_t, err_t, wait_t, everything]
            await asyncio.wait({everything, closed}, return_when=asyncio.FIRST_COMPLETED)
            if not everything.done():
                return  # client closed the channel / went away: finally kills the group
            with contextlib.suppress(Exception):
                await asyncio.wait_for(stdout.drain(), _DRAIN_TIMEOUT_S)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(stderr.drain(), _DRAIN_TIMEOUT_S)
            rc = proc.returncode
            assert rc is not None
            if rc >= 0:
                chan.exit(rc)
            else:
                try:
                    name = signal.Signals(-rc).name.removeprefix("SIG")
                except ValueError:
                    name = "KILL"
                chan.exit_with_signal(name, False, f"killed by signal {-rc}")
            finished = True
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("LoopbackSSHServer session failed")
            with contextlib.suppress(Exception):
                stderr.write(f"LoopbackSSHServer internal error: {exc!r}\n".encode())
                chan.exit(255)
        finally:
            if proc is not None:
                if not finished or proc.returncode is None:
                    _killpg(proc.pid)
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(proc.wait(), _REAP_TIMEOUT_S)
                if proc.returncode is not None:
                    self._live.pop(proc.pid, None)
                # close the pipes now, on this loop: a transport left for the garbage collector would try
                # to close itself on a loop that is gone (an "Event loop is closed" warning in a later test)
                transport = getattr(proc, "_transport", None)
                if transport is not None:
                    with contextlib.suppress(Exception):
                        transport.close()
            for fut in helpers:
                if not fut.done():
                    fut.cancel()
            if not closed.done():
                closed.cancel()
            if helpers:
                with contextlib.suppress(BaseException):
                    await asyncio.wait(helpers, timeout=1.0)

    @staticmethod
    async def _pump_stdin(reader: asyncssh.SSHReader, pipe: asyncio.StreamWriter) -> None:
        """Channel stdin -> child stdin; close the child's stdin on client EOF (or channel close)."""
        try:
            while True:
                try:
                    data = await reader.read(_READ_CHUNK)
                except (asyncssh.BreakReceived, asyncssh.TerminalSizeChanged):
                    continue
                if not data:
                    break
                pipe.write(data)
                await pipe.drain()
        except Exception:
            pass  # child closed its stdin early, or the channel went away
        finally:
            with contextlib.suppress(Exception):
                pipe.close()

    @staticmethod
    async def _pump_out(pipe: asyncio.StreamReader, writer: asyncssh.SSHWriter) -> None:
        """Child stdout/stderr -> channel, as bytes; keeps draining the pipe if the client is gone."""
        client_ok = True
        while True:
            chunk = await pipe.read(_READ_CHUNK)
            if not chunk:
                return
            if client_ok:
                try:
                    writer.write(chunk)
                    await writer.drain()
                except Exception:
                    client_ok = False
