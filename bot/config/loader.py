"""Loading a config: reading the YAML file with a hardened SafeLoader, scanning it for literal secrets,
expanding `${NAME}` environment references, then validation (schema and cross checks) into a `Config`.

YAML is read with a strict SafeLoader: duplicate keys are errors, and alias use, nesting depth, the
number of values and the file size are capped, so a hostile or broken file cannot hang or crash the bot.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from pydantic import ValidationError

from bot.config.checks import _cross_checks, collapse_host_warnings
from bot.config.errors import ConfigError, _format_pydantic, _Index, _loc
from bot.config.fleet import expand_hosts
from bot.config.schema import ENV_REF_RE, NAME_RE, Config, HostConfig
from bot.core.redact import SECRET_NAME_RE

#: Keys whose NAME ends in a secret word (slack_token, signing_secret, api_key, HF_TOKEN); not max_tokens, tokenizer.
SECRET_KEY_RE = SECRET_NAME_RE  # one rule for what names a secret (bot.core.redact)

#: The keys a host (and so a host group) may have.
HOST_KEYS = frozenset(HostConfig.model_fields)

#: Limits on the YAML file: a config is a few KiB with a handful of anchors.
MAX_CONFIG_BYTES = 1024 * 1024
MAX_YAML_ALIASES = 100
MAX_YAML_DEPTH = 100
MAX_YAML_VALUES = 100_000

SECRETS_HINT = (
    "secrets are never read from the config file; set them in the environment (Slack tokens: "
    "SLACK_BOT_TOKEN, SLACK_APP_TOKEN, SLACK_SIGNING_SECRET) or reference one as ${NAME} in an env: map"
)


def _is_env_map(path: tuple[Any, ...]) -> bool:
    """True for the path of `hosts.NAME.env`, `host_groups.NAME.env` or `variants.NAME.env`, the maps that may hold
    ${NAME}."""
    return len(path) == 3 and path[0] in ("hosts", "host_groups", "variants") and path[2] == "env"


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
                # (a boolean is no secret: `secret: true` marks a param whose values are masked)
                if isinstance(k, str) and SECRET_KEY_RE.search(k) and not isinstance(v, (dict, bool)):
                    if not (_is_env_map(path) and isinstance(v, str) and ENV_REF_RE.fullmatch(v)):
                        out.append((_loc(here), f"{_loc(here)}: {SECRETS_HINT}"))
            todo.extend(((*path, k), v) for k, v in reversed(children))
        elif isinstance(node, list):
            todo.extend(((*path, _Index(i)), v) for i, v in reversed(list(enumerate(node))))
    return out


_TOKEN_LIKE = re.compile(r"(?=[^\s]*[A-Za-z])(?=[^\s]*[0-9])[A-Za-z0-9_+=.-]{16,}")


def _masked_by_value(key: str, ref: str, value: str) -> bool:
    """Whether a `${REF}` value put into env key `key` is masked by value: when the key or the variable names
    a secret, or the value looks like a token (16+ letters and digits, no `/`, `:`, `,` or space). A path, a
    model id, a device list or an interface (`/data/hf-cache`, `0,1,2,3`, `eth0:10.0.0.1`) is not."""
    return bool(SECRET_NAME_RE.search(key) or SECRET_NAME_RE.search(ref) or _TOKEN_LIKE.fullmatch(value))


def _expand_env_refs(data: dict[str, Any], environ: Mapping[str, str],
                     expanded: list[str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """A copy of `data` with every `hosts.*.env` / `variants.*.env` value that is exactly `${NAME}` replaced
    by environ[NAME], and an error for each NAME that is not set. The values put in that may be secrets
    (`_masked_by_value`) are appended to `expanded` (masked by value everywhere). `data` itself is not
    modified."""
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
                    if expanded is not None and _masked_by_value(key, m.group(1), env[key]):
                        expanded.append(env[key])
                else:
                    errors.append(f"{section}.{name}.env.{key}: environment variable {m.group(1)} is not set")
            new_entries[name] = {**entry, "env": env}
        out[section] = new_entries
    return out, errors


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


#: Environment variables that override a key of the config file (12-factor: a container or unit sets them).
ENV_OVERRIDES = MappingProxyType({"GPUBOT_DATABASE_URL": "database_url"})


def _host_names(data: dict[str, Any]) -> set[str]:
    hosts = data.get("hosts")
    return {str(h) for h in hosts} if isinstance(hosts, dict) else set()


def _parse(data: dict[str, Any], environ: Mapping[str, str]) -> Config:
    data = {**data, **{key: environ[var] for var, key in ENV_OVERRIDES.items() if environ.get(var)}}
    secrets = _find_secret_keys(data)  # in the file as written: a group's literal secret is named once
    errors = [msg for _loc_, msg in secrets]
    data, fleet_errors = expand_hosts(data, HOST_KEYS)  # host groups and ranges (bot.config.fleet)
    errors.extend(fleet_errors)
    for section in ("hosts", "variants", "host_groups"):
        names = data.get(section)
        if isinstance(names, dict):
            for name in names:
                if not NAME_RE.fullmatch(str(name)):
                    what = ("; a host range is written like gpu-[01-64] or node[1-4,7] (ASCII digits, at most 6 "
                            "per number, one [...] per name)" if "[" in str(name) else "")
                    errors.append(f"{section}.{name}: name must be 1-63 letters, digits, '.', '_' or '-', "
                                  f"starting with a letter or digit{what}")
    # Secrets are looked for in the file as written; references are expanded only afterwards.
    expanded: list[str] = []
    data, env_errors = _expand_env_refs(data, environ, expanded)
    errors.extend(env_errors)
    try:
        cfg = Config.model_validate(data)
        cfg._expanded_env_values = tuple(expanded)
    except ValidationError as e:
        problems = _format_pydantic(e, Config, {loc for loc, _ in secrets})
        # a group's mistake is every one of its hosts' mistake: said once for them all
        raise ConfigError(collapse_host_warnings(list(dict.fromkeys(errors + problems)), _host_names(data))) from None
    errors.extend(_cross_checks(cfg))
    errors = list(dict.fromkeys(errors))
    if errors:
        raise ConfigError(collapse_host_warnings(errors, _host_names(data)))
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
