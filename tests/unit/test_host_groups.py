"""Host groups and ranges in the config (bot.config.fleet, through the loader): `gpu-[01-64]` names, `{n}` and
`{name}` in addresses, a group's keys under each host's own, and every mistake reported with its place."""

from __future__ import annotations

import textwrap

import pytest
from click.testing import CliRunner

from bot.cli import main as cli_main
from bot.config import ConfigError, parse_config
from bot.config.fleet import MAX_RANGE_HOSTS, expand_hosts, range_names

KH = "/etc/gpubot/known_hosts"


def test_range_names_keep_the_padding_as_written_and_take_lists():
    assert range_names("gpu-[01-03]") == [("gpu-01", 1), ("gpu-02", 2), ("gpu-03", 3)]
    assert [n for n, _ in range_names("gpu-[8-11]")] == ["gpu-8", "gpu-9", "gpu-10", "gpu-11"]
    assert [n for n, _ in range_names("node[001-002,010].ib")] == ["node001.ib", "node002.ib", "node010.ib"]
    assert range_names("gpu-01") is None and range_names("gpu-[a-b]") is None
    with pytest.raises(ValueError, match="backwards"):
        range_names("gpu-[9-1]")
    with pytest.raises(ValueError, match=str(MAX_RANGE_HOSTS)):
        range_names("gpu-[1-99999]")


def test_a_fleet_of_64_in_a_group_with_addresses_from_its_names_and_numbers():
    cfg = parse_config({
        "host_groups": {"h200": {"user": "ubuntu", "known_hosts": KH, "log_dirs": ["/var/log/sglang"],
                                 "address": "{name}.cluster.internal", "env": {"HF_HOME": "/data/hf", "A": "g"}}},
        "hosts": {
            "gpu-[01-64]": {"group": "h200"},
            "edge-[1-2]": {"group": "h200", "address": "10.0.9.{n}", "user": "root", "env": {"A": "own"}},
            "bastion": {"address": "10.0.0.1", "known_hosts": KH},
        },
    })
    assert len(cfg.hosts) == 67 and cfg.host_names()[:2] == ["gpu-01", "gpu-02"]
    assert cfg.hosts["gpu-07"].address == "gpu-07.cluster.internal" and cfg.hosts["gpu-64"].user == "ubuntu"
    assert cfg.hosts["edge-2"].address == "10.0.9.2" and cfg.hosts["edge-2"].user == "root"  # its own keys win
    assert cfg.hosts["edge-1"].env == {"HF_HOME": "/data/hf", "A": "own"}  # env merged key by key
    assert cfg.hosts["gpu-01"].log_dirs == ["/var/log/sglang"]
    assert cfg.group_hosts("h200") == [f"gpu-{i:02d}" for i in range(1, 65)] + ["edge-1", "edge-2"]
    assert cfg.group_hosts("nope") == [] and cfg.hosts["bastion"].group is None


@pytest.mark.parametrize(("data", "wanted"), [
    ({"hosts": {"a": {"group": "gone", "address": "x", "known_hosts": KH}}}, "hosts.a.group: unknown group 'gone'"),
    ({"host_groups": {"g": {"group": "h"}}, "hosts": {}}, "host_groups.g.group: a group cannot join"),
    ({"host_groups": {"g": "user=x"}, "hosts": {}}, "host_groups.g: must be a mapping"),
    ({"host_groups": ["g"], "hosts": {}}, "host_groups: must be a mapping"),
    ({"hosts": {"gpu-[5-1]": {"address": "x", "known_hosts": KH}}}, "hosts.gpu-[5-1]: range '5-1' goes backwards"),
    ({"hosts": {"gpu-[1-2]": {"address": "x", "known_hosts": KH}, "gpu-2": {"address": "y", "known_hosts": KH}}},
     "hosts.gpu-2: the host gpu-2 is also named by hosts.gpu-[1-2]"),
    ({"hosts": {"solo": {"address": "10.0.0.{n}", "known_hosts": KH}}}, "hosts.solo.address: {n} is the number"),
    ({"hosts": {"g-[1-2]": {"address": "{host}.x", "known_hosts": KH}}}, "unknown placeholder {host}"),
    ({"host_groups": {"g": {"port": "many"}}, "hosts": {"h-[1-3]": {"group": "g", "address": "x",
                                                                  "known_hosts": KH}}}, "hosts.h-1.port"),
])
def test_every_mistake_is_named_with_its_place(data, wanted):
    with pytest.raises(ConfigError) as e:
        parse_config(data)
    assert any(wanted in line for line in e.value.errors), e.value.errors


def test_a_literal_secret_in_a_group_is_refused_and_a_reference_in_its_env_is_expanded():
    with pytest.raises(ConfigError) as e:
        parse_config({"host_groups": {"g": {"env": {"HF_TOKEN": "hf_literal_value_1234567890"}}},
                      "hosts": {"a": {"group": "g", "address": "x", "known_hosts": KH}}})
    assert any(line.startswith("host_groups.g.env.HF_TOKEN") for line in e.value.errors)
    cfg = parse_config({"host_groups": {"g": {"env": {"HF_TOKEN": "${HF_TOKEN}"}}},
                        "hosts": {"a-[1-2]": {"group": "g", "address": "x", "known_hosts": KH}}},
                       environ={"HF_TOKEN": "hf_from_the_environment_123456"})
    assert cfg.hosts["a-2"].env["HF_TOKEN"] == "hf_from_the_environment_123456"
    assert "hf_from_the_environment_123456" in cfg.expanded_env_values  # masked by value


def test_expand_hosts_leaves_its_input_alone():
    data = {"host_groups": {"g": {"user": "u"}}, "hosts": {"a-[1-2]": {"group": "g", "address": "{name}"}}}
    out, errors = expand_hosts(data)
    assert errors == [] and list(out["hosts"]) == ["a-1", "a-2"] and out["hosts"]["a-1"]["address"] == "a-1"
    assert list(data["hosts"]) == ["a-[1-2]"] and "user" not in data["hosts"]["a-[1-2]"]


def test_check_config_says_how_many_hosts_and_groups_it_read(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(textwrap.dedent(f"""\
        host_groups:
          h200: {{known_hosts: {KH}, log_dirs: [/tmp], address: "10.0.1.{{n}}"}}
        hosts:
          "gpu-[01-64]": {{group: h200}}
        probe_workers: 3
    """))
    res = CliRunner().invoke(cli_main, ["check-config", str(path)])
    assert res.exit_code == 0, res.output
    assert "OK (64 hosts, 1 host group, 0 variants; /gpu status of all 64 SSH hosts over 3 probe workers" \
        in res.output
    # the 64 hosts' shared warning (their known_hosts is not on this machine) is said once
    warnings = [line for line in res.output.splitlines() if line.startswith("  warning:")]
    assert warnings == [f"  warning: hosts.{{gpu-01, gpu-02, gpu-03, ... (64 hosts)}}.known_hosts: {KH} does not "
                        "exist on this machine; host keys cannot be verified, so SSH connections will be refused"]


def test_a_group_s_mistake_is_said_once_at_the_group_not_once_per_host():
    hosts = {"gpu-[01-64]": {"group": "h200", "address": "x"}}
    with pytest.raises(ConfigError) as e:
        parse_config({"host_groups": {"h200": {"usr": "ml", "known_hosts": KH}}, "hosts": hosts})
    assert e.value.errors == ["host_groups.h200.usr: unknown host key (did you mean user?)"]
    with pytest.raises(ConfigError) as e:
        parse_config({"host_groups": {"h200": {"port": "many", "known_hosts": KH}}, "hosts": hosts})
    assert len(e.value.errors) == 1 and e.value.errors[0].startswith(
        "hosts.{gpu-01, gpu-02, gpu-03, ... (64 hosts)}.port:")
    with pytest.raises(ConfigError) as e:
        parse_config({"host_groups": {"h200": {"known_hosts": KH, "env": {"HF_TOKEN": "${HF_TOKEN}"}}},
                      "hosts": hosts}, environ={})
    assert e.value.errors == ["hosts.{gpu-01, gpu-02, gpu-03, ... (64 hosts)}.env.HF_TOKEN: environment variable "
                              "HF_TOKEN is not set"]


@pytest.mark.parametrize(("data", "wanted"), [
    ({"host_groups": {"a b": {}}, "hosts": {}}, "host_groups.a b: name must be"),
    ({"hosts": {"h": {"group": 5, "address": "x", "known_hosts": KH}}}, "hosts.h.group: must be the name of a group"),
    ({"hosts": {"gpu-[01-]": {"address": "x", "known_hosts": KH}}}, "a host range is written like gpu-[01-64]"),
])
def test_group_names_and_range_syntax_are_checked(data, wanted):
    with pytest.raises(ConfigError) as e:
        parse_config(data)
    assert any(wanted in line for line in e.value.errors), e.value.errors


def test_host_names_with_dots_are_collapsed_by_their_whole_name():
    from bot.config.checks import collapse_host_warnings

    names = [f"node{i}.ib" for i in range(1, 6)]
    lines = [f"hosts.{n}.log_dirs: not set" for n in names] + ["hosts.solo.port: bad"]
    assert collapse_host_warnings(lines, set(names) | {"solo"}) == [
        "hosts.{node1.ib, node2.ib, node3.ib, ... (5 hosts)}.log_dirs: not set", "hosts.solo.port: bad"]
