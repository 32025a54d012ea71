"""A fleet in one screen (issue 25): `/gpu status` of more than 8 hosts is one line per host under the fleet's
totals, grouped by host group; `detail=yes` gives every GPU table; `/gpu free N [group=G]` lists exactly the hosts
with N free GPUs (free: under gpu_free_mib and claimed by no live launch), best first.

The hosts are a real SSH server on loopback under ten names; two replaying fake GPUs stand for two kinds of host:
two idle GPUs, and two GPUs of which one is held by a real process."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from bot.config import parse_config
from bot.demo.fakegpu import install_fake_gpu

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def two_kinds(tmp_path):
    """(idle fake GPUs, busy fake GPUs): two GPUs each; on the busy ones GPU 0 holds 8610 MiB (a live process)."""
    idle = install_fake_gpu(tmp_path / "idle", gpu_count=2)
    busy = install_fake_gpu(tmp_path / "busy", gpu_count=2)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    (busy.holders_dir / str(proc.pid)).write_text("0 8610\n")
    yield idle, busy
    proc.kill()
    proc.wait()


def _config(ssh_server, tmp_path, idle, busy, *, busy_first: bool = False, **extra):
    srv = {"address": ssh_server.host, "port": ssh_server.port, "user": ssh_server.username,
           "key_file": str(ssh_server.client_key_path), "known_hosts": str(ssh_server.known_hosts_path),
           "connect_timeout_s": 5, "command_timeout_s": 20, "nvidia_smi_timeout_s": 5, "log_dirs": ["/tmp"]}
    return parse_config({
        "state_dir": str(tmp_path / "state"), "probe_workers": 0,
        "host_groups": {"idle": {**srv, "nvidia_smi": str(idle.nvidia_smi)},
                        "busy": {**srv, "nvidia_smi": str(busy.nvidia_smi)}},
        "hosts": ({"busy-[1-5]": {"group": "busy"}, "idle-[01-05]": {"group": "idle"}} if busy_first
                  else {"idle-[01-05]": {"group": "idle"}, "busy-[1-5]": {"group": "busy"}}),
        **extra,
    })


def _host_rows(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines() if re.match(r"^(idle|busy)-\w+ ", line)]


async def test_status_of_ten_hosts_is_one_line_each_under_the_fleet_s_totals(ssh_server, two_kinds, make_bot,
                                                                             tmp_path):
    bot = await make_bot(_config(ssh_server, tmp_path, *two_kinds))
    answer = await bot.chat.say("/gpu status", user="U1")
    assert answer is not None and answer.audit == "ok", answer
    assert "GPU fleet: 10 hosts · 20 GPUs, 15 free · 0 live launches" in answer.text
    assert _host_rows(answer.text) == [f"idle-0{i}" for i in range(1, 6)] + [f"busy-{i}" for i in range(1, 6)]
    assert "== idle (5 hosts) ==" in answer.text and "== busy (5 hosts) ==" in answer.text
    busy_line = next(line for line in answer.text.splitlines() if line.startswith("busy-3 "))
    assert re.search(r"2 GPUs +1 free", busy_line) and "1 foreign" in busy_line
    assert "/gpu status group=GROUP detail=yes" in answer.text
    tables = await bot.chat.say("/gpu status group=busy detail=yes", user="U1")
    assert "GPU status: 5 hosts" in tables.text and tables.text.count("H200") >= 10


async def test_free_lists_exactly_the_hosts_with_n_free_gpus_best_first(ssh_server, two_kinds, make_bot, tmp_path):
    bot = await make_bot(_config(ssh_server, tmp_path, *two_kinds))
    two = await bot.chat.say("/gpu free 2", user="U1")
    assert two.audit == "ok" and "5 of 10 hosts have 2 or more free GPUs" in two.text
    assert _host_rows(two.text) == [f"idle-0{i}" for i in range(1, 6)]
    assert "free GPUs: 0,1" in two.text
    one = await bot.chat.say("/gpu free 1 group=busy", user="U1")
    assert _host_rows(one.text) == [f"busy-{i}" for i in range(1, 6)] and "free GPUs: 1" in one.text
    anyone = await bot.chat.say("/gpu free", user="U1")
    assert _host_rows(anyone.text)[:5] == [f"idle-0{i}" for i in range(1, 6)]  # most free GPUs first
    none = await bot.chat.say("/gpu free 3", user="U1")
    assert "0 of 10 hosts have 3 or more free GPUs" in none.text and _host_rows(none.text) == []
    for bad in ("/gpu free 0", "/gpu free two", "/gpu free 1 2", "/gpu free 1 group=nope", "/gpu free 1 gpus=2"):
        answer = await bot.chat.say(bad, user="U1")
        assert answer.audit == "invalid", (bad, answer.text)


async def test_a_live_launch_s_gpus_are_not_free_even_before_its_memory_shows(ssh_server, two_kinds, make_bot,
                                                                           tmp_path):
    bot = await make_bot(_config(ssh_server, tmp_path, *two_kinds))
    made = {"variant": "base", "params": {}, "command": "x", "log_path": None, "port": None, "created_by": "U1"}
    bot.runtime.store.launches.create(host="idle-02", gpus=[1], **made)  # starting: its memory does not show yet
    bot.runtime.store.launches.create(host="idle-04", gpus=[], **made)  # names no GPUs: may use them all
    two = await bot.chat.say("/gpu free 2", user="U1")
    assert _host_rows(two.text) == ["idle-01", "idle-03", "idle-05"]
    one = await bot.chat.say("/gpu free 1 group=idle", user="U1")
    assert _host_rows(one.text)[:3] == ["idle-01", "idle-03", "idle-05"] and "idle-02" in _host_rows(one.text)
    assert "idle-04" not in _host_rows(one.text)


async def test_the_digest_of_a_fleet_is_one_line_per_host(ssh_server, two_kinds, make_bot, tmp_path):
    cfg = _config(ssh_server, tmp_path, *two_kinds, watch={"digest_cron": "0 9 * * 1-5", "digest_channel": "C0DIG"})
    bot = await make_bot(cfg)
    assert await bot.runtime.watcher.digest()
    post = bot.chat.posts[-1]
    assert post.channel == "C0DIG" and post.text.startswith("GPU fleet digest: 10 hosts · 20 GPUs, 15 free")
    assert len(_host_rows(post.text)) == 10


async def test_free_is_best_first_across_groups_and_an_empty_group_is_said(ssh_server, two_kinds, make_bot,
                                                                            tmp_path):
    cfg = _config(ssh_server, tmp_path, *two_kinds, busy_first=True)
    cfg = cfg.model_copy(update={"host_groups": {**cfg.host_groups, "spare": {}}})
    bot = await make_bot(cfg)
    anyone = await bot.chat.say("/gpu free", user="U1")
    assert _host_rows(anyone.text) == [f"idle-0{i}" for i in range(1, 6)] + [f"busy-{i}" for i in range(1, 6)]
    empty = await bot.chat.say("/gpu status group=spare", user="U1")
    assert empty.audit == "invalid" and "Empty host group" in empty.text


@pytest.mark.parametrize("hosts", [1, 9])
async def test_a_mention_a_host_prints_pings_nobody(ssh_server, make_bot, tmp_path, hosts):
    # nvidia-smi fails with a user mention and a channel ping in its own words: the status (one host: its table;
    # nine: the fleet view) shows them, and Slack makes neither of them a mention
    noisy = tmp_path / "nvidia-smi"
    noisy.write_text("#!/bin/sh\necho 'NVML failed: ask <@U0BOSS> or <!channel>' >&2\nexit 9\n")
    noisy.chmod(0o755)
    srv = {"address": ssh_server.host, "port": ssh_server.port, "user": ssh_server.username,
           "key_file": str(ssh_server.client_key_path), "known_hosts": str(ssh_server.known_hosts_path),
           "nvidia_smi": str(noisy), "log_dirs": ["/tmp"]}
    cfg = parse_config({"state_dir": str(tmp_path / "state"), "probe_workers": 0,
                        "hosts": {f"n-[1-{hosts}]": dict(srv)}})
    bot = await make_bot(cfg)
    answer = await bot.chat.say("/gpu status", user="U1")
    assert answer.audit == "ok" and "U0BOSS" in answer.text, answer.text
    for where in (answer.text, str(answer.post.blocks)):
        assert "<@U0BOSS>" not in where and "<!channel>" not in where


async def test_the_digest_says_what_needs_someone(ssh_server, two_kinds, make_bot, tmp_path):
    from tests.support.procs import free_port

    cfg = _config(ssh_server, tmp_path, *two_kinds, watch={"digest_cron": "0 9 * * 1-5", "digest_channel": "C0DIG"})
    dead = cfg.hosts["idle-01"].model_copy(update={"port": free_port(), "connect_timeout_s": 2})
    bot = await make_bot(cfg.model_copy(update={"hosts": {**cfg.hosts, "dead-1": dead}}))
    assert await bot.runtime.watcher.digest()
    post = bot.chat.posts[-1]
    assert "Hosts unreachable (1)" in post.text and "dead-1: " in post.text, post.text
    assert "Idle GPUs held" not in post.text  # busy GPU 0's holder started a moment ago
    # what needs someone comes first, before the per-host rows
    assert post.text.startswith("Hosts unreachable (1)"), post.text
    assert post.text.index("dead-1: ") < post.text.index("GPU fleet digest: ") < post.text.index("idle-01"), post.text
    made = {"variant": "base", "params": {}, "command": "x", "log_path": None, "port": None, "created_by": "U1"}
    la = bot.runtime.store.launches.create(host="idle-02", gpus=[1], **made)
    bot.runtime.store.launches.update(la.id, alert_state="silent_hang")
    assert await bot.runtime.watcher.digest()
    post = bot.chat.posts[-1]
    assert "Failed launches not cleaned up (1)" in post.text
    assert f"{la.name} on idle-02: silent_hang at its last check, still live: `/kill {la.id}`" in post.text, post.text
