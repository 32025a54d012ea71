"""The config schema: pydantic models with their field validators, and the constants they use.

Every model forbids unknown keys. Units, ranges and formats of each setting are in the model docstrings;
the documented example with every key is `deploy/config.example.yaml`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
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

#: An environment reference: a value that is exactly `${NAME}` (the format of `env:` values that the loader
#: expands; checks warns about `${` elsewhere in a value).
ENV_REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

#: Upper bound of every duration setting, in seconds.
MAX_SECONDS = 3600
#: Watch durations may be long: a cold 600 GB checkpoint can take over an hour to load (one day at most).
MAX_WATCH_SECONDS = 86400


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


def _not_bool(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError(f"must be a number, not {str(v).lower()}")
    return v


#: An integer as YAML writes it: `true` is not 1, and "22" or 22.0 are not 22.
Int = Annotated[int, Strict()]


def _within(value: int, low: int, high: int, what: str = "") -> int:
    """`value` when low <= value <= high; raises ValueError "must be LOW..HIGH" (plus `what`) otherwise."""
    if not low <= value <= high:
        raise ValueError(f"must be {low}..{high}{what}")
    return value


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
    `known_hosts` is required for SSH hosts: host keys are always verified. `probe_agent` (default true) keeps one
    shell running on each SSH connection that takes the probes, so a probe opens no new SSH channel (one round
    trip, no shell start-up); false opens a channel per probe. `nvml_python`: the path of a Python on the host that
    can `import pynvml` (nvidia-ml-py); GPU readings then come from a small reader kept running on the connection
    (NVML initialised once, one request and answer per probe) instead of two nvidia-smi runs per probe, and
    nvidia-smi is used whenever the reader cannot answer. `systemd: auto` runs each launch
    in its own transient systemd scope where the host's systemd allows it (root, or a user with lingering
    on), so a kill stops its whole cgroup; `off` never does. `cgroup: auto` runs each launch that no systemd scope
    takes in a cgroup v2 directory of its own (`<cgroup2 mount>/gpubot/gpubot-<tag>.launch`) where this user may
    make one (root, or a delegated `gpubot` directory), so a kill stops every process of the launch through its
    `cgroup.kill`, even one that left its session and cleared its environment; `off` never does.
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
    probe_agent: bool = True
    #: The host group (`host_groups:`) whose keys this host takes where it sets none (bot.config.fleet).
    group: str | None = None
    nvml_python: str | None = None
    nvidia_smi: str = "nvidia-smi"
    nvidia_smi_timeout_s: Number = 10.0
    use_nvml: bool = True
    gpu_note: str | None = None
    py_spy: str = "py-spy"
    py_spy_sudo: bool = False
    systemd: Literal["auto", "off"] = "auto"
    cgroup: Literal["auto", "off"] = "auto"
    env: dict[str, str] = Field(default_factory=dict)
    log_dirs: list[str] = Field(default_factory=list)
    #: `slurm`: this host is a Slurm cluster's login node, where variants on it submit jobs (sbatch) unless they
    #: say `runner: ssh`; `ssh` (default): launches run on it directly.
    runner: Literal["ssh", "slurm"] = "ssh"
    #: The cluster's slurm.conf when Slurm's commands on this host do not find it by default (SLURM_CONF).
    slurm_conf: str | None = None

    @field_validator("systemd", "cgroup", mode="before")
    @classmethod
    def _systemd(cls, v: Any) -> Any:
        # YAML 1.1 reads an unquoted `off` (and `no`, `false`) as False, `on`/`yes`/`true` as True
        words = {"off": "off", "no": "off", "false": "off", "auto": "auto", "on": "auto", "yes": "auto",
                 "true": "auto"}
        if isinstance(v, bool):
            return "auto" if v else "off"
        return words.get(v.strip().lower(), v) if isinstance(v, str) else v

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
        return _within(v, 1, 65535)

    @field_validator("max_channels")
    @classmethod
    def _channels(cls, v: int) -> int:
        return _within(v, 1, 64)

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
    secret: bool = False

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
    """How launches are followed, in seconds: while starting, a readiness check every `interval_s` (log
    silence tolerated: `silence_after_s`, or `phase_grace_s` per phase); once ready, a liveness check every
    `serving_interval_s` (process alive, health endpoint, log, GPUs) that alerts after `health_failures`
    failed health checks in a row; with the log silent for `phase_grace_s.serving` (default
    `serving_interval_s`) and idle or spinning GPUs, failing health checks that time out are a serving hang.
    On a new `silent_hang` the watcher dumps every rank's stack with py-spy (`stack_dump_on_hang`; with C frames
    when `stack_dump_native`), says where the ranks wait in the alert and attaches the dump."""

    interval_s: Number = 30.0
    silence_after_s: Number = 300.0
    phase_grace_s: dict[str, Number] = Field(default_factory=dict)
    serving_interval_s: Number = 60.0
    health_failures: int = Field(default=3, ge=1, le=100)
    stack_dump_on_hang: bool = True
    stack_dump_native: bool = False
    digest_cron: str | None = None
    digest_channel: str | None = None

    @field_validator("interval_s", "silence_after_s", "serving_interval_s")
    @classmethod
    def _pos(cls, v: float) -> float:
        return _seconds(v, limit=MAX_WATCH_SECONDS)

    def overridden_by(self, other: WatchPolicy | None) -> WatchPolicy:
        """This policy with the keys `other` sets (a variant's own `watch:`) replaced, key by key; its
        `phase_grace_s` entries are merged over this one's. `other` None: this policy."""
        if other is None:
            return self
        update = {k: getattr(other, k) for k in other.model_fields_set}
        if "phase_grace_s" in update:
            update["phase_grace_s"] = {**self.phase_grace_s, **other.phase_grace_s}
        return self.model_copy(update=update)

    @property
    def serving_silence_s(self) -> float:
        """Seconds of log silence that, with failing health checks, make a serving hang."""
        return float(self.phase_grace_s.get("serving", self.serving_interval_s))

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


#: The generation checks a variant may name by engine: path, JSON body (None: a GET).
GENERATE_PRESETS: Mapping[str, tuple[str, dict[str, Any] | None]] = MappingProxyType({
    "sglang": ("/health_generate", None),
    "openai": ("/v1/completions", {"prompt": "Hi", "max_tokens": 1, "temperature": 0}),
    "tgi": ("/generate", {"inputs": "Hi", "parameters": {"max_new_tokens": 1}}),
})


#: Seconds a generation check's timeout is kept under its host's command timeout (the rest of the probe's budget).
GENERATE_MARGIN_S = 2.0


class GenerateCheck(_Model):
    """A generation check beside the health endpoint: a request that makes the engine produce a token, so a server
    whose HTTP front answers `/health` while generation hangs is seen.

    `preset`: `sglang` (GET `/health_generate`), `openai` (POST `/v1/completions`, `max_tokens: 1`), `tgi` (POST
    `/generate`, `max_new_tokens: 1`) or `custom` (`path`, and `body` for a POST). `path` and `body` override the
    preset's; `model` is put in an OpenAI body (servers that need it: vLLM before 0.6, several gateways). Timing, in
    seconds: each check waits up to `timeout_s` for the answer; it runs on every liveness check once the log has
    been silent for `grace_s`, and otherwise at most every `interval_s` (a busy server is not asked for more
    tokens than it needs). `failures` checks in a row that get no token in time (a timeout, or SGLang's 503) with the
    log silent make a serving hang (while the log moves, a slow answer is a busy server: no alert); that many that
    fail otherwise (another HTTP error) make `unhealthy`. A variant names it as `generate: openai` or as a
    mapping of these keys."""

    preset: Literal["sglang", "openai", "tgi", "custom"] = "custom"
    path: str | None = None
    body: dict[str, Any] | None = None
    model: str | None = Field(default=None, max_length=200)
    timeout_s: Number = 20.0
    grace_s: Number = 60.0
    interval_s: Number = 600.0
    failures: int = Field(default=2, ge=1, le=20)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return {"preset": v} if isinstance(v, str) else v

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"/[A-Za-z0-9_./-]{0,200}", v):
            raise ValueError("must be a path like /v1/completions")
        return v

    @field_validator("timeout_s")
    @classmethod
    def _timeout(cls, v: float) -> float:
        v = _seconds(v)
        if not 1 <= v <= 300:
            raise ValueError("must be 1..300 seconds")
        return v

    @field_validator("grace_s", "interval_s")
    @classmethod
    def _every(cls, v: float) -> float:
        return _seconds(v, limit=MAX_WATCH_SECONDS)

    @field_validator("body")
    @classmethod
    def _body(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and len(json.dumps(v)) > 4096:
            raise ValueError("must be at most 4096 characters as JSON")
        return v

    @model_validator(mode="after")
    def _complete(self) -> GenerateCheck:
        if self.preset == "custom" and self.path is None:
            raise ValueError("a custom generation check needs a `path` (or name a preset: sglang, openai, tgi)")
        return self

    def timeout_under(self, command_timeout_s: float) -> float:
        """Seconds the check may wait on a host whose probe gets `command_timeout_s` seconds: `timeout_s`, kept
        GENERATE_MARGIN_S under the command timeout (at least 1), so the probe still answers."""
        return min(self.timeout_s, max(1.0, command_timeout_s - GENERATE_MARGIN_S))

    def request(self) -> tuple[str, str | None]:
        """(path, JSON body or None for a GET) of this check: the preset's, with `path`, `body` and `model` over it."""
        path, body = GENERATE_PRESETS.get(self.preset, (None, None))
        path = self.path or path or "/"
        body = dict(self.body) if self.body is not None else (dict(body) if body is not None else None)
        if self.model is not None and body is not None:
            body["model"] = self.model
        # ASCII JSON (\\uXXXX escapes): any text of the config goes, a lone surrogate included
        return path, None if body is None else json.dumps(body, separators=(",", ":"), ensure_ascii=True)


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
    generate: GenerateCheck | None = None
    gpus: list[Int] | None = None
    #: How many GPUs the launch takes, chosen at launch among the free ones (bot.core.placement): of the one host
    #: named, or of a host picked from the group named by `host: group:NAME`. Into `{{ gpus }}` and
    #: `{{ cuda_visible_devices }}` like fixed `gpus`.
    gpu_count: Int | None = None
    engine: Literal["sglang", "vllm", "tgi", "trtllm", "llamacpp", "lmdeploy", "generic"] | None = None
    watch: WatchPolicy | None = None
    #: How the launch starts: `ssh` (its process tree on `host`, or one per host of `hosts`) or `slurm` (a job
    #: submitted with sbatch on `host`, the cluster's login node). Default: the host's `runner`.
    runner: Literal["ssh", "slurm"] | None = None
    #: A multi-host launch over SSH (no scheduler): one process tree per host, rank = position in this list,
    #: `host` (when given) must be the first; one launch, one thread, one watch, one kill.
    hosts: list[str] | None = None
    #: Slurm (runner: slurm): how many nodes (one task per node), GPUs per node (`--gres=gpu:N`), and the optional
    #: partition, time limit, account and other `--name=value` sbatch options (bot.core.slurm.sbatch_problems).
    nodes: Int | None = None
    gpus_per_node: Int | None = None
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    extra_sbatch: list[str] = Field(default_factory=list)
    #: The rendezvous port of a launch across nodes (`{{ master_port }}`, on `{{ master_addr }}`, rank 0's node).
    master_port: Int = 29500

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
        return None if v is None else _within(v, 1, 65535)

    @field_validator("master_port")
    @classmethod
    def _master_port(cls, v: int) -> int:
        return _within(v, 1, 65535)

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            if not 2 <= len(v) <= 64:
                raise ValueError("a multi-host variant names 2..64 hosts (one host: use `host:`)")
            if len(set(v)) != len(v):
                raise ValueError("each host may be named once")
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

    @field_validator("gpu_count")
    @classmethod
    def _gpu_count(cls, v: int | None) -> int | None:
        return None if v is None else _within(v, 1, 256, " (GPUs one launch takes)")

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
    `gpubot manifest`). `command_prefix` is 1..3 of `! ? . $ % + = ^ , ; : |` (and `-`/`~` after the first);
    `bot_name` (the app's name and display name in the manifest) 1..35 lower-case letters, digits, `.`,
    `_` or `-`."""

    command_prefix: str = "!"
    bot_name: str = "gpubot"
    api_url: str | None = None
    post_interval_s: float = Field(default=1.0, ge=0.0, le=60.0)
    progress_after_s: float = Field(default=0.5, ge=0.0, le=10.0)
    #: Slash command names by key (`gpu`, `gpubot`, `probe`, `launch`, `kill`, `relaunch`), for two installs
    #: in one workspace: `{gpu: /gpu-staging, probe: /probe-staging}`. Unnamed keys keep `/<key>`.
    slash_commands: dict[str, str] = Field(default_factory=dict)

    @field_validator("command_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not re.fullmatch(r"[!?.$%+=^,;:|~-]{1,3}", v) or v.startswith(("-", "~")):
            raise ValueError(
                "must be 1..3 of the characters ! ? . $ % + = ^ , ; : | (and - or ~ after the first), like ! or ?: "
                "/ would suggest the slash commands of another install, # starts a comment in the console, Slack "
                "delivers & < > escaped, and * _ ` @ are Slack formatting or mentions")
        return v

    @field_validator("bot_name")
    @classmethod
    def _bot_name(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,34}", v):
            raise ValueError("must be 1..35 lower-case letters, digits, '.', '_' or '-' (Slack's rule for an app's "
                             "display name), like gpubot-staging")
        return v


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


class MetricsSettings(_Model):
    """Where the bot serves `/metrics` (Prometheus) and `/healthz`: `port` (none: not served, unless `gpubot run
    --metrics-port` asks) on `host` (loopback by default: a scraper on the same machine or a sidecar; `0.0.0.0` in a
    container whose port is published)."""

    port: int | None = Field(default=None, ge=1, le=65535)
    host: str = Field(default="127.0.0.1", min_length=1, max_length=253)


class Config(_Model):
    """The whole configuration. `state_dir` holds the SQLite database and other state; `database_url`
    (any SQLAlchemy URL) replaces the default `sqlite:///STATE_DIR/gpubot.db`."""

    hosts: dict[str, HostConfig] = Field(default_factory=dict)
    #: Group name -> the host keys its hosts share (bot.config.fleet: merged into each host that names the group
    #: before validation; kept here so commands can name a group).
    host_groups: dict[str, dict[str, Any]] = Field(default_factory=dict)
    variants: dict[str, VariantConfig] = Field(default_factory=dict)
    permissions: Permissions = Field(default_factory=Permissions)
    #: The values the loader put in for `${NAME}` references of env maps (secrets kept out of the file):
    #: masked by value in everything posted, stored or logged. Not a config key.
    _expanded_env_values: tuple[str, ...] = PrivateAttr(default=())
    watch: WatchPolicy = Field(default_factory=WatchPolicy)
    slack: SlackSettings = Field(default_factory=SlackSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    state_dir: str = "~/.local/state/gpubot"
    database_url: str | None = None
    lifecycle: LifecyclePolicy = Field(default_factory=LifecyclePolicy)
    default_host: str | None = None
    #: Probes running at once at most (hosts probed in parallel by `/gpu status all`, watch checks, commands); the
    #: others wait for a slot. One fleet status spread over the probe workers has the same bound, shared among them.
    #: Each probe also has a deadline: its host's connect, command and nvidia-smi timeouts.
    probe_concurrency: Int = 32

    @field_validator("probe_concurrency")
    @classmethod
    def _probe_concurrency(cls, v: int) -> int:
        return _within(v, 1, 1024, " (probes at once over all hosts)")

    #: Probe worker processes (bot.adapters.probe_pool) for a `/gpu status` of 8 SSH hosts or more: each probes its
    #: share of the hosts over connections of its own, off the event loop that acks Slack. Unset (null): one per
    #: usable CPU but one, at most 8, none below 4 usable CPUs (probe_pool.probe_worker_count); 0: none.
    probe_workers: Int | None = None

    @field_validator("probe_workers")
    @classmethod
    def _probe_workers(cls, v: int | None) -> int | None:
        return None if v is None else _within(v, 0, 64, " (probe worker processes)")
    #: Extra secret patterns (Python regexes): whatever they match is masked in everything posted, on top
    #: of the built-in rules (bot/core/redact.py). E.g. `ACME-[0-9A-F]{32}` for an internal token format.
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

    def group_hosts(self, group: str) -> list[str]:
        """The hosts of `group` (those whose entry says `group: NAME`), in file order; [] for an unknown group."""
        return [name for name, h in self.hosts.items() if h.group == group]

    @property
    def expanded_env_values(self) -> tuple[str, ...]:
        """The values the loader put in for `${NAME}` references of `hosts.*.env` / `variants.*.env` (empty
        for a config not made by the loader)."""
        return self._expanded_env_values

    def runner_of(self, v: VariantConfig) -> str:
        """How a (resolved) variant starts: its own `runner`, else its host's (`slurm` on a login node), else `ssh`."""
        if v.runner is not None:
            return v.runner
        host = self.hosts.get(v.host or "")
        return host.runner if host is not None and not v.hosts else "ssh"

    def resolved_variant(self, name: str) -> VariantConfig:
        """The variant with `extends` applied (child keys win; params, env and watch (with its phase_grace_s)
        are merged key by key).

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
                elif key == "watch" and isinstance(merged.get(key), dict) and isinstance(value, dict):
                    grace = {**merged[key].get("phase_grace_s", {}), **value.get("phase_grace_s", {})}
                    merged[key] = {**merged[key], **value, **({"phase_grace_s": grace} if grace else {})}
                elif key == "extra_args" and key in merged:
                    merged[key] = [*merged[key], *value]
                else:
                    merged[key] = value
        merged.pop("extends", None)
        if merged.get("hosts") and not merged.get("host"):
            merged["host"] = merged["hosts"][0]  # a multi-host variant's rank 0
        return VariantConfig.model_validate(merged)
