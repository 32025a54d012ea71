"""YAML configuration -> validated pydantic models.

The file describes hosts, server variants, permissions and the watch policy. Secrets are never read
from it: Slack tokens and signing secrets come from the environment (SLACK_BOT_TOKEN, SLACK_APP_TOKEN,
SLACK_SIGNING_SECRET). `load_config` raises `ConfigError` listing every problem with its location,
e.g. `hosts.gpu-host-1.port: must be 1..65535`.

The documented schema with every key lives in `deploy/config.example.yaml`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import jinja2
import jinja2.meta
import jinja2.sandbox
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

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

#: Names a variant's command template may use besides its declared params.
BUILTIN_TEMPLATE_VARS = frozenset({"port", "variant", "launch_id", "log", "host", "gpus", "cuda_visible_devices"})


class ConfigError(Exception):
    """Raised by `load_config` / `parse_config`; `.errors` is a list of `location: message` strings."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("\n".join(errors))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class HostConfig(_Model):
    """One GPU host reached over SSH, or the machine the bot runs on (`local: true`).

    `port` 1..65535; `connect_timeout_s` / `command_timeout_s` seconds; `max_channels` concurrent SSH
    session channels per connection (keep below the server's MaxSessions, OpenSSH default 10).
    `known_hosts` is required for SSH hosts: host keys are always verified.
    """

    address: str | None = None
    port: int = 22
    user: str | None = None
    key_file: str | None = None
    known_hosts: str | None = None
    local: bool = False
    connect_timeout_s: float = 10.0
    command_timeout_s: float = 30.0
    keepalive_interval_s: float = 15.0
    max_channels: int = 8
    nvidia_smi: str = "nvidia-smi"
    nvidia_smi_timeout_s: float = 10.0
    use_nvml: bool = True
    gpu_note: str | None = None
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
        if not 0 < v <= 3600:
            raise ValueError("must be > 0 and <= 3600 seconds")
        return v

    @field_validator("nvidia_smi")
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
    min: float | None = None
    max: float | None = None
    description: str | None = None

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

    interval_s: float = 30.0
    silence_after_s: float = 300.0
    phase_grace_s: dict[str, float] = Field(default_factory=dict)
    digest_cron: str | None = None
    digest_channel: str | None = None

    @field_validator("interval_s", "silence_after_s")
    @classmethod
    def _pos(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be > 0 seconds")
        return v

    @field_validator("phase_grace_s")
    @classmethod
    def _phases(cls, v: dict[str, float]) -> dict[str, float]:
        known = {"comm_init", "weight_loading", "kv_cache_alloc", "cuda_graph_capture", "warmup", "serving"}
        for k, s in v.items():
            if k not in known:
                raise ValueError(f"unknown phase {k!r}; known: {', '.join(sorted(known))}")
            if s <= 0:
                raise ValueError(f"grace for {k} must be > 0 seconds")
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
    port: int | None = None
    health: str | None = None
    gpus: list[int] | None = None
    engine: Literal["sglang", "vllm", "tgi", "trtllm", "generic"] | None = None
    watch: WatchPolicy | None = None

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
    """Non-secret Slack settings. Tokens are read from the environment only."""

    command_prefix: str = "!"
    bot_name: str = "gpubot"
    api_url: str | None = None


class Config(_Model):
    """The whole configuration. `state_dir` holds the SQLite database and other state."""

    hosts: dict[str, HostConfig] = Field(default_factory=dict)
    variants: dict[str, VariantConfig] = Field(default_factory=dict)
    permissions: Permissions = Field(default_factory=Permissions)
    watch: WatchPolicy = Field(default_factory=WatchPolicy)
    slack: SlackSettings = Field(default_factory=SlackSettings)
    state_dir: str = "~/.local/state/gpubot"
    default_host: str | None = None


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


def _find_secret_keys(data: Any, path: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(data, dict):
        for k, v in data.items():
            loc = f"{path}.{k}" if path else str(k)
            # env maps and params are allowed to *name* things like HF_TOKEN only via ${ENV} references.
            if isinstance(k, str) and SECRET_KEY_RE.search(k) and not isinstance(v, dict):
                if isinstance(v, str) and re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}", v):
                    continue
                out.append(
                    f"{loc}: secrets are never read from the config file; "
                    "put them in the environment (e.g. SLACK_BOT_TOKEN) or reference one as ${NAME}"
                )
            out.extend(_find_secret_keys(v, loc))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out.extend(_find_secret_keys(v, f"{path}[{i}]"))
    return out


def _format_pydantic(e: ValidationError) -> list[str]:
    out = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        # drop pydantic's union branch names from locations
        loc = re.sub(r"\.(ParamSpec|str|int|float|bool)(?=\.|$)", "", loc)
        msg = err["msg"]
        for prefix in ("Value error, ", "Assertion failed, "):
            if msg.startswith(prefix):
                msg = msg[len(prefix) :]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        out.append(f"{loc or '(top level)'}: {msg}")
    return sorted(set(out), key=out.index)


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
        for pname, spec in rv.params.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", pname):
                errors.append(f"variants.{name}.params.{pname}: parameter names must be identifiers")
            if isinstance(spec, ParamSpec) and spec.choices is not None and spec.default is not None:
                if spec.default not in spec.choices:
                    errors.append(f"variants.{name}.params.{pname}.default: not one of the choices")
    return errors


def parse_config(data: Any) -> Config:
    """Validate already-loaded YAML data. Returns a `Config`; raises `ConfigError` with every problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(["(top level): must be a mapping of keys like hosts:, variants:, permissions:"])
    errors = _find_secret_keys(data)
    for section in ("hosts", "variants"):
        names = data.get(section)
        if isinstance(names, dict):
            for name in names:
                if not NAME_RE.fullmatch(str(name)):
                    errors.append(f"{section}.{name}: name must be 1-63 letters, digits, '.', '_' or '-', "
                                  "starting with a letter or digit")
    try:
        cfg = Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(errors + _format_pydantic(e)) from None
    errors.extend(_cross_checks(cfg))
    errors = list(dict.fromkeys(errors))
    if errors:
        raise ConfigError(errors)
    return cfg


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file.

    Returns the `Config`. Raises `ConfigError` (with `.errors`, one `location: message` string each)
    for unreadable files, YAML syntax errors (with line and column) and schema violations.
    """
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"{p}: cannot read: {e}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError([f"{p}:{where}: YAML syntax error: {problem}"]) from None
    return parse_config(data)
