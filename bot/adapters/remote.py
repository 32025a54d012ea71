"""Executors: run one shell command on a host and return its exit status and output.

`SSHExecutor` keeps ONE pooled asyncssh connection per host, reused by every command, reconnected after
a drop, with keepalives, a connect timeout, at most `max_channels` concurrent session channels (OpenSSH's
MaxSessions defaults to 10) and retries of refused channel opens. Host keys are always verified against
the configured known_hosts file. `LocalExecutor` runs the same commands on the bot's own machine.

Every command is wrapped in coreutils `timeout -k KILL_AFTER BUDGET` on the remote side, and guarded by a
client-side timeout, so a hung tool (nvidia-smi on a wedged driver) never hangs the bot.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shlex
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import asyncssh

from bot.adapters import nvml_reader
from bot.config import HostConfig
from bot.core import agent
from bot.core.shell import KILL_AFTER_S, wrap_timeout

log = logging.getLogger(__name__)

#: Ciphers offered, AES-GCM first: asyncssh decrypts it with one call per packet (cryptography's AESGCM), its
#: default ChaCha20-Poly1305 with several; every probe's output is a few packets. The rest of asyncssh's defaults
#: follow, for servers without AES-GCM.
ENCRYPTION_ALGS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com",
                   "aes256-ctr", "aes192-ctr", "aes128-ctr")
#: A failed connect is reported to every command that arrives within this many seconds.
FAILURE_CACHE_S = 5.0
#: Extra seconds the client waits beyond the remote budget before giving up on a command.
CLIENT_MARGIN_S = 10.0


@dataclass
class CommandResult:
    """Outcome of one command: `exit_status` (None when killed by a signal), raw `stdout`/`stderr` bytes,
    `duration_s` seconds measured on the bot, `exit_signal` name when the remote process was signalled."""

    exit_status: int | None
    stdout: bytes
    stderr: bytes
    duration_s: float
    exit_signal: str | None = None


class RemoteError(Exception):
    """A host could not run a command. `host` is the configured host name; str() is a user-facing message."""

    def __init__(self, host: str, message: str):
        self.host = host
        self.message = message
        super().__init__(message)


class HostUnreachable(RemoteError):
    """TCP connect refused, DNS failure, or no SSH answer within the connect timeout."""


class HostKeyRejected(RemoteError):
    """The host presented a key that is unknown or different from the pinned known_hosts entry."""


class AuthenticationFailed(RemoteError):
    """The SSH server refused our key (or no key was available)."""


class RemoteTimeout(RemoteError):
    """The command did not finish within its budget (the remote `timeout` and the client guard)."""


class ConnectionDropped(RemoteError):
    """The connection broke while a command was running; the command's outcome is unknown."""


class Executor(Protocol):
    """Runs shell commands on one host. Implementations: SSHExecutor, LocalExecutor."""

    name: str

    async def run(self, command: str, *, input: bytes | None = None, timeout_s: float | None = None) -> CommandResult:
        """Run `command` (wrapped in `timeout -k`) with optional stdin bytes; raise RemoteError subclasses."""
        ...

    async def run_script(self, script: str, *, timeout_s: float | None = None) -> CommandResult:
        """Run the POSIX sh `script` (values already quoted) within `timeout_s`; as `run("sh -s", input=script)`
        but an executor may use a shell it keeps running (the probe agent). Raises RemoteError subclasses."""
        ...

    def helper_pids(self) -> set[int]:
        """PIDs of the bot's own long-lived helpers on the host (the probe agent), never shown in a probe."""
        ...

    async def open_stream(self, command: str) -> ProcessStream | None:
        """Start `command` as a long-lived process (no timeout) whose pipes the caller keeps (a probe agent in a
        Slurm job's step); None when the host keeps no more of them now. Raises RemoteError subclasses."""
        ...

    def script_slots(self) -> int:
        """How many `run_script` calls this host runs at once (the others wait inside it): at least 1."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


def _known_hosts_has_entry(path: Path, address: str, port: int) -> bool:
    """True when the known_hosts file holds any key for (address, port): a mismatch then means CHANGED."""
    try:
        kh = asyncssh.read_known_hosts(str(path))
        trusted, _ca, _revoked, *_ = kh.match(address, "", port)
        return bool(trusted)
    except (OSError, ValueError, asyncssh.Error):
        return False


#: Seconds before a probe agent that could not be started is tried again (meanwhile probes open their own channel).
AGENT_RETRY_S = 60.0
#: Probe agents per connection at most (a second one serves while the first waits on a slow health endpoint).
MAX_AGENTS = 2


class AgentLost(Exception):
    """The probe agent ended (or garbled its answer) while the connection stayed up: the script can go again over
    a channel of its own."""


class ProcessStream(Protocol):
    """The pipes of one long-lived process a host runs (Executor.open_stream): its stdin, its stdout (stderr merged)
    read up to a pattern, and its end."""

    def write(self, data: bytes) -> None:
        """Send `data` to its stdin."""
        ...

    async def readuntil(self, pattern: re.Pattern[bytes], max_separator_len: int) -> bytes:
        """Its output up to and including the first match of `pattern` (at most `max_separator_len` bytes long).
        Raises asyncio.IncompleteReadError at its end, OSError or asyncssh errors when its pipes broke."""
        ...

    def close(self) -> None:
        """End it (stdin closed, then stopped)."""
        ...

    @property
    def ended(self) -> bool:
        """True once its process ended (or its channel closed)."""
        ...


class _SSHStream:
    """A process on an SSH channel as a ProcessStream; `on_close` runs once, when it is closed or its channel closed
    by itself (the process ended, the connection dropped)."""

    def __init__(self, process: asyncssh.SSHClientProcess, on_close: Callable[[], None] | None = None):
        self.process = process
        self._on_close = on_close
        self._watch = asyncio.ensure_future(process.wait_closed())
        self._watch.add_done_callback(lambda _t: self._closed())

    def _closed(self) -> None:
        if self._on_close is not None:
            self._on_close, done = None, self._on_close
            done()

    def write(self, data: bytes) -> None:
        """Send `data` to its stdin (ProcessStream.write)."""
        self.process.stdin.write(data)

    async def readuntil(self, pattern: re.Pattern[bytes], max_separator_len: int) -> bytes:
        """Its output up to and including `pattern` (ProcessStream.readuntil; raises as it says)."""
        return await self.process.stdout.readuntil(pattern, max_separator_len)

    def close(self) -> None:
        """End it (ProcessStream.close): once, whatever called it first."""
        self.process.close()
        self._closed()

    @property
    def ended(self) -> bool:
        """True once its process ended or its channel closed (ProcessStream.ended)."""
        return self._watch.done() or self.process.is_closing() or self.process.exit_status is not None


class _LocalStream:
    """A local process (its own session) as a ProcessStream."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self._buf = bytearray()

    def write(self, data: bytes) -> None:
        """Send `data` to its stdin (ProcessStream.write)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)

    async def readuntil(self, pattern: re.Pattern[bytes], max_separator_len: int) -> bytes:
        """Its output up to and including `pattern` (ProcessStream.readuntil; raises as it says)."""
        assert self.proc.stdout is not None
        start = 0
        while True:
            m = pattern.search(self._buf, start)
            if m is not None:
                out = bytes(self._buf[:m.end()])
                del self._buf[:m.end()]
                return out
            start = max(0, len(self._buf) - max_separator_len)
            chunk = await self.proc.stdout.read(65536)
            if not chunk:
                raise asyncio.IncompleteReadError(bytes(self._buf), None)
            self._buf += chunk

    def close(self) -> None:
        """End it (ProcessStream.close): its stdin closed, then SIGTERM to its session; nothing once it ended."""
        if self.proc.returncode is None:
            with contextlib.suppress(Exception):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    @property
    def ended(self) -> bool:
        """True once its process ended (ProcessStream.ended)."""
        return self.proc.returncode is not None


class ShellAgent:
    """One probe agent (bot.core.agent) on a long-lived process's pipes (`stream`: a shell on an SSH connection
    `conn`, or a Slurm job's step): its PID on the host, and whether a request is running (`busy`: one at a
    time)."""

    def __init__(self, stream: ProcessStream, pid: int, conn: asyncssh.SSHClientConnection | None = None):
        self.conn = conn
        self.stream = stream
        self.pid = pid
        self.busy = False
        self.closed = False

    @classmethod
    async def start(cls, stream: ProcessStream, timeout_s: float,
                    conn: asyncssh.SSHClientConnection | None = None) -> ShellAgent:
        """The agent on `stream` (a process that runs agent.AGENT_COMMAND), once it said its PID. Raises AgentLost
        (the stream closed) when it does not say it within `timeout_s` seconds."""
        try:
            stream.write(agent.HELLO)
            data = await asyncio.wait_for(stream.readuntil(agent.HELLO_RE, agent.HELLO_MAX), timeout_s)
        except (TimeoutError, asyncio.IncompleteReadError, asyncssh.Error, OSError) as e:
            stream.close()
            raise AgentLost(f"the probe agent did not start: {type(e).__name__}") from None
        except BaseException:  # cancelled: the process must not outlive the caller
            stream.close()
            raise
        m = agent.HELLO_RE.search(data)
        assert m is not None
        return cls(stream, int(m.group(1)), conn)

    def alive_on(self, conn: asyncssh.SSHClientConnection | None) -> bool:
        """True while the agent runs on `conn` (the executor's current connection)."""
        return not self.closed and conn is self.conn and conn is not None and not conn.is_closed()

    async def run(self, script: str, budget_s: float, host: str) -> CommandResult:
        """Run `script` with `budget_s` seconds and return its output (stderr merged into stdout); the caller holds
        the agent (`busy`). Raises RemoteTimeout (the agent is then closed), ConnectionDropped, AgentLost. A
        cancelled request closes the agent too: its output would be in the way of the next one."""
        token = agent.new_token()
        start = time.monotonic()
        deadline = start + budget_s + KILL_AFTER_S + CLIENT_MARGIN_S
        data = b""
        m: re.Match[bytes] | None = None
        try:
            self.stream.write(agent.request(script, budget_s, token))
            while m is None:  # up to the DONE line of this request's token (another is a line of the output)
                data += await asyncio.wait_for(self.stream.readuntil(agent.DONE_RE, agent.DONE_MAX),
                                               max(0.001, deadline - time.monotonic()))
                m = agent.done(data, token)
        except TimeoutError:
            raise RemoteTimeout(host, f"command did not finish within {budget_s:g} s on {host}") from None
        except (asyncio.IncompleteReadError, asyncssh.Error, BrokenPipeError, ConnectionError, OSError) as e:
            if self.conn is not None and self.conn.is_closed():
                raise ConnectionDropped(host, f"SSH connection to {host} was lost: {e}") from None
            raise AgentLost(f"the probe agent ended: {type(e).__name__}") from None
        finally:
            if m is None:
                self.close()
        return CommandResult(int(m.group(2)), data[: m.start()], b"", time.monotonic() - start)

    def close(self) -> None:
        """End the agent (its stream is closed; the host's shell gets EOF or SIGHUP)."""
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                self.stream.close()


#: The NVML reader's source, sent to the host's Python (bot.adapters.nvml_reader).
NVML_READER_SOURCE = (resources.files("bot.adapters") / "nvml_reader.py").read_text()
#: Seconds before an NVML reader that could not start (no pynvml, no driver) is tried again.
NVML_RETRY_S = 600.0


class NvmlUnavailable(Exception):
    """The NVML reader could not start or answer; str() says why (pynvml missing, no driver, no answer in N s)."""


class _NvmlReader:
    """The NVML reader (bot.adapters.nvml_reader) kept running on one SSH connection: one JSON line per request."""

    def __init__(self, conn: asyncssh.SSHClientConnection, process: asyncssh.SSHClientProcess, pid: int):
        self.conn = conn
        self.process = process
        self.pid = pid
        self.closed = False
        self.lock = asyncio.Lock()

    @classmethod
    async def start(cls, conn: asyncssh.SSHClientConnection, python: str, timeout_s: float) -> _NvmlReader:
        """Start the reader with the host's `python` and read its hello. Raises NvmlUnavailable (with the reader's
        own words when it said why), asyncssh errors when the channel cannot be opened."""
        process = await conn.create_process(nvml_reader_command(python), encoding=None)
        try:
            process.stdin.write(json.dumps(NVML_READER_SOURCE).encode() + b"\n")
            hello = json.loads(await asyncio.wait_for(process.stdout.readline(), timeout_s) or b"null")
        except (TimeoutError, ValueError, asyncssh.Error, OSError) as e:
            process.close()
            raise NvmlUnavailable(f"the NVML reader did not start ({type(e).__name__})") from None
        if not isinstance(hello, dict) or not isinstance(hello.get("hello"), int):
            process.close()
            raise NvmlUnavailable(f"the NVML reader did not start with {python} (is it a Python 3?)")
        if hello.get("error"):
            process.close()
            raise NvmlUnavailable(f"NVML reader: {str(hello['error'])[:200]}")
        return cls(conn, process, hello["hello"])

    def alive_on(self, conn: asyncssh.SSHClientConnection | None) -> bool:
        """True while the reader runs on `conn` (the executor's current connection)."""
        return not self.closed and conn is self.conn and not conn.is_closed()

    async def ask(self, timeout_s: float) -> Any:
        """One reading (the decoded JSON answer). Raises NvmlUnavailable (the reader is then closed) when it does
        not answer within `timeout_s` seconds or its answer is not JSON."""
        async with self.lock:
            try:
                self.process.stdin.write(b"\n")
                line = await asyncio.wait_for(self.process.stdout.readline(), timeout_s)
                if not line.endswith(b"\n"):
                    raise ValueError("the reader ended")
                return json.loads(line)
            except TimeoutError:
                self.close()
                raise NvmlUnavailable(f"NVML did not answer in {timeout_s:g} s") from None
            except (ValueError, asyncssh.Error, OSError) as e:
                self.close()
                raise NvmlUnavailable(f"the NVML reader failed ({type(e).__name__})") from None
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        """End the reader (its channel closes; the Python gets EOF and exits)."""
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                self.process.close()


def nvml_reader_command(python: str) -> str:
    """What the reader's channel runs: `python` reading the reader's source as its first stdin line (so its
    arguments stay short in `ps`), its stderr dropped (the JSON lines are the only output)."""
    boot = "import sys,json;exec(json.loads(sys.stdin.readline()))"
    return f"exec {shlex.quote(python)} -u -c {shlex.quote(boot)} {nvml_reader.NAME} 2>/dev/null"


class SSHExecutor:
    """One pooled asyncssh connection to one host.

    `connects` counts successful connection setups; `execs` counts channel exec requests made.
    Raises `RemoteError` subclasses from `run`: HostUnreachable, HostKeyRejected, AuthenticationFailed,
    RemoteTimeout, ConnectionDropped.
    """

    def __init__(self, name: str, cfg: HostConfig, *, keepalive_count_max: int = 3):
        if cfg.local or not cfg.address:
            raise ValueError(f"host {name} is not an SSH host")
        if not cfg.known_hosts:
            raise ValueError(f"host {name} has no known_hosts file; host keys must be verified")
        self.name = name
        self.cfg = cfg
        self.keepalive_count_max = keepalive_count_max
        self._conn: asyncssh.SSHClientConnection | None = None
        self._lock = asyncio.Lock()
        # the probe agents and the NVML reader keep a channel each for good: the other commands share the rest
        helpers = cfg.max_channels - 1 - (1 if cfg.nvml_python else 0)
        self._max_agents = max(0, min(MAX_AGENTS, helpers)) if cfg.probe_agent else 0
        self._channel_slots = max(1, cfg.max_channels - self._max_agents - (1 if cfg.nvml_python else 0))
        self._sem = asyncio.Semaphore(self._channel_slots)
        self._agents: list[ShellAgent] = []
        self._streams = 0  # long-lived commands holding a channel (open_stream)
        self._agent_cond = asyncio.Condition()
        self._agent_retry_at = 0.0
        self.agent_starts = 0
        self._nvml: _NvmlReader | None = None
        self._nvml_lock = asyncio.Lock()
        self._nvml_retry_at = 0.0
        #: Why the NVML reader is not used now (None while it works or was never tried).
        self.nvml_problem: str | None = None
        self.connects = 0
        self.execs = 0
        self._known_hosts_path = Path(os.path.expanduser(cfg.known_hosts))
        self._last_failure: tuple[float, RemoteError] | None = None
        self._key_file = os.path.expanduser(cfg.key_file) if cfg.key_file else None

    async def _connect(self) -> asyncssh.SSHClientConnection:
        cfg = self.cfg
        kh = self._known_hosts_path
        target = f"{cfg.address}:{cfg.port}"
        if not kh.is_file():
            raise HostKeyRejected(
                self.name, f"known_hosts file {kh} not found; cannot verify the host key of {target}"
            )
        kwargs: dict = {
            "port": cfg.port,
            "known_hosts": str(kh),
            "config": None,
            "connect_timeout": cfg.connect_timeout_s,
            "login_timeout": cfg.connect_timeout_s,
            "keepalive_interval": cfg.keepalive_interval_s,
            "keepalive_count_max": self.keepalive_count_max,
            "encryption_algs": ENCRYPTION_ALGS,
        }
        if cfg.user:
            kwargs["username"] = cfg.user
        if self._key_file:
            try:
                kwargs["client_keys"] = [asyncssh.read_private_key(self._key_file)]
            except (OSError, asyncssh.KeyImportError) as e:
                reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                raise AuthenticationFailed(
                    self.name, f"key_file {self._key_file} cannot be used: {reason} "
                    "(gpubot needs an unencrypted key file, or no key_file to use the SSH agent)"
                ) from None
            kwargs["agent_path"] = None
        try:
            conn = await asyncssh.connect(cfg.address, **kwargs)
        except asyncssh.HostKeyNotVerifiable as e:
            if _known_hosts_has_entry(kh, cfg.address or "", cfg.port):
                msg = (
                    f"host key of {target} has CHANGED: it does not match the pinned key in {kh}. "
                    "Refusing to connect (possible man-in-the-middle, or the host was reinstalled: "
                    "verify the new key out of band, then update known_hosts)"
                )
            else:
                msg = (
                    f"host key of {target} is unknown: no entry in {kh}. Refusing to connect; "
                    f"add the host's key (e.g. ssh-keyscan -p {cfg.port} {cfg.address}, verified) to that file"
                )
            log.warning("host %s: %s (%s)", self.name, msg, e)
            raise HostKeyRejected(self.name, msg) from None
        except asyncssh.PermissionDenied as e:
            raise AuthenticationFailed(
                self.name, f"SSH authentication to {cfg.user or ''}@{target} failed: {e.reason}"
            ) from None
        except TimeoutError:
            raise HostUnreachable(
                self.name, f"{target} did not answer within {cfg.connect_timeout_s:g} s"
            ) from None
        except ConnectionRefusedError:
            raise HostUnreachable(self.name, f"{target} refused the connection (is sshd running?)") from None
        except OSError as e:
            raise HostUnreachable(self.name, f"cannot reach {target}: {e.strerror or e}") from None
        except asyncssh.Error as e:
            raise HostUnreachable(self.name, f"SSH to {target} failed: {e.reason}") from None
        self.connects += 1
        log.info("host %s: connected to %s", self.name, target)
        return conn

    async def _connection(self) -> asyncssh.SSHClientConnection:
        async with self._lock:
            conn = self._conn
            if conn is not None and not conn.is_closed():
                return conn
            # Commands queued behind a failed connect get that failure at once instead of each waiting
            # for their own connect timeout.
            if self._last_failure is not None and time.monotonic() - self._last_failure[0] < FAILURE_CACHE_S:
                err = self._last_failure[1]
                raise type(err)(err.host, err.message)
            try:
                self._conn = await self._connect()
            except RemoteError as e:
                self._last_failure = (time.monotonic(), e)
                raise
            self._last_failure = None
            return self._conn

    def _drop(self, conn: asyncssh.SSHClientConnection | None) -> None:
        if conn is not None and self._conn is conn:
            self._conn = None
            conn.close()

    async def run(self, command: str, *, input: bytes | None = None, timeout_s: float | None = None) -> CommandResult:
        """Run `command` over one session channel of the pooled connection.

        The command is wrapped in `timeout -k`; stdin is `input` followed by EOF. Returns CommandResult
        with raw bytes. A refused channel open is retried with backoff; a dead connection is replaced
        once before the command starts. Raises RemoteError subclasses.
        """
        budget = timeout_s if timeout_s is not None else self.cfg.command_timeout_s
        wrapped = wrap_timeout(command, budget)
        delays = [0.05, 0.1, 0.2, 0.4, 0.8, 1.6]
        reconnected = False
        async with self._sem:
            attempt = 0
            while True:
                conn = await self._connection()
                start = time.monotonic()
                try:
                    self.execs += 1
                    res = await conn.run(
                        wrapped,
                        input=input,
                        check=False,
                        encoding=None,
                        timeout=budget + KILL_AFTER_S + CLIENT_MARGIN_S,
                    )
                except asyncssh.ChannelOpenError as e:
                    if conn.is_closed() and not reconnected:
                        self._drop(conn)
                        reconnected = True
                        continue
                    if attempt < len(delays):
                        log.info("host %s: channel open refused (%s); retrying", self.name, e.reason)
                        await asyncio.sleep(delays[attempt])
                        attempt += 1
                        continue
                    raise ConnectionDropped(
                        self.name, f"SSH server kept refusing new channels: {e.reason}"
                    ) from None
                except asyncssh.TimeoutError as e:
                    raise RemoteTimeout(
                        self.name, f"command did not finish within {budget:g} s on {self.name}"
                    ) from e
                except (asyncssh.ConnectionLost, asyncssh.DisconnectError, BrokenPipeError, ConnectionError) as e:
                    self._drop(conn)
                    raise ConnectionDropped(self.name, f"SSH connection to {self.name} was lost: {e}") from None
                duration = time.monotonic() - start
                if res.exit_status is None and not res.exit_signal:
                    # The channel closed without an exit status: the connection dropped mid-command.
                    self._drop(conn)
                    raise ConnectionDropped(
                        self.name, f"SSH connection to {self.name} was lost while the command ran"
                    )
                stdout = res.stdout if isinstance(res.stdout, bytes) else (res.stdout or "").encode()
                stderr = res.stderr if isinstance(res.stderr, bytes) else (res.stderr or "").encode()
                sig = res.exit_signal[0] if res.exit_signal else None
                return CommandResult(res.exit_status, stdout, stderr, duration, sig)

    async def _take_agent(self) -> ShellAgent | None:
        """A probe agent, held for the caller (`_give_back` it): an idle one, a new one while there are fewer than
        MAX_AGENTS (connecting first when needed), else the first to be given back. None when no agent can run
        now (it failed to start: tried again after AGENT_RETRY_S), or none is used. Raises RemoteError subclasses
        when the host cannot be reached."""
        if not self._max_agents:
            return None
        async with self._agent_cond:
            while True:
                conn = await self._connection()
                for stale in [a for a in self._agents if not a.alive_on(conn)]:
                    stale.close()
                    self._agents.remove(stale)
                idle = next((a for a in self._agents if not a.busy), None)
                if idle is None and len(self._agents) < self._max_agents and time.monotonic() >= self._agent_retry_at:
                    try:
                        process = await conn.create_process(agent.AGENT_COMMAND, encoding=None)
                        idle = await ShellAgent.start(_SSHStream(process), self.cfg.connect_timeout_s, conn)
                    except (AgentLost, asyncssh.Error, OSError) as e:
                        log.info("host %s: probe agent unavailable (%s); probes open their own channels for %.0f s",
                                 self.name, e, AGENT_RETRY_S)
                        self._agent_retry_at = time.monotonic() + AGENT_RETRY_S
                    else:
                        self._agents.append(idle)
                        self.agent_starts += 1
                if idle is not None:
                    idle.busy = True
                    return idle
                if not self._agents:
                    return None
                await self._agent_cond.wait()

    async def _give_back(self, worker: ShellAgent) -> None:
        """End the caller's hold on `worker` and wake one caller waiting for an agent."""
        worker.busy = False
        async with self._agent_cond:
            self._agent_cond.notify()

    async def run_script(self, script: str, *, timeout_s: float | None = None) -> CommandResult:
        """Run the POSIX sh `script` on a probe agent (bot.core.agent) when the host keeps them (`probe_agent`):
        no new channel, no login shell; MAX_AGENTS per connection, a script waiting for one while all are busy.
        Otherwise, or when the agent ends during the script, over a channel of its own (`run("sh -s",
        input=script)`). The output's stderr is merged into stdout on an agent. Raises RemoteError subclasses, as
        `run`."""
        budget = timeout_s if timeout_s is not None else self.cfg.command_timeout_s
        worker = await self._take_agent()
        if worker is not None:
            try:
                self.execs += 1
                return await worker.run(script, budget, self.name)
            except AgentLost as e:
                log.info("host %s: %s; running the script over its own channel", self.name, e)
            finally:
                await self._give_back(worker)
        return await self.run("sh -s", input=script.encode(), timeout_s=budget)

    def script_slots(self) -> int:
        """Scripts run at once: one per probe agent (MAX_AGENTS at most), else the channels left to commands."""
        return self._max_agents or self._channel_slots

    async def open_stream(self, command: str) -> ProcessStream | None:
        """Start `command` (no timeout: it runs until closed) on a channel of its own, its stderr merged into its
        stdout by the caller's command; the channel is one of the commands' for as long as it runs. None when
        half of the commands' channels are held so already (the caller runs its commands one by one instead).
        None too when every command channel is busy now (it never waits for one). Raises RemoteError subclasses
        when the host cannot be reached or the channel cannot be opened."""
        if self._streams >= self._channel_slots // 2 or self._sem.locked():  # never waits for a channel
            return None
        self._streams += 1
        await self._sem.acquire()  # free now: returns at once
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._streams -= 1
                self._sem.release()

        try:
            conn = await self._connection()
            process = await conn.create_process(command, encoding=None)
        except (asyncssh.Error, OSError) as e:
            release()
            raise RemoteError(self.name, f"{self.name}: could not start a long-lived command: {e}") from None
        except BaseException:  # RemoteError (no connection), or cancelled
            release()
            raise
        self.execs += 1
        return _SSHStream(process, release)

    def helper_pids(self) -> set[int]:
        """The PIDs of the probe agents and the NVML reader on the host while they run (never shown in a probe)."""
        return {h.pid for h in (*self._agents, self._nvml) if h is not None and not h.closed}

    def nvml_ready(self) -> bool:
        """False while an NVML reader that could not start waits to be tried again (NVML_RETRY_S)."""
        return time.monotonic() >= self._nvml_retry_at

    async def nvml_reading(self, python: str, timeout_s: float) -> Any:
        """One reading of every GPU by the NVML reader kept on the connection (bot.adapters.nvml_reader), started
        with the host's `python` on first use: the decoded JSON answer (bot.core.parse.nvml reads it). Raises
        NvmlUnavailable when the reader cannot start (then not tried again for NVML_RETRY_S) or answer (started
        again next time), RemoteError subclasses when the host cannot be reached."""
        async with self._nvml_lock:
            conn = await self._connection()
            reader = self._nvml
            if reader is not None and not reader.alive_on(conn):
                reader.close()
                reader = self._nvml = None
            if reader is None:
                if not self.nvml_ready():
                    raise NvmlUnavailable(self.nvml_problem or "the NVML reader is not available")
                try:
                    reader = await _NvmlReader.start(conn, python, timeout_s)
                except (NvmlUnavailable, asyncssh.Error, OSError) as e:
                    self.nvml_problem = str(e) if isinstance(e, NvmlUnavailable) else f"NVML reader: {e}"
                    self._nvml_retry_at = time.monotonic() + NVML_RETRY_S
                    log.warning("host %s: %s; GPU readings come from nvidia-smi for %.0f s", self.name,
                                self.nvml_problem, NVML_RETRY_S)
                    raise NvmlUnavailable(self.nvml_problem) from None
                self._nvml = reader
                self.nvml_problem = None
        return await reader.ask(timeout_s)

    async def close(self) -> None:
        """Close the probe agent and the pooled connection (if any) and wait for it to finish closing (bounded,
        5 s)."""
        for helper in (*self._agents, self._nvml):
            if helper is not None:
                helper.close()
        self._agents, self._nvml = [], None
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.wait_closed(), 5)


#: Environment variables a local command inherits from the bot (nothing else: no tokens).
LOCAL_ENV_KEEP = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR",
                            "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"})


class LocalExecutor:
    """Runs commands on the bot's own machine through `sh -c`, in a new session so a timeout kills the
    whole process group. `extra_path` directories are put first on PATH (used by the demo)."""

    def __init__(self, name: str, cfg: HostConfig | None = None, *, extra_path: list[str] | None = None):
        self.name = name
        self.cfg = cfg or HostConfig(local=True)
        self.extra_path = extra_path or []
        self.execs = 0

    def _env(self) -> dict[str, str]:
        """The environment of a local command: never the bot's own (Slack tokens), a minimal one, like a login."""
        env = {k: v for k, v in os.environ.items() if k in LOCAL_ENV_KEEP or k.startswith("LC_")}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        if self.extra_path:
            env["PATH"] = os.pathsep.join([*self.extra_path, env.get("PATH", "")])
        return env

    async def run(self, command: str, *, input: bytes | None = None, timeout_s: float | None = None) -> CommandResult:
        """Run `command` locally (wrapped in `timeout -k`); returns CommandResult; raises RemoteTimeout."""
        budget = timeout_s if timeout_s is not None else self.cfg.command_timeout_s
        wrapped = wrap_timeout(command, budget)
        env = self._env()
        start = time.monotonic()
        self.execs += 1
        proc = await asyncio.create_subprocess_exec(
            "sh",
            "-c",
            wrapped,
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=env,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(input), budget + KILL_AFTER_S + CLIENT_MARGIN_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise RemoteTimeout(self.name, f"command did not finish within {budget:g} s on {self.name}") from None
        except asyncio.CancelledError:  # the caller gave up (shutdown): the command must not outlive it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception, asyncio.CancelledError):  # reaped, its pipes closed, within a bound
                await asyncio.wait_for(proc.wait(), KILL_AFTER_S)
            raise
        rc = proc.returncode
        sig = None
        if rc is not None and rc < 0:
            sig = signal.Signals(-rc).name.removeprefix("SIG")
            rc = None
        return CommandResult(rc, out, err, time.monotonic() - start, sig)

    async def run_script(self, script: str, *, timeout_s: float | None = None) -> CommandResult:
        """`run("sh -s", input=script)`: a local shell starts in a millisecond."""
        return await self.run("sh -s", input=script.encode(), timeout_s=timeout_s)

    async def open_stream(self, command: str) -> ProcessStream | None:
        """Start `command` through `sh -c` in a session of its own (no timeout: it runs until closed, then gets
        SIGTERM), with the environment of `run`; its stdout and stderr are one stream."""
        proc = await asyncio.create_subprocess_exec(
            "sh", "-c", command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True, env=self._env())
        self.execs += 1
        return _LocalStream(proc)

    def helper_pids(self) -> set[int]:
        """No long-lived helpers on the local host."""
        return set()

    def script_slots(self) -> int:
        """Scripts run at once: the host's `max_channels` (local processes are cheap; this bounds a burst)."""
        return max(1, self.cfg.max_channels)

    async def close(self) -> None:
        """Nothing to release for local commands."""
        return None


def build_executor(name: str, cfg: HostConfig, *, extra_path: list[str] | None = None) -> Executor:
    """Return a LocalExecutor for `local: true` hosts, else an SSHExecutor (which verifies host keys)."""
    if cfg.local:
        return LocalExecutor(name, cfg, extra_path=extra_path)
    return SSHExecutor(name, cfg)

