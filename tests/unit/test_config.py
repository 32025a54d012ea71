"""Tests for bot.config: YAML -> pydantic models, error locations, secret rejection, the check-config CLI."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from bot.cli import main as cli_main
from bot.config import (
    BUILTIN_TEMPLATE_VARS,
    Config,
    ConfigError,
    HostConfig,
    ParamSpec,
    config_warnings,
    load_config,
    parse_config,
)

SECRET_MSG = "secrets are never read from the config file"
#: The environment VALID_YAML's `HF_TOKEN: ${HF_TOKEN}` is expanded from.
ENV = {"HF_TOKEN": "hf_from_the_environment"}

VALID_YAML = textwrap.dedent(
    """\
    # A complete configuration using every section.
    hosts:
      gpu-host-1:
        address: 10.0.0.5
        port: 2222
        user: ubuntu
        key_file: ~/.ssh/gpubot_ed25519
        known_hosts: /etc/gpubot/known_hosts
        connect_timeout_s: 5
        command_timeout_s: 45
        keepalive_interval_s: 20
        max_channels: 6
        nvidia_smi: /usr/bin/nvidia-smi
        nvidia_smi_timeout_s: 8
        use_nvml: false
        gpu_note: 8x H200 SXM
        env:
          CUDA_DEVICE_ORDER: PCI_BUS_ID
      gpu-host-2.lab:
        address: gpu2.example.org
        known_hosts: /etc/gpubot/known_hosts
      bot-box:
        local: true
    variants:
      sglang-base:
        host: gpu-host-1
        engine: sglang
        command: >-
          python -m sglang.launch_server --model-path {{ model }} --tp {{ tp }}
          --port {{ port }} --host 0.0.0.0
        params:
          model:
            type: path
            default: /data/models/llama
            description: model directory
          tp:
            type: int
            default: 8
            choices: [1, 2, 4, 8]
          mem_fraction: 0.85
        env:
          NCCL_DEBUG: WARN
          HF_TOKEN: ${HF_TOKEN}
        extra_args: ["--trust-remote-code"]
        workdir: /srv/sglang
        log: /data/logs/{{ variant }}-{{ launch_id }}.log
        port: 30000
        health: /health
        gpus: [0, 1, 2, 3, 4, 5, 6, 7]
        watch:
          interval_s: 10
          silence_after_s: 120
          phase_grace_s:
            weight_loading: 1800
            cuda_graph_capture: 600
      sglang-tp4:
        extends: sglang-base
        params:
          tp:
            type: int
            default: 4
          dtype:
            type: str
            default: bf16
            regex: "^(bf16|fp16|fp8)$"
        env:
          NCCL_DEBUG: INFO
          NCCL_IB_DISABLE: "1"
        extra_args: ["--dtype", "{{ dtype }}"]
        port: 30001
        gpus: [0, 1, 2, 3]
      sglang-tp4-local:
        extends: sglang-tp4
        host: bot-box
        env:
          CUDA_VISIBLE_DEVICES: "0,1,2,3"
    permissions:
      admins: [U012ABCDEF]
      operators: [S0123ABCD, W0ABCDEF]
      viewers: ["*"]
      channels: [C0123ABCDE, G0123ABCDE]
    watch:
      interval_s: 15
      silence_after_s: 600
      phase_grace_s:
        comm_init: 120
        serving: 30
      digest_cron: "0 9 * * 1-5"
      digest_channel: C0123ABCDE
    slack:
      command_prefix: "!"
      bot_name: gpubot
    state_dir: /var/lib/gpubot
    default_host: gpu-host-1
    """
)

HOST = {"address": "10.0.0.5", "user": "u", "known_hosts": "/etc/kh"}


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def errors_of(data) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        parse_config(data)
    errs = ei.value.errors
    assert isinstance(errs, list) and errs
    assert str(ei.value) == "\n".join(errs)
    return errs


def load_errors(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        load_config(write(tmp_path, text))
    return ei.value.errors


def base_data(**extra) -> dict:
    data = {"hosts": {"gpu-host-1": dict(HOST), "local-box": {"local": True}}}
    data.update(extra)
    return data


# --- a valid file ---------------------------------------------------------------------------------


def test_full_valid_config_parses(tmp_path):
    cfg = load_config(write(tmp_path, VALID_YAML), environ=ENV)
    assert isinstance(cfg, Config)
    assert cfg.host_names() == ["gpu-host-1", "gpu-host-2.lab", "bot-box"]

    h1 = cfg.hosts["gpu-host-1"]
    assert (h1.address, h1.port, h1.user) == ("10.0.0.5", 2222, "ubuntu")
    assert h1.key_file == "~/.ssh/gpubot_ed25519"
    assert h1.known_hosts == "/etc/gpubot/known_hosts"
    assert (h1.connect_timeout_s, h1.command_timeout_s, h1.keepalive_interval_s) == (5.0, 45.0, 20.0)
    assert h1.max_channels == 6
    assert h1.nvidia_smi == "/usr/bin/nvidia-smi"
    assert h1.use_nvml is False
    assert h1.gpu_note == "8x H200 SXM"
    assert h1.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert h1.local is False

    h2 = cfg.hosts["gpu-host-2.lab"]
    assert h2.port == 22 and h2.max_channels == 8 and h2.nvidia_smi == "nvidia-smi"

    local = cfg.hosts["bot-box"]
    assert local.local is True and local.address is None and local.known_hosts is None

    base = cfg.variants["sglang-base"]
    assert base.host == "gpu-host-1" and base.engine == "sglang"
    assert base.port == 30000 and base.health == "/health" and base.gpus == list(range(8))
    assert base.log == "/data/logs/{{ variant }}-{{ launch_id }}.log"
    assert isinstance(base.params["model"], ParamSpec) and base.params["model"].type == "path"
    assert base.params["tp"].choices == [1, 2, 4, 8]
    assert base.params["mem_fraction"] == 0.85
    assert base.env["HF_TOKEN"] == "hf_from_the_environment"
    assert base.watch is not None and base.watch.phase_grace_s == {"weight_loading": 1800, "cuda_graph_capture": 600}

    assert cfg.permissions.admins == ["U012ABCDEF"]
    assert cfg.permissions.operators == ["S0123ABCD", "W0ABCDEF"]
    assert cfg.permissions.viewers == ["*"]
    assert cfg.permissions.channels == ["C0123ABCDE", "G0123ABCDE"]
    assert cfg.watch.interval_s == 15 and cfg.watch.silence_after_s == 600
    assert cfg.watch.phase_grace_s == {"comm_init": 120, "serving": 30}
    assert cfg.watch.digest_cron == "0 9 * * 1-5"
    assert cfg.slack.command_prefix == "!" and cfg.slack.bot_name == "gpubot"
    assert cfg.state_dir == "/var/lib/gpubot"
    assert cfg.default_host == "gpu-host-1"


def test_resolved_variant_merges_through_extends(tmp_path):
    cfg = load_config(write(tmp_path, VALID_YAML), environ=ENV)
    rv = cfg.resolved_variant("sglang-tp4")
    assert rv.extends is None
    # inherited
    assert rv.host == "gpu-host-1"
    assert rv.command is not None and "--tp {{ tp }}" in rv.command
    assert rv.log == "/data/logs/{{ variant }}-{{ launch_id }}.log"
    assert rv.health == "/health" and rv.workdir == "/srv/sglang" and rv.engine == "sglang"
    # child wins
    assert rv.port == 30001
    assert rv.gpus == [0, 1, 2, 3]
    # params merged, child spec replaces parent spec of the same name
    assert set(rv.params) == {"model", "tp", "mem_fraction", "dtype"}
    assert rv.params["tp"].default == 4
    assert rv.params["model"].default == "/data/models/llama"
    assert rv.params["dtype"].regex == "^(bf16|fp16|fp8)$"
    assert rv.params["mem_fraction"] == 0.85
    # env merged, child wins per key
    assert rv.env == {"NCCL_DEBUG": "INFO", "HF_TOKEN": "hf_from_the_environment", "NCCL_IB_DISABLE": "1"}
    # extra_args appended after the parent's
    assert rv.extra_args == ["--trust-remote-code", "--dtype", "{{ dtype }}"]
    # the stored variants are not modified
    assert cfg.variants["sglang-tp4"].extends == "sglang-base"
    assert cfg.variants["sglang-base"].port == 30000
    assert cfg.variants["sglang-base"].env == {"NCCL_DEBUG": "WARN", "HF_TOKEN": "hf_from_the_environment"}


def test_resolved_variant_three_levels(tmp_path):
    cfg = load_config(write(tmp_path, VALID_YAML), environ=ENV)
    rv = cfg.resolved_variant("sglang-tp4-local")
    assert rv.host == "bot-box"
    assert rv.port == 30001
    assert rv.env == {
        "NCCL_DEBUG": "INFO",
        "HF_TOKEN": "hf_from_the_environment",
        "NCCL_IB_DISABLE": "1",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    }
    assert rv.extra_args == ["--trust-remote-code", "--dtype", "{{ dtype }}"]
    assert rv.params["tp"].default == 4
    assert cfg.resolved_variant("sglang-base").port == 30000
    with pytest.raises(KeyError):
        cfg.resolved_variant("no-such-variant")


def test_defaults_and_empty_file(tmp_path):
    cfg = load_config(write(tmp_path, ""))
    assert cfg.hosts == {} and cfg.variants == {}
    assert cfg.slack.command_prefix == "!"
    assert cfg.watch.interval_s == 30.0 and cfg.watch.silence_after_s == 300.0
    assert cfg.permissions.viewers == []
    cfg2 = load_config(write(tmp_path, "# only a comment\n", "c2.yaml"))
    assert cfg2.hosts == {}


def test_builtin_template_vars_are_accepted():
    tmpl = " ".join("{{ " + v + " }}" for v in sorted(BUILTIN_TEMPLATE_VARS))
    variant = {"host": "local-box", "command": f"run {tmpl}", "log": "/l/{{ port }}"}
    cfg = parse_config(base_data(variants={"v": variant}))
    assert cfg.variants["v"].command.startswith("run ")


def test_expanduser_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write(tmp_path, "hosts:\n  h:\n    local: true\n")
    cfg = load_config("~/config.yaml")
    assert cfg.host_names() == ["h"]


# --- error reporting ------------------------------------------------------------------------------


def test_port_out_of_range_exact_message(tmp_path):
    text = VALID_YAML.replace("port: 2222", "port: 70000")
    with pytest.raises(ConfigError) as ei:
        load_config(write(tmp_path, text), environ=ENV)
    errs = ei.value.errors
    assert errs == ["hosts.gpu-host-1.port: must be 1..65535"]


@pytest.mark.parametrize("port", [0, -1, 65536])
def test_host_port_bounds(port):
    errs = errors_of({"hosts": {"gpu-host-1": {**HOST, "port": port}}})
    assert "hosts.gpu-host-1.port: must be 1..65535" in errs


def test_port_not_a_number():
    errs = errors_of({"hosts": {"h": {**HOST, "port": "ssh"}}})
    assert len(errs) == 1 and errs[0].startswith("hosts.h.port: ") and "integer" in errs[0]


def test_several_errors_are_all_listed():
    data = {
        "hosts": {
            "a": {**HOST, "port": 70000},
            "b": {**HOST, "max_channels": 100},
            "c": {"address": "10.0.0.9", "user": "u"},
            "d": {"local": True, "nvidia_smi": "nvidia-smi; reboot", "connect_timeout_s": 0},
        },
        "permissions": {"admins": ["bob"], "channels": ["#general"]},
        "watch": {"interval_s": -1},
    }
    errs = errors_of(data)
    expected = {
        "hosts.a.port: must be 1..65535",
        "hosts.b.max_channels: must be 1..64",
        "hosts.c: known_hosts is required for SSH hosts (host keys are always verified)",
        "hosts.d.nvidia_smi: must be a command name or path without spaces or shell characters",
        "hosts.d.connect_timeout_s: must be > 0 and <= 3600 seconds",
        "permissions.admins: 'bob' is not a Slack user ID (U...) or user group ID (S...)",
        "permissions.channels: '#general' is not a Slack channel ID (C..., G... or D...)",
        "watch.interval_s: must be > 0 and <= 86400 seconds",
    }
    assert expected <= set(errs)
    assert len(errs) == len(set(errs)), "duplicates in the error list"


def test_errors_are_location_colon_message():
    errs = errors_of({"hosts": {"h": {**HOST, "port": 0, "max_channels": 0}}})
    for e in errs:
        loc, sep, msg = e.partition(": ")
        assert sep and loc and msg, e


def test_invalid_host_name_reported_together_with_other_errors():
    errs = errors_of({"hosts": {"bad name": {"local": True}, "h": {"local": True, "port": 0}}})
    assert "hosts.h.port: must be 1..65535" in errs
    assert any(e.startswith("hosts.bad name: name must be") for e in errs), errs


def test_invalid_host_name_alone():
    errs = errors_of({"hosts": {"bad name": {"local": True}}})
    assert len(errs) == 1 and errs[0].startswith("hosts.bad name: name must be 1-63 letters")


@pytest.mark.parametrize(
    ("where", "data", "location"),
    [
        ("top", {"hostz": {}}, "hostz"),
        ("host", {"hosts": {"h": {"local": True, "adress": "x"}}}, "hosts.h.adress"),
        ("variant", {"variants": {"v": {"host": "h", "command": "x", "cmd": "y"}}}, "variants.v.cmd"),
        ("param", {"variants": {"v": {"host": "h", "command": "x", "params": {"p": {"type": "int", "dflt": 1}}}}},
         "variants.v.params.p.dflt"),
        ("permissions", {"permissions": {"admin": ["U123"]}}, "permissions.admin"),
        ("watch", {"watch": {"intervl_s": 3}}, "watch.intervl_s"),
        ("slack", {"slack": {"prefix": "!"}}, "slack.prefix"),
    ],
)
def test_unknown_key_with_location(where, data, location):
    errs = errors_of(data)
    assert any(e == f"{location}: unknown key" or e.startswith(f"{location}: unknown key; did you mean ")
               for e in errs), errs


def test_missing_known_hosts_for_ssh_host(tmp_path):
    errs = load_errors(tmp_path, "hosts:\n  gpu-host-9:\n    address: 10.1.1.1\n    user: ubuntu\n")
    assert errs == ["hosts.gpu-host-9: known_hosts is required for SSH hosts (host keys are always verified)"]


def test_missing_address_for_ssh_host():
    errs = errors_of({"hosts": {"h": {"known_hosts": "/kh"}}})
    assert errs == ["hosts.h: address is required unless local: true"]


def test_local_host_needs_neither_address_nor_known_hosts():
    cfg = parse_config({"hosts": {"me": {"local": True}}})
    assert cfg.hosts["me"].local is True


def test_host_env_names_validated():
    errs = errors_of({"hosts": {"h": {"local": True, "env": {"1BAD": "x"}}}})
    assert errs == ["hosts.h.env: invalid environment variable name '1BAD'"]


# --- secrets --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "location"),
    [
        ({"slack": {"slack_token": "xoxb-1-2-3"}}, "slack.slack_token"),
        ({"slack": {"signing_secret": "abc123"}}, "slack.signing_secret"),
        ({"slack": {"bot_token": "xoxb-1"}}, "slack.bot_token"),
        ({"api_key": "sk-123"}, "api_key"),
        ({"hosts": {"h": {"local": True, "password": "hunter2"}}}, "hosts.h.password"),
        ({"hosts": {"h": {"local": True, "ssh_passwd": "hunter2"}}}, "hosts.h.ssh_passwd"),
        ({"hosts": {"h": {"local": True, "env": {"HF_TOKEN": "hf_abcdef"}}}}, "hosts.h.env.HF_TOKEN"),
        ({"variants": {"v": {"env": {"OPENAI_API_KEY": "sk-x"}}}}, "variants.v.env.OPENAI_API_KEY"),
        ({"deep": {"er": [{"x": {"Api-Key": 123}}]}}, "deep.er[0].x.Api-Key"),
        ({"Password": None}, "Password"),
    ],
)
def test_secret_keys_rejected(data, location):
    errs = errors_of(data)
    secret = [e for e in errs if SECRET_MSG in e]
    assert any(e.startswith(f"{location}: ") for e in secret), errs
    msg = next(e for e in secret if e.startswith(f"{location}: "))
    assert "environment" in msg and "SLACK_BOT_TOKEN" in msg


def test_secret_value_never_echoed():
    errs = errors_of({"slack": {"slack_token": "xoxb-very-secret-value"}})
    assert not any("xoxb-very-secret-value" in e for e in errs)


def test_secret_in_file_rejected(tmp_path):
    errs = load_errors(tmp_path, "slack:\n  signing_secret: 8f7e6d5c\nhosts:\n  h:\n    local: true\n")
    assert any(e.startswith("slack.signing_secret: ") and SECRET_MSG in e for e in errs)


def test_env_reference_is_allowed():
    cfg = parse_config(
        base_data(
            variants={
                "v": {
                    "host": "local-box",
                    "command": "serve",
                    "env": {"HF_TOKEN": "${HF_TOKEN}", "WANDB_API_KEY": "${WANDB_API_KEY}"},
                }
            }
        ),
        environ={"HF_TOKEN": "hf_1", "WANDB_API_KEY": "wb_2"},
    )
    assert cfg.variants["v"].env["HF_TOKEN"] == "hf_1"
    assert cfg.variants["v"].env["WANDB_API_KEY"] == "wb_2"


def test_partial_env_reference_is_not_allowed():
    variant = {"host": "local-box", "command": "x", "env": {"HF_TOKEN": "x${HF_TOKEN}"}}
    errs = errors_of(base_data(variants={"v": variant}))
    assert any(e.startswith("variants.v.env.HF_TOKEN: ") and SECRET_MSG in e for e in errs)


@pytest.mark.parametrize(
    "variant",
    [
        {"command": "x --max-num-batched-tokens {{ max_num_batched_tokens }}",
         "params": {"max_num_batched_tokens": 8192}},
        {"command": "x --tokenizer {{ tokenizer }}", "params": {"tokenizer": "/models/tok"}},
        {"command": "x", "env": {"TOKENIZERS_PARALLELISM": "false"}},
        {"command": "x", "env": {"HF_TOKEN_PATH": "/secrets/hf"}},
        {"command": "x --pad {{ pad_token_id }}", "params": {"pad_token_id": 0}},
    ],
)
def test_ordinary_token_named_settings_are_not_secrets(variant):
    # regression: a substring match used to reject common vLLM/SGLang params and env vars as "secrets"
    cfg = parse_config(base_data(variants={"v": {"host": "local-box", **variant}}))
    assert "v" in cfg.variants


@pytest.mark.parametrize("key", ["AWS_SECRET_ACCESS_KEY", "client_secret", "DB_PASSWORD", "AWS_SESSION_TOKEN",
                                 "NGC_API_KEY", "apikey"])
def test_more_secret_names_rejected(key):
    errs = errors_of(base_data(variants={"v": {"host": "local-box", "command": "x", "env": {key: "value123"}}}))
    assert any(e.startswith(f"variants.v.env.{key}: ") and SECRET_MSG in e for e in errs), errs


@pytest.mark.parametrize("key", ["SECRET_KEY", "jwt_secret_key"])
def test_secret_key_names_rejected(key):
    errs = errors_of(base_data(variants={"v": {"host": "local-box", "command": "x", "env": {key: "s3cr3t"}}}))
    assert any(e.startswith(f"variants.v.env.{key}: ") and SECRET_MSG in e for e in errs), errs


# --- YAML and top level ---------------------------------------------------------------------------


def test_yaml_syntax_error_has_line_and_column(tmp_path):
    p = write(tmp_path, "hosts:\n  h:\n    local: true\n  bad: [1, 2\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    (err,) = ei.value.errors
    assert err.startswith(f"{p}:line 5, column 1: YAML syntax error: ")
    assert "expected ',' or ']'" in err


def test_yaml_mapping_error_position(tmp_path):
    p = write(tmp_path, "hosts:\n  h:\n    local: true\nslack: a: b\n")
    (err,) = load_errors(tmp_path, p.read_text())
    assert ":line 4, column 9: YAML syntax error: mapping values are not allowed here" in err


def test_yaml_tab_error(tmp_path):
    (err,) = load_errors(tmp_path, "hosts:\n  h:\n\tlocal: true\n")
    assert "line 3, column 1" in err and "YAML syntax error" in err


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_non_mapping_top_level(tmp_path, text):
    errs = load_errors(tmp_path, text)
    assert errs == ["(top level): must be a mapping of keys like hosts:, variants:, permissions:"]


def test_parse_config_non_mapping():
    assert errors_of([1, 2]) == ["(top level): must be a mapping of keys like hosts:, variants:, permissions:"]


def test_unreadable_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as ei:
        load_config(missing)
    (err,) = ei.value.errors
    assert err.startswith(f"{missing}: cannot read: ")


def test_non_utf8_file(tmp_path):
    p = tmp_path / "latin1.yaml"
    p.write_bytes(b"hosts:\n  h\xe9:\n    local: true\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert "cannot read" in ei.value.errors[0]


# --- variants: cross checks -----------------------------------------------------------------------


def variant_errors(variants: dict, **extra) -> list[str]:
    return errors_of(base_data(variants=variants, **extra))


def test_variant_unknown_host():
    errs = variant_errors({"v": {"host": "gpu-host-7", "command": "serve"}})
    assert errs == ["variants.v.host: unknown host 'gpu-host-7'; known: gpu-host-1, local-box"]


def test_variant_without_host_or_command():
    errs = variant_errors({"v": {"port": 8000}})
    assert "variants.v.host: required (directly or through extends)" in errs
    assert "variants.v.command: required (directly or through extends)" in errs


def test_variant_unknown_extends():
    errs = variant_errors({"child": {"extends": "ghost", "port": 1}})
    assert errs == ["variants.child.extends: unknown variant 'ghost'"]


def test_variant_extends_cycle():
    errs = variant_errors({"a": {"extends": "b", "host": "local-box", "command": "x"}, "b": {"extends": "a"}})
    assert "variants.a.extends: extends cycle at a" in errs
    assert "variants.b.extends: extends cycle at b" in errs


def test_variant_self_extends():
    errs = variant_errors({"a": {"extends": "a", "host": "local-box", "command": "x"}})
    assert errs == ["variants.a.extends: extends cycle at a"]


def test_variant_undeclared_template_variable():
    errs = variant_errors({"v": {"host": "local-box", "command": "serve --tp {{ tp }} --model {{ model }}",
                                 "params": {"tp": 8}}})
    assert errs == ["variants.v.command: uses undeclared parameter(s) model; declare them under params"]


def test_variant_undeclared_variable_in_log():
    errs = variant_errors({"v": {"host": "local-box", "command": "serve", "log": "/logs/{{ run_name }}.log"}})
    assert errs == ["variants.v.log: uses undeclared parameter(s) run_name; declare them under params"]


def test_child_may_use_parent_params():
    cfg = parse_config(
        base_data(
            variants={
                "p": {"host": "local-box", "command": "serve --tp {{ tp }}", "params": {"tp": 8}},
                "c": {"extends": "p", "command": "serve --tp {{ tp }} --dp {{ dp }}", "params": {"dp": 2}},
            }
        )
    )
    assert set(cfg.resolved_variant("c").params) == {"tp", "dp"}


def test_variant_template_syntax_error():
    errs = variant_errors({"v": {"host": "local-box", "command": "serve {% if %}"}})
    assert len(errs) == 1
    assert errs[0].startswith("variants.v.command: template syntax error: ")


def test_variant_template_unclosed_expression():
    errs = variant_errors({"v": {"host": "local-box", "command": "serve {{ tp"}})
    assert len(errs) == 1 and errs[0].startswith("variants.v.command: template syntax error:")


def test_variant_field_validators():
    errs = variant_errors({"v": {"host": "local-box", "command": "x", "port": 0, "gpus": [1, 1], "health": "health"}})
    assert set(errs) == {
        "variants.v.port: must be 1..65535",
        "variants.v.gpus: GPU indexes must be unique",
        "variants.v.health: must be a path like /health",
    }


def test_variant_gpu_index_range():
    errs = variant_errors({"v": {"host": "local-box", "command": "x", "gpus": [0, 256]}})
    assert errs == ["variants.v.gpus: GPU indexes must be 0..255"]


def test_param_default_not_in_choices():
    errs = variant_errors({"v": {"host": "local-box", "command": "x {{ tp }}",
                                 "params": {"tp": {"type": "int", "choices": [1, 2], "default": 3}}}})
    assert errs == ["variants.v.params.tp.default: not one of the choices"]


def test_param_name_not_identifier():
    errs = variant_errors({"v": {"host": "local-box", "command": "x", "params": {"bad-name": 1}}})
    assert errs == ["variants.v.params.bad-name: parameter names must be identifiers"]


def test_param_invalid_regex():
    errs = variant_errors({"v": {"host": "local-box", "command": "x", "params": {"p": {"regex": "(unclosed"}}}})
    assert any(e.startswith("variants.v.params.p.regex: invalid regex") for e in errs), errs


def test_default_host_unknown():
    errs = errors_of(base_data(default_host="nowhere"))
    assert errs == ["default_host: unknown host 'nowhere'"]


def test_watch_unknown_phase():
    errs = errors_of({"watch": {"phase_grace_s": {"loading": 5}}})
    assert len(errs) == 1
    assert errs[0].startswith("watch.phase_grace_s: unknown phase 'loading'; known: ")


# --- Slack IDs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("admins", "bob"),
        ("admins", "u123abc"),
        ("admins", "U1"),
        ("operators", "C0123ABC"),
        ("viewers", "@alice"),
        ("viewers", "S-1"),
    ],
)
def test_invalid_slack_user_ids(field, value):
    errs = errors_of({"permissions": {field: [value]}})
    assert errs == [f"permissions.{field}: {value!r} is not a Slack user ID (U...) or user group ID (S...)"]


@pytest.mark.parametrize("value", ["#general", "U0123ABC", "c0123abc", "C1"])
def test_invalid_slack_channel_ids(value):
    errs = errors_of({"permissions": {"channels": [value]}})
    assert errs == [f"permissions.channels: {value!r} is not a Slack channel ID (C..., G... or D...)"]


def test_valid_slack_ids():
    cfg = parse_config(
        {"permissions": {"admins": ["U0ABC", "W0ABC"], "operators": ["S0ABC", "*"], "viewers": [],
                         "channels": ["C0ABC", "G0ABC", "D0ABC"]}}
    )
    assert cfg.permissions.channels == ["C0ABC", "G0ABC", "D0ABC"]


# --- models used directly -------------------------------------------------------------------------


def test_hostconfig_direct_construction_validates():
    with pytest.raises(ValueError, match=r"must be 1\.\.65535"):
        HostConfig(address="a", known_hosts="/k", port=99999)
    assert HostConfig(local=True).port == 22


def test_example_config_in_deploy_if_present():
    example = Path(__file__).resolve().parents[2] / "deploy" / "config.example.yaml"
    if not example.exists():
        pytest.skip("deploy/config.example.yaml not present")
    data = yaml.safe_load(example.read_text())
    assert isinstance(parse_config(data, environ={}), Config)
    # the strict loader reads it too, with no environment at all
    assert isinstance(load_config(example, environ={}), Config)


# --- CLI ------------------------------------------------------------------------------------------


def test_cli_check_config_ok(tmp_path):
    p = write(tmp_path, VALID_YAML)
    result = CliRunner().invoke(cli_main, ["check-config", str(p)], env=ENV)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"{p}: OK (3 hosts, 3 variants")


def test_cli_check_config_errors(tmp_path):
    bad = VALID_YAML.replace("port: 2222", "port: 70000").replace("max_channels: 6", "max_channels: 0")
    p = write(tmp_path, bad)
    result = CliRunner().invoke(cli_main, ["check-config", str(p)], env=ENV)
    assert result.exit_code == 2
    assert f"config {p} is invalid:" in result.stderr
    assert "  hosts.gpu-host-1.port: must be 1..65535" in result.stderr
    assert "  hosts.gpu-host-1.max_channels: must be 1..64" in result.stderr
    assert "OK" not in result.output


def test_cli_check_config_yaml_error(tmp_path):
    p = write(tmp_path, "hosts: [\n")
    result = CliRunner().invoke(cli_main, ["check-config", str(p)])
    assert result.exit_code == 2
    assert "YAML syntax error" in result.stderr and "line " in result.stderr


def test_cli_check_config_secret(tmp_path):
    p = write(tmp_path, "slack:\n  slack_token: xoxb-123\n")
    result = CliRunner().invoke(cli_main, ["check-config", str(p)])
    assert result.exit_code == 2
    assert "slack.slack_token: secrets are never read from the config file" in result.stderr
    assert "xoxb-123" not in result.output


def test_cli_check_config_missing_file(tmp_path):
    result = CliRunner().invoke(cli_main, ["check-config", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2
    assert "cannot read" in result.stderr


# --- review findings: duplicate keys ---------------------------------------------------------------


def test_duplicate_key_in_a_host_is_an_error(tmp_path):
    text = "hosts:\n  h:\n    address: 10.0.0.1\n    known_hosts: /kh\n    port: 22\n    port: 2222\n"
    assert load_errors(tmp_path, text) == ["hosts.h: duplicate key 'port' (line 6)"]


def test_duplicate_top_level_key_is_an_error(tmp_path):
    text = "hosts:\n  a:\n    local: true\nhosts:\n  b:\n    local: true\n"
    assert load_errors(tmp_path, text) == ["(top level): duplicate key 'hosts' (line 4)"]


def test_every_duplicate_is_listed_with_schema_errors(tmp_path):
    text = textwrap.dedent(
        """\
        hosts:
          h:
            local: true
            local: true
            port: 0
        variants:
          v:
            host: h
            command: x {{ p }}
            params:
              p:
                type: int
                type: str
        """
    )
    errs = load_errors(tmp_path, text)
    assert errs[:2] == ["hosts.h: duplicate key 'local' (line 4)",
                        "variants.v.params.p: duplicate key 'type' (line 13)"]
    assert "hosts.h.port: must be 1..65535" in errs


def test_duplicate_host_names_are_an_error(tmp_path):
    text = "hosts:\n  gpu-1:\n    local: true\n  gpu-1:\n    local: true\n"
    assert load_errors(tmp_path, text) == ["hosts: duplicate key 'gpu-1' (line 4)"]


def test_anchors_aliases_and_merge_keys_still_work(tmp_path):
    text = textwrap.dedent(
        """\
        hosts:
          a: &ssh
            address: 10.0.0.1
            known_hosts: /etc/gpubot/known_hosts
            log_dirs: &logs [/data/logs]
          b:
            <<: *ssh
            address: 10.0.0.2
          c:
            <<: *ssh
            address: 10.0.0.3
            log_dirs: *logs
        permissions:
          admins: &admins [U0ADMIN1]
          operators: *admins
        """
    )
    cfg = load_config(write(tmp_path, text))
    assert [cfg.hosts[n].address for n in "abc"] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert cfg.hosts["b"].known_hosts == "/etc/gpubot/known_hosts"
    assert cfg.hosts["c"].log_dirs == ["/data/logs"]
    assert cfg.permissions.operators == ["U0ADMIN1"]


# --- review findings: hostile YAML -----------------------------------------------------------------


def test_billion_laughs_is_refused_quickly(tmp_path):
    # 9 levels of 9 aliases each: only 81 aliases, but 9**9 values once expanded.
    lines = ['a0: &a0 "lol"']
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    (err,) = load_errors(tmp_path, "\n".join(lines) + "\n")  # refused before expanding (a hang would time out)
    assert "more than 100000 values once aliases are expanded" in err and ":line " in err


def test_more_than_100_aliases_is_refused(tmp_path):
    text = "hosts:\n  h: &h {local: true}\npermissions:\n  admins: [" + ", ".join(["*x"] * 101) + "]\n"
    text = "x: &x U0ABC\n" + text
    (err,) = load_errors(tmp_path, text)
    assert err.endswith("more than 100 aliases (*name)") and ":line 5, column " in err


def test_deep_nesting_is_a_config_error_not_a_crash(tmp_path):
    (err,) = load_errors(tmp_path, "x: " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nested more than 100 levels deep" in err


def test_deep_nesting_through_aliases_is_refused(tmp_path):
    deep = "[" * 90 + "1" + "]" * 90
    text = f"a: &a {deep}\nb: " + "[" * 20 + "*a, *a" + "]" * 20 + "\n"
    (err,) = load_errors(tmp_path, text)
    assert "nested more than 100 levels deep once aliases are expanded" in err


def test_recursive_alias_is_refused(tmp_path):
    (err,) = load_errors(tmp_path, "hosts: &h\n  h: *h\n")
    assert "recursive structure" in err


def test_deeply_nested_python_data_is_a_config_error():
    data: dict = {}
    cur = data
    for _ in range(5000):
        cur["a"] = {}
        cur = cur["a"]
    assert errors_of({"hostz": data}) == ["hostz: unknown key; did you mean 'hosts'?"]


def test_file_over_1_mib_is_refused(tmp_path):
    p = write(tmp_path, "hosts: {}\n" + "#" * (1024 * 1024) + "\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert ei.value.errors == [
        f"{p}: file is larger than 1 MiB; a gpubot config is a few KiB (is this the right file?)"
    ]


def test_file_just_under_the_cap_loads(tmp_path):
    text = "hosts:\n  h:\n    local: true\n"
    p = write(tmp_path, text + "#" * (1024 * 1024 - len(text) - 1) + "\n")
    assert load_config(p).host_names() == ["h"]


# --- review findings: numbers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "location"),
    [
        ({"port": True}, "hosts.h.port"),
        ({"max_channels": True}, "hosts.h.max_channels"),
        ({"port": "22"}, "hosts.h.port"),
        ({"port": 22.0}, "hosts.h.port"),
        ({"connect_timeout_s": True}, "hosts.h.connect_timeout_s"),
        ({"keepalive_interval_s": False}, "hosts.h.keepalive_interval_s"),
    ],
)
def test_host_numbers_are_strict(host, location):
    errs = errors_of({"hosts": {"h": {**HOST, **host}}})
    assert len(errs) == 1 and errs[0].startswith(f"{location}: "), errs


def test_port_true_in_yaml_is_an_error(tmp_path):
    with pytest.raises(ConfigError) as ei:
        load_config(write(tmp_path, VALID_YAML.replace("port: 2222", "port: true")), environ=ENV)
    assert ei.value.errors == ["hosts.gpu-host-1.port: Input should be a valid integer"]


def test_bool_is_not_a_number_message():
    errs = errors_of({"hosts": {"h": {**HOST, "connect_timeout_s": True}}})
    assert errs == ["hosts.h.connect_timeout_s: must be a number, not true"]


def test_variant_numbers_are_strict():
    errs = errors_of(base_data(variants={"v": {"host": "local-box", "command": "x", "port": True, "gpus": [0, True]}}))
    assert set(errs) == {"variants.v.port: Input should be a valid integer",
                         "variants.v.gpus.1: Input should be a valid integer"}


def test_yaml_ints_and_floats_still_accepted(tmp_path):
    text = "hosts:\n  h:\n    local: true\n    port: 2222\n    connect_timeout_s: 2.5\n    keepalive_interval_s: 0\n"
    h = load_config(write(tmp_path, text)).hosts["h"]
    assert (h.port, h.connect_timeout_s, h.keepalive_interval_s) == (2222, 2.5, 0)


@pytest.mark.parametrize("value", [-1, -0.5, 3601, math.nan, math.inf, -math.inf])
def test_keepalive_must_be_finite_0_to_3600(value):
    errs = errors_of({"hosts": {"h": {**HOST, "keepalive_interval_s": value}}})
    assert errs == ["hosts.h.keepalive_interval_s: must be 0..3600 seconds"]


@pytest.mark.parametrize("field", ["connect_timeout_s", "command_timeout_s", "nvidia_smi_timeout_s"])
@pytest.mark.parametrize("value", [0, -1, 3601, math.nan, math.inf])
def test_host_timeouts_must_be_finite_up_to_3600(field, value):
    errs = errors_of({"hosts": {"h": {**HOST, field: value}}})
    assert errs == [f"hosts.h.{field}: must be > 0 and <= 3600 seconds"]


@pytest.mark.parametrize("value", [0, -5, 86401, math.nan, math.inf])
def test_watch_durations_must_be_finite_up_to_one_day(value):
    errs = errors_of({"watch": {"interval_s": value, "silence_after_s": value, "phase_grace_s": {"warmup": value}}})
    assert set(errs) == {
        "watch.interval_s: must be > 0 and <= 86400 seconds",
        "watch.silence_after_s: must be > 0 and <= 86400 seconds",
        "watch.phase_grace_s: grace for warmup must be > 0 and <= 86400 seconds",
    }


def test_hour_long_weight_loading_grace_is_allowed():
    cfg = parse_config({"watch": {"phase_grace_s": {"weight_loading": 5400}}})
    assert cfg.watch.phase_grace_s["weight_loading"] == 5400


def test_nan_in_yaml_is_refused(tmp_path):
    errs = load_errors(tmp_path, "hosts:\n  h:\n    local: true\n    keepalive_interval_s: .nan\n")
    assert errs == ["hosts.h.keepalive_interval_s: must be 0..3600 seconds"]


def test_param_bounds_are_finite_numbers():
    errs = variant_errors({"v": {"host": "local-box", "command": "x {{ p }}",
                                 "params": {"p": {"type": "float", "min": math.nan, "max": True}}}})
    assert set(errs) == {"variants.v.params.p.min: must be a finite number",
                         "variants.v.params.p.max: must be a number, not true"}


# --- review findings: ${NAME} environment references ------------------------------------------------


def test_env_reference_expanded_from_os_environ(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_from_os_environ")
    monkeypatch.setenv("CUDA_HOME_FOR_TEST", "/usr/local/cuda")
    data = base_data(variants={"v": {"host": "local-box", "command": "x", "env": {"HF_TOKEN": "${HF_TOKEN}"}}})
    data["hosts"]["local-box"]["env"] = {"CUDA_HOME": "${CUDA_HOME_FOR_TEST}"}
    cfg = parse_config(data)
    assert cfg.variants["v"].env == {"HF_TOKEN": "hf_from_os_environ"}
    assert cfg.hosts["local-box"].env == {"CUDA_HOME": "/usr/local/cuda"}
    # the caller's data is not modified
    assert data["variants"]["v"]["env"] == {"HF_TOKEN": "${HF_TOKEN}"}


def test_env_reference_to_unset_variable_is_an_error(tmp_path):
    text = "hosts:\n  h:\n    local: true\nvariants:\n  base:\n    host: h\n    command: x\n" \
           "    env:\n      HF_TOKEN: ${HF_TOKEN}\n"
    with pytest.raises(ConfigError) as ei:
        load_config(write(tmp_path, text), environ={"OTHER": "1"})
    assert ei.value.errors == ["variants.base.env.HF_TOKEN: environment variable HF_TOKEN is not set"]


def test_env_reference_unset_in_host_env(monkeypatch):
    monkeypatch.delenv("GPUBOT_TEST_UNSET_VAR", raising=False)
    errs = errors_of({"hosts": {"h": {"local": True, "env": {"X": "${GPUBOT_TEST_UNSET_VAR}"}}}})
    assert errs == ["hosts.h.env.X: environment variable GPUBOT_TEST_UNSET_VAR is not set"]


def test_empty_environment_value_is_expanded():
    cfg = parse_config({"hosts": {"h": {"local": True, "env": {"X": "${EMPTY}"}}}}, environ={"EMPTY": ""})
    assert cfg.hosts["h"].env == {"X": ""}


@pytest.mark.parametrize("value", ["x${A}", "${A}:/opt/bin", "$A", "${A", "${1A}"])
def test_only_whole_references_are_expanded(value):
    cfg = parse_config({"hosts": {"h": {"local": True, "env": {"V": value}}}}, environ={"A": "expanded"})
    assert cfg.hosts["h"].env == {"V": value}


def test_references_outside_env_maps_are_not_expanded():
    cfg = parse_config({"hosts": {"h": {"local": True, "gpu_note": "${A}"}}, "state_dir": "${A}"},
                       environ={"A": "expanded"})
    assert cfg.hosts["h"].gpu_note == "${A}" and cfg.state_dir == "${A}"


def test_expanded_value_never_echoed_in_errors():
    data = {"hosts": {"h": {"local": True, "port": 0, "env": {"HF_TOKEN": "${HF_TOKEN}"}}}}
    with pytest.raises(ConfigError) as ei:
        parse_config(data, environ={"HF_TOKEN": "hf_secret_value_123"})
    assert ei.value.errors == ["hosts.h.port: must be 1..65535"]
    assert "hf_secret_value_123" not in str(ei.value)


def test_reference_outside_env_map_is_still_a_secret():
    errs = errors_of({"slack": {"bot_token": "${SLACK_BOT_TOKEN}"}})
    assert len(errs) == 1 and errs[0].startswith("slack.bot_token: " + SECRET_MSG)


# --- review findings: check-config messages --------------------------------------------------------


def test_secret_key_reported_once_not_also_as_unknown():
    errs = errors_of({"slack": {"slack_token": "xoxb-1"}, "hosts": {"h": {"local": True, "password": "x"}}})
    assert len(errs) == 2, errs
    assert not any("unknown key" in e for e in errs)


def test_secret_hint_is_generic():
    (err,) = errors_of({"api_key": "sk-1"})
    assert err == (
        "api_key: secrets are never read from the config file; set them in the environment (Slack tokens: "
        "SLACK_BOT_TOKEN, SLACK_APP_TOKEN, SLACK_SIGNING_SECRET) or reference one as ${NAME} in an env: map"
    )


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"hosts": {"h": {**HOST, "connect_timout_s": 5}}}, "hosts.h.connect_timout_s: unknown key; did you mean "
                                                            "'connect_timeout_s'?"),
        ({"hosts": {"h": {"local": True, "adress": "x"}}}, "hosts.h.adress: unknown key; did you mean 'address'?"),
        ({"hostz": {}}, "hostz: unknown key; did you mean 'hosts'?"),
        ({"watch": {"intervl_s": 3}}, "watch.intervl_s: unknown key; did you mean 'interval_s'?"),
        ({"variants": {"v": {"watch": {"silence_s": 3}}}},
         "variants.v.watch.silence_s: unknown key; did you mean 'silence_after_s'?"),
        ({"variants": {"v": {"params": {"p": {"defualt": 1}}}}},
         "variants.v.params.p.defualt: unknown key; did you mean 'default'?"),
        ({"permissions": {"zzz": []}}, "permissions.zzz: unknown key"),
    ],
)
def test_unknown_key_did_you_mean(data, expected):
    assert expected in errors_of(data)


@pytest.mark.parametrize("bad_type", ["integer", 5, None])
def test_wrong_param_type_is_one_message(bad_type):
    errs = variant_errors({"v": {"host": "local-box", "command": "x {{ p }}", "params": {"p": {"type": bad_type}}}})
    assert errs == ["variants.v.params.p.type: Input should be 'str', 'int', 'float', 'bool' or 'path'"]


@pytest.mark.parametrize("value", [None, [1, 2]])
def test_param_that_is_neither_default_nor_spec_is_one_message(value):
    errs = variant_errors({"v": {"host": "local-box", "command": "x {{ p }}", "params": {"p": value}}})
    assert len(errs) == 1 and errs[0].startswith("variants.v.params.p: must be a default value"), errs


def test_several_param_errors_keep_their_locations():
    errs = variant_errors({"v": {"host": "local-box", "command": "x {{ a }} {{ b }}",
                                 "params": {"a": {"type": "nope", "regex": "("}, "b": {"min": "low"}, "c": 1}}})
    assert errs[0] == "variants.v.params.a.type: Input should be 'str', 'int', 'float', 'bool' or 'path'"
    assert any(e.startswith("variants.v.params.a.regex: invalid regex") for e in errs)
    assert any(e.startswith("variants.v.params.b.min: ") for e in errs)
    assert len(errs) == 3, errs


def test_host_named_like_a_type_keeps_its_location():
    errs = errors_of({"hosts": {"int": {"local": True, "port": 0}}})
    assert errs == ["hosts.int.port: must be 1..65535"]


# --- review findings: warnings ---------------------------------------------------------------------


def ssh_host_with_files(tmp_path: Path, **extra) -> dict:
    kh, key = tmp_path / "known_hosts", tmp_path / "id_ed25519"
    kh.write_text("")
    key.write_text("")
    return {"address": "10.0.0.5", "known_hosts": str(kh), "key_file": str(key), "log_dirs": ["/data/logs"],
            **extra}


def test_no_warnings_for_a_complete_config(tmp_path):
    cfg = parse_config({"hosts": {"h": ssh_host_with_files(tmp_path)}})
    assert config_warnings(cfg) == []


def test_warning_for_missing_known_hosts_and_key_file(tmp_path):
    host = ssh_host_with_files(tmp_path, known_hosts=str(tmp_path / "nope"), key_file="~/no-such-key")
    warnings = config_warnings(parse_config({"hosts": {"h": host}}))
    assert warnings == [
        f"hosts.h.known_hosts: {tmp_path / 'nope'} does not exist on this machine; host keys cannot be verified, "
        "so SSH connections will be refused",
        "hosts.h.key_file: ~/no-such-key does not exist on this machine; SSH logins with it will fail",
    ]


def test_key_file_tilde_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "id").write_text("")
    cfg = parse_config({"hosts": {"h": ssh_host_with_files(tmp_path, key_file="~/id")}})
    assert config_warnings(cfg) == []


def test_known_hosts_that_is_a_directory_warns(tmp_path):
    cfg = parse_config({"hosts": {"h": ssh_host_with_files(tmp_path, known_hosts=str(tmp_path))}})
    (w,) = config_warnings(cfg)
    assert w.startswith("hosts.h.known_hosts: ") and "is not a regular file" in w


def test_warning_for_host_without_log_dirs_and_no_ssh_checks_for_local(tmp_path):
    cfg = parse_config({"hosts": {"me": {"local": True}}})
    assert config_warnings(cfg) == ["hosts.me.log_dirs: not set, so /probe log= reads are disabled on this host"]


def test_warning_for_no_hosts():
    assert config_warnings(parse_config({})) == ["hosts: no hosts configured; /gpu status and /probe have nothing "
                                                 "to look at"]


def test_warning_for_partial_env_reference_without_its_value(tmp_path):
    host = ssh_host_with_files(tmp_path, env={"PATH": "${PATH}:/opt/bin"})
    (w,) = config_warnings(parse_config({"hosts": {"h": host}}))
    assert w == "hosts.h.env.PATH: only a value that is exactly ${NAME} is expanded; this one is passed literally"


def test_cli_check_config_prints_warnings_and_exits_0(tmp_path):
    text = textwrap.dedent(
        f"""\
        hosts:
          gpu-1:
            address: 10.0.0.5
            known_hosts: {tmp_path}/missing_known_hosts
            log_dirs: [/data/logs]
          me:
            local: true
        """
    )
    p = write(tmp_path, text)
    result = CliRunner().invoke(cli_main, ["check-config", str(p)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{p}: OK (2 hosts, 0 variants; 2 warnings)\n"
    assert result.stderr.splitlines() == [
        f"  warning: hosts.gpu-1.known_hosts: {tmp_path}/missing_known_hosts does not exist on this machine; "
        "host keys cannot be verified, so SSH connections will be refused",
        "  warning: hosts.me.log_dirs: not set, so /probe log= reads are disabled on this host",
    ]


def test_cli_check_config_singular_counts(tmp_path):
    host = ssh_host_with_files(tmp_path)
    text = yaml.safe_dump({"hosts": {"h": host}, "variants": {"v": {"host": "h", "command": "serve"}},
                           "permissions": {"operators": ["U0OPERATOR"]}})
    p = write(tmp_path, text)
    result = CliRunner().invoke(cli_main, ["check-config", str(p)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{p}: OK (1 host, 1 variant)\n"
    assert result.stderr == ""


def test_cli_check_config_one_warning(tmp_path):
    p = write(tmp_path, "")
    result = CliRunner().invoke(cli_main, ["check-config", str(p)])
    assert result.exit_code == 0
    assert result.stdout == f"{p}: OK (0 hosts, 0 variants; 1 warning)\n"
    assert "warning: hosts: no hosts configured" in result.stderr


def test_cli_check_config_duplicate_key_and_unset_reference(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUBOT_TEST_UNSET_VAR", raising=False)
    text = "hosts:\n  h:\n    local: true\n    local: true\n    env:\n      X: ${GPUBOT_TEST_UNSET_VAR}\n"
    result = CliRunner().invoke(cli_main, ["check-config", str(write(tmp_path, text))])
    assert result.exit_code == 2
    assert "  hosts.h: duplicate key 'local' (line 4)" in result.stderr
    assert "  hosts.h.env.X: environment variable GPUBOT_TEST_UNSET_VAR is not set" in result.stderr


def test_a_command_that_cannot_be_execed_is_refused_with_its_fix():
    from bot.core.lifecycle import exec_problems

    def errs(command: str) -> list[str]:
        if not exec_problems(command):
            return []
        return variant_errors({"v": {"host": "local-box", "command": command}})

    assert errs("CUDA_LAUNCH_BLOCKING=1 python -m sglang.launch_server") == [
        "variants.v.command: starts with the environment assignment CUDA_LAUNCH_BLOCKING=...: the command is "
        "exec'ed as the server process, so put the variable under the variant's env"]
    assert "use the variant's workdir" in errs("cd /srv && python serve.py")[0]
    assert "wrapper script" in errs("ulimit -n 65536 && python serve.py")[0]
    assert errs("python -m sglang.launch_server --tp 8") == []
    assert errs("{{ python }} serve.py") == []  # a param decides the program
    assert errs("env CUDA_LAUNCH_BLOCKING=1 python serve.py") == []
    assert "more than one line" in errs("python serve.py\n--port 8000")[0]
    assert "ends with `&`" in errs("python serve.py &")[0]
    assert errs("python serve.py 2>&1") == [] and errs("python serve.py && true") == []


def test_systemd_off_unquoted_in_yaml_means_off(tmp_path):
    import yaml

    from bot.config.schema import HostConfig

    for text, want in (("systemd: off", "off"), ("systemd: 'off'", "off"), ("systemd: no", "off"),
                       ("systemd: auto", "auto"), ("systemd: on", "auto"), ("systemd: 'on'", "auto"),
                       ("systemd: 'No'", "off"), ("{}", "auto")):
        data = {"local": True, **yaml.safe_load(text)}
        assert HostConfig.model_validate(data).systemd == want, text
    with pytest.raises(ValueError, match="auto"):
        HostConfig.model_validate({"local": True, "systemd": "sometimes"})


def test_a_variant_watch_overrides_the_top_level_watch_key_by_key():
    from bot.config.schema import WatchPolicy

    cfg = Config.model_validate({
        "hosts": {"h": {"local": True}},
        "watch": {"interval_s": 2, "serving_interval_s": 10, "phase_grace_s": {"serving": 600, "warmup": 50}},
        "variants": {"base": {"host": "h", "command": "serve", "watch": {"health_failures": 1,
                                                                         "phase_grace_s": {"warmup": 90}}},
                     "child": {"extends": "base", "watch": {"phase_grace_s": {"comm_init": 30}}}},
    })
    top = cfg.watch
    base = top.overridden_by(cfg.resolved_variant("base").watch)
    assert (base.interval_s, base.serving_interval_s, base.health_failures) == (2, 10, 1)
    assert base.phase_grace_s == {"serving": 600, "warmup": 90}
    child = top.overridden_by(cfg.resolved_variant("child").watch)
    assert child.health_failures == 1 and child.phase_grace_s == {"serving": 600, "warmup": 90, "comm_init": 30}
    assert top.overridden_by(None) is top and WatchPolicy().overridden_by(WatchPolicy()) == WatchPolicy()
    empty_parent = Config.model_validate({
        "hosts": {"h": {"local": True}},
        "variants": {"p": {"host": "h", "command": "serve", "watch": None},
                     "c": {"extends": "p", "watch": {"interval_s": 5}}}})
    assert empty_parent.resolved_variant("c").watch.interval_s == 5  # a parent's empty `watch:` is no error


def test_a_rendered_command_that_cannot_be_execed_is_refused_at_launch():
    from bot.config import render_launch
    from bot.core.lifecycle import LaunchError

    cfg = Config.model_validate({
        "hosts": {"h": {"local": True}},
        "variants": {
            "iffy": {"host": "h", "command": "{% if port %}FOO=1 {% endif %}python serve.py", "port": 8000},
            "first": {"host": "h", "command": "{{ prog }} serve.py", "params": {"prog": {"default": "FOO=1"}}},
            "fine": {"host": "h", "command": "{{ prog }} serve.py", "params": {"prog": {"default": "python"}}},
        },
    })
    for name in ("iffy", "first"):
        with pytest.raises(LaunchError, match="starts with the environment assignment FOO"):
            render_launch(cfg, name, {}, launch_id=1, tag="1-a")
    assert render_launch(cfg, "fine", {}, launch_id=1, tag="1-a").command == "python serve.py"
    with pytest.raises(LaunchError, match="builtin 'cd'"):
        render_launch(cfg, "fine", {"prog": "cd"}, launch_id=1, tag="1-a")


def test_a_templated_log_name_gets_the_launch_s_random_part():
    from bot.config import render_launch
    from bot.config.variants import unpredictable_log_name

    assert unpredictable_log_name("/logs/base-12.log", "12-abcdef123456") == "/logs/base-12-abcdef123456.log"
    assert unpredictable_log_name("/logs/run-abcdef123456.txt", "12-abcdef123456") == "/logs/run-abcdef123456.txt"
    assert unpredictable_log_name("/logs/server", "3-0123456789ab") == "/logs/server-0123456789ab"
    cfg = Config.model_validate({
        "hosts": {"h": {"local": True, "log_dirs": ["/data/logs"]}},
        "variants": {"v": {"host": "h", "command": "serve", "log": "/data/logs/{{ variant }}-{{ launch_id }}.log"},
                     "d": {"host": "h", "command": "serve"}}})
    r = render_launch(cfg, "v", {}, launch_id=7, tag="7-00aa11bb22cc")
    assert r.log_path == "/data/logs/v-7-00aa11bb22cc.log" and r.log_dirs == ["/data/logs"]
    assert render_launch(cfg, "d", {}, launch_id=7, tag="7-00aa11bb22cc").log_path == \
        "/data/logs/gpubot-d-7-00aa11bb22cc.log"


def test_try_config_calls_silence_after_its_20_s_in_every_start_up_phase(tmp_path):
    # docs/commands.md promises the alert after the config's 20 s, also for a hang in the rendezvous (comm_init,
    # whose built-in grace is minutes)
    from bot.config import load_config
    from bot.core.diagnose import Observation, diagnose
    from bot.demo.run import write_try_config

    policy = load_config(write_try_config(tmp_path / "try")).watch
    lines = ["[2026-01-01 00:00:00] server_args=ServerArgs(model_path='m')",
             "[2026-01-01 00:00:01 TP0] Init torch distributed begin."]
    silent = Observation(log_lines=lines, process_alive=True, log_silent_s=21, port_open=False)
    verdict = diagnose(silent, grace_s=policy.phase_grace_s, silence_after_s=policy.silence_after_s)
    assert (verdict.verdict, verdict.phase) == ("silent_hang", "comm_init"), verdict
    early = Observation(log_lines=lines, process_alive=True, log_silent_s=15, port_open=False)
    later = diagnose(early, grace_s=policy.phase_grace_s, silence_after_s=policy.silence_after_s)
    assert later.verdict != "silent_hang", later


def test_variants_without_an_operator_warn_that_nobody_may_launch(tmp_path):
    variant = {"host": "h", "command": "python3 -m server"}
    cfg = parse_config({"hosts": {"h": ssh_host_with_files(tmp_path)}, "variants": {"v": variant}})
    (w,) = config_warnings(cfg)
    assert w.startswith("permissions.operators: nobody is an operator or admin") and "U..." in w
    ok = parse_config({"hosts": {"h": ssh_host_with_files(tmp_path)}, "variants": {"v": variant},
                       "permissions": {"operators": ["U0OPERATOR"]}})
    assert config_warnings(ok) == []


def test_the_layout_map_names_every_module():
    import re

    root = Path(__file__).resolve().parents[2]
    layout = (root / "docs" / "development.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    missing = [str(f.relative_to(root)) for pkg in ("bot", "handlers") for f in sorted((root / pkg).rglob("*.py"))
               if f.name != "__init__.py" and not re.search(rf"(?<![\w.-]){re.escape(f.stem)}(?![\w-])", layout)]
    assert missing == [], f"modules the layout map (docs/development.md) does not name: {missing}"


def test_probe_workers_are_checked_and_unset_means_one_per_usable_cpu_but_one_from_four(monkeypatch):
    from bot.adapters import probe_pool
    from bot.adapters.probe_pool import AUTO_WORKERS_MAX, probe_worker_count

    assert probe_worker_count(Config(probe_workers=0)) == 0
    assert probe_worker_count(Config(probe_workers=3)) == 3
    for cpus, want in ((1, 0), (2, 0), (3, 0), (4, 3), (6, 5), (64, AUTO_WORKERS_MAX)):
        monkeypatch.setattr(probe_pool, "usable_cpus", lambda cpus=cpus: cpus)
        assert probe_worker_count(Config()) == want
    for bad in (-1, 65, True):
        with pytest.raises(ValueError, match="probe_workers"):
            Config(probe_workers=bad)


def test_usable_cpus_follow_the_affinity_mask_and_the_cgroup_quota(monkeypatch, tmp_path):
    import builtins

    from bot.adapters.probe_pool import usable_cpus

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    real_open = builtins.open
    quota = tmp_path / "cpu.max"

    def fake_open(path, *a, **k):
        return real_open(quota if str(path) == "/sys/fs/cgroup/cpu.max" else path, *a, **k)

    monkeypatch.setattr(builtins, "open", fake_open)
    for text, want in (("max 100000\n", 16), ("250000 100000\n", 3), ("50000 100000\n", 1), ("junk", 16)):
        quota.write_text(text)
        assert usable_cpus() == want
    quota.unlink()
    assert usable_cpus() == 16
