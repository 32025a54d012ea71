"""YAML configuration -> validated pydantic models.

The file describes hosts, server variants, permissions and the watch policy. Secrets are never read
from it: Slack tokens and signing secrets come from the environment (SLACK_BOT_TOKEN, SLACK_APP_TOKEN,
SLACK_SIGNING_SECRET). An `env:` value that is exactly `${NAME}` is replaced at load time by the
environment variable NAME. `load_config` raises `ConfigError` listing every problem with its location,
e.g. `hosts.gpu-host-1.port: must be 1..65535`; `config_warnings` lists problems that do not stop the bot.

YAML is read with a strict SafeLoader: duplicate keys are errors, and alias use, nesting depth, the
number of values and the file size are capped, so a hostile or broken file cannot hang or crash the bot.

The documented schema with every key lives in `deploy/config.example.yaml`.

The package, bottom to top (a module imports only those above it in this list):
  errors.py   `ConfigError`; pydantic errors -> `location: message` strings
  schema.py   the pydantic models, their field validators and the constants they use
  checks.py   checks after schema validation: cross references, command templates, warnings
  loader.py   YAML reading, secret scan, `${NAME}` expansion: `load_config`, `parse_config`
  variants.py what a variant means for one launch: params validated, command and log path rendered
Import from `bot.config`; every public name is re-exported here. (The digest cron and the slash command
names are checked by the layers that know them: bot.wiring.check_config.)
"""

from bot.config.checks import BUILTIN_TEMPLATE_VARS, command_template_problems, config_warnings
from bot.config.errors import ConfigError
from bot.config.loader import (
    MAX_CONFIG_BYTES,
    MAX_YAML_ALIASES,
    MAX_YAML_DEPTH,
    MAX_YAML_VALUES,
    SECRET_KEY_RE,
    SECRETS_HINT,
    load_config,
    parse_config,
)
from bot.config.schema import (
    ENV_REF_RE,
    MAX_SECONDS,
    MAX_WATCH_SECONDS,
    NAME_RE,
    SLACK_CHANNEL_RE,
    SLACK_GROUP_RE,
    SLACK_USER_RE,
    Config,
    GenerateCheck,
    HostConfig,
    Int,
    LifecyclePolicy,
    MetricsSettings,
    Number,
    ParamSpec,
    Permissions,
    SlackSettings,
    VariantConfig,
    WatchPolicy,
)
from bot.config.variants import coerce_param, param_specs, placement_plan, render_launch, resolve_params

__all__ = [
    "BUILTIN_TEMPLATE_VARS",
    "ENV_REF_RE",
    "MAX_CONFIG_BYTES",
    "MAX_SECONDS",
    "MAX_WATCH_SECONDS",
    "MAX_YAML_ALIASES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_VALUES",
    "NAME_RE",
    "SECRETS_HINT",
    "SECRET_KEY_RE",
    "SLACK_CHANNEL_RE",
    "SLACK_GROUP_RE",
    "SLACK_USER_RE",
    "Config",
    "ConfigError",
    "GenerateCheck",
    "HostConfig",
    "Int",
    "LifecyclePolicy",
    "MetricsSettings",
    "Number",
    "ParamSpec",
    "Permissions",
    "SlackSettings",
    "VariantConfig",
    "WatchPolicy",
    "coerce_param",
    "command_template_problems",
    "config_warnings",
    "load_config",
    "param_specs",
    "parse_config",
    "placement_plan",
    "render_launch",
    "resolve_params",
]
