"""The one composition root: `build_runtime(config, ...)` wires every part of the bot once, for Slack, the
console, the demo and the tests alike.

Who gets what: one Redactor (built-in rules plus the config's `redact_patterns`) for the renderer, the
audit writer, the host service and the launch service; one Store (the database) whose repositories only
services use; one Surface where answers go (the outbox over a transport for Slack, or the caller's own,
e.g. the console's); one Scheduler for the watcher; one Dispatcher for every route.

Importing this module is cheap: `check_config` (run by every gpubot command that reads a config, such as
`check-config`) needs only the config, the scheduler adapter and the command table; `build_runtime` imports the
services (and with them the database, SSH and the charts) when it wires them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from bot.adapters import scheduler as scheduler_adapter
from bot.adapters.leader import AdvisoryLeader, SoleLeader, bot_identity, leadership_for
from bot.adapters.locks import DecisionLocks
from bot.adapters.scheduler import Scheduler
from bot.adapters.statelock import StateLock
from bot.adapters.store import DatabaseUnavailable
from bot.config import Config, ConfigError
from bot.core.clock import SYSTEM_CLOCK, Clock
from handlers import derive as handler_derive

if TYPE_CHECKING:
    from bot.adapters.cpu import CpuPool
    from bot.adapters.metrics import Metrics
    from bot.adapters.remote import Executor
    from bot.adapters.secretbox import SecretBox
    from bot.adapters.store import Store
    from bot.config import WatchPolicy
    from bot.core.redact import Redactor
    from bot.present.render import Renderer
    from bot.services.audit import Audit
    from bot.services.confirmations import ConfirmationService
    from bot.services.history import CheckHistory
    from bot.services.hosts import HostService, NvmlReader
    from bot.services.journal import CommandJournal
    from bot.services.launches import LaunchService
    from bot.services.outbox import Outbox, Transport
    from bot.services.stacks import StackService
    from bot.services.surface import Surface
    from bot.services.threads import IncidentThreads
    from bot.services.watch import Watcher
    from handlers import Dispatcher, Services

log = logging.getLogger(__name__)
#: Seconds between a shared database bot's looks at the launches the other bots started (`Runtime._keep_up`): the
#: leader adopts their watches, and every bot learns their secret values (to mask them).
ADOPT_EVERY_S = 1.0


@functools.cache
def shared_cpu_pool() -> CpuPool:
    """The process's one CPU worker pool (the timeline charts), shared by every runtime built here; its worker
    process starts on first use and ends with the process."""
    from bot.adapters.cpu import CpuPool

    return CpuPool()


def config_problems(config: Config) -> list[str]:
    """Problems of a schema-valid config that only the parts above the config layer can see: a digest cron
    APScheduler refuses, slash command names the command table does not know or Slack would refuse.
    `location: message` strings; empty when fine."""
    return scheduler_adapter.config_problems(config) + handler_derive.config_problems(config)


def check_config(config: Config) -> Config:
    """`config` itself, or ConfigError listing `config_problems`."""
    problems = config_problems(config)
    if problems:
        raise ConfigError(problems)
    return config


@dataclass
class Runtime:
    """Every part of one bot, wired. `start()` inside the event loop; `close()` at the end."""

    config: Config
    redactor: Redactor
    renderer: Renderer
    store: Store
    audit: Audit
    hosts: HostService
    history: CheckHistory
    surface: Surface
    outbox: Outbox | None
    threads: IncidentThreads
    launches: LaunchService
    stacks: StackService
    confirmations: ConfirmationService
    watcher: Watcher
    services: Services
    dispatcher: Dispatcher
    journal: CommandJournal | None = None
    metrics: Metrics | None = None
    lock: StateLock | None = None
    leadership: SoleLeader | AdvisoryLeader = field(default_factory=SoleLeader)
    recover: bool = True
    _watch: bool = True
    _leading_task: asyncio.Task | None = None
    _adopting: asyncio.Task | None = None
    _keeping_up: asyncio.Task | None = None

    async def start(self, *, watch: bool = True, settle_heap: bool = False) -> None:
        """Lead, or follow: the leader (the only bot on its database, or the holder of a shared database's
        leadership) starts the outbox sender (what an earlier run left queued goes out first) and, with `watch`,
        the scheduled readiness checks; a follower queues its answers for the leader to send and takes over when
        the leader goes (bot.adapters.leader). A long-running process (the Slack service, the console) passes
        `settle_heap` (see `settle_heap`)."""
        self._watch = watch
        await self._hold_life()
        if not self.leadership.shared:
            await self._lead()
        else:
            self.watcher.following = True
            self._leading_task = asyncio.get_running_loop().create_task(
                self.leadership.run(self._lead, self._follow), name="gpubot-leadership")
            self._keeping_up = asyncio.get_running_loop().create_task(self._keep_up(), name="gpubot-keep-up")
        if settle_heap:
            settle_heap_now()

    @property
    def leading(self) -> bool:
        """True while this bot sends the outbox and runs the checks."""
        return self.leadership.leading

    async def vitals(self, *, slack: bool | None = None, timeout_s: float = 3.0) -> dict[str, object]:
        """The bot's health for /healthz (and the gauges of /metrics, refreshed): `healthy` (the database answered
        within `timeout_s` seconds and Slack, where known, is connected; a follower is healthy), `role` (leader or
        follower), `slack` (`slack`: True, False or None when not known), `database`, `watched` (launches checked
        here), `outbox_depth` and `outbox_oldest_age_s` (rows still to send). Never raises."""
        async def ask(fn: Callable[[], object]) -> object:
            return await asyncio.wait_for(asyncio.to_thread(fn), timeout_s)

        try:
            await ask(self.store.db.ping)
            database = True
        except Exception as e:
            log.warning("health: the database did not answer: %s", e)
            database = False
        backlog: tuple[int, float] | None = None
        if self.outbox is not None and database:
            try:
                depth, oldest = await ask(self.store.outbox.backlog)  # type: ignore[misc]
                backlog = (depth, max(0.0, self.store.clock.time() - oldest) if oldest is not None else 0.0)
            except Exception as e:
                log.warning("health: the outbox could not be read: %s", e)
        watched = self.watcher.scheduler.watched_count()
        if self.metrics is not None:
            self.metrics.refresh(outbox=backlog, leader=self.leading, watched=watched, slack=slack, database=database)
        return {"healthy": database and slack is not False, "role": "leader" if self.leading else "follower",
                "slack": slack, "database": database, "watched": watched,
                "outbox_depth": backlog[0] if backlog else None,
                "outbox_oldest_age_s": round(backlog[1], 3) if backlog else None}

    async def _hold_life(self) -> None:
        """Hold (or take again) this bot's life lock: while it is held, no other bot answers its commands."""
        try:
            if not await self.launches.locks.hold_life(self.audit.owner):
                log.error("this bot's life lock (%s) is held by another session", self.audit.owner)
        except Exception as e:
            log.warning("cannot take this bot's life lock (tried again in %.0f s): %s", ADOPT_EVERY_S, e)

    async def _answer_orphans(self) -> None:
        """Answer the commands that bots now gone left (bot.services.journal); a database that refuses: next
        time."""
        if self.journal is None:
            return
        try:
            await self.journal.recover()
        except Exception as e:
            log.warning("cannot look for commands that gone bots left: %s", e)

    async def _lead(self) -> None:
        if self.outbox is not None:
            self.outbox.start()
        await self._answer_orphans()
        if self.leadership.shared and self.recover:
            await self.launches.recover_orphans()  # what a leader that died left half-done; never a live bot's
        await self.launches.finish_interrupted_starts()  # before the checks: a launch left starting, no PID
        await self.launches.finish_interrupted_kills()  # before the checks: they would call it kill_failed
        if self._watch:
            await self.watcher.start()
            if self.leadership.shared:
                self._adopting = asyncio.get_running_loop().create_task(self._adopt(), name="gpubot-adopt")

    async def _adopt(self) -> None:
        """While leading a shared database: follow the launches the other bots start (every ADOPT_EVERY_S)."""
        while True:
            await asyncio.sleep(ADOPT_EVERY_S)
            try:
                self.watcher.adopt()
            except Exception as e:  # the database refuses for now: next time
                log.warning("cannot look for other bots' launches: %s", e)

    async def _keep_up(self) -> None:
        """On a shared database, leader or follower: learn the secret values of the launches the other bots start
        (every ADOPT_EVERY_S, off the event loop), so that this bot masks them too."""
        while True:
            await asyncio.sleep(ADOPT_EVERY_S)
            await self._hold_life()  # first: a bot whose session was ended must not look gone for long
            if self.leading:
                await self._answer_orphans()
            await asyncio.to_thread(self.launches.secrets.learn_new)

    async def _follow(self) -> None:
        """This bot stopped leading (its heartbeat failed): stop sending and checking at once."""
        if self._adopting is not None:
            self._adopting.cancel()
            self._adopting = None
        await self.watcher.stop()
        self.watcher.following = True
        if self.outbox is not None:
            await self.outbox.stop()
            self.outbox.hold()

    async def close(self, *, flush_s: float = 5.0) -> None:
        """Stop the checks, give the outbox `flush_s` seconds to send what is queued (the rest stays queued
        in the database; a follower leaves it to the leader), close SSH connections and the database. Never
        raises."""
        if self._leading_task is not None:
            self._leading_task.cancel()
            with contextlib.suppress(BaseException):
                await self._leading_task
        for task in (self._adopting, self._keeping_up):
            if task is not None:
                task.cancel()
        for step in (self.watcher.stop, self.history.close, lambda: self._stop_outbox(flush_s), self.hosts.close):
            try:
                await step()
            except Exception:
                log.exception("shutdown step failed")
        self.launches.locks.release_life()
        self.store.close()
        if self.lock is not None:
            self.lock.release()

    async def _stop_outbox(self, flush_s: float) -> None:
        if self.outbox is not None:
            if self.outbox.sending or not self.outbox.shared:
                await self.outbox.flush(flush_s)
            await self.outbox.stop()


def settle_heap_now() -> None:
    """Collect garbage once, then move every object alive (modules, templates, compiled patterns, the wiring: about
    150,000 of them) out of the garbage collector's view (`gc.freeze`), so a full collection walks only what was
    made since. Measured: a full collection during a 1,000-row `/probe` cost ~20 % of its CPU before."""
    gc.collect()
    gc.freeze()


#: Environment variables of the bot whose values are secrets (Slack credentials), masked by value.
SECRET_ENV_NAMES = ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_CLIENT_SECRET")


def known_secret_values(config: Config, environ: Mapping[str, str] | None = None) -> list[str]:
    """The secret values the bot knows at start-up, masked by value wherever they appear: its Slack
    credentials (SECRET_ENV_NAMES), the `${NAME}` values the config loader put into env maps, env values
    whose name says secret, and defaults of params that are `secret: true` or secret-named."""
    from bot.core.redact import SECRET_NAME_RE

    env = os.environ if environ is None else environ
    values = [env.get(n, "") for n in SECRET_ENV_NAMES]
    values += list(config.expanded_env_values)
    maps = [h.env for h in config.hosts.values()] + [v.env for v in config.variants.values()]
    values += [val for m in maps for k, val in m.items() if SECRET_NAME_RE.search(k)]
    for v in config.variants.values():
        for name, spec in (v.params or {}).items():
            default = getattr(spec, "default", None)
            if default is not None and (getattr(spec, "secret", False) or SECRET_NAME_RE.search(name)):
                values.append(str(default))
    return [x for x in values if x]


def state_url(state_dir: str) -> str:
    """`default_url(state_dir)`; raises DatabaseUnavailable naming the directory when it cannot be created."""
    from bot.adapters.store import default_url

    try:
        return default_url(state_dir)
    except OSError as e:
        raise _dir_unusable(state_dir, e) from e


def _secret_box(store: Store, config: Config) -> SecretBox | None:
    """The SecretBox of this bot: its key in GPUBOT_SECRET_KEY, else `secret.key` beside the SQLite database
    (the state directory for another database). None, with a warning, when there is no usable key: secret
    params are then masked by value only until the bot restarts."""
    from bot.adapters.secretbox import SecretBox, SecretBoxError

    path = Path(store.db.path)
    directory = path.parent if store.url.startswith("sqlite") and path.name else Path(config.state_dir)
    try:
        return SecretBox.for_directory(directory)
    except SecretBoxError as e:
        log.warning("secret param values will not survive a restart: %s", e)
        return None


def _dir_unusable(path: str, e: OSError) -> DatabaseUnavailable:
    """The DatabaseUnavailable for a state directory that cannot be created or written (`e` from mkdir/open),
    naming the file in the way when a part of the path is a file."""
    if isinstance(e, FileExistsError | NotADirectoryError):
        p = Path(os.path.expanduser(path))
        while not p.exists() and p != p.parent:
            p = p.parent
        return DatabaseUnavailable(path, f"the state directory cannot be used: {p} is not a directory")
    return DatabaseUnavailable(path, f"the state directory cannot be used: {e.strerror or e}")


def build_runtime(config: Config, *, surface: Surface | None = None, transport: Transport | None = None,
                  store: Store | None = None, executors: Mapping[str, Executor] | None = None,
                  nvml_reader: NvmlReader | None = None, extra_path: list[str] | None = None,
                  watch_policy: WatchPolicy | None = None, poll_s: float = 0.5, start_check_s: float = 1.0,
                  outbox_options: Mapping[str, float] | None = None,
                  surface_factory: Callable[[Outbox], Surface] | None = None, recover: bool = True,
                  clock: Clock | None = None, threads: bool = True) -> Runtime:
    """Wire a bot for `config`.

    Answers go to `surface`, or, with a `transport` (Slack), through an Outbox in the database
    (`slack.post_interval_s` apart per channel; `outbox_options` are further Outbox settings) and an OutboxSurface
    (or `surface_factory(outbox)`). `store` defaults to the config's database (`database_url`, else
    `state_dir/gpubot.db`); `executors` replace hosts' executors (tests); `watch_policy` overrides the config's
    `watch:`; `poll_s`/`start_check_s` time kills and the first look at a launch; `threads` False: the surface has
    no threads (the console), so suggested thread commands are written with their launch (`!logs #7 200`). Launches
    a previous run left `stopping` become `kill_failed` (unless `recover` is False: a one-shot command beside a
    running bot, such as `gpubot bundle`, leaves them to it). Without a `store` it takes the state directory's lock
    (one bot per state directory; released by `Runtime.close`). Raises ConfigError (see `config_problems`),
    StateDirLocked when another bot holds the state directory, ValueError without a surface or transport, and
    DatabaseUnavailable (naming the file or directory) for an unusable database or state directory. `clock`
    (default: the system's) is the one clock of the bot: the store's times, kill confirmations' expiry, launches'
    and checks' times (tests pass tests.support.clock.ManualClock).
    """
    from bot.adapters.logs import redact_logs
    from bot.adapters.metrics import Metrics
    from bot.adapters.store import Store
    from bot.core.redact import Redactor
    from bot.present.render import Renderer
    from bot.services.alerts import AlertPoster
    from bot.services.audit import Audit
    from bot.services.bundles import BundleService
    from bot.services.confirmations import ConfirmationService
    from bot.services.history import CheckHistory
    from bot.services.hosts import HostService
    from bot.services.journal import CONFIRM_GONE_S, CommandJournal
    from bot.services.launches import LaunchService
    from bot.services.outbox import Outbox
    from bot.services.stacks import StackService
    from bot.services.surface import OutboxSurface
    from bot.services.threads import IncidentThreads
    from bot.services.watch import Watcher
    from handlers import Dispatcher, Services

    check_config(config)
    if surface is None and transport is None:
        raise ValueError("build_runtime needs a surface or a transport")
    if store is not None and clock is not None and store.clock is not clock:
        raise ValueError("build_runtime: a store and a clock that is not the store's: build the Store with it")
    redactor = Redactor(config.redact_patterns, values=known_secret_values(config))
    redact_logs(redactor)
    names = handler_derive.command_names(config)
    renderer = Renderer(redactor, names if threads else replace(names, threads=False))
    lock = StateLock.for_database(config.database_url, config.state_dir) if store is None else None
    try:
        if lock is not None:
            lock.acquire()
    except OSError as e:
        raise _dir_unusable(str(lock.dir), e) from e
    try:
        store = store or Store(config.database_url or state_url(config.state_dir), clock or SYSTEM_CLOCK)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    metrics = Metrics()
    # this run's name in the command journal: `host:pid` and a token (a restarted container has the same host:pid)
    owner = f"{bot_identity()[:280]}:{secrets.token_hex(4)}"
    audit = Audit(store.events, redactor, metrics, commands=store.commands, owner=owner)
    hosts = HostService(config, dict(executors or {}), redactor=redactor, nvml_reader=nvml_reader,
                        extra_path=extra_path, clock=store.clock, metrics=metrics)
    outbox = None
    if transport is not None:
        outbox = Outbox(store.outbox, transport, min_interval_s=config.slack.post_interval_s,
                        on_posted=store.launches.replace_thread_ts, redactor=redactor, clock=store.clock,
                        **dict(outbox_options or {}))
        surface = surface_factory(outbox) if surface_factory is not None else OutboxSurface(outbox)
    assert surface is not None
    threads = IncidentThreads(store.launches, surface, renderer)
    leadership = leadership_for(store.db.engine)
    locks = DecisionLocks(store.db.engine)
    launches = LaunchService(config, hosts, store, audit, threads, redactor=redactor, poll_s=poll_s,
                             start_check_s=start_check_s, secretbox=_secret_box(store, config), locks=locks)
    # only a bot that talks to Slack answers the commands of another (a console prints; Slack would never see them)
    journal = CommandJournal(store.commands, store.launches, surface, renderer, locks.alive, owner=owner,
                             clock=store.clock, confirm_s=CONFIRM_GONE_S if leadership.shared else 0.0) \
        if transport is not None else None
    launches.secrets.relearn()
    if outbox is not None and leadership.shared:
        outbox.shared = True
        outbox.hold()  # until this bot leads
    if recover and not leadership.shared:  # a shared database's leader does it when it takes the lead
        launches.recover_interrupted_kills()
    stacks = StackService(hosts, launches, audit)
    confirmations = ConfirmationService(store.confirmations, launches)
    history = CheckHistory(store.observations)
    cpu = shared_cpu_pool()
    alerts = AlertPoster(surface, renderer, threads, history, cpu, store.clock, metrics)
    watcher = Watcher(config, launches, store, alerts, threads, surface, renderer, Scheduler(store.url),
                      history=history, cpu=cpu, policy=watch_policy, stacks=stacks)
    # the watcher follows new launches while it runs: LaunchService calls these hooks, wired here
    launches.follow_hooks.append(watcher.follow)
    launches.early_exit_hooks.append(watcher.exited_early)
    bundles = BundleService(hosts, launches, stacks, audit, redactor, policy_for=watcher.policy_for)
    services = Services(config=config, renderer=renderer, hosts=hosts, launches=launches, stacks=stacks,
                        bundles=bundles, confirmations=confirmations, watcher=watcher)
    return Runtime(config=config, redactor=redactor, renderer=renderer, store=store, audit=audit, hosts=hosts,
                   history=history, surface=surface, outbox=outbox, threads=threads, launches=launches, stacks=stacks,
                   confirmations=confirmations, watcher=watcher, services=services,
                   dispatcher=Dispatcher(services, audit), journal=journal, metrics=metrics, lock=lock,
                   leadership=leadership, recover=recover)
