"""Tests for deploy/: the example config documents (and validates against) the whole schema, the Slack
manifest matches what the app registers, and no deploy file carries a secret."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from bot.config import Config, ConfigError, load_config, parse_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
EXAMPLE = DEPLOY / "config.example.yaml"
MANIFEST = DEPLOY / "slack-manifest.yaml"
UNIT = DEPLOY / "gpubot.service"
CONTAINERFILE = DEPLOY / "Containerfile"
ENV_EXAMPLE = DEPLOY / "env.example"

# Real-looking Slack credentials: xoxb-/xoxp-/xoxa-/xoxe-... tokens and xapp- app tokens with digits.
TOKEN_RE = re.compile(r"\bxox[abpre]-[0-9A-Za-z-]*\d|\bxapp-\d")


def _example_data() -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """Pydantic model classes named anywhere in a type annotation (through unions, dicts, lists)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out.extend(_models_in(arg))
    return out


def _values_for(annotation: Any, value: Any) -> list[tuple[type[BaseModel], dict]]:
    """(model, mapping) pairs found in `value`, which the schema types as `annotation`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, value)] if isinstance(value, dict) else []
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    out: list[tuple[type[BaseModel], dict]] = []
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            out.extend(_values_for(arg, value))
    elif origin is dict and isinstance(value, dict):
        for v in value.values():
            out.extend(_values_for(args[1], v))
    elif origin is list and isinstance(value, list):
        for v in value:
            out.extend(_values_for(args[0], v))
    return out


def _keys_by_model(model: type[BaseModel], data: dict) -> dict[type[BaseModel], set[str]]:
    """For every model reachable from `model`, the keys used in the example mappings typed as it."""
    seen: dict[type[BaseModel], set[str]] = {}
    todo = [(model, data)]
    while todo:
        m, d = todo.pop()
        seen.setdefault(m, set()).update(d)
        for name, field in m.model_fields.items():
            if name in d:
                todo.extend(_values_for(field.annotation, d[name]))
    return seen


def _all_models(model: type[BaseModel]) -> set[type[BaseModel]]:
    out: set[type[BaseModel]] = set()
    todo = [model]
    while todo:
        m = todo.pop()
        if m in out:
            continue
        out.add(m)
        for field in m.model_fields.values():
            todo.extend(_models_in(field.annotation))
    return out


def _all_keys(data: Any) -> set[str]:
    if isinstance(data, dict):
        keys = {str(k) for k in data}
        for v in data.values():
            keys |= _all_keys(v)
        return keys
    if isinstance(data, list):
        return set().union(*(_all_keys(v) for v in data)) if data else set()
    return set()


# ---------------------------------------------------------------------------------------------------------
# config.example.yaml
# ---------------------------------------------------------------------------------------------------------


def test_example_config_validates():
    cfg = load_config(EXAMPLE)
    assert cfg.default_host in cfg.hosts
    assert any(h.local for h in cfg.hosts.values())
    assert any(not h.local for h in cfg.hosts.values())
    # every variant resolves (extends applied) to a host and a command
    for name in cfg.variants:
        rv = cfg.resolved_variant(name)
        placed = rv.host is not None and rv.host.startswith("group:") and cfg.group_hosts(rv.host[6:])
        assert (rv.host in cfg.hosts or placed) and rv.command


def test_example_config_eagle3_extends_base():
    cfg = load_config(EXAMPLE)
    base, eagle = cfg.resolved_variant("base"), cfg.resolved_variant("eagle3")
    assert cfg.variants["eagle3"].extends == "base"
    assert "--speculative-algorithm" in eagle.extra_args
    assert eagle.command == base.command
    assert set(base.params) <= set(eagle.params)
    for var in ("python", "model", "port"):
        assert "{{ " + var + " }}" in base.command
    assert "{{ variant }}" in base.log and "{{ launch_id }}" in base.log


def test_example_config_shows_both_param_forms():
    from bot.config import ParamSpec

    params = load_config(EXAMPLE).variants["base"].params
    assert any(isinstance(p, ParamSpec) for p in params.values())
    assert any(not isinstance(p, ParamSpec) for p in params.values())


def test_example_config_documents_every_schema_field_somewhere():
    keys = _all_keys(_example_data())
    missing = sorted(
        f"{m.__name__}.{name}" for m in _all_models(Config) for name in m.model_fields if name not in keys
    )
    assert not missing, f"deploy/config.example.yaml does not show: {', '.join(missing)}"


def test_example_config_documents_every_field_in_its_own_model():
    """Stricter: each field appears in a mapping that the schema types as that field's model."""
    found = _keys_by_model(Config, _example_data())
    problems = []
    for m in _all_models(Config):
        if m not in found:
            problems.append(f"{m.__name__}: no example at all")
            continue
        problems.extend(f"{m.__name__}.{n}" for n in m.model_fields if n not in found[m])
    assert not problems, f"deploy/config.example.yaml misses: {', '.join(sorted(problems))}"


def test_schema_walk_sees_every_model():
    names = {m.__name__ for m in _all_models(Config)}
    assert {"Config", "HostConfig", "VariantConfig", "ParamSpec", "WatchPolicy", "Permissions",
            "SlackSettings"} <= names


def test_example_config_has_no_secret_values():
    text = EXAMPLE.read_text(encoding="utf-8")
    assert "xoxb-" not in text and "xapp-" not in text and "xoxp-" not in text
    assert not TOKEN_RE.search(text)


def test_secret_in_example_would_be_rejected():
    """The header's promise: a literal secret under a secret-like key is an error."""
    data = _example_data()
    data["variants"]["base"]["env"]["HF_TOKEN"] = "hf_literal_value"
    with pytest.raises(ConfigError) as e:
        parse_config(data)
    assert any("HF_TOKEN" in err for err in e.value.errors)


# ---------------------------------------------------------------------------------------------------------
# slack-manifest.yaml
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    data = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_manifest_metadata_and_bot_user(manifest):
    assert manifest["_metadata"] == {"major_version": 2, "minor_version": 1}
    assert manifest["display_information"]["name"]
    bot_user = manifest["features"]["bot_user"]
    assert bot_user["display_name"] == "gpubot"
    assert bot_user["always_online"] is True


def test_manifest_declares_the_slash_commands_of_the_command_table(manifest):
    """The checked-in manifest is what `gpubot manifest` derives from handlers.COMMANDS (so it cannot drift
    from what the Bolt app registers), apart from its comments."""
    from handlers import manifest as derived_manifest
    from handlers import slash_names

    commands = manifest["features"]["slash_commands"]
    assert sorted(c["command"] for c in commands) == sorted(slash_names(Config()).values())
    generated = derived_manifest(Config())
    assert commands == generated["features"]["slash_commands"]
    assert manifest["oauth_config"] == generated["oauth_config"]
    assert manifest["settings"] == generated["settings"]
    for c in commands:
        assert c["description"]
        assert c["should_escape"] is False
        assert "url" not in c  # Socket Mode: no request URLs


def test_gpubot_manifest_prints_the_renamed_slash_commands_of_a_config(tmp_path):
    """Two installs in one workspace: the second renames its slash commands, and its manifest says so."""
    from click.testing import CliRunner

    from bot.cli import main

    cfg = tmp_path / "staging.yaml"
    cfg.write_text("slack:\n  bot_name: gpubot-staging\n  slash_commands: {gpu: /gpu-staging, kill: /kill-staging}\n")
    result = CliRunner().invoke(main, ["manifest", "--config", str(cfg)])
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(result.output)
    names = [c["command"] for c in data["features"]["slash_commands"]]
    assert "/gpu-staging" in names and "/kill-staging" in names and "/gpu" not in names and "/kill" not in names
    assert "/probe" in names  # not renamed
    assert data["features"]["bot_user"]["display_name"] == "gpubot-staging"
    http = CliRunner().invoke(main, ["manifest", "--request-url", "https://bot.example.com/slack/events"])
    settings = yaml.safe_load(http.output)["settings"]
    assert settings["socket_mode_enabled"] is False
    assert settings["event_subscriptions"]["request_url"] == "https://bot.example.com/slack/events"


@pytest.mark.parametrize(("yaml_text", "error"), [
    ("slack: {slash_commands: {gpubot: /logs}}", "slack.slash_commands.gpubot: /logs is the name of a command"),
    ("slack: {slash_commands: {gpu: /snooze}}", "slack.slash_commands.gpu: /snooze is the name of a command"),
    ("slack: {slash_commands: {kill: /probe, probe: /kill}}", "slack.slash_commands.kill: /probe is the name of"),
    ("hosts: {kill: {local: true}}", "hosts.kill: a host may not be named like a command"),
    ("hosts: {'7': {local: true}}", "hosts.7: a host may not be named like a command, `all` or a number"),
    ("hosts: {all: {local: true}}", "hosts.all: a host may not be named like a command"),
    ("slack: {bot_name: Bad Name}", "slack.bot_name: must be 1..35 lower-case letters"),
    ("slack: {command_prefix: ''}", "slack.command_prefix: must be 1..3 of the characters"),
    ("slack: {command_prefix: /}", "/ would suggest the slash commands of another install"),
    ("slack: {command_prefix: '#'}", "# starts a comment in the console"),
    ("slack: {command_prefix: '&'}", "Slack delivers & < > escaped"),
])
def test_names_that_would_shadow_commands_are_config_errors(tmp_path, yaml_text, error):
    """A renamed slash command that is a command word (`!logs 50` would stop being logs), swapped command
    names, hosts named like a command, `all` or a number (`/gpu HOST`, `probe 7` would not reach them)."""
    from click.testing import CliRunner

    from bot.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text + "\n")
    result = CliRunner().invoke(main, ["check-config", str(cfg)])
    assert result.exit_code == 2 and error in result.output, result.output


def test_bad_slash_command_names_are_config_errors(tmp_path):
    from click.testing import CliRunner

    from bot.cli import main

    cfg = tmp_path / "bad.yaml"
    cfg.write_text("slack:\n  slash_commands: {gpu: 'gpu staging', nope: /x, kill: /probe}\n")
    result = CliRunner().invoke(main, ["check-config", str(cfg)])
    assert result.exit_code == 2
    assert "slack.slash_commands.gpu: 'gpu staging' is not a slash command name" in result.output
    assert "slack.slash_commands.nope: unknown slash command" in result.output
    assert "slack.slash_commands: /probe is used by more than one command" in result.output


def test_manifest_usage_hints(manifest):
    hints = {c["command"]: c.get("usage_hint", "") for c in manifest["features"]["slash_commands"]}
    assert "status" in hints["/gpu"] and "probe" in hints["/gpu"]
    assert "pgid=" in hints["/probe"] and "log=" in hints["/probe"]


def test_manifest_scopes(manifest):
    scopes = set(manifest["oauth_config"]["scopes"]["bot"])
    assert {"commands", "chat:write", "app_mentions:read", "files:write"} <= scopes
    assert {"channels:history", "groups:history"} <= scopes  # `!` messages
    assert len(scopes) == len(manifest["oauth_config"]["scopes"]["bot"])  # no duplicates
    assert all(re.fullmatch(r"[a-z_]+(:[a-z_.]+)?", s) for s in scopes)


def test_manifest_settings(manifest):
    settings = manifest["settings"]
    events = set(settings["event_subscriptions"]["bot_events"])
    assert {"app_mention", "message.channels"} <= events
    assert settings["socket_mode_enabled"] is True
    assert settings["interactivity"]["is_enabled"] is True
    assert settings["org_deploy_enabled"] is False
    assert settings["token_rotation_enabled"] is False
    assert "request_url" not in settings["event_subscriptions"]


def test_manifest_message_events_have_history_scopes(manifest):
    scopes = set(manifest["oauth_config"]["scopes"]["bot"])
    needs = {"message.channels": "channels:history", "message.groups": "groups:history",
             "message.im": "im:history", "message.mpim": "mpim:history", "app_mention": "app_mentions:read"}
    for event in manifest["settings"]["event_subscriptions"]["bot_events"]:
        assert needs[event] in scopes, f"bot event {event} needs scope {needs[event]}"


# ---------------------------------------------------------------------------------------------------------
# gpubot.service, Containerfile, env.example
# ---------------------------------------------------------------------------------------------------------


def _unit_settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_systemd_unit():
    text = UNIT.read_text(encoding="utf-8")
    s = _unit_settings(text)
    (exec_start,) = s["ExecStart"]
    argv = exec_start.split()
    assert Path(argv[0]).name == "gpubot"
    assert "run --config" in exec_start
    assert s["User"] == ["gpubot"]
    assert s["EnvironmentFile"] == ["/etc/gpubot/env"]
    assert s["Restart"] == ["on-failure"]
    assert s["NoNewPrivileges"] == ["true"]
    assert s["ProtectSystem"] == ["strict"]
    assert s["ReadWritePaths"]


def test_systemd_unit_has_no_token():
    text = UNIT.read_text(encoding="utf-8")
    assert not TOKEN_RE.search(text)
    assert "xoxb-" not in text and "xapp-" not in text
    s = _unit_settings(text)
    for env in s.get("Environment", []):
        assert not re.search(r"SLACK_(BOT_TOKEN|APP_TOKEN|SIGNING_SECRET)", env)


def test_containerfile():
    text = CONTAINERFILE.read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11-slim", text, re.MULTILINE)
    assert re.search(r'^ENTRYPOINT \["gpubot"\]', text, re.MULTILINE)
    assert re.search(r'^CMD \["run", "--config", "/etc/gpubot/config.yaml"\]', text, re.MULTILINE)
    assert re.search(r"^USER (?!root)\S+", text, re.MULTILINE)
    assert not TOKEN_RE.search(text)


def test_env_example_placeholders_only():
    text = ENV_EXAMPLE.read_text(encoding="utf-8")
    assigned = dict(
        line.split("=", 1) for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")
    )
    assert {"SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET"} <= set(assigned)
    assert assigned["SLACK_BOT_TOKEN"].startswith("xoxb-")
    assert assigned["SLACK_APP_TOKEN"].startswith("xapp-")
    assert not TOKEN_RE.search(text)
    for value in assigned.values():
        assert "REPLACE" in value
