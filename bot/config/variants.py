"""What a variant means for one launch: its declared params validated and typed, then its command and log
path rendered (pure).

Nothing a user typed reaches a shell unquoted: every value is validated against the variant's declared
params, then `shlex.quote`d before the sandboxed Jinja2 template renders it (and the template itself was
checked not to undo the quoting: checks.command_template_problems).
"""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

import jinja2
import jinja2.sandbox

from bot.config.checks import command_template_problems
from bot.config.schema import Config, ParamSpec, VariantConfig
from bot.core.lifecycle import LAUNCH_ENV, LaunchError, RenderedLaunch, exec_problems
from bot.core.placement import GROUP_PREFIX, PlacementPlan
from bot.core.ranks import base_tag, rank_log

_CTRL_RE = re.compile(r"[\x00-\x1f\x7f]")


def param_specs(variant: VariantConfig) -> dict[str, ParamSpec]:
    """The variant's params as ParamSpec; a bare scalar is a param of that type with that default."""
    out: dict[str, ParamSpec] = {}
    for name, spec in variant.params.items():
        if isinstance(spec, ParamSpec):
            out[name] = spec
        else:
            kind = "bool" if isinstance(spec, bool) else "int" if isinstance(spec, int) else \
                "float" if isinstance(spec, float) else "path" if str(spec).startswith("/") else "str"
            out[name] = ParamSpec(type=kind, default=spec)
    return out


def coerce_param(name: str, spec: ParamSpec, raw: Any) -> Any:
    """Validate one value against its spec and return it typed (str, int, float or bool).

    Raises LaunchError with a message naming the param. Strings may not start with '-' (no smuggled
    flags), contain control characters or newlines, or exceed 1024 characters; paths must be absolute
    without `..`.
    """
    if isinstance(raw, str):
        text = raw
        if len(text) > 1024 or _CTRL_RE.search(text):
            raise LaunchError(f"{name}: value must be at most 1024 characters, without newlines or control characters")
    else:
        text = str(raw)
    value: Any
    try:
        if spec.type == "int":
            if isinstance(raw, bool) or not re.fullmatch(r"-?[0-9]{1,12}", text.strip()):
                raise ValueError
            value = int(text)
        elif spec.type == "float":
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
        elif spec.type == "bool":
            lowered = text.strip().lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                raise ValueError
            value = lowered in ("true", "1", "yes", "on")
        else:
            value = text
    except ValueError:
        raise LaunchError(f"{name}: {text[:60]!r} is not a valid {spec.type}") from None
    if spec.type in ("str", "path"):
        if value.startswith("-"):
            raise LaunchError(f"{name}: values may not start with '-' (no extra flags through params)")
        if spec.type == "path" and (not value.startswith("/") or "/../" in value + "/"):
            raise LaunchError(f"{name}: must be an absolute path without '..'")
    if spec.choices is not None and value not in spec.choices:
        raise LaunchError(f"{name}: must be one of {', '.join(map(str, spec.choices))}")
    if spec.regex is not None and not re.fullmatch(spec.regex, str(value)):
        raise LaunchError(f"{name}: {str(value)[:60]!r} does not match {spec.regex}")
    if spec.type in ("int", "float"):
        if spec.min is not None and value < spec.min:
            raise LaunchError(f"{name}: must be >= {spec.min:g}")
        if spec.max is not None and value > spec.max:
            raise LaunchError(f"{name}: must be <= {spec.max:g}")
    return value


def resolve_params(variant: VariantConfig, given: dict[str, str]) -> dict[str, Any]:
    """Declared params with defaults, overridden by `given` (only declared names may be set).

    Returns typed values. Raises LaunchError for unknown names, invalid values and missing required
    params (declared without a default).
    """
    specs = param_specs(variant)
    unknown = sorted(set(given) - set(specs))
    if unknown:
        known = ", ".join(sorted(specs)) or "(none)"
        raise LaunchError(f"unknown parameter(s) {', '.join(unknown)}; this variant declares: {known}")
    out: dict[str, Any] = {}
    for name, spec in specs.items():
        if name in given:
            out[name] = coerce_param(name, spec, given[name])
        elif spec.default is not None:
            out[name] = coerce_param(name, spec, spec.default)
        else:
            raise LaunchError(f"{name}: required (no default); pass {name}=VALUE")
    return out


def _quote_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return shlex.quote(str(v))


_ENV = jinja2.sandbox.ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False)


def _variant(config: Config, variant_name: str) -> VariantConfig:
    """The variant resolved (extends applied). Raises LaunchError for an unknown one."""
    if variant_name not in config.variants:
        known = ", ".join(config.variants) or "(none configured)"
        raise LaunchError(f"unknown variant {variant_name[:40]!r}; known variants: {known}")
    return config.resolved_variant(variant_name)


def placement_plan(config: Config, variant_name: str, host: str | None = None,
                   prefer: tuple[int, ...] | list[int] = ()) -> PlacementPlan | None:
    """What placing a launch of the variant needs (bot.core.placement), or None when its GPUs are fixed (a host and
    `gpus:`, or neither `gpu_count` nor a group): the group's hosts (or `host`, which must be one of them) and the
    GPU count; for one host with `gpu_count`, that host. `prefer`: GPUs to keep when free (a relaunch's).
    Raises LaunchError for an unknown variant or host, or a host outside the variant's group."""
    v = _variant(config, variant_name)
    target = v.host or ""
    if not target.startswith(GROUP_PREFIX):
        if v.gpu_count is None:
            return None
        name = host or target
        if name not in config.hosts:
            raise LaunchError(f"unknown host {str(name)[:40]!r}; known hosts: {', '.join(config.hosts)}")
        return PlacementPlan(hosts=(name,), count=v.gpu_count, prefer=tuple(prefer))
    group = target[len(GROUP_PREFIX):]
    members = config.group_hosts(group)
    if not members:
        raise LaunchError(f"{variant_name} is placed on group {group!r}, which has no hosts in the config")
    if host is not None:
        if host not in config.hosts:
            raise LaunchError(f"unknown host {host[:40]!r}; {variant_name} runs on a host of group {group}: "
                              f"{', '.join(members[:10])}{' ...' if len(members) > 10 else ''}")
        if host not in members:
            raise LaunchError(f"{host} is not in group {group}, where {variant_name} runs; leave out host= to "
                              f"let the bot pick one of its {len(members)} hosts")
        members = [host]
    count = v.gpu_count if v.gpu_count is not None else len(v.gpus or ())
    return PlacementPlan(hosts=tuple(members), count=count, gpus=tuple(v.gpus or ()) if v.gpu_count is None else (),
                         group=group if host is None else None, prefer=tuple(prefer))


def render_launch(config: Config, variant_name: str, given: dict[str, str], *, launch_id: int,
                  host: str | None = None, tag: str = "", gpus: list[int] | tuple[int, ...] | None = None,
                  rank: int = 0, slurm: bool = False) -> RenderedLaunch:
    """Render a variant into a RenderedLaunch (pure).

    Values are validated (resolve_params), shell-quoted, then the sandboxed command template renders them;
    `extra_args` are appended quoted. The log path defaults to `/tmp/gpubot-VARIANT-ID.log`. `host` and `gpus`
    replace the variant's (a placed launch: bot.core.placement). The ranks' variables: `node_rank` (`rank`),
    `nnodes` (the variant's `hosts`, else 1), `master_addr` (the address of its first host) and `master_port`; with
    `slurm`, `node_rank`, `nnodes` and `master_addr` are the GPUBOT_* shell variables the job's step sets
    (bot.core.slurm.batch_script), expanded on each node.
    Raises LaunchError for an unknown variant/host, bad params, or a template that fails to render.
    """
    v = _variant(config, variant_name)
    host = host or v.host
    if host is not None and host.startswith(GROUP_PREFIX):
        raise LaunchError(f"{variant_name} runs on a host of {host}: the host is picked when it launches")
    if host not in config.hosts:
        raise LaunchError(f"unknown host {str(host)[:40]!r}; known hosts: {', '.join(config.hosts)}")
    params = resolve_params(v, given)
    gpus = list(gpus if gpus is not None else v.gpus or [])
    first = (v.hosts or [host])[0]
    builtins = {"variant": variant_name, "launch_id": launch_id, "host": host,
                "port": v.port if v.port is not None else "", "gpus": ",".join(map(str, gpus)),
                "cuda_visible_devices": ",".join(map(str, gpus)), "node_rank": rank, "nnodes": len(v.hosts or [host]),
                "master_addr": (config.hosts[first].address if first in config.hosts else None) or first,
                "master_port": v.master_port}
    log_dirs = config.hosts[host].log_dirs
    if v.log and not log_dirs:
        raise LaunchError(f"{variant_name} sets a log path, but host {host} has no log_dirs: list the log "
                          f"directory under hosts.{host}.log_dirs (or drop `log:` to use a private default)")
    # default: a name nobody can predict (the random tag), so no one can plant a symlink there first
    default_dir = log_dirs[0] if log_dirs else "/tmp"
    try:
        log_path = _ENV.from_string(v.log).render(**builtins, **params) if v.log else \
            f"{default_dir}/gpubot-{variant_name}-{base_tag(tag) or launch_id}.log"
    except jinja2.TemplateError as e:
        raise LaunchError(f"log template of {variant_name} failed: {e}") from None
    if not log_path.startswith("/") or _CTRL_RE.search(log_path) or "/../" in log_path + "/":
        raise LaunchError(f"log path {log_path[:100]!r} must be an absolute path without '..'")
    if log_dirs and not any(log_path.startswith(d.rstrip("/") + "/") for d in log_dirs):
        raise LaunchError(f"log path {log_path[:100]!r} is outside {host}'s log_dirs ({', '.join(log_dirs)})")
    log_path = rank_log(unpredictable_log_name(log_path, base_tag(tag)), rank) or log_path
    problems = command_template_problems(v.command or "")
    if problems:  # check-config reports these too; never render a template that would undo the quoting
        raise LaunchError(f"the command template of {variant_name} is unsafe: {problems[0]}")
    quoted = {k: _quote_value(val) for k, val in params.items()}
    qbuiltins = {k: _quote_value(val) for k, val in builtins.items()}
    qbuiltins["log"] = shlex.quote(log_path)
    if slurm:  # known only on the nodes, when the job runs: the step's variables, expanded there
        qbuiltins.update(node_rank='"${GPUBOT_NODE_RANK}"', nnodes='"${GPUBOT_NNODES}"',
                         master_addr='"${GPUBOT_MASTER_ADDR}"')
    try:
        command = _ENV.from_string(v.command or "").render(**qbuiltins, **quoted).strip()
    except jinja2.TemplateError as e:
        raise LaunchError(f"command template of {variant_name} failed: {e}") from None
    if v.extra_args:
        command += " " + " ".join(shlex.quote(a) for a in v.extra_args)
    if problems := exec_problems(command):  # a param or an {% if %} may have put a builtin first
        raise LaunchError(f"the command of {variant_name} cannot be started: it {problems[0]}")
    env = dict(v.env)
    env["PYTHONUNBUFFERED"] = "1"
    if gpus:
        env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(map(str, gpus)))
    env[LAUNCH_ENV] = tag or f"{launch_id}-untagged"
    return RenderedLaunch(variant=variant_name, host=host, command=command, log_path=log_path, port=v.port,
                          gpus=gpus, env=env, workdir=v.workdir, params=params, health_path=v.health,
                          log_dirs=list(log_dirs) or [default_dir])


def unpredictable_log_name(path: str, tag: str) -> str:
    """`path` with the random part of the launch's `tag` (`12-<hex>`) put before its extension
    (`/logs/base-12.log` -> `/logs/base-12-<hex>.log`) unless the name already carries it: ids are visible in
    Slack, so a templated name alone could be predicted and planted first (the launch refuses an existing
    name). Without a random part in the tag the path is returned as it is."""
    rand = tag.rpartition("-")[2] if "-" in tag else ""
    if not re.fullmatch(r"[0-9a-f]{8,}", rand) or rand in path:
        return path
    head, _, name = path.rpartition("/")
    stem, dot, ext = name.rpartition(".") if "." in name.lstrip(".") else (name, "", "")
    return f"{head}/{stem}-{rand}{dot}{ext}"
