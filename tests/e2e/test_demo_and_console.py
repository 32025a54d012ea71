"""The README's first command (`gpubot demo`) and the scripted console, as real subprocesses."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
import uuid

import pytest
import yaml

from tests.support.procs import pids_with_env, wait_until

pytestmark = pytest.mark.timeout(120)

#: Environment variable marking every process a test of this module started (inherited by what they start).
MARK = "GPUBOT_TEST_CLI"


def _marked(value: str) -> list[int]:
    """Live processes on this machine whose environment carries MARK=value."""
    return pids_with_env(MARK, value)


@pytest.fixture
async def cli():
    """`await cli(*args, stdin=bytes, env=..., merge_stderr=...) -> (returncode, stdout, stderr)`: `python -m
    bot.cli ARGS` in its own session. At teardown every process it or its children started (the demo's and the
    console's launched servers included: they inherit a marker in their environment) is killed, even when the
    test failed."""
    mark = uuid.uuid4().hex
    procs: list[asyncio.subprocess.Process] = []

    async def run(*args: str, stdin: bytes | None = None, env: dict | None = None, merge_stderr: bool = False,
                  timeout_s: float = 90) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot.cli", *args, env={**(env or os.environ), MARK: mark},
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE, start_new_session=True)
        procs.append(proc)
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout_s)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), (err or b"").decode()

    yield run
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    for pid in _marked(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)


def _env_without_nvidia_smi() -> dict:
    env = dict(os.environ)
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has a real nvidia-smi; the replay path is not used")
    return env


async def test_demo_launches_probes_and_kills_a_real_local_server(cli):
    env = _env_without_nvidia_smi()
    rc, out, _ = await cli("demo", env=env, merge_stderr=True)
    assert rc == 0, out
    assert "replayed sample GPU data" in out
    m = re.search(r"Launched demo#1 on local: pid (\d+) \(process group (\d+)\)", out)
    assert m, out
    pid, pgid = int(m.group(1)), int(m.group(2))  # the server, and its wrapper shell's group
    assert "Checks passed: port" in out
    # /gpu status: the replayed H200s, each held by one TP rank of the launch
    assert "$ /gpu status" in out and "H200" in out and out.count("8.4 / 140.4") >= 2
    assert len(re.findall(r"\[demo#1 by console\] python\S* fake_server\.py --worker-rank", out)) == 4  # status + probe
    # /probe of the launch's process group: the real local launcher and its two workers, log, port, health
    assert f"$ /probe local pgid={pgid}" in out
    assert re.search(rf"^\s+{pid}\s+{pgid}\s+S", out, re.M), out
    assert "The server is fired up and ready to roll!" in out
    assert "listening" in out and "ok (HTTP 200)" in out
    # /kill 1 asks first, naming what it would stop; /kill 1 --yes: every process gone, memory released
    assert f"Kill demo#1 on local? process group {pgid}, 4 processes, GPUs 0,1, 16.8 GiB." in out
    assert ("Confirm with [Kill] (or type `!confirm 1`, 1 being this confirmation's number, not a launch's, "
            "or `/kill 1 --yes`)") in out
    assert "[Cancel] (or `!cancel 1`) stops nothing" in out
    assert out.index("Confirm with [Kill]") < out.index("Killed demo#1")
    assert "Killed demo#1" in out and "16.8 GiB before, 0.0 GiB after: released" in out
    assert "demo finished" in out
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


async def test_scripted_console_session(tmp_path, ssh_server, start_fake_server, cli):
    server = start_fake_server(mode="hang", workers=2, load_s=0.1)
    # each TP rank registers its GPU memory, then logs "Load weight end"
    await wait_until(lambda: server.log_path.read_text(errors="replace").count("Load weight end") == 2, 30,
                     what="both ranks loaded")
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
    rc, out, err = await cli("console", "--config", str(path), stdin=script.encode())
    assert rc == 0, err
    assert out.count("GPU status: 1 host") == 1, out  # the line after quit never ran
    assert "16.8 / 140.4" in out
    assert "Probe of gpu-host-1" in out and "Load weight end" in out
    assert "Unknown host or command: 'frobnicate'. Hosts: gpu-host-1." in out
    assert "Unknown host" in out and "Known hosts: gpu-host-1" in out
    assert "could not parse the command" in out
    assert not marker.exists()
    assert "log= must be under this host's log directories" in out and "root:" not in out


async def test_try_config_lets_a_newcomer_launch_and_kill_without_a_gpu(tmp_path, cli):
    _env_without_nvidia_smi()
    d = tmp_path / "try"
    rc, out, err = await cli("try-config", str(d))
    assert rc == 0 and (d / "config.yaml").is_file(), out + err
    (d / "config.yaml").write_text((d / "config.yaml").read_text() + "# my own edit\n")
    rc, _, err = await cli("try-config", str(d))  # an existing config is never overwritten silently
    assert rc == 2 and "--force" in err and "# my own edit" in (d / "config.yaml").read_text()
    rc, text, err = await cli("console", "--config", str(d / "config.yaml"),
                              stdin=b"/launch demo\n/gpu status\n/kill demo --yes\n")
    assert rc == 0, err
    # (whether the ranks already hold GPU memory at `/gpu status` depends on the machine's load: the holder
    # attribution is checked by the demo test, which waits until the server is ready)
    assert "Launched demo#1" in text and "GPU status: 1 host" in text
    assert "Killed demo#1" in text and "released" in text
    # the root message's new state, without a message id the console never showed
    assert "[earlier message updated] demo#1 on local: killed" in text, text


async def test_a_launchs_root_tells_the_console_what_it_can_type(tmp_path, cli):
    _env_without_nvidia_smi()
    d = tmp_path / "try"
    rc, out, err = await cli("try-config", str(d))
    assert rc == 0, out + err
    rc, text, err = await cli("console", "--config", str(d / "config.yaml"),
                              stdin=b"/launch demo\n/probe 1\n/kill 1 --yes\n")
    assert rc == 0, err
    assert "Anywhere (the console too): `/probe 1` · `/gpu logs 1 200` · `/kill 1` · `/relaunch 1`" in text, text
    assert "Probe of local (" in text and "demo#1" in text and "Killed demo#1" in text


async def test_the_console_shows_a_warning_about_the_secret_key_that_no_answer_gives(tmp_path, cli):
    """The console is quiet at its default log level (answers say what failed), but a key file others can read
    is said on stderr; an explicit `--log-level WARNING` shows every warning."""
    _env_without_nvidia_smi()
    d = tmp_path / "try"
    rc, out, err = await cli("try-config", str(d))
    assert rc == 0, out + err
    rc, _, err = await cli("console", "--config", str(d / "config.yaml"), stdin=b"/help\n")
    assert rc == 0 and "readable by others" not in err, err
    (key,) = list(d.rglob("secret.key"))
    key.chmod(0o644)
    rc, _, err = await cli("console", "--config", str(d / "config.yaml"), stdin=b"/help\n")
    assert rc == 0 and "readable by others (mode 644)" in err and "chmod 600" in err, err
