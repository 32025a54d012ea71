"""Tests for bot.config: YAML -> pydantic models, error locations, secret rejection, the check-config CLI."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from bot.cli import main as cli_main
from bot.config import BUILTIN_TEMPLATE_VARS, Config, ConfigError, HostConfig, ParamSpec, load_config, parse_config

SECRET_MSG = "secrets are never read from the config file"

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
    cfg = load_config(write(tmp_path, VALID_YAML))
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
    assert base.env["HF_TOKEN"] == "${HF_TOKEN}"
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
    cfg = load_config(write(tmp_path, VALID_YAML))
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
    assert rv.env == {"NCCL_DEBUG": "INFO", "HF_TOKEN": "${HF_TOKEN}", "NCCL_IB_DISABLE": "1"}
    # extra_args appended after the parent's
    assert rv.extra_args == ["--trust-remote-code", "--dtype", "{{ dtype }}"]
    # the stored variants are not modified
    assert cfg.variants["sglang-tp4"].extends == "sglang-base"
    assert cfg.variants["sglang-base"].port == 30000
    assert cfg.variants["sglang-base"].env == {"NCCL_DEBUG": "WARN", "HF_TOKEN": "${HF_TOKEN}"}


def test_resolved_variant_three_levels(tmp_path):
    cfg = load_config(write(tmp_path, VALID_YAML))
    rv = cfg.resolved_variant("sglang-tp4-local")
    assert rv.host == "bot-box"
    assert rv.port == 30001
    assert rv.env == {
        "NCCL_DEBUG": "INFO",
        "HF_TOKEN": "${HF_TOKEN}",
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
    errs = load_errors(tmp_path, text)
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
        "watch.interval_s: must be > 0 seconds",
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
    assert f"{location}: unknown key" in errs


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
        )
    )
    assert cfg.variants["v"].env["HF_TOKEN"] == "${HF_TOKEN}"
    assert cfg.variants["v"].env["WANDB_API_KEY"] == "${WANDB_API_KEY}"


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
    assert isinstance(parse_config(data), Config)


# --- CLI ------------------------------------------------------------------------------------------


def test_cli_check_config_ok(tmp_path):
    p = write(tmp_path, VALID_YAML)
    result = CliRunner().invoke(cli_main, ["check-config", str(p)])
    assert result.exit_code == 0, result.output
    assert f"{p}: OK (3 hosts, 3 variants)" in result.output


def test_cli_check_config_errors(tmp_path):
    bad = VALID_YAML.replace("port: 2222", "port: 70000").replace("max_channels: 6", "max_channels: 0")
    p = write(tmp_path, bad)
    result = CliRunner().invoke(cli_main, ["check-config", str(p)])
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
