"""Tests for the service files in deploy/: compose.yaml (gpubot + PostgreSQL), the systemd unit (Type=notify,
watchdog, hardening measured by `systemd-analyze security`), the Containerfile and its .dockerignore."""

from __future__ import annotations

import configparser
import fnmatch
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
UNIT = DEPLOY / "gpubot.service"
CONTAINERFILE = DEPLOY / "Containerfile"
DOCKERIGNORE = DEPLOY / "Containerfile.dockerignore"
README = DEPLOY / "README.md"

#: The most `systemd-analyze security` may rate the unit (0 = fully sandboxed, 10 = not at all).
MAX_EXPOSURE = 5.0

# Real-looking Slack credentials (as in test_deploy.py).
TOKEN_RE = re.compile(r"\bxox[abpre]-[0-9A-Za-z-]*\d|\bxapp-\d")


# ---------------------------------------------------------------------------------------------------------
# compose.yaml
# ---------------------------------------------------------------------------------------------------------


class _NoDuplicatesLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key written twice in one mapping (PyYAML keeps the last one silently; Compose
    refuses the file). Keys merged in with `<<:` may be overridden, as YAML allows."""

    def construct_mapping(self, node, deep=False):
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _compose() -> dict[str, Any]:
    data = yaml.load(COMPOSE.read_text(encoding="utf-8"), Loader=_NoDuplicatesLoader)
    assert isinstance(data, dict)
    return data


def _environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's `environment:` as a dict (Compose allows a mapping or a list of NAME=VALUE)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _healthcheck_text(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    return " ".join(test) if isinstance(test, list) else str(test)


def test_compose_has_gpubot_and_postgres():
    services = _compose()["services"]
    assert {"gpubot", "postgres"} <= set(services)
    assert re.fullmatch(r"(docker\.io/(library/)?)?postgres:16(\.\d+)*(-\S+)?", services["postgres"]["image"])


def test_compose_gpubot_waits_for_a_healthy_postgres():
    services = _compose()["services"]
    depends = services["gpubot"]["depends_on"]
    assert isinstance(depends, dict), "depends_on must be the long form, with a condition"
    assert depends["postgres"]["condition"] == "service_healthy"
    assert "pg_isready" in _healthcheck_text(services["postgres"])


def test_compose_database_url_is_psycopg_on_the_postgres_service():
    services = _compose()["services"]
    url = _environment(services["gpubot"])["GPUBOT_DATABASE_URL"]
    assert url.startswith("postgresql+psycopg://")
    assert re.search(r"@postgres:5432/", url)
    pg_env = _environment(services["postgres"])
    user, db = pg_env["POSTGRES_USER"], pg_env["POSTGRES_DB"]
    assert url.startswith(f"postgresql+psycopg://{user}:") and url.endswith(f"/{db}")
    # one password for both sides, from POSTGRES_PASSWORD (a default only for the trial)
    assert "${POSTGRES_PASSWORD" in url and pg_env["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD")


def test_compose_gpubot_service():
    services = _compose()["services"]
    gpubot = services["gpubot"]
    assert gpubot["build"]["context"] == ".."
    assert (COMPOSE.parent / gpubot["build"]["context"] / gpubot["build"]["dockerfile"]).resolve() == CONTAINERFILE
    env = _environment(gpubot)
    assert env["GPUBOT_CONFIG"] == "/etc/gpubot/config.yaml"
    assert gpubot["env_file"], "Slack tokens come from an env file"
    # global options before the subcommand, the metrics port after it; the config path from GPUBOT_CONFIG
    argv = gpubot["command"] if isinstance(gpubot["command"], list) else shlex.split(gpubot["command"])
    run = argv.index("run")
    assert argv[argv.index("--log-format") + 1] == "json" and argv.index("--log-format") < run
    assert argv[argv.index("--metrics-port") + 1] == "9108" and argv.index("--metrics-port") > run
    assert argv[argv.index("--metrics-host") + 1] == "0.0.0.0"
    assert "--config" not in argv
    check = _healthcheck_text(gpubot)
    assert "python" in check and "http://127.0.0.1:9108/healthz" in check and "curl" not in check


def test_compose_healthcheck_command_is_valid_python():
    test = _compose()["services"]["gpubot"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    compile(test[3], "<healthcheck>", "exec")


def _defaults(text: str) -> str:
    """`text` with every `${NAME:-default}` replaced by its default, as Compose does when NAME is unset."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}", r"\1", text)


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """A service's short-form `volumes:` by target: (source, options), variables at their defaults."""
    out = {}
    for entry in service.get("volumes") or []:
        source, target, *options = _defaults(entry).split(":")
        out[target] = (source, ",".join(options))
    return out


def test_compose_mounts_and_volumes():
    data = _compose()
    named = set(data.get("volumes") or {})
    for name, target in (("gpubot", "/var/lib/gpubot"), ("postgres", "/var/lib/postgresql/data")):
        source, _ = _mounts(data["services"][name])[target]
        assert source in named, f"{name} keeps {target} in a named volume"
    mounts = _mounts(data["services"]["gpubot"])
    for target in ("/etc/gpubot/config.yaml", "/etc/gpubot/known_hosts", "/etc/gpubot/id_ed25519"):
        source, options = mounts[target]
        assert source.startswith("/"), f"{target} is a file of the host"
        assert "ro" in options.split(","), f"{target} must be mounted read-only"


def test_compose_second_bot_only_with_its_profile():
    services = _compose()["services"]
    for name, svc in services.items():
        if name.startswith("gpubot") and name != "gpubot":
            assert svc.get("profiles"), f"{name} must not start with a plain `up`"
            assert _environment(svc)["GPUBOT_DATABASE_URL"] == _environment(services["gpubot"])["GPUBOT_DATABASE_URL"]
            assert _mounts(svc)["/var/lib/gpubot"] != _mounts(services["gpubot"])["/var/lib/gpubot"], \
                f"{name} needs a state volume of its own"


def test_compose_variables_have_defaults_and_no_secret():
    text = COMPOSE.read_text(encoding="utf-8")
    refs = re.findall(r"\$\{([^}]*)\}", text)
    assert refs
    for ref in refs:
        assert ":-" in ref, f"${{{ref}}} has no default: `docker compose up` would warn and use an empty string"
    assert not TOKEN_RE.search(text)
    for svc in _compose()["services"].values():
        for key in _environment(svc):
            assert not key.startswith("SLACK_"), "Slack tokens belong in the env file, not in compose.yaml"


# ---------------------------------------------------------------------------------------------------------
# gpubot.service
# ---------------------------------------------------------------------------------------------------------


def _unit() -> configparser.RawConfigParser:
    """The unit as configparser reads it. systemd lets a key repeat (lists add up): strict=False takes the file
    (the last value wins here); `_unit_values` has every value."""
    parser = configparser.RawConfigParser(strict=False, interpolation=None, delimiters=("=",),
                                          comment_prefixes=("#", ";"), empty_lines_in_values=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive in systemd
    parser.read_string(UNIT.read_text(encoding="utf-8"), source=str(UNIT))
    return parser


def _unit_values(section: str) -> dict[str, list[str]]:
    """Every `Key=value` of `section`, repeated keys in file order."""
    out: dict[str, list[str]] = {}
    current = None
    for raw in UNIT.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            continue
        if current == section:
            key, sep, value = line.partition("=")
            assert sep, f"not Key=value: {raw!r}"
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def _seconds(span: str) -> float:
    """A systemd time span such as `30s`, `1min 30s`, `500ms` or `30`, in seconds."""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "": 1}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span):
        total += float(number) * units[unit]
    return total


def test_unit_parses_with_configparser():
    unit = _unit()
    assert set(unit.sections()) == {"Unit", "Service", "Install"}
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    # configparser's last value agrees with the raw reading of every key
    for section in unit.sections():
        for key, values in _unit_values(section).items():
            assert unit[section][key] == values[-1]


def test_unit_is_notify_with_watchdog():
    service = _unit()["Service"]
    assert service["Type"] == "notify"
    assert service["NotifyAccess"] == "main"
    watchdog = _seconds(service["WatchdogSec"])
    assert 10 <= watchdog <= 300
    # READY=1 comes after the Slack connection: the start timeout must leave room for it
    assert _seconds(service.get("TimeoutStartSec", "90s")) >= 60


def test_unit_exec_start():
    (exec_start,) = _unit_values("Service")["ExecStart"]
    argv = shlex.split(exec_start)
    assert Path(argv[0]).name == "gpubot"
    run = argv.index("run")
    assert argv[argv.index("--log-format") + 1] == "json" and argv.index("--log-format") < run
    assert argv[argv.index("--log-level") + 1] == "INFO" and argv.index("--log-level") < run
    assert argv[argv.index("--config") + 1] == "/etc/gpubot/config.yaml" and argv.index("--config") > run
    assert argv[argv.index("--metrics-port") + 1] == "9108" and argv.index("--metrics-port") > run
    assert "--metrics-host" not in argv  # loopback, the default


def test_unit_restarts_on_exit_2():
    """Exit status 2 is also what an unreachable database gives at start: the unit must retry it."""
    service = _unit_values("Service")
    assert service["Restart"] == ["on-failure"]
    prevented = " ".join(service.get("RestartPreventExitStatus", [])).split()
    assert "2" not in prevented


def test_unit_keeps_what_the_bot_needs():
    service = _unit_values("Service")
    assert service["User"] == ["gpubot"]
    assert service["StateDirectory"] == ["gpubot"]
    families = " ".join(service["RestrictAddressFamilies"]).split()
    assert {"AF_INET", "AF_INET6", "AF_UNIX", "AF_NETLINK"} <= set(families)
    assert not families[0].startswith("~")
    # /dev/nvidia* for local hosts: no private /dev, no device allow-list, and no ProtectClock=, which on
    # systemd < 253 implies DeviceAllow=char-rtc and so closes every other device
    for key in ("PrivateDevices", "ProtectClock", "DevicePolicy", "DeviceAllow"):
        assert service.get(key, ["no"])[-1] in ("no", "false"), key
    # cffi/libffi closures need writable+executable memory
    assert service.get("MemoryDenyWriteExecute", ["no"])[-1] in ("no", "false")
    # ps needs /proc/meminfo etc., and other users' GPU processes; the probe reads /proc/net/tcp
    assert service.get("ProcSubset", ["all"])[-1] == "all"
    assert service.get("ProtectProc", ["default"])[-1] == "default"
    # ProtectHome=yes/tmpfs would hide /run/user/<uid>, which `systemd-run --user` needs for local launches
    assert service["ProtectHome"] == ["read-only"]
    # a filter of @system-service, errors instead of kills
    assert "@system-service" in " ".join(service["SystemCallFilter"]).split()
    assert service["SystemCallErrorNumber"] == ["EPERM"]
    assert service["CapabilityBoundingSet"] == [""]
    assert service["NoNewPrivileges"] == ["true"]


def test_unit_header_documents_linger_and_metrics():
    text = UNIT.read_text(encoding="utf-8")
    header = text[: text.index("[Unit]")]
    assert "loginctl enable-linger gpubot" in header
    assert "gpubot-<tag>.scope" in header and "KillMode=" in header and "ReadWritePaths=" in header
    assert "127.0.0.1:9108" in header and "/healthz" in header and "/metrics" in header


def test_unit_and_readme_quote_the_same_exposure():
    unit_figures = set(re.findall(r"exposure (\d+\.\d) OK", UNIT.read_text(encoding="utf-8")))
    unit_figures |= set(re.findall(r"security gpubot\.service`: (\d+\.\d) OK", UNIT.read_text(encoding="utf-8")))
    readme_figures = set(re.findall(r"\*\*(\d+\.\d) OK\*\*", README.read_text(encoding="utf-8")))
    assert len(unit_figures) == 1 and unit_figures == readme_figures
    assert float(next(iter(unit_figures))) <= MAX_EXPOSURE


def _exposure(output: str) -> float | None:
    m = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", output)
    return float(m.group(1)) if m else None


def test_unit_exposure_by_systemd_analyze(tmp_path):
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd): cannot rate the unit's hardening")
    unit = tmp_path / UNIT.name  # a directory of its own: nothing else is read as a unit
    shutil.copyfile(UNIT, unit)
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": "cat"}
    proc = subprocess.run([exe, "security", "--offline=true", "--no-pager", str(unit)], capture_output=True,
                          text=True, errors="replace", timeout=60, env=env, cwd=tmp_path, check=False)
    output = proc.stdout + proc.stderr
    exposure = _exposure(output)
    if exposure is None:
        unsupported = re.search(r"unrecognized option|unknown option|invalid option", output, re.IGNORECASE)
        if unsupported and "offline" in output:
            pytest.skip(f"this systemd-analyze has no --offline (systemd < 250): {output.strip()[:200]}")
        pytest.fail(f"systemd-analyze security gave no overall exposure (exit {proc.returncode}):\n{output}")
    failing = [line for line in proc.stdout.splitlines() if line.startswith("✗")]
    assert exposure <= MAX_EXPOSURE, f"overall exposure {exposure} > {MAX_EXPOSURE}; open settings:\n" + \
        "\n".join(failing)


# ---------------------------------------------------------------------------------------------------------
# Containerfile and its .dockerignore
# ---------------------------------------------------------------------------------------------------------


def test_containerfile_installs_the_postgres_extra():
    text = CONTAINERFILE.read_text(encoding="utf-8")
    installs = re.findall(r"^RUN .*\bpip install\b(.*)$", text, re.MULTILINE)
    assert any(re.search(r"""['"]?/src\[postgres\]['"]?""", args) for args in installs), installs
    header = text[: text.index("FROM ")]
    assert "GPUBOT_CONFIG" in header and "GPUBOT_DATABASE_URL" in header and "compose.yaml" in header


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether `path` (relative to the build context) or a directory above it matches a .dockerignore pattern
    (Docker's `**/` prefix and shell globs; no `!` exceptions are used)."""
    parts = path.split("/")
    for pattern in patterns:
        for i in range(1, len(parts) + 1):
            if pattern.startswith("**/"):
                if fnmatch.fnmatchcase(parts[i - 1], pattern[3:]):
                    return True
            elif fnmatch.fnmatchcase("/".join(parts[:i]), pattern.strip("/")):
                return True
    return False


def test_dockerignore_keeps_secrets_out_and_the_package_in():
    patterns = [line.strip() for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert not any(p.startswith("!") for p in patterns), "_ignored does not handle exceptions"
    for secret in ("deploy/env", ".env", "deploy/.env", "deploy/trial.env", ".git/config", ".venv/bin/python",
                   "deploy/id_ed25519", "id_rsa.pub", "deploy/known_hosts"):
        assert _ignored(secret, patterns), f"{secret} would be copied into the image"
    for needed in ("pyproject.toml", "README.md", "LICENSE", "bot/cli.py", "handlers/__init__.py",
                   "bot/adapters/store/alembic/env.py", "templates/__init__.py"):
        assert not _ignored(needed, patterns), f"{needed} is needed by `pip install /src`"
