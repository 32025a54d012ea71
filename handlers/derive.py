"""What derives from the command table (handlers.table): the grammar's vocabulary, the slash commands (names
configurable with `slack.slash_commands`, so two installs can live in one workspace) and the Slack app
manifest."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from bot.config import Config
from bot.core.commands import CommandNames
from bot.core.grammar import Grammar, SlashCommand, Vocabulary
from handlers.spec import CommandSpec
from handlers.table import COMMANDS

#: A Slack slash command name: "/" and 1..31 lower-case letters, digits, "-" or "_".
SLASH_NAME_RE = re.compile(r"^/[a-z0-9_-]{1,31}$")


def slash_keys(commands: Sequence[CommandSpec] = COMMANDS) -> dict[str, tuple[str, bool]]:
    """key -> (command it runs by default, router?) for every slash command of the table: a router key
    comes from a command's `default_of` (`gpu` -> status), a plain one from `slash` (`probe`)."""
    out: dict[str, tuple[str, bool]] = {}
    for c in commands:
        if c.default_of:
            out[c.default_of] = (c.name, True)
    for c in commands:
        if c.slash:
            out[c.slash] = (c.name, False)
    return out


def slash_names(config: Config, commands: Sequence[CommandSpec] = COMMANDS) -> dict[str, str]:
    """key -> slash command name: `/<key>`, unless `slack.slash_commands` renames it."""
    renamed = config.slack.slash_commands
    return {key: renamed.get(key, f"/{key}") for key in slash_keys(commands)}


def command_names(config: Config, commands: Sequence[CommandSpec] = COMMANDS) -> CommandNames:
    """How this install writes the commands its answers suggest (bot.core.commands): a command with a slash
    command of its own under that name (`/kill`, or `/kill-staging` where `slack.slash_commands` renames it), the
    others through the router (`/gpu status`, `/gpu-staging logs`), thread commands with `slack.command_prefix`."""
    names = slash_names(config, commands)
    keys = slash_keys(commands)
    routers = [key for key, (_, router) in keys.items() if router]
    router = names["gpu"] if "gpu" in names else names[routers[0]] if routers else "/gpu"
    own = {default: names[key] for key, (default, is_router) in keys.items() if not is_router}
    return CommandNames(slash_of=own, router=router, prefix=config.slack.command_prefix)


def config_problems(config: Config, commands: Sequence[CommandSpec] = COMMANDS) -> list[str]:
    """`location: message` for each problem the command table can see in `config`. Slash commands
    (`slack.slash_commands`): an unknown key, a name Slack would refuse, two commands with one name, or a new
    name that is a command word (`/logs` as the router would make `!logs 50` mean something else). Hosts: a
    name that is a command word, `all` or a number (`/gpu NAME` and `probe 7` would mean the command, all
    hosts, or launch 7). Empty when fine."""
    keys = slash_keys(commands)
    words = {w for c in commands for w in (c.name, *c.aliases)}
    out = []
    for key, name in config.slack.slash_commands.items():
        if key not in keys:
            out.append(f"slack.slash_commands.{key}: unknown slash command; known: {', '.join(sorted(keys))}")
        elif not SLASH_NAME_RE.match(name):
            out.append(f"slack.slash_commands.{key}: {name!r} is not a slash command name (like /gpu-staging)")
        elif name != f"/{key}" and (name[1:] in words or name[1:] in keys):
            out.append(f"slack.slash_commands.{key}: {name} is the name of a command; pick a name of its own "
                       f"(like /{key}-staging)")
    names = list(slash_names(config, commands).values())
    for name in sorted({n for n in names if names.count(n) > 1}):
        out.append(f"slack.slash_commands: {name} is used by more than one command")
    for host in config.hosts:
        if host.lower() in words or host.lower() == "all" or host.isdigit():
            gpu = config.slack.slash_commands.get("gpu") or "/gpu"
            out.append(f"hosts.{host}: a host may not be named like a command, `all` or a number (`{gpu} {host}` and "
                       "`probe` would not reach it); rename it")
    return out


def vocabulary(config: Config, commands: Sequence[CommandSpec] = COMMANDS) -> Vocabulary:
    """The grammar's words: every command name and alias, the slash commands by their configured names, and
    the router words of messages (the router slash commands' names without the "/": `gpu`, `gpubot`, or
    `gpu-staging` where `slack.slash_commands` renames it, so two installs never both answer `!gpu`)."""
    words: dict[str, str] = {}
    for c in commands:
        words[c.name] = c.name
        for a in c.aliases:
            words[a] = c.name
    names = slash_names(config, commands)
    slash: dict[str, SlashCommand] = {}
    routers: dict[str, str] = {}
    for key, (default, router) in slash_keys(commands).items():
        slash[names[key]] = SlashCommand(names[key], default, router)
        if router:  # `!gpu ...` routes like `/gpu ...`, under the install's own name (`!gpu-staging ...`)
            routers[names[key].lstrip("/")] = default
    return Vocabulary(words=words, slash=slash, routers=routers)


def grammar(config: Config, commands: Sequence[CommandSpec] = COMMANDS) -> Grammar:
    """The Grammar for `config` (see vocabulary)."""
    return Grammar(vocabulary(config, commands))


def manifest(config: Config, commands: Sequence[CommandSpec] = COMMANDS, *,
             request_url: str | None = None) -> dict[str, Any]:
    """The Slack app manifest (manifest version 2.1) for this install: its bot name, every slash command of
    the table under its configured name, the scopes and events gpubot uses. Socket Mode, unless
    `request_url` (https://HOST/slack/events) asks for HTTP mode."""
    by_name = {c.name: c for c in commands}
    keys = slash_keys(commands)
    names = slash_names(config, commands)
    written = command_names(config, commands)
    slash_entries = []
    for key, (default, _router) in keys.items():
        c = by_name[default]
        entry: dict[str, Any] = {"command": names[key], "description": written.expand(c.description or c.summary),
                                 "usage_hint": written.expand(c.hint or c.usage), "should_escape": False}
        if request_url:
            entry["url"] = request_url
        slash_entries.append(entry)
    name = config.slack.bot_name
    settings: dict[str, Any] = {
        "event_subscriptions": {"bot_events": ["app_mention", "message.channels", "message.groups"]},
        "interactivity": {"is_enabled": True},
        "org_deploy_enabled": False,
        "socket_mode_enabled": request_url is None,
        "token_rotation_enabled": False,
    }
    if request_url:
        settings["event_subscriptions"]["request_url"] = request_url
        settings["interactivity"]["request_url"] = request_url
    return {
        "_metadata": {"major_version": 2, "minor_version": 1},
        "display_information": {
            "name": name, "description": "Debug GPU inference servers (SGLang, vLLM, ...) over SSH, as a team.",
            "background_color": "#1d3b2a"},
        "features": {"bot_user": {"display_name": name, "always_online": True}, "slash_commands": slash_entries},
        "oauth_config": {"scopes": {"bot": list(BOT_SCOPES)}},
        "settings": settings,
    }


#: The bot token scopes gpubot uses: slash commands, posting and editing (chat:write; chat:write.public for
#: public channels the bot was not invited to), mentions and `!` messages (history, also the outbox's lookup
#: before a retry), files, and user groups (roles may name them).
BOT_SCOPES = ("commands", "chat:write", "chat:write.public", "app_mentions:read", "channels:history",
              "groups:history", "files:write", "usergroups:read")
