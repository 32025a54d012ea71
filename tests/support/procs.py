"""Process and timing helpers for tests: ports, condition waits (never bare sleeps), the fake inference
server, and finding/killing every process a launch left (by its GPUBOT_LAUNCH tag)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

FAKE_SERVER = str(resources.files("bot.demo") / "fake_server.py")


def terminate(proc: subprocess.Popen[Any], timeout_s: float = 5.0) -> None:
    """Stop exactly `proc`: SIGTERM, wait up to `timeout_s` seconds, then SIGKILL and wait again; reaped either
    way. Nothing when it already exited."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)


def free_port() -> int:
    """An unused loopback TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_until(predicate: Callable[[], T | Awaitable[T]], timeout: float = 60.0, *,
                     what: str | Callable[[], str] = "condition",
                     every: float = 0.05) -> T:
    """Poll `predicate` (sync or async) until it returns something truthy, and return that. Raises
    AssertionError naming `what` (a text, or a function that tells the state at that moment) after `timeout`
    seconds (generous: the suite must pass on a loaded 2-core machine; a passing test never waits for the
    timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}")
        await asyncio.sleep(every)


def wait_until_sync(predicate: Callable[[], T], timeout: float = 60.0, *, what: str = "condition") -> T:
    """`wait_until` for synchronous code."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}")
        time.sleep(0.05)


async def wait_log(path: str | os.PathLike[str] | None, text: str, timeout: float = 60.0, *, count: int = 1) -> None:
    """Wait until the file at `path` contains `text` (at least `count` times: e.g. once per TP rank)."""
    def found() -> bool:
        return bool(path) and os.path.exists(path) and Path(path).read_text(errors="replace").count(text) >= count

    await wait_until(found, timeout, what=f"{count} x {text!r} in {path}")


def pids_with_env(name: str, value: str, *, prefix: bool = False) -> list[int]:
    """Live (not zombie) processes on this machine whose environment carries NAME=value (with `prefix`: a value
    that starts with `value`)."""
    out = []
    needle = f"{name}={value}".encode()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and (any(x.startswith(needle) for x in env) if prefix else needle in env):
            out.append(int(d))
    return out


def pids_of_launch(la: Any) -> list[int]:
    """Every live process on this machine carrying the launch's unique GPUBOT_LAUNCH tag, or a rank's tag of it
    (`<tag>-rK`: the ranks of a launch across hosts, every host being this machine in tests)."""
    tag = getattr(la, "tag", "")
    if not tag:
        return []
    return sorted({*pids_with_env("GPUBOT_LAUNCH", tag), *pids_with_env("GPUBOT_LAUNCH", f"{tag}-r", prefix=True)})


def kill_launches(launches: Iterable[Any]) -> int:
    """SIGKILL every process of these launches (by tag); returns how many were signalled. For finalizers:
    whatever a failed test left running is stopped."""
    n = 0
    for la in launches:
        for pid in pids_of_launch(la):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                n += 1
    return n


@dataclass
class FakeServer:
    """A fake inference server started directly by a test (process group leader `pid`)."""

    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Wait until its /health answers 200."""
        def ready() -> bool:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                    return r.status == 200
            return False

        wait_until_sync(ready, timeout_s, what=f"fake server on port {self.port}; log:\n{self.log_path.read_text()}")

    def wait_log(self, text: str, timeout_s: float = 30.0) -> None:
        """Wait until its log contains `text`."""
        wait_until_sync(lambda: text in self.log_path.read_text(errors="replace"), timeout_s,
                        what=f"{text!r} in {self.log_path}")


class FakeServers:
    """Starts fake servers (bot/demo/fake_server.py) in their own sessions; `stop_all` kills every group."""

    def __init__(self, directory: Path, gpu_state: Path):
        self.directory = directory
        self.gpu_state = gpu_state
        self.started: list[FakeServer] = []

    def start(self, mode: str = "ready", workers: int = 2, load_s: float = 0.3, **extra: Any) -> FakeServer:
        """Start one server (`mode` ready/hang/crash/oom/exit/heartbeat) with `workers` TP workers."""
        port = free_port()
        log_path = self.directory / f"server-{len(self.started)}.log"
        cmd = [sys.executable, FAKE_SERVER, "--workers", str(workers), "--port", str(port), "--mode", mode,
               "--load-s", str(load_s), "--gpu-state", str(self.gpu_state)]
        for k, v in extra.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        with open(log_path, "wb") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        srv = FakeServer(proc, port, log_path)
        self.started.append(srv)
        return srv

    def stop_all(self) -> None:
        """SIGKILL every started server's process group and reap it."""
        for s in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(s.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                s.proc.wait(timeout=5)
