"""LaunchService: launch, kill and relaunch server variants on hosts, with pre-launch checks, verified GPU
release and an audit trail. The I/O edge around the pure rules in `bot.core.lifecycle`.

Every action is recorded in the store's events table with the Slack user ID, time, args and result. A
launch is recorded (state `starting`) before its process is started, and its PID (= PGID = SID) right after.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bot.adapters.remote import RemoteError
from bot.adapters.store import TERMINAL_STATES, Launch, Store
from bot.config import Config
from bot.core.lifecycle import (
    DEFAULT_GPU_FREE_MIB,
    CheckResult,
    Holder,
    LaunchError,
    RenderedLaunch,
    attribute_holders,
    gpu_memory,
    group_confirmed,
    launch_processes,
    launch_script,
    parse_launch_output,
    prelaunch_checks,
    render_launch,
    signal_script,
)
from bot.core.models import HostFailure, ProcessInfo, Snapshot
from bot.core.probe import ProbeRequest
from bot.core.redact import MASK, SECRET_NAME_RE, redact, redact_mapping
from bot.services.hosts import HostService

log = logging.getLogger(__name__)

#: A launch in state `starting` younger than this counts as live without looking for its processes.
STARTING_GRACE_S = 120.0


def redact_params(params: dict) -> dict:
    """Params as recorded anywhere (audit trail, launches table): secret-named params masked, the rest
    redacted (bot.core.redact.redact_mapping)."""
    return redact_mapping({k: v if isinstance(v, (int, float, bool)) else str(v) for k, v in params.items()})

#: Called with the new launch (state `starting`) before its process starts; returns the incident thread's
#: ts (the root message it posted) or None.
OnCreated = Callable[[Launch], Awaitable[str | None]]


@dataclass
class LaunchOutcome:
    """Result of `launch`: `launch` (None when refused before recording), `refused` problems, check
    lines that passed, and `error` when starting failed."""

    launch: Launch | None
    checks: CheckResult = field(default_factory=CheckResult)
    error: str | None = None
    exited_early: list[str] = field(default_factory=list)
    host: str | None = None

    @property
    def ok(self) -> bool:
        """True when the server process was started and still ran at the first check."""
        return self.launch is not None and self.error is None and self.checks.ok and not self.exited_early


@dataclass
class KillOutcome:
    """Result of a kill: processes signalled, the ones left (with their state), GPU memory before/after
    (MiB over the launch's GPUs) and whether the memory was released."""

    target: str
    signalled: list[ProcessInfo] = field(default_factory=list)
    remaining: list[ProcessInfo] = field(default_factory=list)
    still_holding: list[Holder] = field(default_factory=list)
    mem_before_mib: float | None = None
    mem_after_mib: float | None = None
    released: bool = False
    used_sigkill: bool = False
    error: str | None = None
    nothing_to_kill: bool = False
    seconds: float = 0.0
    gpu_error: str | None = None

    @property
    def needs_reboot(self) -> bool:
        """True when a remaining process is in uninterruptible sleep (D) or still running in the driver."""
        return any(p.state in ("D", "R") for p in self.remaining)


@dataclass
class KillPreview:
    """What a kill would stop, shown before a typed `/kill` is confirmed: the `host`, the launch's
    process group `pgid` (None for a single pid), the processes (pid, state, command), the GPU indexes
    `gpus` and `gpu_mib` MiB of GPU memory they hold (None when unknown). `error` says why the host
    could not be read (the kill may still be tried); `refusal` (pid kills) why there is nothing to confirm."""

    target: str
    host: str
    launch_id: int | None = None
    pid: int | None = None
    pgid: int | None = None
    processes: list[ProcessInfo] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)
    gpu_mib: float | None = None
    error: str | None = None
    refusal: str | None = None


def build_launch_service(config: Config, hosts: HostService, store: Store | None = None) -> LaunchService:
    """A LaunchService with the config's lifecycle policy and its store (default: the config's database).
    Launches a previous bot process left `stopping` (it stopped mid-kill) become `kill_failed`."""
    from bot.adapters.store import default_url

    store = store or Store(config.database_url or default_url(config.state_dir))
    lc = config.lifecycle
    service = LaunchService(config, hosts, store, gpu_free_mib=lc.gpu_free_mib, kill_grace_s=lc.kill_grace_s,
                            release_timeout_s=lc.release_timeout_s, min_shm_free_mib=lc.min_shm_free_mib)
    for la in service.recover_interrupted_kills():  # every entry point builds it once, at start
        log.warning("%s was being stopped when the bot stopped; it is now kill_failed", la.name)
    return service


class LaunchService:
    """Launch/kill/relaunch for every configured host. Timings in seconds, memory in MiB."""

    def __init__(self, config: Config, hosts: HostService, store: Store, *, gpu_free_mib: float = DEFAULT_GPU_FREE_MIB,
                 kill_grace_s: float = 10.0, release_timeout_s: float = 60.0, poll_s: float = 0.5,
                 start_check_s: float = 1.0, min_shm_free_mib: float = 1024.0):
        self.config = config
        self.hosts = hosts
        self.store = store
        self.gpu_free_mib = gpu_free_mib
        self.kill_grace_s = kill_grace_s
        self.release_timeout_s = release_timeout_s
        self.poll_s = poll_s
        self.start_check_s = start_check_s
        self.min_shm_free_mib = min_shm_free_mib
        self._locks: dict[str, asyncio.Lock] = {}
        #: Called with each launch whose process started (the watcher subscribes here).
        self.started_listeners: list[Callable[[Launch], Any]] = []

    # -- helpers ------------------------------------------------------------------------------------
    def recover_interrupted_kills(self) -> list[Launch]:
        """Launches left `stopping` by a bot that stopped mid-kill become `kill_failed` (live again, so they
        are watched and can be killed). Call once at start, before taking commands. Returns them."""
        out = []
        for la in self.store.recent_launches(1000):
            if la.state == "stopping":
                out.append(self.store.update_launch(la.id, state="kill_failed",
                                                    state_detail="the bot stopped during a kill; kill it again"))
        return out

    async def _snapshot(self, host: str, req: ProbeRequest) -> Snapshot:
        res = await self.hosts.probe(host, req)
        if isinstance(res, HostFailure):
            raise RemoteError(host, res.reason)
        return res

    def _host_launches(self, host: str) -> list[Launch]:
        return [la for la in self.store.recent_launches(200) if la.host == host]

    def holders(self, snap: Snapshot) -> list[Holder]:
        """GPU holders of a snapshot, attributed to this host's launches by tag (or orphan / foreign)."""
        return attribute_holders(snap.gpu, snap.table, self._host_launches(snap.host), snap.launch_tags)

    @staticmethod
    def _tagged(la: Launch, snap: Snapshot) -> list[int]:
        return [pid for pid, tag in snap.launch_tags.items() if la.tag and tag == la.tag]

    def launch_processes_of(self, la: Launch, snap: Snapshot) -> list[ProcessInfo]:
        """The live processes of `la` in a snapshot taken with `select_tag=la.tag` (see launch_processes)."""
        return launch_processes(snap.table, tagged=self._tagged(la, snap), pgid=la.pgid, sid=la.sid)

    # -- launch -------------------------------------------------------------------------------------
    async def launch(self, variant: str, params: dict[str, str], *, user: str, channel: str | None = None,
                     host: str | None = None, thread_ts: str | None = None, relaunch_of: int | None = None,
                     on_created: OnCreated | None = None) -> LaunchOutcome:
        """Check, record and start one launch. Raises LaunchError for bad input (nothing recorded then) and
        never raises for remote failures (they are in the outcome and the events table)."""
        preview = render_launch(self.config, variant, params, launch_id=0, host=host)
        host = preview.host
        # One launch decision at a time per host: two /launch racing must not both pass the checks.
        async with self._host_lock(host):
            return await self._launch_locked(preview, variant, params, user=user, channel=channel,
                                             thread_ts=thread_ts, relaunch_of=relaunch_of, on_created=on_created)

    def _host_lock(self, host: str) -> asyncio.Lock:
        lock = self._locks.get(host)
        if lock is None:
            lock = self._locks[host] = asyncio.Lock()
        return lock

    async def _launch_locked(self, preview: RenderedLaunch, variant: str, params: dict[str, str], *, user: str,
                             channel: str | None, thread_ts: str | None, relaunch_of: int | None,
                             on_created: OnCreated | None) -> LaunchOutcome:
        host = preview.host
        args = {"variant": variant, "host": host, "params": redact_params(params)}
        try:
            snap = await self._snapshot(host, ProbeRequest(port=preview.port, health_path=None, shm=True))
        except RemoteError as e:
            self.store.add_event(user_id=user, action="launch", args=args, result="error", detail=str(e),
                                 host=host, channel=channel)
            return LaunchOutcome(None, error=f"pre-launch check of {host} failed: {e}", host=host)
        live, others = [], []
        for la in self.store.live_launches(host):
            recent = la.state == "starting" and time.time() - la.created_at < STARTING_GRACE_S
            if recent or self.launch_processes_of(la, snap):
                (live if la.variant == variant else others).append(la)
            else:
                self.store.update_launch(la.id, state="exited", state_detail="no process left (seen at a later launch)")
        checks = prelaunch_checks(snap, preview, self.holders(snap), live_same_variant=live,
                                  gpu_free_mib=self.gpu_free_mib, shm_free_mib=snap.shm_free_mib,
                                  min_shm_free_mib=self.min_shm_free_mib)
        for la in others:  # GPUs and ports of our other live launches are taken even before memory shows it
            # a launch that names no GPUs may use all of them
            if la.gpus and preview.gpus:
                shared = ",".join(map(str, sorted(set(la.gpus) & set(preview.gpus))))
            else:
                shared = "all"
            if shared:
                checks.problems.append(f"GPU(s) {shared} belong to {la.name} ({la.state}); `/kill {la.id}` first")
            if la.port and la.port == preview.port:
                checks.problems.append(f"port {la.port} belongs to {la.name} ({la.state}); `/kill {la.id}` first")
        if not checks.ok:
            self.store.add_event(user_id=user, action="launch", args=args, result="refused",
                                 detail="; ".join(checks.problems), host=host, channel=channel)
            return LaunchOutcome(None, checks=checks, host=host)
        la = self.store.create_launch(host=host, variant=variant, params=redact_params(preview.params), command="",
                                      log_path=None, port=preview.port, gpus=preview.gpus, created_by=user,
                                      channel=channel, thread_ts=thread_ts, relaunch_of=relaunch_of)
        r = render_launch(self.config, variant, params, launch_id=la.id, host=host, tag=la.tag)
        command = r.command
        for k, v in r.params.items():  # values of secret-named params never reach the database
            if SECRET_NAME_RE.search(k) and str(v):
                command = command.replace(shlex.quote(str(v)), MASK)
        la = self.store.update_launch(la.id, command=redact(command), log_path=r.log_path)
        if on_created is not None and thread_ts is None:
            try:
                ts = await on_created(la)
            except Exception:
                log.exception("posting the root message of %s failed", la.name)
                ts = None
            if ts:
                la = self.store.update_launch(la.id, thread_ts=ts)
        outcome = await self._start(la, r, user, args, checks)
        return outcome

    async def _start(self, la: Launch, r: RenderedLaunch, user: str, args: dict, checks: CheckResult) -> LaunchOutcome:
        try:
            res = await self.hosts.executor(la.host).run("sh -s", input=launch_script(r).encode(), timeout_s=30)
        except RemoteError as e:
            la = self.store.update_launch(la.id, state="failed", state_detail=str(e))
            self.store.add_event(user_id=user, action="launch", args=args, result="error", detail=str(e),
                                 launch_id=la.id, host=la.host, channel=la.channel)
            return LaunchOutcome(la, checks=checks, error=str(e))
        out = res.stdout.decode("utf-8", "replace")
        pid = parse_launch_output(out)
        if pid is None:
            why = (out + res.stderr.decode("utf-8", "replace")).strip()[:500] or f"exit {res.exit_status}"
            la = self.store.update_launch(la.id, state="failed", state_detail=why)
            self.store.add_event(user_id=user, action="launch", args=args, result="error", detail=why,
                                 launch_id=la.id, host=la.host, channel=la.channel)
            return LaunchOutcome(la, checks=checks, error=f"could not start: {why}")
        la = self.store.set_started(la.id, pid)
        if la.state != "running":  # killed while it was starting: stop what just started, verified
            await asyncio.sleep(0.2)
            try:
                k = await self._kill(la, KillOutcome(target=la.name))
                detail = self.describe_kill(k)
            except RemoteError as e:
                detail = f"could not stop it: {e}"
            self.store.update_launch(la.id, state_detail=f"cancelled while starting; {detail}")
            return LaunchOutcome(la, checks=checks, error=f"{la.name} was cancelled while it was starting ({detail})")
        self.store.add_event(user_id=user, action="launch", args={**args, "launch": la.name}, result="started",
                             detail=f"pid {pid} log {r.log_path}", launch_id=la.id, host=la.host, channel=la.channel)
        outcome = LaunchOutcome(la, checks=checks)
        for listener in self.started_listeners:
            try:
                listener(la)
            except Exception:
                log.exception("a started-listener failed for %s", la.name)
        await asyncio.sleep(self.start_check_s)
        try:
            snap = await self._snapshot(la.host, self.launch_probe_request(la, tail_lines=15))
        except RemoteError:
            return outcome
        if not self.launch_processes_of(la, snap):
            tail = snap.log.tail if snap.log else []
            outcome.exited_early = tail or ["(the log is empty)"]
            outcome.launch = self.store.update_launch(la.id, state="exited",
                                                      state_detail="exited within the first check")
        return outcome

    def launch_probe_request(self, la: Launch, *, tail_lines: int = 20, gpu: bool = True) -> ProbeRequest:
        """A probe of one launch: its session/process group, its tagged processes, its log and port.

        The launch's own log path (rendered from the config, not typed by a user) is allowed as is.
        """
        host_dirs = self.config.hosts[la.host].log_dirs if la.host in self.config.hosts else []
        # the host's log_dirs; without them only the launch's own default log (random name) is readable
        log_dirs = list(host_dirs) or ([la.log_path.rsplit("/", 1)[0] or "/"] if la.log_path else None)
        return ProbeRequest(select_tag=la.tag or None, log_path=la.log_path, log_dirs=log_dirs,
                            port=la.port, health_path=self._health(la), tail_lines=tail_lines, gpu=gpu)

    def _health(self, la: Launch) -> str | None:
        if la.variant in self.config.variants:
            return self.config.resolved_variant(la.variant).health or "/health"
        return "/health"

    async def probe_launch(self, la: Launch, *, tail_lines: int = 20) -> Snapshot | HostFailure:
        """Probe one launch (see launch_probe_request)."""
        return await self.hosts.probe(la.host, self.launch_probe_request(la, tail_lines=tail_lines))

    # -- kill ---------------------------------------------------------------------------------------
    async def kill_preview(self, la: Launch) -> KillPreview:
        """What `kill(la)` would stop now (one probe of the host). Never raises: an unreadable host is
        reported in `error`."""
        out = KillPreview(target=la.name, host=la.host, launch_id=la.id, pgid=la.pgid, gpus=list(la.gpus))
        try:
            snap = await self._snapshot(la.host, ProbeRequest(select_tag=la.tag or None, health_path=None))
        except RemoteError as e:
            out.error = str(e)
            return out
        out.processes = self.launch_processes_of(la, snap)
        pids = {p.pid for p in out.processes}
        if snap.gpu.ok:
            held = [gp for gp in snap.gpu.processes if gp.pid in pids]
            if held:
                out.gpu_mib = float(sum(gp.used_memory_mib or 0 for gp in held))
                out.gpus = sorted({gp.gpu_index for gp in held if gp.gpu_index is not None} | set(la.gpus))
            elif pids:  # per-process readings missing (some VMs): the memory used on the launch's GPUs
                out.gpu_mib = gpu_memory(snap.gpu, la.gpus)
            else:
                out.gpu_mib = 0.0
        return out

    async def kill_pid_preview(self, host: str, pid: int) -> KillPreview:
        """What `kill_pid(host, pid)` would stop now. Never raises; `refusal` is set when the pid does not
        exist or holds no GPU memory (kill_pid would refuse it too)."""
        out = KillPreview(target=f"pid {pid}", host=host, pid=pid)
        try:
            snap = await self._snapshot(host, ProbeRequest(pid=pid, health_path=None))
        except RemoteError as e:
            out.error = str(e)
            return out
        row = next((p for p in snap.table if p.pid == pid), None)
        held = [gp for gp in snap.gpu.processes if gp.pid == pid]
        if row is None:
            out.refusal = f"no process {pid} on {host}"
        elif not snap.gpu.ok:
            out.refusal = f"cannot tell whether pid {pid} holds a GPU ({snap.gpu.error})"
        elif not held:
            out.refusal = f"pid {pid} holds no GPU memory; `/kill pid=` only stops processes that hold a GPU"
        else:
            out.processes = [row]
            out.pgid = None
            out.gpus = sorted({gp.gpu_index for gp in held if gp.gpu_index is not None})
            out.gpu_mib = float(sum(gp.used_memory_mib or 0 for gp in held))
        return out

    async def kill(self, la: Launch, *, user: str, channel: str | None = None) -> KillOutcome:
        """SIGTERM the launch's process group and every process of its session (and tagged ones), wait
        `kill_grace_s`, SIGKILL what is left, then poll GPU memory until the launch's GPUs are released
        (at most `release_timeout_s`). Never raises; the outcome and the events table say what happened."""
        t0 = time.monotonic()
        out = KillOutcome(target=la.name)
        current = self.store.get_launch(la.id)
        if current is not None and current.state == "stopping":
            out.error = f"{la.name} is already being stopped by another kill"
            return out
        if la.state == "starting" and la.pid is None:
            self.store.update_launch(la.id, state="killed", state_detail="cancelled while starting")
            out.nothing_to_kill = out.released = True
            self.store.add_event(user_id=user, action="kill", args={"launch": la.name}, result="cancelled",
                                 detail="cancelled before its process was recorded", launch_id=la.id, host=la.host,
                                 channel=channel)
            return out
        # not live while it is being stopped: the readiness checks stay quiet about a deliberate stop
        self.store.update_launch(la.id, state="stopping")
        try:
            out = await self._kill(la, out)
        except RemoteError as e:
            out.error = str(e)
        except BaseException:  # cancelled (shutdown) mid-kill: never leave it `stopping`, which nothing may kill
            self.store.update_launch(la.id, state="kill_failed", state_detail="the kill was interrupted; kill it again")
            raise
        out.seconds = time.monotonic() - t0
        if out.error:
            state, result = la.state, "error"
        elif out.remaining or out.still_holding:
            state, result = "kill_failed", "incomplete"
        elif out.gpu_error:
            state, result = "killed", "unverified"
        else:
            state, result = "killed", "released" if out.released else "killed"
        detail = self.describe_kill(out)
        before = current.state if current is not None else la.state
        if out.nothing_to_kill and before in TERMINAL_STATES:
            # an ended launch with nothing left (a stale button, a second kill): keep how it ended
            state, detail, result = before, (current.state_detail if current else None) or detail, "nothing"
        self.store.update_launch(la.id, state=state, state_detail=detail)
        self.store.add_event(user_id=user, action="kill", args={"launch": la.name}, result=result, detail=detail,
                             launch_id=la.id, host=la.host, channel=channel)
        return out

    async def _kill(self, la: Launch, out: KillOutcome) -> KillOutcome:
        req = ProbeRequest(select_tag=la.tag or None, health_path=None)
        snap = await self._snapshot(la.host, req)
        procs = self.launch_processes_of(la, snap)
        group_ok = group_confirmed(snap.table, self._tagged(la, snap), la.pgid)
        out.mem_before_mib = gpu_memory(snap.gpu, la.gpus)
        if not procs:
            out.nothing_to_kill = True
            out.released = True
            out.mem_after_mib = out.mem_before_mib
            return out
        out.signalled = procs
        ex = self.hosts.executor(la.host)
        pgid = la.pgid if group_ok else None  # only a group that is confirmed ours is signalled as a whole
        await ex.run("sh -s", input=signal_script([p.pid for p in procs], pgid, "TERM").encode(), timeout_s=15)
        procs = await self._wait_gone(la, self.kill_grace_s, [p.pid for p in procs])
        if procs:
            out.used_sigkill = True
            await ex.run("sh -s", input=signal_script([p.pid for p in procs], pgid, "KILL").encode(), timeout_s=15)
            procs = await self._wait_gone(la, 5.0, [p.pid for p in procs])
        out.remaining = procs
        return await self._wait_released(la, out, {p.pid for p in out.signalled})

    async def _wait_gone(self, la: Launch, budget_s: float, pids: list[int]) -> list[ProcessInfo]:
        deadline = time.monotonic() + budget_s
        while True:
            snap = await self._snapshot(la.host, ProbeRequest(select_tag=la.tag or None, health_path=None, gpu=False))
            procs = self.launch_processes_of(la, snap)
            if not la.tag:  # a foreign pid (/kill pid=N): follow the number itself
                procs += [p for p in snap.table if p.pid in pids]
            procs = [p for p in {p.pid: p for p in procs}.values() if p.state != "Z"]
            if not procs or time.monotonic() >= deadline:
                return procs
            await asyncio.sleep(self.poll_s)

    async def _wait_released(self, la: Launch, out: KillOutcome, pids: set[int]) -> KillOutcome:
        deadline = time.monotonic() + self.release_timeout_s
        while True:
            snap = await self._snapshot(la.host, ProbeRequest(health_path=None))
            out.mem_after_mib = gpu_memory(snap.gpu, la.gpus)
            out.gpu_error = None if snap.gpu.ok else snap.gpu.error
            holders = [h for h in self.holders(snap) if h.pid in pids or h.launch_id == la.id]
            out.still_holding = holders
            gpus_free = True
            if snap.gpu.ok and la.gpus:
                gpus_free = all((g.memory_used_mib or 0) < self.gpu_free_mib
                                for g in snap.gpu.gpus if g.index in la.gpus)
            if not snap.gpu.ok:
                out.released = not holders and not out.remaining
                return out
            if not holders and gpus_free:
                out.released = True
                return out
            if time.monotonic() >= deadline:
                out.released = False
                return out
            await asyncio.sleep(self.poll_s)

    async def kill_pid(self, host: str, pid: int, *, user: str, channel: str | None = None,
                       expect_command: str | None = None) -> KillOutcome:
        """Kill one (foreign) process: SIGTERM, grace, SIGKILL; report its GPU memory released or not.
        With `expect_command` (the command line shown when the kill was confirmed), a pid that now runs
        another command (reused) is not killed."""
        out = KillOutcome(target=f"pid {pid} on {host}")
        t0 = time.monotonic()
        try:
            snap = await self._snapshot(host, ProbeRequest(pid=pid, health_path=None))
            row = next((p for p in snap.table if p.pid == pid), None)
            held = sum(gp.used_memory_mib or 0 for gp in snap.gpu.processes if gp.pid == pid)
            out.mem_before_mib = float(held) if snap.gpu.ok else None
            holds_gpu = any(gp.pid == pid for gp in snap.gpu.processes)
            if row is None:
                out.nothing_to_kill = out.released = True
            elif expect_command is not None and row.args != expect_command:
                out.error = (f"pid {pid} now runs another command ({row.args[:60]}); the process that was "
                             "confirmed is gone, nothing was killed")
            elif not snap.gpu.ok:
                out.error = f"cannot tell whether pid {pid} holds a GPU ({snap.gpu.error}); not killed"
            elif not holds_gpu:
                out.error = (f"pid {pid} ({row.args[:60]}) holds no GPU memory; `/kill pid=` only stops "
                             "processes that hold a GPU")
            else:
                out.signalled = [row]
                ex = self.hosts.executor(host)
                await ex.run("sh -s", input=signal_script([pid], None, "TERM").encode(), timeout_s=15)
                fake = Launch(id=0, host=host, variant="pid", params={}, command="", log_path=None, port=None,
                              gpus=[], pid=pid, pgid=None, sid=None, state="running", state_detail=None,
                              created_by="", created_at=0, ended_at=None, channel=None, thread_ts=None)
                left = await self._wait_gone(fake, self.kill_grace_s, [pid])
                if left:
                    out.used_sigkill = True
                    await ex.run("sh -s", input=signal_script([pid], None, "KILL").encode(), timeout_s=15)
                    left = await self._wait_gone(fake, 5.0, [pid])
                out.remaining = left
                after = await self._snapshot(host, ProbeRequest(health_path=None))
                out.still_holding = [h for h in self.holders(after) if h.pid == pid]
                out.mem_after_mib = float(sum(h.mib or 0 for h in out.still_holding)) if after.gpu.ok else None
                out.released = not out.remaining and not out.still_holding
        except RemoteError as e:
            out.error = str(e)
        out.seconds = time.monotonic() - t0
        self.store.add_event(user_id=user, action="kill_pid", args={"host": host, "pid": pid},
                             result="error" if out.error else ("released" if out.released else "incomplete"),
                             detail=self.describe_kill(out), host=host, channel=channel)
        return out

    @staticmethod
    def describe_kill(out: KillOutcome) -> str:
        """One line for the audit trail and the root message."""
        if out.error:
            return f"kill failed: {out.error}"
        if out.nothing_to_kill:
            return "no process was left"
        mem = ""
        if out.mem_before_mib is not None and out.mem_after_mib is not None:
            mem = f"; GPU memory {out.mem_before_mib / 1024:.1f} -> {out.mem_after_mib / 1024:.1f} GiB"
        if out.remaining or out.still_holding:
            return f"{len(out.remaining)} process(es) survived, {len(out.still_holding)} still hold GPU memory{mem}"
        return f"{len(out.signalled)} process(es) stopped{' (SIGKILL needed)' if out.used_sigkill else ''}{mem}"

    # -- relaunch -----------------------------------------------------------------------------------
    async def relaunch(self, la: Launch, params: dict[str, str], *, user: str,
                       channel: str | None = None) -> tuple[KillOutcome, LaunchOutcome | None]:
        """Kill `la` (verified: processes gone and GPU memory released), then launch the same variant on the
        same host with its params updated by `params`, in the same thread. Returns both outcomes; the
        launch outcome is None when the kill did not complete."""
        merged = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in la.params.items()
                  if v != MASK}  # a secret param was never stored: it falls back to its default, or must be given
        merged.update(params)
        render_launch(self.config, la.variant, merged, launch_id=0, host=la.host)  # validate before killing
        current = self.store.get_launch(la.id)
        if current is not None and current.state == "stopping":
            raise LaunchError(f"{la.name} is being stopped by another kill; relaunch it when that has answered")
        if la.live:
            k = await self.kill(la, user=user, channel=channel)
        else:
            k = KillOutcome(target=la.name, nothing_to_kill=True, released=True)
        if k.error or k.remaining or k.still_holding or not (k.released or k.gpu_error):
            self.store.add_event(user_id=user, action="relaunch",
                                 args={"launch": la.name, "params": redact_params(params)}, result="refused",
                                 detail="the old launch did not stop cleanly", launch_id=la.id, host=la.host,
                                 channel=channel)
            return k, None
        new = await self.launch(la.variant, merged, user=user, channel=la.channel or channel, host=la.host,
                                thread_ts=la.thread_ts, relaunch_of=la.id)
        self.store.add_event(user_id=user, action="relaunch", args={"launch": la.name, "params": redact_params(params)},
                             result="started" if new.ok else "failed",
                             detail=new.launch.name if new.launch else "; ".join(new.checks.problems) or new.error,
                             launch_id=la.id, host=la.host, channel=channel)
        return k, new

    # -- lookup -------------------------------------------------------------------------------------
    def find(self, ref: str | None, *, channel: str | None = None, thread_ts: str | None = None,
             allow_only_live: bool = True) -> Launch:
        """Resolve a launch reference: `12`, `base#12`, a variant name (its newest live launch), or nothing:
        the launch of this thread; outside any thread, the only live launch when `allow_only_live`.
        Raises LaunchError naming the live launches."""
        la = self._find(ref, channel=channel, thread_ts=thread_ts, allow_only_live=allow_only_live)
        if la.host not in self.config.hosts:
            raise LaunchError(f"{la.name} ran on host {la.host!r}, which is no longer in the config")
        return la

    def _find(self, ref: str | None, *, channel: str | None, thread_ts: str | None,
              allow_only_live: bool) -> Launch:
        if ref:
            text = ref.strip()
            prefix, _, num = text.rpartition("#") if "#" in text else ("", "", text)
            if num.isascii() and num.isdigit():
                la = self.store.get_launch(int(num))
                if la is None or (prefix and prefix != la.variant):
                    raise LaunchError(f"no launch {text[:40]!r}")
                return la
            live = self.store.live_launches(variant=text)
            if len(live) == 1:
                return live[0]
            if len(live) > 1:
                raise LaunchError(f"{text[:40]!r} has {len(live)} live launches: "
                                  + ", ".join(f"{la.name} on {la.host}" for la in live) + "; name one")
            raise LaunchError(f"no live launch of {text[:40]!r}; {self._live_list()}")
        if channel and thread_ts:
            la = self.store.launch_for_thread(channel, thread_ts)
            if la is not None:
                return la
            raise LaunchError(f"this thread belongs to no launch: name one; {self._live_list()}")
        if not allow_only_live:
            raise LaunchError(f"name the launch (id or variant); {self._live_list()}")
        live = self.store.live_launches()
        if len(live) == 1:
            return live[0]
        raise LaunchError(f"name the launch (id or variant); {self._live_list()}")

    def _live_list(self) -> str:
        live = self.store.live_launches()
        if not live:
            return "no launch is live"
        return "live launches: " + ", ".join(f"{la.name} on {la.host}" for la in live[:10])
