"""Checks run on a `Config` after schema validation: cross-references between sections
(`_cross_checks`), the shell-safety of command templates (`command_template_problems`) and the
problems that do not stop the bot (`config_warnings`).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Collection
from pathlib import Path

import jinja2
import jinja2.meta
import jinja2.sandbox

from bot.config.schema import ENV_REF_RE, Config, ParamSpec, VariantConfig
from bot.core.lifecycle import exec_problems
from bot.core.placement import GROUP_PREFIX
from bot.core.slurm import SbatchSpec, sbatch_problems

#: Names a variant's command template may use besides its declared params.
BUILTIN_TEMPLATE_VARS = frozenset({"port", "variant", "launch_id", "log", "host", "gpus", "cuda_visible_devices",
                                   "node_rank", "nnodes", "master_addr", "master_port"})

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
    """Problems a valid schema can still have, as `location: message` strings: unknown hosts and variants
    referred to, `extends` cycles, missing host or command, unsafe or undeclared template names, bad params."""
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
        elif rv.host.startswith(GROUP_PREFIX):
            group = rv.host[len(GROUP_PREFIX):]
            if not cfg.group_hosts(group):
                known = ", ".join(sorted({h.group for h in cfg.hosts.values() if h.group})) or "(none)"
                errors.append(f"variants.{name}.host: no host is in group {group!r}; groups with hosts: {known}")
            if rv.gpu_count is None and not rv.gpus:
                errors.append(f"variants.{name}.gpu_count: required when the variant is placed on a host group "
                              f"(how many free GPUs to pick), or name fixed `gpus:`")
        elif rv.host not in cfg.hosts:
            if cfg.group_hosts(rv.host):  # a group's name without its prefix
                errors.append(f"variants.{name}.host: {rv.host!r} is a host group, not a host; write "
                              f"`host: {GROUP_PREFIX}{rv.host}` to place it on one of its hosts (with `gpu_count`)")
            else:
                names = list(cfg.hosts)
                known = ", ".join(names[:10]) + (f", ... ({len(names)} hosts)" if len(names) > 10 else "")
                errors.append(f"variants.{name}.host: unknown host {rv.host!r}; known: {known}")
        if rv.gpu_count is not None and rv.gpus:
            errors.append(f"variants.{name}.gpu_count: give fixed `gpus:` or a `gpu_count` to pick, not both")
        errors.extend(f"variants.{name}.{p}" for p in spans_problems(cfg, rv))
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
            errors.extend(f"variants.{name}.command: {p}" for p in exec_problems(rv.command))
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


#: The variant keys that only a Slurm launch reads.
_SLURM_KEYS = ("nodes", "gpus_per_node", "partition", "time", "account", "extra_sbatch")


def spans_problems(cfg: Config, rv: VariantConfig) -> list[str]:
    """`key: message` problems of a resolved variant's runner (pure): a Slurm variant needs a login host (not a group
    nor `hosts`), leaves the GPUs to Slurm (`gpus_per_node`, not `gpus`/`gpu_count`) and has sbatch options Slurm
    takes (bot.core.slurm.sbatch_problems); Slurm's keys on an SSH variant are refused; a multi-host variant names
    known hosts, with `host`, when given, as its first (rank 0), and fixed GPUs only."""
    out: list[str] = []
    if cfg.runner_of(rv) == "slurm":
        if rv.hosts:
            out.append("hosts: a Slurm variant runs on the nodes Slurm gives it; name its login node as `host`")
        if rv.host and rv.host.startswith(GROUP_PREFIX):
            out.append("host: a Slurm variant's host is the cluster's login node (where sbatch runs), not a group")
        if rv.gpus or rv.gpu_count is not None:
            out.append("gpus_per_node: Slurm picks a Slurm job's GPUs; say how many with `gpus_per_node`, not "
                       "`gpus` or `gpu_count`")
        for p in sbatch_problems(sbatch_spec(rv)):  # "nodes must be ..." -> "nodes: must be ..."
            key, _, rest = p.partition(" ")
            out.append(p if key.endswith(":") else f"{key}: {rest}")
        return out
    set_keys = [k for k in _SLURM_KEYS if getattr(rv, k)]
    if set_keys:
        out.append(f"{set_keys[0]}: only a Slurm variant reads {', '.join(set_keys)}; add `runner: slurm` (with a "
                   f"login node as `host`)")
    if rv.hosts:
        unknown = [h for h in rv.hosts if h not in cfg.hosts]
        if unknown:
            out.append(f"hosts: unknown host{'s' if len(unknown) > 1 else ''} {', '.join(unknown[:5])}")
        if rv.host and rv.host != rv.hosts[0]:
            out.append(f"host: {rv.host} is not the first of `hosts` (rank 0, {rv.hosts[0]}); leave `host` out")
        if rv.gpu_count is not None:
            out.append("gpu_count: a multi-host variant uses fixed `gpus` on each host")
        dirs = {tuple(cfg.hosts[h].log_dirs[:1]) for h in rv.hosts if h in cfg.hosts}
        if len(dirs) > 1:
            out.append("hosts: the hosts of a multi-host variant need the same first `log_dirs` entry (rank K "
                       "writes its log beside rank 0's)")
    return out


def sbatch_spec(v: VariantConfig) -> SbatchSpec:
    """The Slurm allocation a (resolved) Slurm variant asks for (bot.core.slurm.SbatchSpec)."""
    return SbatchSpec(nodes=1 if v.nodes is None else v.nodes, gpus_per_node=v.gpus_per_node or 0,
                      partition=v.partition, time=v.time,
                      account=v.account, extra_sbatch=tuple(v.extra_sbatch))


# moved to the scheduler adapter in the next step
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
    reads are then refused); an env value with `${...}` that is not the whole value (passed literally); variants
    but no operator or admin (nobody may launch from Slack); a multi-host variant whose first host has no address
    (`{{ master_addr }}` is then its name).
    Never raises for a valid `Config`.
    """
    out: list[str] = []
    named = cfg.slack.slash_commands

    def sl(key: str) -> str:  # this install's name of a slash command
        return named.get(key) or f"/{key}"

    if not cfg.hosts:
        out.append(f"hosts: no hosts configured; {sl('gpu')} status and {sl('probe')} have nothing to look at")
    if cfg.variants and not (cfg.permissions.operators or cfg.permissions.admins):
        out.append(f"permissions.operators: nobody is an operator or admin, so nobody may {sl('launch')}, "
                   f"{sl('kill')} or {sl('relaunch')} from Slack; put your Slack user ID (U...) there")
    for vname in cfg.variants:
        try:
            rv = cfg.resolved_variant(vname)
        except KeyError:
            continue
        first = (rv.hosts or [None])[0]
        if first in cfg.hosts and not cfg.hosts[first].address:
            out.append(f"variants.{vname}.hosts: its first host {first} has no `address`, so {{{{ master_addr }}}} "
                       f"is the name {first!r}, which the other ranks must resolve; give {first} an address")
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
    out += _generation_warnings(cfg)
    return out


def _generation_warnings(cfg: Config) -> list[str]:
    """A variant's generation check whose timeout the host's command timeout cuts (it is kept 2 s under it)."""
    out = []
    for name in cfg.variants:
        try:
            v = cfg.resolved_variant(name)
        except KeyError:
            continue
        host = cfg.hosts.get(v.host or "")
        cut = v.generate.timeout_under(host.command_timeout_s) if v.generate and host else None
        if v.generate is not None and cut is not None and cut < v.generate.timeout_s:
            out.append(f"variants.{name}.generate.timeout_s: {v.generate.timeout_s:g} s is cut to {cut:g} s (kept "
                       f"under hosts.{v.host}.command_timeout_s); raise the host's command_timeout_s to wait longer")
    return out


#: A warning (or error) shared by more hosts than this is said once, naming the first few of them and their count.
SHARED_WARNING_HOSTS = 3


def _split_host_line(line: str, hosts: Collection[str]) -> tuple[str, str, str] | None:
    """(host, key path, message) of a `hosts.NAME.KEY...: MESSAGE` line whose NAME is one of `hosts` (the longest
    that fits: names may hold dots), else None."""
    if not line.startswith("hosts."):
        return None
    rest = line[len("hosts."):]
    head, sep, message = rest.partition(": ")
    if not sep:
        return None
    if head in hosts:  # a problem of the whole entry (`hosts.gpu-01: address is required ...`)
        return head, "", message
    best = None
    for i, ch in enumerate(head):
        if ch == "." and head[:i] in hosts:
            best = i
    if best is None:
        return None
    return head[:best], head[best + 1:], message


def collapse_host_warnings(lines: list[str], hosts: Collection[str]) -> list[str]:
    """`lines` (`location: message`, as config_warnings and ConfigError give them) with each one that more than
    SHARED_WARNING_HOSTS of `hosts` share (the same key and message, as hosts of one group or range have) said
    once, as `hosts.{gpu-01, gpu-02, gpu-03, ... (64 hosts)}.KEY: MESSAGE`, where the first of them was; other
    lines kept, in order."""
    hosts = hosts if isinstance(hosts, (set, frozenset, dict)) else set(hosts)
    split = [_split_host_line(line, hosts) for line in lines]
    groups: dict[tuple[str, str], list[str]] = {}
    for parts in split:
        if parts is not None:
            groups.setdefault(parts[1:], []).append(parts[0])
    out: list[str] = []
    done: set[tuple[str, str]] = set()
    for line, parts in zip(lines, split, strict=True):
        shared = parts[1:] if parts is not None else None
        if shared is None or len(groups[shared]) <= SHARED_WARNING_HOSTS:
            out.append(line)
        elif shared not in done:
            done.add(shared)
            names = groups[shared]
            key = f".{shared[0]}" if shared[0] else ""
            out.append(f"hosts.{{{', '.join(names[:SHARED_WARNING_HOSTS])}, ... ({len(names)} hosts)}}{key}: "
                       f"{shared[1]}")
    return out
