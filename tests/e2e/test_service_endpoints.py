"""The bot as a service (issue 26): `gpubot run`'s /healthz and /metrics scraped in Socket Mode, systemd's
notifications (READY=1, WATCHDOG=1, STOPPING=1) on a real datagram socket, and JSON logs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import subprocess
import sys

import aiohttp
import pytest

from bot.adapters import sdnotify
from bot.config import Config
from bot.slack.runner import run_socket_mode
from tests.support.fakes.slack_server import FakeSlack
from tests.support.procs import free_port, wait_until

pytestmark = pytest.mark.timeout(90)


class NotifySocket:
    """A datagram socket standing in for systemd's NOTIFY_SOCKET; `messages` what the bot sent."""

    def __init__(self, path: str):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + path[1:] if path.startswith("@") else path)
        self.sock.setblocking(False)
        self.messages: list[str] = []

    def read(self) -> list[str]:
        with contextlib.suppress(BlockingIOError):
            while True:
                self.messages.append(self.sock.recv(4096).decode())
        return self.messages

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path):
    ns = NotifySocket(str(tmp_path / "notify.sock"))
    yield ns
    ns.close()


def test_notify_sends_to_a_path_and_an_abstract_socket_and_nothing_without_one(notify_socket, tmp_path):
    assert sdnotify.notify("READY=1", {}) is False
    assert sdnotify.notify("READY=1\nSTATUS=up", {"NOTIFY_SOCKET": notify_socket.path}) is True
    abstract = NotifySocket(f"@gpubot-test-{tmp_path.name}")
    try:
        assert sdnotify.notify("WATCHDOG=1", {"NOTIFY_SOCKET": abstract.path}) is True
        assert abstract.read() == ["WATCHDOG=1"]
    finally:
        abstract.close()
    assert notify_socket.read() == ["READY=1\nSTATUS=up"]
    assert sdnotify.notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")}) is False  # never raises
    assert sdnotify.watchdog_period_s({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert sdnotify.watchdog_period_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None  # another's
    assert sdnotify.watchdog_period_s({"WATCHDOG_USEC": "nope"}) is None
    assert sdnotify.watchdog_period_s({}) is None


async def scrape(port: int, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}",
                                                   timeout=aiohttp.ClientTimeout(total=10)) as r:
        return r.status, await r.text()


def metric(text: str, name: str) -> float | None:
    """The value of the sample `name` (with its labels, as printed) in a Prometheus exposition, or None."""
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return None if m is None else float(m.group(1))


async def test_socket_mode_serves_healthz_and_metrics_and_tells_systemd(monkeypatch, tmp_path, notify_socket):
    port = free_port()
    config = Config.model_validate({"state_dir": str(tmp_path / "state"), "metrics": {"port": port},
                                    "slack": {"post_interval_s": 0.0}})
    async with FakeSlack() as fake:
        for k, v in {"SLACK_BOT_TOKEN": "xoxb-test", "SLACK_APP_TOKEN": "xapp-test", "SLACK_API_URL": fake.api_url,
                     "NOTIFY_SOCKET": notify_socket.path, "WATCHDOG_USEC": "200000"}.items():
            monkeypatch.setenv(k, v)
        stop = asyncio.Event()
        bot = asyncio.ensure_future(run_socket_mode(config, stop=stop))
        try:
            await fake.wait_connected(30)
            await wait_until(lambda: any(m.startswith("READY=1") for m in notify_socket.read()), 30,
                             what="READY=1 once connected")
            status, body = await wait_until(lambda: _ok(port), 30, what="/healthz answering")
            vitals = json.loads(body)
            assert status == 200 and vitals["healthy"] is True
            assert vitals["role"] == "leader" and vitals["slack"] is True and vitals["database"] is True
            assert vitals["outbox_depth"] == 0 and vitals["watched"] == 0

            await fake.push_slash_command("/gpu", "help", user_id="U1", channel_id="C1")
            await fake.push_slash_command("/gpu", "frobnicate", user_id="U1", channel_id="C1")
            text = await wait_until(lambda: _metrics_with(port, 'gpubot_commands_total{command="help",result="ok"}'),
                                    30, what="the help command counted")
            assert metric(text, "gpubot_leader") == 1.0
            assert metric(text, "gpubot_slack_connected") == 1.0
            assert metric(text, "gpubot_database_up") == 1.0
            assert metric(text, "gpubot_outbox_depth") is not None
            await wait_until(lambda: _metrics_with(port, 'gpubot_commands_total{command="unknown",result="unknown"}'),
                             30, what="the unknown command counted under one label")
            text = await _metrics_with(port, "gpubot_leader")
            assert "frobnicate" not in text  # what a user typed never becomes a label

            # two watchdog feeds at least (every 0.1 s here); still READY once
            await wait_until(lambda: notify_socket.read().count("WATCHDOG=1") >= 2, 10, what="the watchdog fed")
            assert sum(m.startswith("READY=1") for m in notify_socket.read()) == 1

            await fake.drop_websocket()  # Slack gone: unhealthy until the bot reconnects
            await fake.close()
            status, body = await wait_until(lambda: _status_is(port, 503), 30, what="/healthz 503 without Slack")
            assert json.loads(body)["slack"] is False and json.loads(body)["database"] is True
        finally:
            stop.set()
            await asyncio.wait_for(bot, 30)
    assert notify_socket.read()[-1] == "STOPPING=1"
    with pytest.raises(aiohttp.ClientError):
        await scrape(port, "/healthz")  # closed with the bot


async def _ok(port: int) -> tuple[int, str] | None:
    with contextlib.suppress(aiohttp.ClientError):
        status, body = await scrape(port, "/healthz")
        return (status, body) if status == 200 else None
    return None


async def _status_is(port: int, want: int) -> tuple[int, str] | None:
    status, body = await scrape(port, "/healthz")
    return (status, body) if status == want else None


async def _metrics_with(port: int, name: str) -> str | None:
    _, text = await scrape(port, "/metrics")
    return text if metric(text, name) else None


def test_json_logs_are_one_redacted_object_per_line(tmp_path):
    """`gpubot --log-format json`: every line on stderr is a JSON object with time, level, logger and message, and
    a secret in a logged message is masked."""
    token = "xoxb-" + "1234567890-" * 3 + "abcdefabcdef"
    config = tmp_path / "c.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\n")
    proc = subprocess.run([sys.executable, "-m", "bot.cli", "--log-level", "DEBUG", "--log-format", "json", "run",
                           "--config", str(config)], env={"PATH": "/usr/bin:/bin", "SLACK_BOT_TOKEN": token},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "SLACK_APP_TOKEN is not set" in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("{")]
    assert lines, proc.stderr
    for ln in lines:
        rec = json.loads(ln)
        assert {"time", "level", "logger", "message"} <= rec.keys()
    assert token not in proc.stderr


async def test_a_bot_token_slack_refuses_stops_the_service_with_one_clear_line(monkeypatch, tmp_path):
    """A placeholder or revoked SLACK_BOT_TOKEN is not retried forever: `gpubot run` stops at once, naming it."""
    from bot.slack.runner import MissingSecret

    config = Config.model_validate({"state_dir": str(tmp_path / "state")})
    async with FakeSlack() as fake:
        for k, v in {"SLACK_BOT_TOKEN": "xoxb-REPLACE-ME", "SLACK_APP_TOKEN": "xapp-test",
                     "SLACK_API_URL": fake.api_url}.items():
            monkeypatch.setenv(k, v)
        fake.set_error("auth.test", "invalid_auth")
        with pytest.raises(MissingSecret, match=r"Slack refused SLACK_BOT_TOKEN \(invalid_auth\)"):
            await asyncio.wait_for(run_socket_mode(config), 30)
        assert fake.connection_count == 0  # it never connected
        fake.clear_errors()
        fake.set_error("auth.test", "ratelimited", times=1)  # anything else: started anyway
        stop = asyncio.Event()
        bot = asyncio.ensure_future(run_socket_mode(config, stop=stop))
        try:
            await fake.wait_connected(30)
        finally:
            stop.set()
            await asyncio.wait_for(bot, 30)


def test_json_logs_redact_the_extras_a_library_passes(tmp_path):
    """aiohttp's access log passes the request line and headers as `extra` fields, which the JSON formatter writes
    out: a token in them is masked like one in the message."""
    import logging

    from multidict import CIMultiDict
    from pythonjsonlogger.json import JsonFormatter

    from bot.adapters.logs import RedactingFilter
    from bot.core.redact import Redactor

    token = "xoxb-" + "1234567890-" * 3 + "abcdefabcdef"
    out = tmp_path / "log.json"
    handler = logging.FileHandler(out)
    handler.setFormatter(JsonFormatter("%(levelname)s %(name)s %(message)s", timestamp="time"))
    handler.addFilter(RedactingFilter(Redactor([], values=[token])))
    logger = logging.getLogger("test.json.extras")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("GET %s", f"/healthz?token={token}",
                       extra={"first_request_line": f"GET /healthz?token={token}",
                              "request_header": CIMultiDict({"User-Agent": f"curl {token}"}), "n": 3})
    finally:
        logger.removeHandler(handler)
        handler.close()
    rec = json.loads(out.read_text())
    assert token not in out.read_text()
    assert rec["first_request_line"].startswith("GET /healthz?token=") and rec["n"] == 3
    assert "User-Agent" in rec["request_header"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d.*", rec["time"])  # ISO 8601


async def test_a_metrics_port_in_use_stops_the_bot_before_it_connects_or_leads(monkeypatch, tmp_path):
    """The port is bound before the bot starts: a port in use is an OSError at once, with no Slack connection and
    no command taken, and the state directory is free again for the next try."""
    config = Config.model_validate({"state_dir": str(tmp_path / "state"), "metrics": {"port": free_port()}})
    async with FakeSlack() as fake:
        for k, v in {"SLACK_BOT_TOKEN": "xoxb-test", "SLACK_APP_TOKEN": "xapp-test",
                     "SLACK_API_URL": fake.api_url}.items():
            monkeypatch.setenv(k, v)
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", config.metrics.port))
            taken.listen()
            with pytest.raises(OSError):
                await asyncio.wait_for(run_socket_mode(config), 30)
        assert fake.connection_count == 0 and not fake.calls_for("apps.connections.open")
        stop = asyncio.Event()  # the port free again: the same state directory starts (its lock was released)
        bot = asyncio.ensure_future(run_socket_mode(config, stop=stop))
        try:
            await fake.wait_connected(30)
            _, body = await wait_until(lambda: _ok(config.metrics.port), 30, what="/healthz answering")
            assert json.loads(body)["slack"] is True
        finally:
            stop.set()
            await asyncio.wait_for(bot, 30)
