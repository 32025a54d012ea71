"""Issue 25's acceptance on a fleet of 64 SSH hosts: 64 real SSH servers on loopback (each its own port, host key
and client key), four kinds of host by how many of their 8 GPUs are held (0, 6, 7 or 8, by live processes).

- `/gpu status all` is one message, one line per host, within Slack's block and text limits (slack_sdk's
  validators), nothing attached;
- `/gpu free 2` lists exactly the hosts with 2 free GPUs or more;
- two `/launch` of a variant placed on the group, at the same moment, land on different GPUs;
- `/gpu whois HOST:GPU` names a foreign holder's user and command, and a launch's Slack user.

Each kind's nvidia-smi is a shell script printing what the replaying fake nvidia-smi printed for it once (its
holders are live processes), so 64 probes cost 64 shells, not 128 Python starts."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import re
import shlex
import subprocess

import pytest
from slack_sdk.models.blocks import Block

from bot.config import parse_config
from bot.core.parse import nvidia_smi
from bot.demo.fakegpu import install_fake_gpu
from bot.present.render import MAX_BLOCKS, MAX_MESSAGE_TEXT, MAX_SECTION_TEXT
from tests.support.builders import OPERATOR
from tests.support.fakes.ssh_server import LoopbackSSHServer

pytestmark = pytest.mark.timeout(300)

HOSTS = 64
#: GPUs held on each kind of host (host i is kind i % 4): free GPUs 8, 2, 1, 0.
HELD = (0, 6, 7, 8)


@pytest.fixture
def kinds(tmp_path):
    """One static nvidia-smi per kind (paths), and the sleepers holding their GPUs (killed at teardown)."""
    sleepers: list[subprocess.Popen] = []
    scripts = []
    try:
        for k, held in enumerate(HELD):
            gpu = install_fake_gpu(tmp_path / f"kind{k}", gpu_count=8)
            for index in range(8 - held, 8):  # the highest indexes are held
                proc = subprocess.Popen(["sleep", "600"])
                sleepers.append(proc)
                (gpu.holders_dir / str(proc.pid)).write_text(f"{index} 70000\n")
            outs = {}
            for sec, fields in (("gpu", nvidia_smi.GPU_QUERY_FIELDS), ("apps", nvidia_smi.APPS_QUERY_FIELDS)):
                flag = "--query-gpu" if sec == "gpu" else "--query-compute-apps"
                out = subprocess.run([str(gpu.nvidia_smi), f"{flag}={','.join(fields)}",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True)
                outs[sec] = tmp_path / f"kind{k}.{sec}.csv"
                outs[sec].write_text(out.stdout)
            script = tmp_path / f"kind{k}-nvidia-smi"
            script.write_text("#!/bin/sh\ncase \"$1\" in\n"
                              f"  --query-gpu=*) exec cat {shlex.quote(str(outs['gpu']))} ;;\n"
                              f"  --query-compute-apps=*) exec cat {shlex.quote(str(outs['apps']))} ;;\n"
                              "esac\necho 'unsupported' >&2; exit 2\n")
            script.chmod(0o755)
            scripts.append(script)
        yield scripts
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()


@pytest.fixture
async def fleet(tmp_path):
    """64 loopback SSH servers."""
    async with contextlib.AsyncExitStack() as stack:
        servers = [await stack.enter_async_context(LoopbackSSHServer(tmp_path / f"ssh{i}")) for i in range(HOSTS)]
        yield servers


def _config(servers, scripts, tmp_path):
    hosts = {}
    for i, srv in enumerate(servers):
        hosts[f"gpu-{i + 1:02d}"] = {"group": "h200", "address": srv.host, "port": srv.port,
                                     "key_file": str(srv.client_key_path), "known_hosts": str(srv.known_hosts_path),
                                     "nvidia_smi": str(scripts[i % 4])}
    return parse_config({
        "state_dir": str(tmp_path / "state"), "probe_workers": 0, "probe_concurrency": 16,
        "host_groups": {"h200": {"user": servers[0].username, "connect_timeout_s": 20, "command_timeout_s": 60,
                                 "nvidia_smi_timeout_s": 20, "log_dirs": [str(tmp_path / "logs")]}},
        "hosts": hosts,
        "variants": {"pair": {"host": "group:h200", "gpu_count": 2, "command": "sleep {{ secs }}",
                              "params": {"secs": {"type": "int", "default": 600}}}},
        "permissions": {"operators": [OPERATOR]},
    })


def _host_rows(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines() if re.match(r"^gpu-\d\d ", line)]


def _kind(host: str) -> int:
    return (int(host.split("-")[1]) - 1) % 4


async def test_a_fleet_of_64_hosts(fleet, kinds, make_bot, tmp_path):
    (tmp_path / "logs").mkdir()
    bot = await make_bot(_config(fleet, kinds, tmp_path))
    # one message, one line per host, within Slack's limits
    status = await bot.chat.say("/gpu status all", user=OPERATOR)
    assert status.audit == "ok", status.text
    assert _host_rows(status.text) == [f"gpu-{i:02d}" for i in range(1, HOSTS + 1)]
    assert f"GPU fleet: {HOSTS} hosts · {HOSTS * 8} GPUs, {16 * (8 + 2 + 1 + 0)} free" in status.text
    msg = status.post
    assert not msg.files and len(msg.text) <= MAX_MESSAGE_TEXT and 0 < len(msg.blocks) <= MAX_BLOCKS
    for block in msg.blocks:
        Block.parse(block).validate_json()
        if block["type"] == "section":
            assert len(block["text"]["text"]) <= MAX_SECTION_TEXT
    user = getpass.getuser()
    held = next(line for line in status.text.splitlines() if line.startswith("gpu-02 "))
    assert f"6 foreign ({user})" in held, held  # the holders' user on the host

    # exactly the hosts with 2 free GPUs or more
    free = await bot.chat.say("/gpu free 2", user=OPERATOR)
    expect = sorted(f"gpu-{i:02d}" for i in range(1, HOSTS + 1) if 8 - HELD[(i - 1) % 4] >= 2)
    assert sorted(_host_rows(free.text)) == expect and len(expect) == 32
    assert _host_rows(free.text)[:16] == [h for h in expect if _kind(h) == 0]  # 8 free first

    # two launches of the placed variant at the same moment: different GPUs
    first, second = await asyncio.gather(bot.chat.say("/launch pair", user=OPERATOR),
                                         bot.chat.say("/launch pair", user=OPERATOR))
    assert first.audit == second.audit == "started", (first.text, second.text)
    placed = [(la.host, g) for la in bot.runtime.store.launches.recent() for g in la.gpus]
    assert len(placed) == 4 and len(set(placed)) == 4, placed
    for la in bot.runtime.store.launches.recent():
        assert _kind(la.host) in (1, 0) and len(la.gpus) == 2
    hosts = {la.host for la in bot.runtime.store.launches.recent()}
    assert any(_kind(h) == 1 for h in hosts)  # best fit: a host with exactly 2 free GPUs first

    # who holds what: a foreign holder's user and command; a launch's Slack user
    whois = await bot.chat.say("/gpu whois gpu-02:7", user=OPERATOR)
    assert whois.audit == "ok" and f"[foreign] user *{user}*" in str(whois.post.blocks), whois.text
    assert "sleep 600" in whois.text and "/kill pid=" in whois.text
    la = bot.runtime.store.launches.recent()[0]
    mine = await bot.chat.say(f"/gpu whois {la.host} {la.gpus[0]}", user=OPERATOR)
    assert f"Claimed by *{la.name}*" in str(mine.post.blocks) and f"<@{OPERATOR}>" in str(mine.post.blocks)
    bad = await bot.chat.say("/gpu whois gpu-02:99x", user=OPERATOR)
    assert bad.audit == "invalid"
