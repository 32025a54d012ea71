"""Host groups and host ranges: what the loader makes of `hosts:` before it is validated (pure).

A fleet's config names tens of hosts that differ in a number. `host_groups:` maps a group name to the keys its hosts
share (any HostConfig key but `group`: user, key_file, known_hosts, log_dirs, nvidia_smi, env, ...); a host entry
joins one with `group: NAME`, and its own keys win (its `env` is merged over the group's, key by key). A host name
may be a range, Slurm's hostlist style: `gpu-[01-64]` (zero padding kept as written), `gpu-[1-4,7,10-12]`; each
name it stands for gets a copy of its entry. In `address`, `{name}` is the host's name and `{n}` its number in the
range (no padding: `10.0.1.{n}`), so `address: "{name}.cluster.internal"` fits a whole group. The names made must
not repeat another host's.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection
from typing import Any

from bot.core.hostlist import MAX_RANGE_HOSTS, RANGE_RE, range_names

__all__ = ["MAX_HOSTS", "MAX_RANGE_HOSTS", "RANGE_RE", "TEMPLATE_KEYS", "expand_hosts", "range_names"]

#: The most hosts all of `hosts:` may stand for once expanded.
MAX_HOSTS = 4096
#: The keys whose values may hold `{name}` and `{n}`.
TEMPLATE_KEYS = ("address",)
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")


def _fill(value: Any, name: str, number: int | None, where: str, errors: list[str]) -> Any:
    """`value` with `{name}` and `{n}` put in (a value that is not a string is returned as it is)."""
    if not isinstance(value, str):
        return value

    def put(m: re.Match[str]) -> str:
        word = m.group(1)
        if word == "name":
            return name
        if word == "n" and number is not None:
            return str(number)
        if word == "n":
            errors.append(f"{where}: {{n}} is the number of a host in a range (like gpu-[01-64]); {name} is none")
        else:
            errors.append(f"{where}: unknown placeholder {{{word}}} (only {{name}} and {{n}})")
        return m.group(0)

    return _PLACEHOLDER_RE.sub(put, value)


def expand_hosts(data: dict[str, Any], host_keys: Collection[str] = ()) -> tuple[dict[str, Any], list[str]]:
    """A copy of `data` (`data` is not changed) whose `hosts` has each range name expanded, each entry's group's
    keys merged under its own, and `{name}` / `{n}` put into TEMPLATE_KEYS; and the errors found, each with its
    location (an unknown group, a bad range, a name made twice, a group that names a group or is not a mapping,
    a group key that is not one of `host_keys` (when given: said once, at the group, and left out), an unknown
    placeholder). What is left to check (each key's value) is the schema's."""
    errors: list[str] = []
    groups = data.get("host_groups")
    if groups is None:
        groups = {}
    if not isinstance(groups, dict):
        return data, ["host_groups: must be a mapping of group names to host keys"]
    groups = dict(groups)
    for gname, gkeys in groups.items():
        if not isinstance(gkeys, dict):
            errors.append(f"host_groups.{gname}: must be a mapping of host keys (user, key_file, known_hosts, ...)")
            continue
        if "group" in gkeys:
            errors.append(f"host_groups.{gname}.group: a group cannot join another group")
        unknown = [k for k in gkeys if host_keys and k != "group" and k not in host_keys]
        for k in unknown:
            close = difflib.get_close_matches(str(k), list(host_keys), n=1)
            errors.append(f"host_groups.{gname}.{k}: unknown host key" + (f" (did you mean {close[0]}?)" if close
                                                                          else ""))
        groups[gname] = {k: v for k, v in gkeys.items() if k not in unknown}
    hosts = data.get("hosts")
    if not isinstance(hosts, dict):
        return data, errors
    out: dict[str, Any] = {}
    made_by: dict[str, str] = {}
    for key, entry in hosts.items():
        key_s = str(key)
        try:
            names = range_names(key_s)
        except ValueError as e:
            errors.append(f"hosts.{key_s}: {e}")
            continue
        if not isinstance(entry, dict):
            out.setdefault(key_s, entry)  # the schema says what is wrong with it
            continue
        group = entry.get("group")
        base = dict(entry)
        if group is not None and not isinstance(group, str):
            errors.append(f"hosts.{key_s}.group: must be the name of a group under host_groups")
        elif group is not None:
            gkeys = groups.get(group)
            if not isinstance(gkeys, dict):
                known = ", ".join(map(str, groups)) or "none defined under host_groups:"
                errors.append(f"hosts.{key_s}.group: unknown group {group!r} (groups: {known})")
            else:
                base = {k: v for k, v in gkeys.items() if k != "group"} | entry
                if isinstance(gkeys.get("env"), dict) and isinstance(entry.get("env"), dict):
                    base["env"] = {**gkeys["env"], **entry["env"]}
        for name, number in names if names is not None else [(key_s, None)]:
            if name in made_by:
                errors.append(f"hosts.{key_s}: the host {name} is also named by hosts.{made_by[name]}")
                continue
            made_by[name] = key_s
            host = dict(base)
            for k in TEMPLATE_KEYS:
                if k in host:
                    host[k] = _fill(host[k], name, number, f"hosts.{key_s}.{k}", errors)
            out[name] = host
        if len(out) > MAX_HOSTS:
            errors.append(f"hosts: more than {MAX_HOSTS} hosts once ranges are expanded")
            break
    return {**data, "hosts": out}, list(dict.fromkeys(errors))
