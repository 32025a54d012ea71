"""`gpubot` command line (click): run | serve-http | console | demo | try-config | check-config | diagnose | bundle |
manifest | db upgrade.

Start-up is kept short: this module imports only click and two light exception modules; each command imports
what it uses when it runs (`gpubot --version` loads no pydantic, `diagnose` no config, database, SSH or Slack
library, `check-config` no database, SSH, chart or Slack library).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import NoReturn

import click

from bot.adapters.statelock import StateDirLocked

#: `--config FILE`, or the environment's GPUBOT_CONFIG (a container or unit sets it once).
_config_option = click.option("--config", "config_path", required=True, envvar="GPUBOT_CONFIG", show_envvar=True,
                              type=click.Path(), help="YAML config file")


def _setup_logging(level: str, fmt: str = "text") -> None:
    """Log to stderr at `level`: `text` lines (`TIME LEVEL LOGGER: MESSAGE`), or `json`, one object per line with
    the keys time (ISO 8601, UTC), level, logger, message (and exc_info with a traceback) for a log collector
    (python-json-logger).
    Every record is redacted before it is written (bot.adapters.logs, installed by the runtime)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(JsonFormatter("%(levelname)s %(name)s %(message)s", timestamp="time",
                                           rename_fields={"levelname": "level", "name": "logger"}))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])


def _load(path: str):
    """The config at `path`, checked by the schema and by the parts that only the wiring sees (digest cron,
    slash command names); on errors print every one and exit 2."""
    from bot.config import ConfigError, load_config
    from bot.wiring import check_config

    try:
        return check_config(load_config(path))
    except ConfigError as e:
        click.echo(f"config {path} is invalid:", err=True)
        for line in e.errors:
            click.echo(f"  {line}", err=True)
        sys.exit(2)


def _fail(message: str) -> NoReturn:
    """Print `error: MESSAGE` on stderr and exit with status 2 (bad input, an unusable state, a refused target)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def _state_hint(reason: str) -> str:
    """What to do about a database or state directory that cannot be used, by the database's own words."""
    r = reason.lower()
    if "database url" in r or "driver" in r:
        return "fix database_url in the config (or GPUBOT_DATABASE_URL)"
    if "connection" in r or "could not" in r or "timeout" in r or "password" in r:
        return "check that the database server is up and reachable, and its user and password"
    if "not a database" in r or "malformed" in r:
        return "the database is corrupted: move it aside and the bot starts a new one, or restore a backup"
    if "full" in r:
        return "the disk is full: free space, then start again"
    if "directory" in r:
        return "point state_dir at a directory this user can write"
    if "driver" in r or "url" in r:
        return "fix database_url in the config"
    return "check the file's permissions and the disk, then start again"


class _Group(click.Group):
    """The command group; a state directory held by another running bot, or a database or state directory that
    cannot be used (corrupted, unwritable, disk full), is one clear line on stderr and exit status 2."""

    def invoke(self, ctx: click.Context) -> object:
        """Run the subcommand; StateDirLocked (naming the PID) and DatabaseUnavailable (naming the file) become
        `error: ...` on stderr, exit status 2."""
        try:
            return super().invoke(ctx)
        except StateDirLocked as e:
            _fail(str(e))
        except Exception as e:
            from bot.core.errors import DatabaseUnavailable  # here: `--version` imports nothing of the bot's core

            if not isinstance(e, DatabaseUnavailable):
                raise
            _fail(f"cannot use the bot's state at {e.path}: {e.reason} ({_state_hint(e.reason)})")


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gpubot", prog_name="gpubot", message="%(prog)s %(version)s")
@click.option("--log-level", default="WARNING", show_default=True, help="DEBUG, INFO, WARNING or ERROR")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              envvar="GPUBOT_LOG_FORMAT", show_envvar=True, help="json: one JSON object per line (a log collector's)")
def main(log_level: str, log_format: str) -> None:
    """gpubot: debug GPU inference servers from Slack, as a team."""
    _setup_logging(log_level, log_format)


#: `--metrics-port` / `--metrics-host`: where /metrics and /healthz are served (they override the config's `metrics:`).
def _metrics_options(f):
    f = click.option("--metrics-host", default=None,
                     help="address for --metrics-port (default: the config's metrics.host, 127.0.0.1)")(f)
    return click.option("--metrics-port", type=click.IntRange(1, 65535), default=None, envvar="GPUBOT_METRICS_PORT",
                        show_envvar=True,
                        help="serve /metrics and /healthz on this port (default: the config's metrics.port)")(f)


def _with_metrics(config, port: int | None, host: str | None):
    """`config` with its `metrics:` overridden by the command line's --metrics-port / --metrics-host."""
    if port is None and host is None:
        return config
    from pydantic import ValidationError

    from bot.config import MetricsSettings

    given = {k: v for k, v in (("port", port), ("host", host)) if v is not None}
    try:
        metrics = MetricsSettings.model_validate({**config.metrics.model_dump(), **given})
    except ValidationError as e:
        _fail("bad --metrics-host or --metrics-port: " + "; ".join(
            f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()))
    return config.model_copy(update={"metrics": metrics})


def _serve(coro_factory) -> None:
    """Run the service coroutine; a missing token or an address that cannot be bound is one line, exit 2."""
    import asyncio

    from bot.slack.runner import MissingSecret

    try:
        asyncio.run(coro_factory())
    except MissingSecret as e:
        _fail(str(e))
    except OSError as e:
        import socket

        if isinstance(e, socket.gaierror):
            _fail(f"cannot listen: the address does not resolve ({e.strerror or e}): fix --metrics-host or --host")
        if e.errno is None or not e.strerror or "address" not in e.strerror.lower():
            raise
        _fail(f"cannot listen: {e.strerror} (choose another --metrics-port or --port)")


@main.command()
@_config_option
@_metrics_options
def run(config_path: str, metrics_port: int | None, metrics_host: str | None) -> None:
    """Connect to Slack over Socket Mode (needs SLACK_BOT_TOKEN and SLACK_APP_TOKEN)."""
    from bot.slack.runner import run_socket_mode

    config = _with_metrics(_load(config_path), metrics_port, metrics_host)
    _serve(lambda: run_socket_mode(config))


@main.command("serve-http")
@_config_option
@click.option("--port", default=3000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--host", "bind", default="0.0.0.0", show_default=True, help="address to listen on")
@_metrics_options
def serve_http(config_path: str, port: int, bind: str, metrics_port: int | None, metrics_host: str | None) -> None:
    """Serve Slack's HTTP requests at /slack/events, with /healthz and /metrics beside them (needs SLACK_BOT_TOKEN
    and SLACK_SIGNING_SECRET)."""
    from bot.slack.runner import run_http

    config = _with_metrics(_load(config_path), metrics_port, metrics_host)
    _serve(lambda: run_http(config, port=port, host=bind))


#: Loggers whose warnings the console shows even at its quiet default: what no answer in the chat would say.
_ALWAYS_WARN = ("bot.adapters.secretbox", "bot.services.secrets", "bot.wiring")


@main.command()
@_config_option
def console(config_path: str) -> None:
    """The same commands in a terminal; reads one command per line when stdin is not a terminal."""
    import asyncio

    from bot.console import run_console, run_interactive

    config = _load(config_path)
    parent = click.get_current_context().parent
    chosen = parent is not None and parent.get_parameter_source("log_level") == click.core.ParameterSource.COMMANDLINE
    if logging.getLogger().level == logging.WARNING and not chosen:
        # answers already say what failed; repeated WARNING lines on stderr would only duplicate them. Warnings
        # that no answer gives (the secret key's file, its mode and owner) are still shown
        logging.getLogger().setLevel(logging.ERROR)
        for name in _ALWAYS_WARN:
            logging.getLogger(name).setLevel(logging.WARNING)
    if sys.stdin.isatty():
        sys.exit(run_interactive(config))
    try:
        sys.exit(asyncio.run(run_console(config)))
    except KeyboardInterrupt:
        sys.exit(130)


@main.command()
def demo() -> None:
    """Launch a demo server on this machine, then /gpu status, /probe and /kill it. No token, GPU or config."""
    from bot.demo.run import main as demo_main

    sys.exit(demo_main())


@main.command("try-config")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Overwrite an existing DIRECTORY/config.yaml.")
def try_config(directory: str, force: bool) -> None:
    """Write DIRECTORY/config.yaml to try /launch, /kill and /relaunch on this machine in the console
    (replayed H200 GPUs when there is no nvidia-smi; the demo server as variant `demo`). An existing
    config.yaml is kept (exit 2) unless --force."""
    from bot.demo.run import write_try_config

    existing = Path(directory) / "config.yaml"
    if existing.exists() and not force:
        _fail(f"{existing} exists; use it (gpubot console --config {existing}), choose another "
              "directory, or pass --force to overwrite it")
    try:
        path = write_try_config(directory)
    except OSError as e:
        _fail(f"cannot write {directory}: {e}")
    click.echo(f"wrote {path}\nnow try:  printf '/launch demo\\nwait 4\\n/gpu status\\n/kill demo --yes\\n' | "
               f"gpubot console --config {path}\n(or interactively: gpubot console --config {path}; from a checkout, "
               "run gpubot as ./dev gpubot)")


@main.command("check-config")
@click.argument("path", type=click.Path(), envvar="GPUBOT_CONFIG", required=True)
def check_config(path: str) -> None:
    """Validate a config file: prints every error with its location and exits 2, or prints a summary.

    Warnings (a missing known_hosts or key file, a host without log_dirs, no hosts at all) are printed
    to stderr after the summary; they do not change the exit code 0.
    """
    from bot.adapters.probe_pool import POOL_MIN_HOSTS, probe_worker_count
    from bot.config import config_warnings
    from bot.config.checks import collapse_host_warnings

    config = _load(path)
    warnings = config_warnings(config)

    def count(n: int, word: str) -> str:
        return f"{n} {word}" if n == 1 else f"{n} {word}s"

    groups = f", {count(len(config.host_groups), 'host group')}" if config.host_groups else ""
    summary = f"{count(len(config.hosts), 'host')}{groups}, {count(len(config.variants), 'variant')}"
    ssh_hosts = sum(1 for h in config.hosts.values() if not h.local)
    if ssh_hosts >= POOL_MIN_HOSTS:
        workers = probe_worker_count(config)
        why = "probe_workers: 0" if config.probe_workers == 0 else "fewer than 4 usable CPUs here; see probe_workers"
        summary += (f"; /gpu status of all {ssh_hosts} SSH hosts over {count(workers, 'probe worker')}" if workers
                    else f"; /gpu status of every host in the bot's own process ({why})")
    warnings = collapse_host_warnings(warnings, config.hosts)
    if warnings:
        summary += f"; {count(len(warnings), 'warning')}"
    click.echo(f"{path}: OK ({summary})")
    for line in warnings:
        click.echo(f"  warning: {line}", err=True)


@main.command()
@click.argument("directory", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="print the verdict as JSON")
def diagnose(directory: str, as_json: bool) -> None:
    """Diagnose one case bundle DIRECTORY (server.log, ps.txt, nvidia-smi.*, observed.json, ...; of a launch across
    nodes also node-NAME/ folders, ranks.txt and scontrol.txt).

    Prints the verdict, phase, summary, evidence and next steps; with --json an object with the keys
    verdict, phase, summary, evidence, next_steps, confidence, runner_up, missing. Exit 0; exit 2 when the directory is
    missing or unreadable.
    """
    import json

    from bot.adapters.bundle import BundleError, diagnose_bundle
    from bot.core.diagnose import format_verdict

    try:
        verdict = diagnose_bundle(directory)  # a launch across nodes: every rank's folder and Slurm's word weigh in
    except BundleError as e:
        _fail(str(e))
    if as_json:
        click.echo(json.dumps(verdict.to_dict(), indent=2, ensure_ascii=False))
    else:
        click.echo(format_verdict(verdict), nl=False)


@main.command()
@click.argument("target")
@click.argument("directory", type=click.Path())
@_config_option
def bundle(target: str, directory: str, config_path: str) -> None:
    """Collect a bundle of TARGET (a launch: `12`, `base#12`, a variant's live launch; or a configured host)
    into DIRECTORY (new or empty), in the format `gpubot diagnose` reads: log tail, ps, nvidia-smi table and CSV,
    listening sockets, health, dmesg when readable, py-spy dumps of a live launch's ranks, observed.json from two
    probes a few seconds apart; redacted. Runs beside a running bot (it does not take the state directory's
    lock). Exit 0; exit 2 for an unknown target, an unreachable host or a directory that cannot be written."""
    import asyncio

    from bot.adapters.store import Store
    from bot.console import ConsoleSurface
    from bot.services.bundles import CollectError
    from bot.services.launches import LaunchError
    from bot.wiring import build_runtime, state_url

    config = _load(config_path)
    store = Store(config.database_url or state_url(config.state_dir))
    runtime = build_runtime(config, surface=ConsoleSurface(sys.stderr), store=store, recover=False)

    async def collect():
        try:
            if target in config.hosts:
                return await runtime.services.bundles.collect(host=target, user="cli")
            la = runtime.launches.find(target, allow_only_live=False)
            return await runtime.services.bundles.collect(launch=la, user="cli")
        finally:
            await runtime.hosts.close()

    try:
        collected = asyncio.run(collect())
        root = collected.write(directory)
    except LaunchError as e:
        _fail(f"{e}; TARGET may also be a host: {', '.join(config.host_names())}")
    except CollectError as e:
        _fail(str(e))
    except OSError as e:
        _fail(f"cannot write the bundle to {directory}: {e.strerror or e}")
    finally:
        store.close()
    click.echo(f"{root}: {len(collected.files)} files; read it with `gpubot diagnose {root}`")


@main.command()
@click.option("--config", "config_path", type=click.Path(), envvar="GPUBOT_CONFIG", show_envvar=True,
              help="YAML config file (default: built-in defaults)")
@click.option("--request-url", default=None, help="https://HOST/slack/events for HTTP mode (default: Socket Mode)")
def manifest(config_path: str | None, request_url: str | None) -> None:
    """Print the Slack app manifest (YAML) matching this install: its bot name and its slash commands under
    their configured names (`slack.slash_commands`), the scopes and events gpubot uses."""
    import yaml

    from bot.config import Config
    from handlers import manifest as build_manifest

    if request_url is not None and not request_url.startswith("https://"):
        _fail("--request-url must be an https:// URL (Slack only calls HTTPS)")
    config = _load(config_path) if config_path else Config()
    click.echo(yaml.safe_dump(build_manifest(config, request_url=request_url), sort_keys=False), nl=False)



@main.group()
def db() -> None:
    """The database's schema (Alembic migrations; a bot also upgrades it when it starts)."""


@db.command("upgrade")
@_config_option
def db_upgrade(config_path: str) -> None:
    """Bring the database (`database_url`, else `state_dir`'s SQLite file) to this release's schema revision,
    printing the revision before and after. Safe beside a running bot and with two bots on one PostgreSQL
    database (they take turns through an advisory lock). Exit 2 when the database cannot be used."""
    from sqlalchemy import create_engine
    from sqlalchemy.exc import SQLAlchemyError

    from bot.adapters.store import tables
    from bot.adapters.store.db import pg_connect_args
    from bot.adapters.store.migrate import SchemaError, upgrade
    from bot.wiring import state_url

    config = _load(config_path)
    url = config.database_url or state_url(config.state_dir)
    shown = url.split("@")[-1]
    try:
        engine = create_engine(url, connect_args=pg_connect_args(url))
        try:
            before, after = upgrade(engine, tables())
        finally:
            engine.dispose()
    except (SchemaError, SQLAlchemyError, ImportError, ValueError) as e:  # ValueError: e.g. a port no number
        _fail(f"database {shown}: {' '.join(str(e).split())[:300]}")
    if before == after:
        click.echo(f"database {shown}: already at schema revision {after}")
    else:
        click.echo(f"database {shown}: schema revision {before or '(none: new, or made before migrations)'} -> "
                   f"{after}")


if __name__ == "__main__":
    main()
