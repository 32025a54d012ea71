"""YAML configuration -> validated pydantic models.

The file describes hosts, server variants, permissions and the watch policy. Secrets are never read
from it: Slack tokens and signing secrets come from the environment (SLACK_BOT_TOKEN, SLACK_APP_TOKEN,
SLACK_SIGNING_SECRET). An `env:` value that is exactly `${NAME}` is replaced at load time by the
environment variable NAME. `load_config` raises `ConfigError` listing every problem with its location,
e.g. `hosts.gpu-host-1.port: must be 1..65535`; `config_warnings` lists problems that do not stop the bot.

YAML is read with a strict SafeLoader: duplicate keys are errors, and alias use, nesting depth, the
number of values and the file size are capped, so a hostile or broken file cannot hang or crash the bot.

The documented schema with every key lives in `deploy/config.example.yaml`.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import stat
import types
import typing
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import jinja2
import jinja2.meta
import jinja2.sandbox
import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
SLACK_USER_RE = re.compile(r"^[UW][A-Z0-9]{2,}$")
SLACK_GROUP_RE = re.compile(r"^S[A-Z0-9]{2,}$")
SLACK_CHANNEL_RE = re.compile(r"^[CGD][A-Z0-9]{2,}$")
#: Keys whose NAME ends in a secret word (slack_token, signing_secret, api_key, HF_TOKEN); not max_tokens, tokenizer.
SECRET_KEY_RE = re.compile(
    r"(?:^|[_-])(?:token|secret|password|passwd|passphrase|api[_-]?key|access[_-]?key|private[_-]?key"
    r"|secret[_-]?key)$",
    re.IGNORECASE,
)

#: An environment reference: a value that is exactly `${NAME}`.
ENV_REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

#: Names a variant's command template may use besides its declared params.
BUILTIN_TEMPLATE_VARS = frozenset({"port", "variant", "launch_id", "log", "host", "gpus", "cuda_visible_devices"})

#: Limits on the YAML file: a config is a few KiB with a handful of anchors.
MAX_CONFIG_BYTES = 1024 * 1024
MAX_YAML_ALIASES = 100
MAX_YAML_DEPTH = 100
MAX_YAML_VALUES = 100_000
#: Upper bound of every duration setting, in seconds.
MAX_SECONDS = 3600
#: Watch durations may be long: a cold 600 GB checkpoint can take over an hour to load (one day at most).
MAX_WATCH_SECONDS = 86400

SECRETS_HINT = (
    "secrets are never read from the config file; set them in the environment (Slack tokens: "
    "SLACK_BOT_TOKEN, SLACK_APP_TOKEN, SLACK_SIGNING_SECRET) or reference one as ${NAME} in an env: map"
)


class ConfigError(Exception):
    """Raised by `load_config` / `parse_config`; `.errors` is a list of `location: message` strings."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("\n".join(errors))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


def _not_bool(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError(f"must be a number, not {str(v).lower()}")
    return v


#: An integer as YAML writes it: `true` is not 1, and "22" or 22.0 are not 22.
Int = Annotated[int, Strict()]
#: A number: ints are accepted, `true` / `false` are not.
Number = Annotated[float, BeforeValidator(_not_bool)]


def _seconds(v: float, *, zero_ok: bool = False, limit: float = MAX_SECONDS) -> float:
    """`v` if it is a finite number of seconds, > 0 (>= 0 with `zero_ok`) and <= `limit`; else raises
    ValueError with the allowed range."""
    if zero_ok:
        if not 0 <= v <= limit:  # also false for NaN
            raise ValueError(f"must be 0..{limit:g} seconds")
    elif not 0 < v <= limit:
        raise ValueError(f"must be > 0 and <= {limit:g} seconds")
    return v


class HostConfig(_Model):
    """One GPU host reached over SSH, or the machine the bot runs on (`local: true`).

    `port` 1..65535; `connect_timeout_s` / `command_timeout_s` / `nvidia_smi_timeout_s` seconds in
    (0, 3600]; `keepalive_interval_s` seconds in [0, 3600] (0: no keepalives); `max_channels` concurrent SSH
    session channels per connection (keep below the server's MaxSessions, OpenSSH default 10).
    Integers must be YAML integers (`port: true` is an error); every duration must be finite.
    `known_hosts` is required for SSH hosts: host keys are always verified.
    """

    address: str | None = None
    port: Int = 22
    user: str | None = None
    key_file: str | None = None
    known_hosts: str | None = None
    local: bool = False
    connect_timeout_s: Number = 10.0
    command_timeout_s: Number = 30.0
    keepalive_interval_s: Number = 15.0
    max_channels: Int = 8
    nvidia_smi: str = "nvidia-smi"
    nvidia_smi_timeout_s: Number = 10.0
    use_nvml: bool = True
    gpu_note: str | None = None
    py_spy: str = "py-spy"
    py_spy_sudo: bool = False
    env: dict[str, str] = Field(default_factory=dict)
    log_dirs: list[str] = Field(default_factory=list)

    @field_validator("log_dirs")
    @classmethod
    def _log_dirs(cls, v: list[str]) -> list[str]:
        out = []
        for d in v:
            if not d.startswith("/") or any(c in d for c in "\x00\n\r") or "/../" in d + "/" or d.rstrip("/") == "":
                raise ValueError(f"{d!r}: log directories must be absolute paths other than / (no ..)")
            out.append(d.rstrip("/"))
        return out

    @field_validator("port")
    @classmethod
    def _port(cls, v: int) -> int:
        if not 1 <= v <= 65535:
            raise ValueError("must be 1..65535")
        return v

    @field_validator("max_channels")
    @classmethod
    def _channels(cls, v: int) -> int:
        if not 1 <= v <= 64:
            raise ValueError("must be 1..64")
        return v

    @field_validator("connect_timeout_s", "command_timeout_s", "nvidia_smi_timeout_s")
    @classmethod
    def _positive(cls, v: float) -> float:
        return _seconds(v)

    @field_validator("keepalive_interval_s")
    @classmethod
    def _keepalive(cls, v: float) -> float:
        return _seconds(v, zero_ok=True)  # 0 turns keepalives off

    @field_validator("nvidia_smi", "py_spy")
    @classmethod
    def _tool_path(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_./+-]+", v):
            raise ValueError("must be a command name or path without spaces or shell characters")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError(f"invalid environment variable name {k!r}")
        return v

    @model_validator(mode="after")
    def _address_or_local(self) -> HostConfig:
        if not self.local:
            if not self.address:
                raise ValueError("address is required unless local: true")
            if not self.known_hosts:
                raise ValueError("known_hosts is required for SSH hosts (host keys are always verified)")
        return self


class ParamSpec(_Model):
    """A declared launch parameter: type, default and validation (choices or regex)."""

    type: Literal["str", "int", "float", "bool", "path"] = "str"
    default: Any = None
    choices: list[Any] | None = None
    regex: str | None = None
    min: Number | None = None
    max: Number | None = None
    description: str | None = None

    @field_validator("min", "max")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @field_validator("regex")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"invalid regex: {e}") from e
        return v


class WatchPolicy(_Model):
    """How launches are followed: check interval and silence threshold in seconds, per-phase grace."""

    interval_s: Number = 30.0
    silence_after_s: Number = 300.0
    phase_grace_s: dict[str, Number] = Field(default_factory=dict)
    digest_cron: str | None = None
    digest_channel: str | None = None

    @field_validator("interval_s", "silence_after_s")
    @classmethod
    def _pos(cls, v: float) -> float:
        return _seconds(v, limit=MAX_WATCH_SECONDS)

    @field_validator("digest_cron")
    @classmethod
    def _cron(cls, v: str | None) -> str | None:
        if v is not None:
            from apscheduler.triggers.cron import CronTrigger

            try:
                CronTrigger.from_crontab(v)
            except ValueError as e:
                raise ValueError(f"not a crontab expression (minute hour day month weekday): {e}") from None
        return v

    @field_validator("phase_grace_s")
    @classmethod
    def _phases(cls, v: dict[str, float]) -> dict[str, float]:
        known = {"comm_init", "weight_loading", "kv_cache_alloc", "cuda_graph_capture", "warmup", "serving"}
        for k, s in v.items():
            if k not in known:
                raise ValueError(f"unknown phase {k!r}; known: {', '.join(sorted(known))}")
            if not 0 < s <= MAX_WATCH_SECONDS:
                raise ValueError(f"grace for {k} must be > 0 and <= {MAX_WATCH_SECONDS} seconds")
        return v


class VariantConfig(_Model):
    """A server variant: how to launch it, where its log goes, which port and GPUs it uses.

    `command` is a Jinja2 template rendered in a sandbox; user-supplied values are validated against
    `params` and shell-quoted before rendering. `extends` names another variant to inherit from.
    """

    host: str | None = None
    extends: str | None = None
    command: str | None = None
    params: dict[str, ParamSpec | str | int | float | bool] = Field(default_factory=dict)
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    log: str | None = None
    port: Int | None = None
    health: str | None = None
    gpus: list[Int] | None = None
    engine: Literal["sglang", "vllm", "tgi", "trtllm", "generic"] | None = None
    watch: WatchPolicy | None = None

    @field_validator("params", mode="before")
    @classmethod
    def _params(cls, v: Any) -> Any:
        # Decide per value which form it is, so one mistake gives one message (a plain union would report
        # the failure of every member: ParamSpec, str, int, float and bool).
        if not isinstance(v, dict):
            return v
        out: dict[Any, Any] = {}
        problems: list[InitErrorDetails] = []
        for name, spec in v.items():
            if isinstance(spec, (ParamSpec, str, int, float, bool)):
                out[name] = spec
            elif isinstance(spec, dict):
                try:
                    out[name] = ParamSpec.model_validate(spec)
                except ValidationError as e:
                    for err in e.errors(include_url=False):
                        detail = InitErrorDetails(type=err["type"], loc=(name, *err["loc"]), input=err["input"])
                        if "ctx" in err:
                            detail["ctx"] = err["ctx"]
                        problems.append(detail)
            else:
                problems.append(InitErrorDetails(
                    type=PydanticCustomError(
                        "param_value",
                        "must be a default value (string, number or true/false) or a mapping of "
                        "type/default/choices/regex/min/max/description",
                    ),
                    loc=(name,),
                    input=spec,
                ))
        if problems:
            raise ValidationError.from_exception_data("params", problems)
        return out

    @field_validator("port")
    @classmethod
    def _port(cls, v: int | None) -> int | None:
        if v is not None and not 1 <= v <= 65535:
            raise ValueError("must be 1..65535")
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: list[int] | None) -> list[int] | None:
        if v is not None:
            if any(g < 0 or g > 255 for g in v):
                raise ValueError("GPU indexes must be 0..255")
            if len(set(v)) != len(v):
                raise ValueError("GPU indexes must be unique")
        return v

    @field_validator("health")
    @classmethod
    def _health(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"/[A-Za-z0-9_./-]*", v):
            raise ValueError("must be a path like /health")
        return v


class Permissions(_Model):
    """Who may do what, by immutable Slack IDs (user IDs U..., user groups S..., channels C...).

    Empty `viewers` means everyone may run read-only commands; `channels` empty means any channel.
    """

    admins: list[str] = Field(default_factory=list)
    operators: list[str] = Field(default_factory=list)
    viewers: list[str] = Field(default_factory=list)
    channels: list[str] = Field(default_factory=list)

    @field_validator("admins", "operators", "viewers")
    @classmethod
    def _ids(cls, v: list[str]) -> list[str]:
        for x in v:
            if not (SLACK_USER_RE.match(x) or SLACK_GROUP_RE.match(x) or x == "*"):
                raise ValueError(f"{x!r} is not a Slack user ID (U...) or user group ID (S...)")
        return v

    @field_validator("channels")
    @classmethod
    def _chans(cls, v: list[str]) -> list[str]:
        for x in v:
            if not SLACK_CHANNEL_RE.match(x):
                raise ValueError(f"{x!r} is not a Slack channel ID (C..., G... or D...)")
        return v


class SlackSettings(_Model):
    """Non-secret Slack settings. Tokens are read from the environment only. `post_interval_s`: seconds
    between two messages (posts, edits, files) in one channel (Slack allows about one per second);
    `progress_after_s`: a command whose answer takes longer than this many seconds gets a placeholder
    message at once, edited into the answer; `slash_commands`: slash command names by key (see
    `gpubot manifest`)."""

    command_prefix: str = "!"
    bot_name: str = "gpubot"
    api_url: str | None = None
    post_interval_s: float = Field(default=1.0, ge=0.0, le=60.0)
    progress_after_s: float = Field(default=0.5, ge=0.0, le=10.0)
    #: Slash command names by key (`gpu`, `gpubot`, `probe`, `launch`, `kill`, `relaunch`), for two installs
    #: in one workspace: `{gpu: /gpu-staging, probe: /probe-staging}`. Unnamed keys keep `/<key>`.
    slash_commands: dict[str, str] = Field(default_factory=dict)


class LifecyclePolicy(_Model):
    """Launch/kill settings: a GPU counts as free below `gpu_free_mib` MiB used; `kill_grace_s` seconds between
    SIGTERM and SIGKILL; `release_timeout_s` seconds to wait for GPU memory to be released after a kill;
    `min_shm_free_mib` MiB of /dev/shm a launch needs."""

    gpu_free_mib: Number = 1024.0
    kill_grace_s: Number = 10.0
    release_timeout_s: Number = 60.0
    min_shm_free_mib: Number = 1024.0

    @field_validator("kill_grace_s", "release_timeout_s")
    @classmethod
    def _secs(cls, v: float) -> float:
        return _seconds(v)

    @field_validator("gpu_free_mib", "min_shm_free_mib")
    @classmethod
    def _mib(cls, v: float) -> float:
        if not 0 <= v <= 10_000_000:
            raise ValueError("must be 0..10000000 MiB")
        return v


#: A group containing a quantifier, itself quantified: `(a+)+`, `(\\w*x)*`, `(a|b+){2,}` (catastrophic
#: backtracking in Python's re, which has no timeout).
_NESTED_QUANTIFIER_RE = re.compile(r"\((?:[^()\\]|\\.)*[+*}](?:[^()\\]|\\.)*\)[+*{]")


class Config(_Model):
    """The whole configuration. `state_dir` holds the SQLite database and other state; `database_url`
    (any SQLAlchemy URL) replaces the default `sqlite:///STATE_DIR/gpubot.db`."""

    hosts: dict[str, HostConfig] = Field(default_factory=dict)
    variants: dict[str, VariantConfig] = Field(default_factory=dict)
    permissions: Permissions = Field(default_factory=Permissions)
    watch: WatchPolicy = Field(default_factory=WatchPolicy)
    slack: SlackSettings = Field(default_factory=SlackSettings)
    state_dir: str = "~/.local/state/gpubot"
    database_url: str | None = None
    lifecycle: LifecyclePolicy = Field(default_factory=LifecyclePolicy)
    default_host: str | None = None
    #: Extra secret patterns (Python regexes): whatever they match is masked in everything posted, on top
    #: of the built-in rules (bot/redact.py). E.g. `ACME-[0-9A-F]{32}` for an internal token format.
    redact_patterns: list[str] = Field(default_factory=list, max_length=100)

    @field_validator("redact_patterns")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        problems = []
        for i, pat in enumerate(v):
            where = f"[{i}] {pat[:60]!r}"
            if not pat or len(pat) > 500:
                problems.append(f"{where}: must be 1..500 characters")
                continue
            try:
                if re.compile(pat).search(""):
                    problems.append(f"{where}: matches the empty string")
            except re.error as e:
                problems.append(f"{where}: not a valid regex: {e}")
                continue
            if _NESTED_QUANTIFIER_RE.search(pat):
                problems.append(f"{where}: a repeated group that itself repeats (like `(a+)+`) can take exponential "
                                "time on a crafted log line; write it without the nesting")
        if problems:
            raise ValueError("; ".join(problems))
        return v


    def host_names(self) -> list[str]:
        """Configured host names, in file order."""
        return list(self.hosts)

    def resolved_variant(self, name: str) -> VariantConfig:
        """The variant with `extends` applied (child keys win; params and env are merged).

        Raises KeyError for an unknown variant.
        """
        chain: list[VariantConfig] = []
        cur: str | None = name
        seen: set[str] = set()
        while cur is not None:
            if cur in seen:
                raise KeyError(f"extends cycle at {cur}")
            seen.add(cur)
            chain.append(self.variants[cur])
            cur = self.variants[cur].extends
        merged: dict[str, Any] = {}
        for v in reversed(chain):
            data = v.model_dump(exclude_unset=True)
            for key, value in data.items():
                if key in ("params", "env") and key in merged:
                    merged[key] = {**merged[key], **value}
                elif key == "extra_args" and key in merged:
                    merged[key] = [*merged[key], *value]
                else:
                    merged[key] = value
        merged.pop("extends", None)
        return VariantConfig.model_validate(merged)


class _Index(int):
    """A list index in a location path (shown as `[i]`; a mapping key is shown as `.key`)."""


def _loc(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, _Index) else (f".{part}" if out else str(part))
    return out


def _is_env_map(path: tuple[Any, ...]) -> bool:
    """True for the path of `hosts.NAME.env` or `variants.NAME.env`, the maps that may hold ${NAME}."""
    return len(path) == 3 and path[0] in ("hosts", "variants") and path[2] == "env"


def _find_secret_keys(data: Any) -> list[tuple[str, str]]:
    """(location, error) for every secret-looking key with a literal value, anywhere in `data`."""
    out: list[tuple[str, str]] = []
    todo: list[tuple[tuple[Any, ...], Any]] = [((), data)]
    while todo:
        path, node = todo.pop()
        if isinstance(node, dict):
            children = list(node.items())
            for k, v in children:
                here = (*path, k)
                # Only env maps may name a secret, and only as a reference to the bot's environment.
                if isinstance(k, str) and SECRET_KEY_RE.search(k) and not isinstance(v, dict):
                    if not (_is_env_map(path) and isinstance(v, str) and ENV_REF_RE.fullmatch(v)):
                        out.append((_loc(here), f"{_loc(here)}: {SECRETS_HINT}"))
            todo.extend(((*path, k), v) for k, v in reversed(children))
        elif isinstance(node, list):
            todo.extend(((*path, _Index(i)), v) for i, v in reversed(list(enumerate(node))))
    return out


def _expand_env_refs(data: dict[str, Any], environ: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """A copy of `data` with every `hosts.*.env` / `variants.*.env` value that is exactly `${NAME}` replaced
    by environ[NAME], and an error for each NAME that is not set. `data` itself is not modified."""
    errors: list[str] = []
    out = dict(data)
    for section in ("hosts", "variants"):
        entries = data.get(section)
        if not isinstance(entries, dict):
            continue
        new_entries = dict(entries)
        for name, entry in entries.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("env"), dict):
                continue
            env = dict(entry["env"])
            for key, value in env.items():
                m = ENV_REF_RE.fullmatch(value) if isinstance(value, str) else None
                if m is None:
                    continue
                if m.group(1) in environ:
                    env[key] = environ[m.group(1)]
                else:
                    errors.append(f"{section}.{name}.env.{key}: environment variable {m.group(1)} is not set")
            new_entries[name] = {**entry, "env": env}
        out[section] = new_entries
    return out, errors


def _unwrap_model(annotation: Any, part: Any) -> Any:
    """The annotation one step below `annotation` at location part `part`, or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(part) if isinstance(part, str) else None
        return field.annotation if field is not None else None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _unwrap_model(args[0], part)
    if origin is dict:
        return args[1]
    if origin is list:
        return args[0]
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            below = _unwrap_model(arg, part)
            if below is not None:
                return below
    return None


def _as_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _as_model(args[0])
    if origin in (typing.Union, types.UnionType):
        return next((m for m in map(_as_model, args) if m is not None), None)
    return None


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that validates the mapping at `loc` (a pydantic error location), or None."""
    annotation: Any = Config
    for part in loc:
        annotation = _unwrap_model(annotation, part)
        if annotation is None:
            return None
    return _as_model(annotation)


def _unknown_key_message(loc: tuple[Any, ...]) -> str:
    model = _model_at(loc[:-1])
    if model is None or not loc:
        return "unknown key"
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    return f"unknown key; did you mean {close[0]!r}?" if close else "unknown key"


def _format_pydantic(e: ValidationError, skip_unknown: Collection[str] = ()) -> list[str]:
    """`location: message` strings for a pydantic error; "unknown key" is left out at `skip_unknown`."""
    out = []
    for err in e.errors(include_url=False):
        parts = tuple(p for p in err["loc"] if not str(p).startswith("function-"))
        loc = ".".join(str(p) for p in parts)
        msg = err["msg"]
        for prefix in ("Value error, ", "Assertion failed, "):
            if msg.startswith(prefix):
                msg = msg[len(prefix) :]
        if err["type"] == "extra_forbidden":
            if loc in skip_unknown:
                continue  # already reported as a secret
            msg = _unknown_key_message(parts)
        out.append(f"{loc or '(top level)'}: {msg}")
    return list(dict.fromkeys(out))


#: Characters a command template may not contain outside its {{ }} expressions: each can undo the
#: shell-quoting of a value (quotes and backslashes re-open or escape it; backticks and $( run it).
_FORBIDDEN_IN_COMMAND = (("'", "quotes"), ('"', "quotes"), ("\\", "backslashes"), ("`", "backticks"),
                         ("$(", "$( )"), ("${", "${ }"))
_ALLOWED_BLOCKS = frozenset({"if", "elif", "else", "endif"})


def command_template_problems(template: str) -> list[str]:
    """Shapes of a command template that would undo the shell-quoting of values (pure).

    Values are `shlex.quote`d BEFORE the template renders them, so the template must not be able to
    re-open or strip that quoting. Checked on Jinja2's own token stream: every `{{ }}` holds one plain
    name (no filters, indexing, calls or attributes); blocks are only if/elif/else/endif; no comments;
    and the literal text has no quotes, backslashes, backticks, `$(` or `${` (pass such values as params
    or extra_args, which gpubot quotes). Returns messages; empty when the template is safe.
    """
    problems: list[str] = []
    env = jinja2.sandbox.SandboxedEnvironment()
    try:
        tokens = list(env.lex(template))
    except jinja2.TemplateSyntaxError as e:
        return [f"template syntax error: {e.message}"]
    i = 0
    while i < len(tokens):
        _line, kind, value = tokens[i]
        if kind == "data":
            for bad, what in _FORBIDDEN_IN_COMMAND:
                if bad in value:
                    problems.append(f"{what} are not allowed in command templates (values are shell-quoted by "
                                    "gpubot; pass such text as a param or in extra_args)")
                    break
        elif kind in ("comment_begin", "linecomment_begin"):
            problems.append("comments are not allowed in command templates")
        elif kind in ("variable_begin", "block_begin"):
            end = "variable_end" if kind == "variable_begin" else "block_end"
            j = i + 1
            inner = []
            while j < len(tokens) and tokens[j][1] != end:
                if tokens[j][1] != "whitespace":
                    inner.append(tokens[j])
                j += 1
            if kind == "variable_begin" and not (len(inner) == 1 and inner[0][1] == "name"):
                text = " ".join(str(t[2]) for t in inner)[:40]
                problems.append(f"`{{{{ {text} }}}}`: only plain names are allowed in command templates (no "
                                "filters, indexing, calls or attributes: they would undo the shell quoting)")
            if kind == "block_begin" and (not inner or inner[0][2] not in _ALLOWED_BLOCKS):
                name = inner[0][2] if inner else "?"
                problems.append(f"`{{% {name} %}}`: only if/elif/else/endif blocks are allowed in command templates")
            i = j
        i += 1
    return list(dict.fromkeys(problems))


def _cross_checks(cfg: Config) -> list[str]:
    errors: list[str] = []
    env = jinja2.sandbox.SandboxedEnvironment()
    if cfg.default_host is not None and cfg.default_host not in cfg.hosts:
        errors.append(f"default_host: unknown host {cfg.default_host!r}")
    for name, v in cfg.variants.items():
        if v.extends is not None and v.extends not in cfg.variants:
            errors.append(f"variants.{name}.extends: unknown variant {v.extends!r}")
            continue
        try:
            rv = cfg.resolved_variant(name)
        except KeyError as e:
            errors.append(f"variants.{name}.extends: {e.args[0]}")
            continue
        if rv.host is None:
            errors.append(f"variants.{name}.host: required (directly or through extends)")
        elif rv.host not in cfg.hosts:
            errors.append(f"variants.{name}.host: unknown host {rv.host!r}; known: {', '.join(cfg.hosts)}")
        if not rv.command:
            errors.append(f"variants.{name}.command: required (directly or through extends)")
            continue
        for field_name, tmpl in (("command", rv.command), ("log", rv.log)):
            if tmpl is None:
                continue
            try:
                ast = env.parse(tmpl)
            except jinja2.TemplateSyntaxError as e:
                errors.append(f"variants.{name}.{field_name}: template syntax error: {e.message}")
                continue
            used = jinja2.meta.find_undeclared_variables(ast)
            unknown = sorted(used - set(rv.params) - BUILTIN_TEMPLATE_VARS)
            if unknown:
                errors.append(
                    f"variants.{name}.{field_name}: uses undeclared parameter(s) {', '.join(unknown)}; "
                    "declare them under params"
                )
        if rv.command:
            errors.extend(f"variants.{name}.command: {p}" for p in command_template_problems(rv.command))
        for pname, spec in rv.params.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", pname):
                errors.append(f"variants.{name}.params.{pname}: parameter names must be identifiers")
            if pname in BUILTIN_TEMPLATE_VARS:
                errors.append(f"variants.{name}.params.{pname}: {pname!r} is a built-in template variable "
                              f"(set by gpubot: {', '.join(sorted(BUILTIN_TEMPLATE_VARS))}); rename the param")
            if isinstance(spec, ParamSpec) and spec.choices is not None and spec.default is not None:
                if spec.default not in spec.choices:
                    errors.append(f"variants.{name}.params.{pname}.default: not one of the choices")
    return errors


def parse_config(data: Any, environ: Mapping[str, str] | None = None) -> Config:
    """Validate already-loaded YAML data and expand its `${NAME}` environment references.

    Values of `hosts.*.env` and `variants.*.env` that are exactly `${NAME}` are replaced by NAME from
    `environ` (default: `os.environ`). `data` is not modified. Returns a `Config`; raises `ConfigError`
    with every problem (including each referenced variable that is not set).
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(["(top level): must be a mapping of keys like hosts:, variants:, permissions:"])
    try:
        return _parse(data, os.environ if environ is None else environ)
    except RecursionError:
        raise ConfigError([f"(top level): nested too deeply (more than {MAX_YAML_DEPTH} levels)"]) from None


def _parse(data: dict[str, Any], environ: Mapping[str, str]) -> Config:
    secrets = _find_secret_keys(data)
    errors = [msg for _loc_, msg in secrets]
    for section in ("hosts", "variants"):
        names = data.get(section)
        if isinstance(names, dict):
            for name in names:
                if not NAME_RE.fullmatch(str(name)):
                    errors.append(f"{section}.{name}: name must be 1-63 letters, digits, '.', '_' or '-', "
                                  "starting with a letter or digit")
    # Secrets are looked for in the file as written; references are expanded only afterwards.
    data, env_errors = _expand_env_refs(data, environ)
    errors.extend(env_errors)
    try:
        cfg = Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(list(dict.fromkeys(errors + _format_pydantic(e, {loc for loc, _ in secrets})))) from None
    errors.extend(_cross_checks(cfg))
    errors = list(dict.fromkeys(errors))
    if errors:
        raise ConfigError(errors)
    return cfg


class _YAMLLimitError(Exception):
    """The YAML text is over one of the loader's limits; `mark` is where, when known."""

    def __init__(self, message: str, mark: Any = None):
        super().__init__(message)
        self.message = message
        self.mark = mark


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and caps aliases, depth and the expanded size.

    Duplicate keys are collected in `.duplicates` (as `location: duplicate key 'x' (line N)`) and the
    last one still wins, so every duplicate of the file is reported at once. Limits raise
    `_YAMLLimitError` during composition, before anything is constructed.
    """

    def __init__(self, stream: str):
        super().__init__(stream)
        self.duplicates: list[str] = []
        self._aliases = 0
        self._nodes = 0
        self._depth = 0
        self._paths: dict[int, str] = {}
        self._checked: set[int] = set()

    # -- compose: limits -----------------------------------------------------------------------------

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise _YAMLLimitError(f"more than {MAX_YAML_ALIASES} aliases (*name)", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        self._nodes += 1
        if self._nodes > MAX_YAML_VALUES:
            raise _YAMLLimitError(f"more than {MAX_YAML_VALUES} values", self.peek_event().start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _YAMLLimitError(f"nested more than {MAX_YAML_DEPTH} levels deep", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Any:
        node = super().compose_document()
        self._check_graph(node)
        return node

    def _check_graph(self, root: yaml.Node) -> None:
        """Walk the node graph once (aliases are shared nodes): refuse cycles, and documents that
        would be too deep or too large once aliases are expanded. Records each mapping's location."""
        size: dict[int, int] = {}
        depth: dict[int, int] = {}
        visiting: set[int] = set()
        stack: list[tuple[yaml.Node, str, bool]] = [(root, "", False)]
        while stack:
            node, path, done = stack.pop()
            nid = id(node)
            children = self._children(node)
            if done:
                visiting.discard(nid)
                size[nid] = min(1 + sum(size[id(c)] for c, _ in children), MAX_YAML_VALUES + 1)
                depth[nid] = 1 + max((depth[id(c)] for c, _ in children), default=0)
                # Without aliases, compose_node has already enforced both limits.
                if size[nid] > MAX_YAML_VALUES:
                    raise _YAMLLimitError(f"more than {MAX_YAML_VALUES} values once aliases are expanded",
                                          node.start_mark)
                if depth[nid] > MAX_YAML_DEPTH:
                    raise _YAMLLimitError(
                        f"nested more than {MAX_YAML_DEPTH} levels deep once aliases are expanded", node.start_mark
                    )
                continue
            if nid in size:
                continue
            if nid in visiting:
                raise _YAMLLimitError("an alias refers to a node that contains it (recursive structure)",
                                      node.start_mark)
            visiting.add(nid)
            self._paths.setdefault(nid, path)
            stack.append((node, path, True))
            for child, child_path in reversed(children):
                stack.append((child, self._join(path, child_path), False))

    @staticmethod
    def _children(node: yaml.Node) -> list[tuple[yaml.Node, str]]:
        if isinstance(node, yaml.MappingNode):
            out: list[tuple[yaml.Node, str]] = []
            for k, v in node.value:
                label = k.value if isinstance(k, yaml.ScalarNode) else "?"
                out.extend(((k, label), (v, label)))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [(v, f"[{i}]") for i, v in enumerate(node.value)]
        return []

    @staticmethod
    def _join(path: str, part: str) -> str:
        return path + part if part.startswith("[") else (f"{path}.{part}" if path else part)

    # -- construct: duplicate keys -------------------------------------------------------------------

    def _check_duplicates(self, node: yaml.MappingNode) -> None:
        # Runs before PyYAML flattens merge keys (<<) into the node, so overriding a merged key is fine.
        if id(node) in self._checked:
            return
        self._checked.add(id(node))
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            try:
                if key in seen:
                    loc = self._paths.get(id(node)) or "(top level)"
                    self.duplicates.append(f"{loc}: duplicate key {key!r} (line {key_node.start_mark.line + 1})")
                seen.add(key)
            except TypeError:  # unhashable: PyYAML reports it
                continue

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        self._check_duplicates(node)
        super().flatten_mapping(node)

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            self._check_duplicates(node)
        return super().construct_mapping(node, deep=deep)


def _read_yaml(p: Path, text: str) -> tuple[Any, list[str]]:
    """Parse `text` with `_ConfigLoader`: (data, duplicate-key errors). Raises ConfigError for syntax
    errors and the loader's limits."""
    try:
        loader = _ConfigLoader(text)  # PyYAML checks every character here
    except yaml.reader.ReaderError as e:  # a control character (NUL, ESC, ...) YAML does not allow
        pos = e.position
        where = f"line {text.count(chr(10), 0, pos) + 1}, column {pos - text.rfind(chr(10), 0, pos)}"
        char = f"#x{e.character:04x}" if isinstance(e.character, int) else repr(e.character)
        raise ConfigError([f"{p}:{where}: YAML syntax error: unacceptable character {char} ({e.reason})"]) from None
    try:
        data = loader.get_single_data()
    except _YAMLLimitError as e:
        mark = e.mark
        where = f":line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError([f"{p}{where}: {e.message}"]) from None
    except RecursionError:
        raise ConfigError([f"{p}: nested too deeply (more than {MAX_YAML_DEPTH} levels)"]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError([f"{p}:{where}: YAML syntax error: {problem}"]) from None
    finally:
        loader.dispose()
    return data, loader.duplicates


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate a YAML config file (`~` is expanded in `path`).

    `environ` (default `os.environ`) supplies the `${NAME}` references of `env:` maps. Returns the
    `Config`. Raises `ConfigError` (with `.errors`, one `location: message` string each) for unreadable
    files, files over 1 MiB, YAML syntax errors (with line and column), duplicate keys, too many aliases
    or too deep nesting, unset referenced variables and schema violations.
    """
    p = Path(path).expanduser()
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError([f"{p}: file is larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB; "
                               "a gpubot config is a few KiB (is this the right file?)"])
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"{p}: cannot read: {e}"]) from None
    data, duplicates = _read_yaml(p, text)
    try:
        cfg = parse_config(data, environ)
    except ConfigError as e:
        raise ConfigError(duplicates + [err for err in e.errors if err not in duplicates]) from None
    if duplicates:
        raise ConfigError(duplicates)
    return cfg


def _path_problem(value: str) -> str | None:
    """Why the local file `value` (`~` expanded) is unusable, or None when it is a readable file."""
    try:
        st = os.stat(Path(value).expanduser())
    except (FileNotFoundError, NotADirectoryError):
        return "does not exist on this machine"
    except OSError as e:
        return f"cannot be checked ({e.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    return None


def config_warnings(cfg: Config) -> list[str]:
    """Problems that do not make `cfg` invalid but will make something fail or be disabled (pure apart
    from checking that files exist on this machine).

    Returns `location: message` strings, empty when there is nothing to say: no hosts configured; an SSH
    host whose `known_hosts` or `key_file` does not exist here; a host with no `log_dirs` (`/probe log=`
    reads are then refused); an env value with `${...}` that is not the whole value (passed literally).
    Never raises for a valid `Config`.
    """
    out: list[str] = []
    if not cfg.hosts:
        out.append("hosts: no hosts configured; /gpu status and /probe have nothing to look at")
    for name, host in cfg.hosts.items():
        if not host.local:
            for field_name, consequence in (("known_hosts", "host keys cannot be verified, so SSH connections "
                                             "will be refused"), ("key_file", "SSH logins with it will fail")):
                value = getattr(host, field_name)
                problem = _path_problem(value) if value else None
                if problem:
                    out.append(f"hosts.{name}.{field_name}: {value} {problem}; {consequence}")
        if not host.log_dirs:
            out.append(f"hosts.{name}.log_dirs: not set, so /probe log= reads are disabled on this host")
    env_maps = [(f"hosts.{n}.env", h.env) for n, h in cfg.hosts.items()]
    env_maps += [(f"variants.{n}.env", v.env) for n, v in cfg.variants.items()]
    for where, env in env_maps:
        for key, value in env.items():
            if "${" in value and not ENV_REF_RE.fullmatch(value):
                out.append(f"{where}.{key}: only a value that is exactly ${{NAME}} is expanded; "
                           "this one is passed literally")
    return out
