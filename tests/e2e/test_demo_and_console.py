"""The README's first command (`gpubot demo`) and the scripted console, as real subprocesses."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys

import pytest
import yaml

pytestmark = pytest.mark.timeout(90)


def _env_without_nvidia_smi() -> dict:
    env = dict(os.environ)
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has a real nvidia-smi; the replay path is not used")
    return env


async def test_demo_launches_probes_and_kills_a_real_local_server():
    env = _env_without_nvidia_smi()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "demo", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out_b, _ = await asyncio.wait_for(proc.communicate(), 80)
    out = out_b.decode()
    assert proc.returncode == 0, out
    assert "replayed sample GPU data" in out
    m = re.search(r"Launched demo#1 on local: pid (\d+) \(= process group = session\)", out)
    assert m, out
    pid = int(m.group(1))
    assert "Checks passed: port" in out
    # /gpu status: the replayed H200s, each held by one TP rank of the launch
    assert "$ /gpu status" in out and "H200" in out and out.count("8.4 / 140.4") >= 2
    assert len(re.findall(r"\[demo#1\] python\S* fake_server\.py --worker-rank", out)) == 4  # status + probe
    # /probe of the launch's process group: the real local launcher and its two workers, log, port, health
    assert f"$ /probe local pgid={pid}" in out
    assert re.search(rf"^\s+{pid}\s+\d+\s+S", out, re.M), out
    assert "The server is fired up and ready to roll!" in out
    assert "listening" in out and "ok (HTTP 200)" in out
    # /kill 1 asks first, naming what it would stop; /kill 1 --yes: every process gone, memory released
    assert f"Kill demo#1 on local? process group {pid}, 3 processes, GPUs 0,1, 16.8 GiB." in out
    assert "Confirm with [Kill], or type: /kill 1 --yes" in out
    assert out.index("Confirm with [Kill]") < out.index("Killed demo#1")
    assert "Killed demo#1" in out and "16.8 GiB before, 0.0 GiB after: released" in out
    assert "demo finished" in out
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


async def test_scripted_console_session(tmp_path, ssh_server, start_fake_server):
    server = start_fake_server(mode="hang", workers=2, load_s=0.1)
    await asyncio.to_thread(server.wait_log, "Load weight end")
    marker = tmp_path / "pwned"
    cfg = {
        "hosts": {"gpu-host-1": {
            "address": ssh_server.host, "port": ssh_server.port, "user": ssh_server.username,
            "key_file": str(ssh_server.client_key_path), "known_hosts": str(ssh_server.known_hosts_path),
            "connect_timeout_s": 5, "log_dirs": [str(tmp_path)]}},
        "state_dir": str(tmp_path / "state"),
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    script = "\n".join([
        "# a comment line is ignored",
        "/gpu status",
        f"probe gpu-host-1 pgid={server.pid} log={server.log_path}",
        "frobnicate",
        "/probe no-such-host",
        f"!probe match='x; touch {marker}'",
        "probe gpu-host-1 log=/etc/shadow",
        'probe "unbalanced',
        "quit",
        "/gpu status",  # never reached
    ]) + "\n"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "console", "--config", str(path),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out_b, err_b = await asyncio.wait_for(proc.communicate(script.encode()), 60)
    out = out_b.decode()
    assert proc.returncode == 0, err_b.decode()
    assert out.count("GPU status: 1 host") == 1, out  # the line after quit never ran
    assert "16.8 / 140.4" in out
    assert "Probe of gpu-host-1" in out and "Load weight end" in out
    assert "Unknown command 'frobnicate'" in out
    assert "Unknown host" in out and "Known hosts: gpu-host-1" in out
    assert "could not parse the command" in out
    assert not marker.exists()
    assert "log= must be under this host's log directories" in out and "root:" not in out


async def test_try_config_lets_a_newcomer_launch_and_kill_without_a_gpu(tmp_path):
    _env_without_nvidia_smi()
    d = tmp_path / "try"
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "bot.cli", "try-config", str(d),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert proc.returncode == 0 and (d / "config.yaml").is_file(), out
    script = "/launch demo\n/gpu status\n/kill demo --yes\n"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "console", "--config", str(d / "config.yaml"),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out_b, err_b = await asyncio.wait_for(proc.communicate(script.encode()), 60)
    text = out_b.decode()
    assert proc.returncode == 0, err_b.decode()
    assert "Launched demo#1" in text and text.count("[demo#1]") == 2
    assert "Killed demo#1" in text and "released" in text
