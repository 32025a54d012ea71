"""SIGKILL the bot while 3 launches are watched, restart it: every watch resumes, the alerts that came due
during the downtime are posted once, and nothing is posted twice (also after a second restart)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time

import pytest
import yaml

from bot.adapters.store import Store
from tests.conftest import free_port
from tests.integration.test_lifecycle import make_config, pids_of_launch

pytestmark = pytest.mark.timeout(120)


async def start_bot(config_path) -> asyncio.subprocess.Process:
    """`gpubot console` as the bot process (its watcher prints alerts); stdin stays open to keep it alive."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "console", "--config", str(config_path),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)


async def read_for(proc, seconds: float) -> str:
    out = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = await asyncio.wait_for(proc.stdout.read(65536), max(0.05, deadline - time.monotonic()))
        except TimeoutError:
            break
        if not chunk:
            break
        out += chunk
    return out.decode(errors="replace")


def alert_lines(text: str) -> list[str]:
    return re.findall(r"^(v\d#\d+) on gpu-host-1: silent_hang", text, re.M)


async def test_sigkill_and_restart_loses_no_alert_and_repeats_none(ssh_server, fake_gpu, tmp_path):
    from bot.demo.fakegpu import install_fake_gpu

    cfg = make_config(ssh_server, fake_gpu, tmp_path)
    install_fake_gpu(fake_gpu.state_dir.parent, gpu_count=6)
    data = cfg.model_dump(mode="json", exclude_none=True)
    base = data["variants"].pop("base")
    data["variants"].pop("helper")
    for i, gpus in enumerate(([0, 1], [2, 3], [4, 5]), start=1):
        data["variants"][f"v{i}"] = {**base, "gpus": gpus, "port": free_port(),
                                     "command": base["command"].replace("--gpus 0,1", "--gpus " +
                                                                        ",".join(map(str, gpus)))}
    data["watch"] = {"interval_s": 0.5, "silence_after_s": 8.0,
                     "phase_grace_s": {p: 8.0 for p in ("comm_init", "weight_loading", "kv_cache_alloc",
                                                        "cuda_graph_capture", "warmup")}}
    data["permissions"] = {}
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump(data))
    a = await start_bot(path)
    try:
        a.stdin.write(b"".join(f"/launch v{i} mode=hang workers=1\n".encode() for i in (1, 2, 3)))
        await a.stdin.drain()
        out_a = ""
        deadline = time.monotonic() + 20
        while out_a.count("Launched v") < 3 and time.monotonic() < deadline:
            out_a += await read_for(a, 0.5)
        assert out_a.count("Launched v") == 3, out_a
        a.send_signal(signal.SIGKILL)  # no clean shutdown: the jobs are only in the database
        await a.wait()
        assert alert_lines(out_a) == [], out_a  # nothing was due yet
        await asyncio.sleep(8.0)  # downtime: all three silent_hang alerts come due now

        b = await start_bot(path)
        out_b = await read_for(b, 8.0)
        b.send_signal(signal.SIGKILL)
        await b.wait()
        assert sorted(alert_lines(out_b)) == ["v1#1", "v2#2", "v3#3"], out_b  # each exactly once

        c = await start_bot(path)  # a second restart posts nothing again
        out_c = await read_for(c, 3.0)
        c.stdin.close()
        await asyncio.wait_for(c.wait(), 20)
        assert alert_lines(out_c) == [], out_c
    finally:
        for proc in (a,):
            if proc.returncode is None:
                proc.kill()
        store = Store(f"sqlite:///{tmp_path / 'state' / 'gpubot.db'}")
        try:
            for la in store.recent_launches():
                for pid in pids_of_launch(la):
                    os.kill(pid, signal.SIGKILL)
        finally:
            store.close()
