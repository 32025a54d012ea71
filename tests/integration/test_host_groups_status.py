"""`/gpu status group=NAME` over a config with host groups and ranges: only that group's hosts answer (and any named
beside it), an unknown group is named with the known ones, and `/gpu status` still shows every host. The hosts are a
real SSH server on loopback under several names."""

from __future__ import annotations

import pytest

from bot.config import parse_config

pytestmark = pytest.mark.timeout(120)


def _config(ssh_server, tmp_path):
    srv = {"address": ssh_server.host, "port": ssh_server.port, "user": ssh_server.username,
           "key_file": str(ssh_server.client_key_path), "known_hosts": str(ssh_server.known_hosts_path),
           "connect_timeout_s": 5, "command_timeout_s": 20, "nvidia_smi_timeout_s": 3, "log_dirs": ["/tmp"]}
    return parse_config({
        "state_dir": str(tmp_path / "state"),
        "probe_workers": 0,
        "host_groups": {"lab": srv, "prod": srv},
        "hosts": {"lab-[1-2]": {"group": "lab"}, "prod-[01-03]": {"group": "prod"}, "spare": dict(srv)},
    })


async def test_status_of_a_group_shows_its_hosts_only(ssh_server, fake_gpu, make_bot, tmp_path):
    bot = await make_bot(_config(ssh_server, tmp_path))
    answer = await bot.chat.say("/gpu status group=prod", user="U1")
    assert answer is not None and answer.audit == "ok", answer
    for name in ("prod-01", "prod-02", "prod-03"):
        assert f"== {name}" in answer.text
    assert "== lab-1" not in answer.text and "== spare" not in answer.text
    assert "H200" in answer.text
    both = await bot.chat.say("/gpu status spare group=lab", user="U1")
    assert [h for h in ("spare", "lab-1", "lab-2", "prod-01") if f"== {h}" in both.text] == ["spare", "lab-1",
                                                                                               "lab-2"]
    every = await bot.chat.say("/gpu status", user="U1")
    assert all(f"== {h}" in every.text for h in ("lab-1", "lab-2", "prod-01", "prod-02", "prod-03", "spare"))


async def test_an_unknown_group_is_named_with_the_known_ones(ssh_server, fake_gpu, make_bot, tmp_path):
    bot = await make_bot(_config(ssh_server, tmp_path))
    answer = await bot.chat.say("/gpu status group=stage", user="U1")
    assert answer is not None and answer.audit == "invalid"
    assert "Unknown host group" in answer.text and "lab, prod" in answer.text and "stage" in answer.text
    bad = await bot.chat.say("/gpu status group=prod nosuchhost", user="U1")
    assert bad.audit == "invalid" and "Unknown host" in bad.text
