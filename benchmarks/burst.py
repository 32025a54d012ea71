"""The 200-burst: how fast are acks, how many Slack calls does an answer cost, and when do the answers land,
when 200 `/gpu status` slash commands arrive within 2 s? Prints figures; asserts nothing.

How: the real Bolt app (bot.slack.app.build_app over the real runtime, outbox and SQLite database) in Socket
Mode against the fake Slack running in a separate process (benchmarks.fake_slack_server, so the fake's work
neither shares the bot's event loop nor counts as the bot's CPU). The one host is this machine (`local:
true`) with the replaying fake nvidia-smi (bot.demo.fakegpu). After one warm-up command, the fake pushes
`--count` slash commands evenly over `--over-s` seconds, and the run waits until every command is acked and
answered and the outbox is empty. Two variants, each with a fresh bot and fake:
  one: every command in one channel (the pacing of one channel decides when the last answer lands);
  ten: the commands round-robin over 10 channels.

Printed per variant:
  ack latency p50/p99/max: from the envelope being written to the websocket to its ack arriving, both times
    taken by the fake (Slack's limit is 3 s);
  Slack calls per answer: (chat.postMessage + chat.update + chat.delete + file uploads) / commands in the burst
    channels, with chat.postEphemeral counted apart;
  first and last answer landed: seconds after the first envelope was pushed;
  the bot's CPU seconds during the burst (the bot process; its child processes, the local probes, apart), the
    bot's event-loop lag p50/p99/max (how late a 10 ms sleep wakes up) and its garbage collector's pauses
    (they stop every thread, the Socket Mode one included);
  the machine's load average (os.getloadavg) at the start and the end.

Defaults are representative of a real workspace: Slack's pacing of about one message per second per channel
(`slack.post_interval_s` = 1 s, its real default), so the one-channel variant takes about 200 s with one call
per answer (twice that with two), the ten-channel one about 20 s: about 4 minutes in all. `--post-interval-s
0.01` (or `--quick`, which also implies it) shows the bot's own costs in seconds, without Slack's pacing.

Run: .venv/bin/python -m benchmarks.burst [--quick] [--post-interval-s S] [--count N] [--over-s S]
     [--variants one,ten] [--deadline-s S]
Against another release's tree (the fake Slack process comes from the same tree; the first line names it):
     cp benchmarks/burst.py benchmarks/fake_slack_server.py /tmp/b/ && cd /that/tree &&
     PYTHONPATH=/that/tree .venv/bin/python /tmp/b/burst.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import json
import logging
import os
import resource
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

import bot
from bot.adapters.store import Store
from bot.config import Config, HostConfig
from bot.demo.fakegpu import REPLAY_NOTE, install_fake_gpu
from bot.slack.app import build_app, slack_runtime
from bot.slack.client import make_client

#: Methods that put or change a message in a channel (what Slack paces), per answer.
COUNTED = ("chat.postMessage", "chat.update", "chat.delete", "files.completeUploadExternal")
#: Text of a `/gpu status` answer (a post, or a placeholder's edit into the answer).
ANSWER_PREFIX = "GPU status"
#: The source tree `bot` is imported from.
TREE = str(Path(bot.__file__).resolve().parent.parent)
#: Channels of the variants.
VARIANTS = {"one": ["C1"], "ten": [f"C{i:02d}" for i in range(1, 11)]}


@dataclass
class Figures:
    """What one variant measured (times in seconds)."""

    variant: str
    channels: int
    count: int
    acks: list[float] = field(default_factory=list)
    unacked: int = 0
    calls: dict[str, int] = field(default_factory=dict)
    answers: int = 0
    first_answer_s: float | None = None
    last_answer_s: float | None = None
    cpu_s: float = 0.0
    children_cpu_s: float = 0.0
    lag: list[float] = field(default_factory=list)
    gc: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    finished: bool = True
    load: tuple[tuple[float, float, float], tuple[float, float, float]] | None = None


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank `q` percentile (0..100) of `values`; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


class LagMonitor:
    """How late the event loop wakes a 10 ms sleep: `lags` in seconds, while running."""

    def __init__(self, every_s: float = 0.01):
        self.every_s = every_s
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Start sampling on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(self.every_s)
            self.lags.append(max(0.0, time.monotonic() - t0 - self.every_s))

    async def stop(self) -> list[float]:
        """Stop sampling; returns the lags."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return self.lags


class GcPauses:
    """The cyclic garbage collector's pauses in this process (they stop every thread): `pauses` in seconds."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._started)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


class FakeSlackProcess:
    """benchmarks.fake_slack_server as a child process: `api_url`, and `get`/`post` on its control API."""

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.api_url = ""
        self.control_url = ""
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Start the process and read its addresses. Raises RuntimeError when it does not start."""
        # by file, with the tree the bot comes from first on the path: a copy of this benchmark runs against
        # another release's tree (PYTHONPATH=/that/tree) and its fake Slack comes from there too
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (TREE, os.environ.get("PYTHONPATH")) if p)}
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).with_name("fake_slack_server.py")), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, env=env)
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 30)
        if not line:
            raise RuntimeError("the fake Slack process did not start")
        addresses = json.loads(line)
        self.api_url, self.control_url = addresses["api_url"], addresses["control_url"]
        self.session = aiohttp.ClientSession()

    async def get(self, path: str) -> Any:
        """GET a control route; returns its JSON."""
        assert self.session is not None
        async with self.session.get(self.control_url + path) as r:
            return await r.json()

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        """POST JSON to a control route; returns its JSON."""
        assert self.session is not None
        async with self.session.post(self.control_url + path, json=body) as r:
            return await r.json()

    async def stop(self) -> None:
        """Close its stdin (it exits) and wait for it."""
        if self.session is not None:
            await self.session.close()
        if self.proc is not None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


def bench_config(workdir: Path, post_interval_s: float) -> Config:
    """This machine as the one host `local`, with the replaying fake nvidia-smi (2 H200s)."""
    gpu = install_fake_gpu(workdir / "gpu", gpu_count=2)
    host = HostConfig(local=True, nvidia_smi=str(gpu.nvidia_smi), use_nvml=False, gpu_note=REPLAY_NOTE,
                      log_dirs=[str(workdir)])
    return Config.model_validate({"hosts": {"local": host.model_dump()}, "default_host": "local",
                                  "state_dir": str(workdir / "state"),
                                  "slack": {"post_interval_s": post_interval_s}})


async def _wait(predicate: Any, timeout_s: float, every_s: float = 0.25) -> bool:
    """Poll the async `predicate` until it is true (True) or `timeout_s` passed (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(every_s)
    return False


async def run_variant(variant: str, args: argparse.Namespace) -> Figures:
    """One variant with a fresh fake Slack process and a fresh bot; returns its figures."""
    channels = VARIANTS[variant]
    out = Figures(variant, len(channels), args.count)
    fake = FakeSlackProcess()
    await fake.start()
    session = aiohttp.ClientSession()
    with tempfile.TemporaryDirectory(prefix="gpubot-burst-") as tmp:
        client = make_client("xoxb-bench", fake.api_url, session=session)
        runtime = slack_runtime(bench_config(Path(tmp), args.post_interval_s), client,
                                store=Store(f"sqlite:///{tmp}/gpubot.db"))
        app, slack_bot = build_app(runtime, client)
        await runtime.start(watch=False)
        handler = socket_handler(app, slack_bot)
        await handler.connect_async()
        try:
            await _wait(lambda: _status(fake, "connected"), 30)
            await _warm_up(fake)

            async def done() -> bool:
                status = await fake.get("/status")
                return (status["acked"] >= args.count and not slack_bot.tasks
                        and runtime.outbox is not None and runtime.outbox.pending() == 0)

            lag = LagMonitor()
            load0 = os.getloadavg()
            cpu0, children0, t0 = time.process_time(), _children_cpu(), time.monotonic()
            lag.start()
            with GcPauses() as gc_pauses:
                await fake.post("/burst", {"count": args.count, "over_s": args.over_s, "channels": channels,
                                           "command": "/gpu", "text": "status", "answer_prefix": ANSWER_PREFIX})
                out.finished = await _wait(done, args.deadline_s, every_s=0.5)
            out.gc = gc_pauses.pauses
            out.cpu_s, out.children_cpu_s = time.process_time() - cpu0, _children_cpu() - children0
            out.wall_s = time.monotonic() - t0
            out.lag = await lag.stop()
            out.load = (load0, os.getloadavg())
            _tally(out, await fake.get("/report"), set(channels))
        finally:
            await handler.close_async()
            await slack_bot.drain(5)
            await runtime.close(flush_s=0)
            await session.close()
            await fake.stop()
    return out


def socket_handler(app: Any, slack_bot: Any) -> Any:
    """The Socket Mode handler `gpubot run` uses: bot.slack.socket.SocketModeThread (acks off the bot's loop), or
    Bolt's AsyncSocketModeHandler in releases before it."""
    try:
        from bot.slack.socket import SocketModeThread
    except ImportError:
        return AsyncSocketModeHandler(app, app_token="xapp-bench", ping_interval=5)
    return SocketModeThread(app, "xapp-bench", ping_interval=5, spawn=slack_bot.spawn)


async def _status(fake: FakeSlackProcess, key: str) -> Any:
    return (await fake.get("/status"))[key]


async def _warm_up(fake: FakeSlackProcess) -> None:
    """One `/gpu status` in another channel, answered, before the burst (templates, connections, auth.test)."""
    await fake.post("/burst", {"count": 1, "over_s": 0, "channels": ["CWARMUP"], "command": "/gpu",
                               "text": "status", "answer_prefix": ANSWER_PREFIX})
    if not await _wait(lambda: _status(fake, "answers"), 60):
        raise RuntimeError("the warm-up command was not answered within 60 s")


def _children_cpu() -> float:
    """CPU seconds (user + system) of the bot's finished child processes."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _tally(out: Figures, report: dict[str, Any], channels: set[str]) -> None:
    """Fill `out` from the fake's report: acks of the burst's envelopes, calls in its channels since it began."""
    start = report["burst_started_at"]
    for env in report["envelopes"]:
        if env["channel"] not in channels:
            continue
        if env["acked_at"] is None or env["sent_at"] is None:
            out.unacked += 1
        else:
            out.acks.append(env["acked_at"] - env["sent_at"])
    landed = []
    for call in report["calls"]:
        if call["channel"] not in channels or call["time"] < start or call["status"] != 200:
            continue
        out.calls[call["method"]] = out.calls.get(call["method"], 0) + 1
        if call["method"] in ("chat.postMessage", "chat.update") and call["text"].startswith(ANSWER_PREFIX):
            landed.append(call["time"] - start)
    out.answers = len(landed)
    if landed:
        out.first_answer_s, out.last_answer_s = min(landed), max(landed)


def _ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1000:.0f}"


def report(out: Figures, args: argparse.Namespace) -> None:
    """Print one variant's figures."""
    counted = sum(out.calls.get(m, 0) for m in COUNTED)
    per = {m.split(".")[-1]: out.calls.get(m, 0) for m in COUNTED}
    print(f"\n== {out.count} x /gpu status over {args.over_s:g} s into {out.channels} channel(s) "
          f"[variant {out.variant}, post_interval_s {args.post_interval_s:g}]")
    if not out.finished:
        print(f"  NOT FINISHED within --deadline-s {args.deadline_s:g} s: figures of what happened until then")
    print(f"  ack latency ms: p50 {_ms(out.acks, 50)}  p99 {_ms(out.acks, 99)}  max "
          f"{max(out.acks, default=float('nan')) * 1000:.0f}  (acked {len(out.acks)}, not acked {out.unacked}; "
          f"{sum(a > 0.1 for a in out.acks)} over 100 ms)")
    print(f"  Slack calls per answer: {counted / out.count:.2f}  ({counted} calls: {per}; "
          f"postEphemeral {out.calls.get('chat.postEphemeral', 0)})")
    first = "-" if out.first_answer_s is None else f"{out.first_answer_s:.1f}"
    last = "-" if out.last_answer_s is None else f"{out.last_answer_s:.1f}"
    print(f"  answers landed: {out.answers} of {out.count}; first after {first} s, last after {last} s")
    print(f"  bot CPU: {out.cpu_s:.2f} s in the bot process ({out.cpu_s / out.count * 1000:.1f} ms per command), "
          f"{out.children_cpu_s:.2f} s in its child processes (the local probes); wall {out.wall_s:.1f} s")
    print(f"  event-loop lag ms: p50 {_ms(out.lag, 50)}  p99 {_ms(out.lag, 99)}  max "
          f"{max(out.lag, default=float('nan')) * 1000:.0f}; garbage collector: {len(out.gc)} pauses, "
          f"{sum(out.gc) * 1000:.0f} ms in all, longest {max(out.gc, default=0.0) * 1000:.0f} ms")
    if out.load is not None:
        print("  load average (1, 5, 15 min): start {:.2f} {:.2f} {:.2f}, end {:.2f} {:.2f} {:.2f}".format(
            *out.load[0], *out.load[1]) + f"; {_process_count()} processes on this machine at the end")


def _process_count() -> int:
    """How many processes this machine runs now (each is a row the probe parses and redacts)."""
    return sum(1 for name in os.listdir("/proc") if name.isdigit())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="post_interval_s 0.01: the bot's own costs in seconds")
    p.add_argument("--post-interval-s", type=float, default=None,
                   help="slack.post_interval_s, the pacing per channel (default 1, Slack's; 0.01 with --quick)")
    p.add_argument("--count", type=int, default=200, help="slash commands in the burst (default 200)")
    p.add_argument("--over-s", type=float, default=2.0, help="seconds the burst is spread over (default 2)")
    p.add_argument("--variants", default="one,ten", help="one (1 channel), ten (10 channels); default both")
    p.add_argument("--deadline-s", type=float, default=600.0,
                   help="stop waiting for a variant's answers after this many seconds (default 600)")
    args = p.parse_args(argv)
    if args.post_interval_s is None:
        args.post_interval_s = 0.01 if args.quick else 1.0
    return args


async def amain(args: argparse.Namespace) -> None:
    """Run the chosen variants and print their figures."""
    handler = "SocketModeThread" if importlib.util.find_spec("bot.slack.socket") else "AsyncSocketModeHandler"
    print(f"gpubot burst benchmark: bot from {TREE}/bot (Socket Mode: {handler}); "
          f"{os.cpu_count()} CPUs; " + "load average at start {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print(f"processes on this machine (rows of each probe's process table): {_process_count()}")
    for variant in [v.strip() for v in args.variants.split(",") if v.strip()]:
        report(await run_variant(variant, args), args)
    print("\nload average at end {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


def main(argv: list[str] | None = None) -> None:
    """Entry point: `python -m benchmarks.burst`."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        os.environ.pop(name, None)  # slack_sdk ignores NO_PROXY
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    main()
