"""A bundle collected from a live host reads like the alert: `!bundle` in a hung launch's thread attaches a
tar.gz of the diagnose format (log tail, ps, nvidia-smi, sockets, health, py-spy dumps of the ranks,
observed.json from two probes), redacted, and `gpubot diagnose` on it, offline, gives the alert's verdict and
phase; `gpubot bundle` (a real subprocess beside the running bot) writes the same into a directory."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from bot.cli import main
from tests.support.alerts import alerts, wait_alert
from tests.support.builders import FAST_WATCH, launch_config
from tests.support.procs import wait_log

pytestmark = pytest.mark.timeout(240)

PY_SPY = Path(sys.executable).parent / "py-spy"
SECRET = "hf_Zq8TbundleSecretValue123456"


def _diagnose(directory: Path) -> dict:
    result = CliRunner().invoke(main, ["diagnose", str(directory), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _unpack(data: bytes, into: Path) -> Path:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        names = tar.getnames()
        tar.extractall(into, filter="data")
    (top,) = {n.split("/", 1)[0] for n in names}
    return into / top


async def _hung_bot(make_bot, ssh_server, fake_gpu, tmp_path):
    py_spy = str(PY_SPY) if shutil.which("py-spy", path=str(PY_SPY.parent)) else str(tmp_path / "no-py-spy")
    cfg = launch_config(ssh_server, fake_gpu, tmp_path, host={"py_spy": py_spy, "nvidia_smi": str(fake_gpu.nvidia_smi)})
    cfg.variants["base"].command += f" --hang-in collective --served-model-name {SECRET}"
    cfg.variants["base"].env["HF_TOKEN"] = SECRET
    bot = await make_bot(cfg, watch_policy=FAST_WATCH)
    await bot.chat.say("/launch base mode=hang workers=2")
    await wait_log(bot.launch(1).log_path, "Load weight end", count=2)
    await bot.runtime.watcher.start()
    la = await wait_alert(bot, 1, {"silent_hang"})
    return bot, cfg, la


async def test_bang_bundle_attaches_a_tar_gz_that_diagnoses_offline_like_the_alert(make_bot, ssh_server, fake_gpu,
                                                                                  tmp_path):
    bot, _, la = await _hung_bot(make_bot, ssh_server, fake_gpu, tmp_path)
    (alert,) = alerts(bot, "silent_hang")
    answer = await bot.chat.say("!bundle", thread=la.thread_ts)
    assert answer.audit == "ok", answer.text
    ((name, data),) = answer.post.files
    assert name.startswith("base-1-") and name.endswith(".tar.gz") and data[:2] == b"\x1f\x8b"
    root = _unpack(data, tmp_path / "unpacked")
    files = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert {"server.log", "ps.txt", "nvidia-smi.csv", "nvidia-smi.txt", "observed.json", "collected.md"} <= files
    observed = json.loads((root / "observed.json").read_text())
    assert observed["process_alive"] is True and observed["log_growing"] is False
    assert observed["log_silent_s"] >= 2 and observed["gpu_mem_rising"] is False
    assert "Load weight end" in (root / "server.log").read_text()
    for path in root.rglob("*"):
        if path.is_file():
            assert SECRET[:12] not in path.read_text(errors="replace"), path  # redacted, every file
    got = _diagnose(root)
    assert (got["verdict"], got["phase"]) == (bot.launch(1).alert_state, bot.store.observations.list(1)[-1].phase)
    assert got["verdict"] == "silent_hang"
    assert f"diagnosed offline: {got['verdict']}" in answer.text
    if any(f.startswith("py-spy/") for f in files):  # py-spy could attach: the stacks travel with the bundle
        assert "rank 1 is in hang_loop" in "\n".join(got["evidence"])
        assert "rank 1 is in hang_loop" in alert.text or "rank 1 is in hang_loop" in str(alert.blocks)
    assert bot.events(action="bundle")[-1].result == "ok"


async def test_gpubot_bundle_beside_the_running_bot_writes_the_directory(make_bot, ssh_server, fake_gpu, tmp_path):
    bot, cfg, _ = await _hung_bot(make_bot, ssh_server, fake_gpu, tmp_path)
    path = tmp_path / "bot.yaml"
    data = cfg.model_dump(mode="json", exclude_none=True)
    data["variants"]["base"]["env"].pop("HF_TOKEN")  # a secret in a config file is refused (environment only)
    data["watch"] = FAST_WATCH.model_dump(mode="json", exclude_none=True)  # the policy the running bot judges by
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "b1"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "bot.cli", "bundle", "base#1", str(out),
                                                "--config", str(path), env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, stderr.decode()
    assert "read it with `gpubot diagnose" in stdout.decode()
    assert _diagnose(out)["verdict"] == "silent_hang"
    # a host bundle, and a directory that already holds one is refused (nothing overwritten)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "bot.cli", "bundle", "gpu-host-1", str(out),
                                                "--config", str(path), env=env, stderr=asyncio.subprocess.PIPE)
    _, stderr = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 2 and "is not empty" in stderr.decode()
    # a host bundle lists every process of the host, not only the GPU holders (this test's own process holds none)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "bot.cli", "bundle", "gpu-host-1",
                                                str(tmp_path / "b2"), "--config", str(path), env=env,
                                                stderr=asyncio.subprocess.PIPE)
    _, stderr = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, stderr.decode()
    host_ps = next((tmp_path / "b2").rglob("ps.txt")).read_text()
    assert any(line.split()[:1] == [str(os.getpid())] for line in host_ps.splitlines()), host_ps[:500]
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "bot.cli", "bundle", "nosuch#9",
                                                str(tmp_path / "b3"), "--config", str(path), env=env,
                                                stderr=asyncio.subprocess.PIPE)
    _, stderr = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 2 and "no launch" in stderr.decode()
    assert bot.launch(1).live  # the running bot's launch was left alone


def test_diagnose_an_empty_or_unreadable_directory_exits_2(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(main, ["diagnose", str(empty)])
    assert result.exit_code == 2 and "no bundle files here" in result.output
    result = CliRunner().invoke(main, ["diagnose", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "no such directory" in result.output
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        (locked / "server.log").write_text("x\n")
        (locked / "server.log").chmod(0)
        result = CliRunner().invoke(main, ["diagnose", str(locked)])
        assert result.exit_code == 2 and "cannot read" in result.output


def test_diagnose_without_observed_json_infers_the_silence_from_file_times_and_says_what_is_unknown(tmp_path):
    d = tmp_path / "b"
    d.mkdir()
    (d / "server.log").write_text("[2025-01-01 10:00:00 TP0] Load weight begin. avail mem=139.00 GB\n"
                                  "[2025-01-01 10:00:09 TP0] Init torch distributed begin.\n")
    (d / "ps.txt").write_text("  PID  PPID STAT %CPU COMMAND\n  100     1 Sl    0.0 python -m sglang.launch_server\n")
    os.utime(d / "server.log", (1_000_000, 1_000_000))
    os.utime(d / "ps.txt", (1_000_900, 1_000_900))
    got = _diagnose(d)
    joined = "\n".join(got["evidence"])
    assert got["verdict"] == "silent_hang" and got["phase"] == "comm_init", got
    assert "inferred from file times" in joined
    assert "not known: whether the process is alive, whether the port is open" in joined
    os.utime(d / "server.log", (1_000_890, 1_000_890))  # written just before the capture: nothing inferred
    got = _diagnose(d)  # a start-up step last, its silence not known: a low-confidence `loading` that says so
    assert (got["verdict"], got["confidence"]) == ("loading", "low"), got
    assert "whether the log is silent" in "\n".join(got["evidence"]) and "growing" in (got["missing"] or ""), got
