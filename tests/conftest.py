"""Shared fixtures: fake GPU (replaying nvidia-smi), loopback SSH server, fake servers killed by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pytest

from bot.config import Config, HostConfig
from bot.demo.fakegpu import FakeGpu, install_fake_gpu
from tests.data import CASES, FIXTURES, H200  # noqa: F401  (re-exported for tests)
from tests.fakes.ssh_server import LoopbackSSHServer


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    """slack_sdk and aiohttp would route loopback traffic through a proxy from the environment."""
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture
def fake_gpu(tmp_path) -> FakeGpu:
    """A replaying fake nvidia-smi (1 H200) installed under tmp_path."""
    return install_fake_gpu(tmp_path / "fakegpu", gpu_count=1)


@pytest.fixture
async def ssh_server(tmp_path, fake_gpu):
    """A real asyncssh server on loopback; the fake nvidia-smi is first on its commands' PATH."""
    env = {"PATH": f"{fake_gpu.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    async with LoopbackSSHServer(tmp_path / "ssh", env=env) as srv:
        yield srv


def ssh_host(srv, **overrides) -> HostConfig:
    """HostConfig pointing at a LoopbackSSHServer / OpenSSHServer (host keys verified)."""
    fields = {
        "address": srv.host,
        "port": srv.port,
        "user": srv.username,
        "key_file": str(srv.client_key_path),
        "known_hosts": str(srv.known_hosts_path),
        "connect_timeout_s": 5,
        "command_timeout_s": 20,
        "nvidia_smi_timeout_s": 3,
        "keepalive_interval_s": 5,
        "log_dirs": ["/tmp"],
    }
    fields.update(overrides)
    return HostConfig(**fields)


@pytest.fixture
def ssh_config(ssh_server) -> Config:
    """Config with one SSH host `gpu-host-1` reached through the loopback server."""
    return Config(hosts={"gpu-host-1": ssh_host(ssh_server)}, default_host="gpu-host-1")


def free_port() -> int:
    """An unused loopback TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class FakeServer:
    """A running fake inference server (process group leader `pid`)."""

    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                    if r.status == 200:
                        return
            time.sleep(0.1)
        raise AssertionError(f"fake server not ready; log:\n{self.log_path.read_text()}")

    def wait_log(self, text: str, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.log_path.read_text(errors="replace"):
                return
            time.sleep(0.1)
        raise AssertionError(f"{text!r} not in log:\n{self.log_path.read_text()}")


@pytest.fixture
def start_fake_server(tmp_path, fake_gpu):
    """Factory: start the fake multi-process server in its own session; every group is killed at teardown."""
    started: list[FakeServer] = []

    def start(mode: str = "ready", workers: int = 2, load_s: float = 0.3, **extra) -> FakeServer:
        port = free_port()
        log_path = tmp_path / f"server-{len(started)}.log"
        script = str(resources.files("bot.demo") / "fake_server.py")
        cmd = [sys.executable, script, "--workers", str(workers), "--port", str(port), "--mode", mode,
               "--load-s", str(load_s), "--gpu-state", str(fake_gpu.state_dir)]
        for k, v in extra.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        with open(log_path, "wb") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        srv = FakeServer(proc, port, log_path)
        started.append(srv)
        return srv

    yield start
    for s in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(s.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            s.proc.wait(timeout=5)
