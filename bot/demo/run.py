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
from bot.console import console_runtime, run_command_line
from bot.core.models import LaunchState
from bot.demo.fakegpu import REPLAY_NOTE, install_fake_gpu


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


def demo_config(tmpdir: Path) -> Config:
    """The demo's config: this machine as host `local` (fake nvidia-smi replaying H200 captures when it has
    no nvidia-smi), and a variant `demo` that runs the fake 2-rank server on GPUs 0 and 1."""
    server = str(resources.files("bot.demo") / "fake_server.py")
    params: dict = {"python": {"type": "path", "default": sys.executable},
                    "server": {"type": "path", "default": server},
                    "load_s": {"type": "float", "default": 1.0, "min": 0, "max": 60},
                    # `/launch demo mode=hang hang_in=collective`: a hang to watch, with stacks to dump
                    "mode": {"type": "str", "default": "ready", "choices": ["ready", "hang", "crash", "oom"]},
                    "hang_in": {"type": "str", "default": "sleep", "choices": ["sleep", "rendezvous", "collective"]}}
    command = ("{{ python }} {{ server }} --workers 2 --gpus 0,1 --port {{ port }} --mode {{ mode }} "
               "--hang-in {{ hang_in }} --load-s {{ load_s }} --load-steps 4")
    # py-spy beside this Python (pip install py-spy puts it there) serves `!stack` and the dumps on a hang
    py_spy = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or "py-spy"
    lifecycle: dict = {"kill_grace_s": 5, "release_timeout_s": 15, "min_shm_free_mib": 0}
    if shutil.which("nvidia-smi") is None:
        fake = install_fake_gpu(tmpdir / "gpu", gpu_count=2)
        host = HostConfig(local=True, nvidia_smi=str(fake.nvidia_smi), use_nvml=False, gpu_note=REPLAY_NOTE,
                          log_dirs=[str(tmpdir)], py_spy=py_spy)
        params["state"] = {"type": "path", "default": str(fake.state_dir)}
        command += " --gpu-state {{ state }}"
    else:
        # a real GPU machine: the demo server holds no real GPU memory, and other jobs may use the GPUs
        host = HostConfig(local=True, log_dirs=[str(tmpdir)], py_spy=py_spy)
        lifecycle["gpu_free_mib"] = 10_000_000
    variant = {"host": "local", "command": command, "params": params, "port": free_port(),
               "gpus": [0, 1], "log": str(tmpdir / "{{ variant }}-{{ launch_id }}.log"), "health": "/health"}
    return Config.model_validate({"hosts": {"local": host.model_dump()}, "default_host": "local",
                                  "variants": {"demo": variant}, "state_dir": str(tmpdir / "state"),
                                  "lifecycle": lifecycle,
                                  # a newcomer's session is short: check every 2 s (also once ready), call
                                  # silence after 20 s in every start-up phase (the built-in graces, minutes
                                  # for a rendezvous or a weight load, are for real servers)
                                  "watch": {"interval_s": 2, "silence_after_s": 20, "serving_interval_s": 2,
                                            "phase_grace_s": dict.fromkeys(TRY_PHASES, 20)}})


#: The start-up phases whose grace try-config lowers to its 20 s.
TRY_PHASES = ("comm_init", "weight_loading", "kv_cache_alloc", "cuda_graph_capture", "warmup")


def write_try_config(directory: str | os.PathLike[str]) -> Path:
    """Write `DIR/config.yaml`: this machine as host `local` (replayed H200 GPUs when it has no
    nvidia-smi, logs and state under DIR) with the demo server as variant `demo`, for trying /launch,
    /kill and /relaunch in `gpubot console`. Returns the config path. Raises OSError if DIR is unwritable.
    """
    import yaml

    root = Path(directory).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    config = demo_config(root)
    path = root / "config.yaml"
    data = config.model_dump(exclude_defaults=True)
    path.write_text("# Written by `gpubot try-config`: this machine as a GPU host for trying gpubot.\n"
                    + yaml.safe_dump(data, sort_keys=False))
    return path


async def run_demo(out: TextIO | None = None) -> int:
    """Run the demo, printing to `out` (default stdout). Returns the exit code (0 on success).

    `/launch demo` (incident thread, pre-launch checks), `/gpu status` (holders labelled with the launch),
    `/probe` of the launch's process group, log and port, then `/kill 1` (which shows what it would stop
    and asks for confirmation) and `/kill 1 --yes` (GPU memory released).
    """
    out = out or sys.stdout
    with tempfile.TemporaryDirectory(prefix="gpubot-demo-") as tmp:
        tmpdir = Path(tmp)
        config = demo_config(tmpdir)
        print(f"gpubot demo: host 'local' is this machine ({socket.gethostname()}); no Slack token needed.", file=out)
        if config.hosts["local"].gpu_note:
            print(f"GPU data: {REPLAY_NOTE}.", file=out)
        runtime = console_runtime(config, out)
        port = config.variants["demo"].port
        rc = 0
        la = None
        try:
            print("\n$ /launch demo", file=out)
            await run_command_line("/launch demo", runtime)
            la = runtime.launches.get(1)
            if la is None or la.state != LaunchState.RUNNING or la.pid is None:
                print("the demo server did not start", file=out)
                return 1
            if not await asyncio.to_thread(wait_healthy, port, 30.0, _Pid(la.pid)):
                print("the demo server did not become ready", file=out)
                rc = 1
            else:
                print(f"(demo#1 is ready: its health endpoint http://127.0.0.1:{port}/health answers 200)", file=out)
            for line in ("/gpu status", f"/probe local pgid={la.pgid} log={la.log_path} port={port}", "/kill 1",
                         "/kill 1 --yes"):
                print(f"\n$ {line}", file=out)
                await run_command_line(line, runtime)
            after = runtime.launches.get(1)
            if after is None or after.state != LaunchState.KILLED:
                rc = 1
        finally:
            if la is not None and la.pgid and not await asyncio.to_thread(stop_group, la.pgid, 3.0):
                print(f"demo server process group {la.pgid}: SOME PROCESSES REMAIN", file=out)
                rc = 1
            await runtime.close()
        print(f"\ndemo {'finished' if rc == 0 else 'FAILED'}: launch -> status -> probe -> kill", file=out)
        return rc


class _Pid:
    """Minimal Popen-like handle for wait_healthy: `poll()` is None while the process lives."""

    def __init__(self, pid: int):
        self.pid = pid

    def poll(self) -> int | None:
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return None if f.read().rsplit(")", 1)[1].split()[0] != "Z" else 0
        except OSError:
            return 0


def main() -> int:
    """Entry point used by `gpubot demo`."""
    return asyncio.run(run_demo())
