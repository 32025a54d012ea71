"""The fake Slack (tests.support.fakes.slack_server.FakeSlack) in a process of its own, for benchmarks.

A benchmark that measures the bot's acks and Slack calls must not run the fake on the bot's event loop: the
fake's own work (answering 400 Web API calls, pushing envelopes) would then be counted as the bot's and
would delay the bot's acks. This module serves the fake (Web API and Socket Mode, as in the tests) plus a
tiny control API, both on ephemeral loopback ports, and prints one JSON line on stdout once both listen:
`{"api_url": "http://127.0.0.1:P/api/", "control_url": "http://127.0.0.1:Q"}`. It stops when stdin closes
(the parent exited) or on SIGTERM/SIGINT.

Control API (JSON):
* `GET  /status`: `{"connected": bool, "pushed": N, "acked": N, "answers": N}` (answers: chat.postMessage /
  chat.update calls whose text starts with the burst's `answer_prefix`).
* `POST /burst {"count", "over_s", "channels", "command", "text", "answer_prefix"}`: pushes `count` slash
  commands evenly over `over_s` seconds, round-robin over `channels`, from this process's loop; answers at
  once (`{"started": true}`).
* `GET  /report`: every envelope (`channel`, `sent_at`, `acked_at`) and every Web API call (`method`, `time`,
  `channel`, `status`, `text`: the first 80 characters), with `burst_started_at`; times are this process's
  `time.monotonic()` seconds.

Run: python -m benchmarks.fake_slack_server   (started by benchmarks.burst, by file; not useful alone)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

from aiohttp import web

from tests.support.fakes.slack_server import FakeSlack

#: Methods whose text is an answer (a post, or an edit of a placeholder into the answer).
ANSWER_METHODS = ("chat.postMessage", "chat.update")


class Control:
    """The control API over one FakeSlack (see the module docstring)."""

    def __init__(self, fake: FakeSlack):
        self.fake = fake
        self.burst_started_at: float | None = None
        self.answer_prefix = "GPU status"
        self.pushed: list[tuple[str, str]] = []  # (envelope id, channel)
        self._tasks: set[asyncio.Task] = set()

    def app(self) -> web.Application:
        """The aiohttp application of the control routes."""
        app = web.Application()
        app.router.add_get("/status", self.status)
        app.router.add_post("/burst", self.burst)
        app.router.add_get("/report", self.report)
        return app

    def _answers(self) -> int:
        return sum(1 for c in self.fake.calls if c["method"] in ANSWER_METHODS and c["status"] == 200
                   and str(c["params"].get("text") or "").startswith(self.answer_prefix))

    async def status(self, request: web.Request) -> web.Response:
        """Connected?, and how many envelopes were pushed, acked, and answers landed."""
        acked = sum(1 for env_id, _ in self.pushed if env_id in self.fake.acks)
        return web.json_response({"connected": self.fake.connected, "pushed": len(self.pushed), "acked": acked,
                                  "answers": self._answers()})

    async def burst(self, request: web.Request) -> web.Response:
        """Start pushing a burst of slash commands (see the module docstring)."""
        spec = await request.json()
        self.answer_prefix = str(spec.get("answer_prefix", self.answer_prefix))
        task = asyncio.get_running_loop().create_task(self._push(
            int(spec["count"]), float(spec["over_s"]), list(spec["channels"]), str(spec.get("command", "/gpu")),
            str(spec.get("text", "status"))))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return web.json_response({"started": True})

    async def _push(self, count: int, over_s: float, channels: list[str], command: str, text: str) -> None:
        """Push `count` slash commands, the i-th at `i * over_s / count` seconds after the first."""
        start = self.burst_started_at = time.monotonic()
        for i in range(count):
            await asyncio.sleep(max(0.0, start + i * over_s / count - time.monotonic()))
            channel = channels[i % len(channels)]
            env_id = await self.fake.push_slash_command(command, text, user_id=f"U{i % 7 + 1}", channel_id=channel)
            self.pushed.append((env_id, channel))

    async def report(self, request: web.Request) -> web.Response:
        """Envelopes and Web API calls so far (see the module docstring)."""
        envelopes = [{"id": env_id, "channel": channel, "sent_at": self.fake.envelopes[env_id]["sent_at"],
                      "acked_at": (self.fake.acks.get(env_id) or (None, None))[1]}
                     for env_id, channel in self.pushed]
        calls = [_call_row(c) for c in self.fake.calls]
        return web.json_response({"burst_started_at": self.burst_started_at, "envelopes": envelopes,
                                  "calls": calls, "now": time.monotonic()})


def _call_row(call: dict[str, Any]) -> dict[str, Any]:
    """One recorded Web API call, reduced to what a report needs."""
    params = call["params"]
    return {"method": call["method"], "time": call["time"], "status": call["status"],
            "channel": params.get("channel") or params.get("channel_id"),
            "text": str(params.get("text") or "")[:80]}


async def _stdin_closed() -> None:
    """Return when stdin reaches end of file (the parent process is gone)."""
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def serve() -> None:
    """Serve the fake Slack and the control API until stdin closes or a signal arrives."""
    fake = FakeSlack()
    await fake.start()
    runner = web.AppRunner(Control(fake).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    print(json.dumps({"api_url": fake.api_url, "control_url": f"http://127.0.0.1:{port}"}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    watcher = loop.create_task(_stdin_closed())
    watcher.add_done_callback(lambda _t: stop.set())
    await stop.wait()
    await runner.cleanup()
    await fake.close()
    os._exit(0)  # the stdin reader thread may still be blocked


def main() -> None:
    """Entry point: `python -m benchmarks.fake_slack_server`."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        os.environ.pop(name, None)
    asyncio.run(serve())


if __name__ == "__main__":
    main()
