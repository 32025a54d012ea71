"""`/healthz` and `/metrics` over HTTP (aiohttp) on a port of their own (`metrics.port`, or `--metrics-port`), in
Socket Mode and HTTP mode; in HTTP mode /healthz is also served beside /slack/events (for the load balancer).

`/healthz` answers 200 with a JSON body while the database answers and Slack is connected (a follower is healthy:
it takes commands and stands by), 503 with the same body otherwise; `/metrics` is Prometheus' text format
(bot.adapters.metrics), its gauges refreshed at each scrape.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from bot.adapters.metrics import CONTENT_TYPE
from bot.wiring import Runtime

log = logging.getLogger(__name__)


class HealthEndpoints:
    """The two endpoints of one runtime. `slack_connected` tells whether Slack is connected (Socket Mode's
    websocket); None where the bot cannot know (HTTP mode: Slack calls in)."""

    def __init__(self, runtime: Runtime, slack_connected: Callable[[], Awaitable[bool]] | None = None):
        self.runtime = runtime
        self.slack_connected = slack_connected

    async def _vitals(self) -> dict[str, object]:
        slack = await self.slack_connected() if self.slack_connected is not None else None
        return await self.runtime.vitals(slack=slack)

    async def healthz(self, _request: web.Request) -> web.Response:
        """GET /healthz: 200 and the vitals as JSON when healthy, else 503 and the same JSON."""
        vitals = await self._vitals()
        return web.json_response(vitals, status=200 if vitals["healthy"] else 503)

    async def metrics(self, _request: web.Request) -> web.Response:
        """GET /metrics: every metric of the runtime, in Prometheus' text format."""
        await self._vitals()
        assert self.runtime.metrics is not None
        body = self.runtime.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    def add_routes(self, app: web.Application, *, metrics: bool = True) -> None:
        """Add GET /healthz and (with `metrics`) GET /metrics to `app`."""
        app.router.add_get("/healthz", self.healthz)
        if metrics:
            app.router.add_get("/metrics", self.metrics)

    async def serve(self, host: str, port: int) -> web.AppRunner:
        """Listen on `host:port` with the two endpoints alone; returns the runner (`await runner.cleanup()` stops
        it). Raises OSError when the address cannot be bound."""
        app = web.Application()
        self.add_routes(app)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except BaseException:
            await runner.cleanup()
            raise
        log.info("serving /healthz and /metrics on %s:%s", host, port)
        return runner
