"""A throwaway Debian OpenSSH ``sshd`` on loopback for integration tests.

``with OpenSSHServer(tmp_path, max_sessions=10) as s:`` generates host and client ed25519 keys with
``ssh-keygen``, writes a private ``sshd_config`` (127.0.0.1, a free ephemeral port, public-key auth
only, ``UsePAM no``, ``StrictModes no``), validates it with ``sshd -t``, and runs ``sshd -D -E log``
by its absolute path as a child ``subprocess.Popen`` that the test owns. On exit exactly that PID is
terminated (then killed) - nothing else.

Notes:

* As root, ``/run/sshd`` (the privilege-separation directory) is created if missing and the login
  user is ``root`` (``PermitRootLogin prohibit-password``). As root, sshd IGNORES client signal
  requests ("session signalling requires privilege separation").
* As a non-root user sshd runs without privilege separation and can only log in that same user.
* As root, ``username=`` logs in another existing user (e.g. one whose login shell is ``/bin/sh``, so
  sessions do not pay for root's ``.bashrc``); the private directory is then made world-readable
  (0755, the private keys stay 0600) so sshd, reading ``authorized_keys`` as that user, can open it.
* Sessions run the user's login shell with sshd's default PATH, not the test's environment; use
  ``env={"PATH": ...}`` (written as ``SetEnv``) to put fake tools first on PATH.
* Per-connection sshd children (and commands started without a PTY) are not killed when the
  listener is stopped; close client connections before leaving the context.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.procs import terminate

_SKIP_REASON = "OpenSSH sshd not installed (apt-get install openssh-server)"


class OpenSSHUnavailable(RuntimeError):
    """sshd is missing or could not be started; callers may ``pytest.skip`` on it."""


def sshd_path() -> str | None:
    """Absolute path of ``sshd`` (PATH lookup, then ``/usr/sbin/sshd``), or None."""
    found = shutil.which("sshd") or shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:/sbin")
    if found:
        return os.path.abspath(found)
    return "/usr/sbin/sshd" if os.access("/usr/sbin/sshd", os.X_OK) else None


def ssh_keygen_path() -> str | None:
    """Absolute path of ``ssh-keygen`` or None."""
    found = shutil.which("ssh-keygen")
    return os.path.abspath(found) if found else None


def sshd_available() -> bool:
    """True when both ``sshd`` and ``ssh-keygen`` are installed."""
    return sshd_path() is not None and ssh_keygen_path() is not None


def require_sshd() -> str:
    """Return the sshd path, or ``pytest.skip`` when OpenSSH sshd / ssh-keygen is not installed."""
    import pytest

    path = sshd_path()
    if path is None or ssh_keygen_path() is None:
        pytest.skip(_SKIP_REASON)
    return path


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _quote(value: str) -> str:
    if any(ch in value for ch in '"\n\r'):
        raise ValueError(f"unsupported character in sshd_config value: {value!r}")
    return f'"{value}"'


class OpenSSHServer:
    """Context manager running a private OpenSSH ``sshd -D`` on ``127.0.0.1``.

    Args:
        tmp_path: directory for a private sub-directory with keys, config, pid and log file.
        max_sessions: ``MaxSessions`` (OpenSSH default 10).
        username: the user to log in (default: the current user; another user needs root).
        extra_config: further ``sshd_config`` lines appended as given (e.g. ``"MaxStartups 500"``; sshd keeps
            the first value of a keyword, so use ``max_sessions`` for ``MaxSessions``).
        env: variables for every session, written as ``SetEnv NAME=value`` (overrides sshd's PATH).
        start_timeout_s: how long to wait for sshd to listen, per attempt.
        attempts: how many ports to try if sshd fails to bind the picked port.

    Attributes (valid inside the ``with``): host, port, username (the login user), client_key_path,
    known_hosts_path, known_hosts_line, host_pub_key (``"ssh-ed25519 AAAA..."``), log_path,
    config_path, pid, proc (the ``Popen``), sshd (absolute path).
    """

    def __init__(self, tmp_path: str | os.PathLike[str], max_sessions: int = 10,
                 env: Mapping[str, str] | None = None, start_timeout_s: float = 10.0,
                 attempts: int = 5, *, username: str | None = None,
                 extra_config: Sequence[str] = ()) -> None:
        self.sshd = sshd_path()
        self.keygen = ssh_keygen_path()
        base = Path(tmp_path)
        base.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="openssh-", dir=base))
        self.max_sessions = max_sessions
        self.env = dict(env or {})
        self.start_timeout_s = start_timeout_s
        self.attempts = attempts

        self.host = "127.0.0.1"
        self.port = 0
        self.username = username or pwd.getpwuid(os.getuid()).pw_name
        self.extra_config = [str(line) for line in extra_config]
        if any(ch in line for line in self.extra_config for ch in "\n\r"):
            raise ValueError("extra_config lines must be single lines")
        if self.username != pwd.getpwuid(os.getuid()).pw_name:
            os.chmod(self.dir, 0o755)  # sshd reads authorized_keys as the login user
        self.host_key_path = self.dir / "host_ed25519"
        self.client_key_path = self.dir / "client_ed25519"
        self.authorized_keys_path = self.dir / "authorized_keys"
        self.known_hosts_path = self.dir / "known_hosts"
        self.config_path = self.dir / "sshd_config"
        self.pid_path = self.dir / "sshd.pid"
        self.log_path = self.dir / "sshd.log"
        self.stderr_path = self.dir / "sshd.stderr"
        self.host_pub_key = ""
        self.known_hosts_line = ""
        self.proc: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ public API

    @property
    def pid(self) -> int | None:
        """PID of the sshd listener we started (None when not running)."""
        return self.proc.pid if self.proc is not None else None

    def __enter__(self) -> OpenSSHServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Generate keys, write and validate the config, start sshd and wait until it listens.

        Raises ``OpenSSHUnavailable`` when sshd is missing or does not come up (the log tail is in
        the message).
        """
        if self.sshd is None or self.keygen is None:
            raise OpenSSHUnavailable(_SKIP_REASON)
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self._keygen(self.host_key_path)
        self._keygen(self.client_key_path)
        client_pub = (self.client_key_path.with_suffix(".pub")).read_text().split()
        self.authorized_keys_path.write_text(f"{client_pub[0]} {client_pub[1]}\n")
        os.chmod(self.authorized_keys_path, 0o644)
        host_pub = self.host_key_path.with_suffix(".pub").read_text().split()
        self.host_pub_key = f"{host_pub[0]} {host_pub[1]}"

        errors: list[str] = []
        for _ in range(max(1, self.attempts)):
            self.port = _free_port(self.host)
            self._write_config()
            check = subprocess.run([self.sshd, "-t", "-f", str(self.config_path)],
                                   capture_output=True, text=True, timeout=30, check=False)
            if check.returncode != 0:
                raise OpenSSHUnavailable(f"sshd -t rejected the config: {check.stderr.strip()}")
            if self.log_path.exists():
                self.log_path.unlink()
            with open(self.stderr_path, "wb") as err:
                self.proc = subprocess.Popen(
                    [self.sshd, "-D", "-f", str(self.config_path), "-E", str(self.log_path)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                    start_new_session=True,
                )
            if self._wait_listening():
                break
            errors.append(self._reap_failed())
        else:
            raise OpenSSHUnavailable("sshd did not start: " + " | ".join(errors))
        self.known_hosts_line = f"[{self.host}]:{self.port} {self.host_pub_key}"
        self.known_hosts_path.write_text(self.known_hosts_line + "\n")

    def stop(self) -> None:
        """Terminate exactly the sshd PID we started (SIGTERM, wait, SIGKILL, wait)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            terminate(proc)

    def log_text(self) -> str:
        """Contents of sshd's log file (LogLevel VERBOSE)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def connect_kwargs(self, **overrides: Any) -> dict[str, Any]:
        """Keyword arguments for ``asyncssh.connect`` (host key verified, client key only)."""
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

    # ------------------------------------------------------------------ internals

    def _keygen(self, path: Path) -> None:
        assert self.keygen is not None
        for p in (path, path.with_suffix(".pub")):
            if p.exists():
                p.unlink()
        subprocess.run([self.keygen, "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
                       check=True, capture_output=True, timeout=30)
        os.chmod(path, 0o600)

    def _write_config(self) -> None:
        lines = [
            f"Port {self.port}",
            f"ListenAddress {self.host}",
            f"HostKey {_quote(str(self.host_key_path))}",
            f"PidFile {_quote(str(self.pid_path))}",
            f"AuthorizedKeysFile {_quote(str(self.authorized_keys_path))}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "PermitRootLogin prohibit-password",
            "StrictModes no",
            f"MaxSessions {int(self.max_sessions)}",
            "LogLevel VERBOSE",
        ]
        if self.env:
            lines.append("SetEnv " + " ".join(_quote(f"{k}={v}") for k, v in self.env.items()))
        lines += self.extra_config
        self.config_path.write_text("\n".join(lines) + "\n")

    def _wait_listening(self) -> bool:
        """Poll the log for 'Server listening', then confirm the port accepts a TCP connection."""
        assert self.proc is not None
        marker = f"Server listening on {self.host} port {self.port}"
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if marker in self.log_text():
                try:
                    with socket.create_connection((self.host, self.port), timeout=1.0):
                        return True
                except OSError:
                    pass
            time.sleep(0.02)
        return False

    def _reap_failed(self) -> str:
        proc, self.proc = self.proc, None
        assert proc is not None
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=5)
        try:
            err = self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            err = ""
        tail = (self.log_text() + err).strip().splitlines()[-5:]
        return f"port {self.port} rc={proc.returncode}: " + " / ".join(tail)
