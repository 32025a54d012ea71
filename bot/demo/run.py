"""`gpubot demo`: the whole first slice on the local machine, with no Slack token, no GPU and no config.

It starts the fake multi-process server (bot/demo/fake_server.py: 2 TP-rank workers, SGLang-style log,
/health on an ephemeral port), waits until it is ready, then answers `/gpu status` and a `/probe` of the
server's process group through the same dispatcher and templates as Slack, and stops the server by its
process group. Without nvidia-smi on this machine the GPU table is a replay of real H200 captures,
labelled "replayed sample GPU data", in which the fake server's workers hold the memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from importlib import resources
from pathlib import Path
from typing import TextIO

from bot.config import Config, HostConfig
from bot.console import ConsoleSurface, run_command_line
from bot.demo.fakegpu import REPLAY_NOTE, install_fake_gpu
from bot.service import HostService


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 (bind to 0, read it, close)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, timeout_s: float, proc: subprocess.Popen) -> bool:
    """Poll http://127.0.0.1:PORT/health until 200 (True), the process exits, or `timeout_s` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    return False


def stop_group(pgid: int, grace_s: float = 3.0, proc: subprocess.Popen | None = None) -> bool:
    """SIGTERM the process group, wait up to `grace_s`, then SIGKILL. Returns True when it is gone.

    `proc` (the group leader, when it is our child) is reaped on the way so it does not linger as a zombie.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if proc is not None:
            proc.poll()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    time.sleep(0.2)
    if proc is not None:
        proc.poll()
    try:
        os.killpg(pgid, 0)
        return False
    except ProcessLookupError:
        return True


def start_server(cmd: list[str], log_path: Path) -> subprocess.Popen:
    """Start `cmd` in its own session (PID = PGID = SID) with stdout+stderr to `log_path`."""
    with open(log_path, "wb") as logf:
        return subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


async def run_demo(out: TextIO | None = None) -> int:
    """Run the demo, printing to `out` (default stdout). Returns the exit code (0 on success)."""
    out = out or sys.stdout
    with tempfile.TemporaryDirectory(prefix="gpubot-demo-") as tmp:
        tmpdir = Path(tmp)
        real_smi = shutil.which("nvidia-smi")
        host = HostConfig(local=True, log_dirs=[str(tmpdir)])
        gpu_state = None
        if real_smi is None:
            fake = install_fake_gpu(tmpdir / "gpu", gpu_count=2)
            gpu_state = str(fake.state_dir)
            host = HostConfig(local=True, nvidia_smi=str(fake.nvidia_smi), use_nvml=False, gpu_note=REPLAY_NOTE,
                              log_dirs=[str(tmpdir)])
        config = Config(hosts={"local": host}, default_host="local", state_dir=str(tmpdir / "state"))
        port = free_port()
        log_path = tmpdir / "demo-server.log"
        server = str(resources.files("bot.demo") / "fake_server.py")
        cmd = [sys.executable, server, "--workers", "2", "--gpus", "0,1", "--port", str(port), "--mode", "ready",
               "--load-s", "1.0", "--load-steps", "4"]
        if gpu_state:
            cmd += ["--gpu-state", gpu_state]
        print(f"gpubot demo: host 'local' is this machine ({socket.gethostname()}); no Slack token needed.", file=out)
        if real_smi is None:
            print(f"GPU data: {REPLAY_NOTE}.", file=out)
        proc = start_server(cmd, log_path)
        print(f"started demo server: pid {proc.pid} (process group {proc.pid}), 2 TP-rank workers on GPUs 0 "
              f"and 1, port {port}, log {log_path}", file=out)
        hosts = HostService(config)
        surface = ConsoleSurface(out)
        rc = 0
        try:
            if not await asyncio.to_thread(wait_healthy, port, 30.0, proc):
                print(f"demo server did not become ready; last log lines:\n{log_path.read_text()[-2000:]}", file=out)
                rc = 1
            else:
                for line in ("/gpu status", f"/probe local pgid={proc.pid} log={log_path} port={port}"):
                    print(f"\n$ {line}", file=out)
                    await run_command_line(line, config, hosts, surface)
        finally:
            gone = await asyncio.to_thread(stop_group, proc.pid, 3.0, proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
            await hosts.close()
            outcome = "all processes gone" if gone else "SOME REMAIN"
            print(f"\nstopped demo server (process group {proc.pid}): {outcome}", file=out)
            if not gone:
                rc = 1
        return rc


def main() -> int:
    """Entry point used by `gpubot demo`."""
    return asyncio.run(run_demo())
