"""A local fake of Slack's servers for offline end-to-end tests.

Only the *servers* are fake: the real ``slack_sdk`` ``AsyncWebClient`` and the real
``slack_bolt`` ``AsyncApp`` / ``AsyncSocketModeHandler`` talk to it over loopback HTTP and a
websocket, exactly as they would talk to Slack (see ``/work/shared/notes/stack-facts.md`` 1.1/1.2).

Typical use::

    async with FakeSlack() as fake:
        client = AsyncWebClient(token="xoxb-test", base_url=fake.api_url)
        app = AsyncApp(client=client, signing_secret="x")
        handler = AsyncSocketModeHandler(app, app_token="xapp-test", ping_interval=1)
        await handler.connect_async()
        await fake.wait_connected(5)
        env_id = await fake.push_slash_command(text="status")
        payload, latency = await fake.wait_for_ack(env_id, 3)
        call = await fake.wait_for_call("chat.postMessage")
        await handler.close_async()

Routes served on ``127.0.0.1:<random port>``:

* ``POST /api/{method}``       Web API (form, JSON and query parameters are merged)
* ``POST /upload/{file_id}``   raw upload target returned by ``files.getUploadURLExternal``
* ``POST /response/{rid}``     ``response_url`` sink (what Bolt's ``respond()`` posts to)
* ``GET  /link/``              Socket Mode websocket (URL returned by ``apps.connections.open``)

Remember to unset ``HTTP(S)_PROXY``/``http(s)_proxy`` in tests: slack_sdk ignores ``NO_PROXY``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import WSMsgType, web

__all__ = ["APP_ID", "BOT_ID", "BOT_USER_ID", "TEAM_ID", "FakeSlack"]

BOT_USER_ID = "UBOT"
BOT_ID = "BBOT"
TEAM_ID = "T1"
TEAM_DOMAIN = "test"
APP_ID = "A1"
BOT_NAME = "gpubot"

# Parameters that slack_sdk form-encodes as JSON strings; the fake decodes them.
_JSON_STRING_PARAMS = ("blocks", "attachments", "files", "metadata")
_TS_BASE = 1_700_000_000


@dataclass
class _Failure:
    method: str | None
    status: int
    retry_after: float | int | None
    remaining: int | None
    deadline: float | None

    def active(self, now: float) -> bool:
        if self.remaining is not None and self.remaining <= 0:
            return False
        return not (self.deadline is not None and now >= self.deadline)

    def matches(self, method: str) -> bool:
        return self.method is None or self.method == method


@dataclass
class _ApiError:
    method: str
    error: str
    remaining: int | None


@dataclass
class _Connection:
    """One Socket Mode websocket connection as seen by the server."""

    number: int
    ws: web.WebSocketResponse
    transport: asyncio.BaseTransport | None
    link_n: str | None
    connected_at: float
    closed: bool = False


class FakeSlack:
    """Fake Slack Web API + Socket Mode + upload + response_url server (aiohttp, 127.0.0.1:0).

    Use as ``async with FakeSlack() as fake:`` or call :meth:`start` / :meth:`close`.

    Recorded state (plain lists/dicts, safe to read from tests at any time):

    * ``calls``: every Web API request, in arrival order, as a dict ``{"method", "params",
      "token", "headers", "time", "status", "response"}`` (``time`` is ``time.monotonic()``,
      ``status`` the HTTP status answered, ``response`` the JSON body or text answered).
    * ``failed_calls``: the subset of ``calls`` answered with an injected HTTP failure (:meth:`fail`).
    * ``messages``: ``chat.postMessage`` posts as dicts ``{"channel", "ts", "thread_ts", "text",
      "blocks", "params", "user", "bot_id"}`` (``blocks`` decoded if sent as a JSON string).
      Posts are kept as posted; edits go to ``updates`` (see :meth:`message_state`).
    * ``updates``: ``chat.update`` calls as ``{"channel", "ts", "text", "blocks", "params"}``.
    * ``ephemerals``: ``chat.postEphemeral`` calls as ``{"channel", "user", "text", "blocks",
      "thread_ts", "message_ts", "params"}``.
    * ``deletions``: ``(channel, ts)`` of every message removed with ``chat.delete``.
    * ``reactions``: ``(op, channel, timestamp, name)`` with ``op`` in ``"add"``/``"remove"``.
    * ``uploads``: ``{file_id: bytes}`` raw bytes POSTed to the upload URL.
    * ``files``: ``{file_id: {"id", "filename", "length", "title", "channel_id", "thread_ts",
      "initial_comment", "completed"}}``.
    * ``responses``: ``(rid, body)`` for every POST to a ``response_url`` built by :meth:`response_url`.
    * ``envelopes``: ``{envelope_id: {"type", "payload", "envelope", "pushed_at", "sent_at"}}``.
    * ``acks``: ``{envelope_id: (payload_or_None, monotonic_time)}`` from Socket Mode acks.
    * ``client_messages``: every JSON message the Socket Mode client sent (acks included).
    * ``connection_count``: number of websocket connections accepted so far.

    Directory data used to answer ``users.info`` / ``conversations.info`` and to fill the
    ``user_name`` / ``channel_name`` fields of slash commands: ``users`` and ``channels``
    (``{id: dict}``); unknown ids get a generated entry.
    """

    def __init__(self, *, host: str = "127.0.0.1", hello_delay: float = 0.0) -> None:
        """Create the fake (not started yet).

        Args:
            host: interface to bind; keep the loopback default.
            hello_delay: seconds to wait after the websocket handshake before sending ``hello``.
        """
        self.host = host
        self.hello_delay = hello_delay
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._port: int | None = None
        self._cond = asyncio.Condition()
        self._outbox: deque[str] = deque()
        self._targets: dict[str, int] = {}  # envelope id -> the only connection (number) to send it on
        self._connections: list[_Connection] = []
        self._ws_tasks: set[asyncio.Task[Any]] = set()
        self._failures: list[_Failure] = []
        self._errors: list[_ApiError] = []
        self._ts_counter = itertools.count(1)
        self._last_ts_us = 0
        self._file_counter = itertools.count(1)
        self._link_counter = itertools.count(1)
        self._link_issued: dict[str, float] = {}
        self._env_counter = itertools.count(1)
        self._trigger_counter = itertools.count(1)
        self._closing = False

        self.users: dict[str, dict[str, Any]] = {}
        #: user group id (S...) -> member user ids, answered by usergroups.users.list
        self.usergroups: dict[str, list[str]] = {}
        self.channels: dict[str, dict[str, Any]] = {}
        self._reset_records()

    def _reset_records(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.failed_calls: list[dict[str, Any]] = []
        self.messages: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []
        self.ephemerals: list[dict[str, Any]] = []
        self.deletions: list[tuple[str, str]] = []
        self.reactions: list[tuple[str, str, str, str]] = []
        self.uploads: dict[str, bytes] = {}
        self.files: dict[str, dict[str, Any]] = {}
        self.responses: list[tuple[str, Any]] = []
        self.envelopes: dict[str, dict[str, Any]] = {}
        self.acks: dict[str, tuple[Any, float]] = {}
        self.client_messages: list[dict[str, Any]] = []
        self.connection_count = 0

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> FakeSlack:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Bind 127.0.0.1 on a free port and start serving."""
        if self._runner is not None:
            raise RuntimeError("FakeSlack already started")
        app = web.Application()
        app.router.add_post("/api/{method}", self._handle_api)
        app.router.add_get("/api/{method}", self._handle_api)
        app.router.add_post("/upload/{file_id}", self._handle_upload)
        app.router.add_post("/response/{rid}", self._handle_response)
        app.router.add_get("/link/", self._handle_ws)
        app.router.add_get("/link", self._handle_ws)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, 0)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._site = runner, site
        self._port = runner.addresses[0][1]
        self._closing = False

    async def close(self) -> None:
        """Close websockets (server side), stop the site and the runner. Idempotent."""
        if self._runner is None:
            return
        self._closing = True
        for conn in list(self._connections):
            await self._close_connection(conn, abrupt=False)
        if self._ws_tasks:
            _done, pending = await asyncio.wait(set(self._ws_tasks), timeout=2.0)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        runner, self._runner, self._site = self._runner, None, None
        await runner.cleanup()

    # ------------------------------------------------------------------ addresses

    @property
    def port(self) -> int:
        """TCP port the fake listens on (after :meth:`start`)."""
        if self._port is None:
            raise RuntimeError("FakeSlack not started")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{self.host}:{self.port}"

    @property
    def api_url(self) -> str:
        """``http://127.0.0.1:PORT/api/``: pass as ``AsyncWebClient(base_url=...)``."""
        return f"{self.base_url}/api/"

    def response_url(self, rid: str) -> str:
        """URL of the response_url sink for id ``rid``; POSTs to it land in :attr:`responses`."""
        return f"{self.base_url}/response/{rid}"

    # ------------------------------------------------------------------ configuration

    def fail(
        self,
        method: str | None,
        status: int = 429,
        retry_after: float | int | None = 1,
        *,
        times: int | None = None,
        for_seconds: float | None = None,
    ) -> None:
        """Make Web API calls to ``method`` (``None``: every method) answer HTTP ``status``.

        429 answers carry ``Retry-After: <retry_after>`` (omitted if ``None``) and the JSON body
        ``{"ok": false, "error": "ratelimited"}``; other statuses answer a ``text/plain`` body.
        The rule applies ``times`` times, or during ``for_seconds`` seconds, whichever ends first;
        with neither given it applies once. Matching calls are recorded in :attr:`failed_calls`.
        """
        if times is None and for_seconds is None:
            times = 1
        deadline = time.monotonic() + for_seconds if for_seconds is not None else None
        self._failures.append(_Failure(method, status, retry_after, times, deadline))

    def clear_failures(self) -> None:
        """Remove every rule added by :meth:`fail`."""
        self._failures.clear()

    def set_error(self, method: str, error: str = "channel_not_found", *, times: int | None = None) -> None:
        """Make ``method`` answer HTTP 200 ``{"ok": false, "error": error}`` (``times`` times, or
        until :meth:`clear_errors` when ``None``)."""
        self._errors.append(_ApiError(method, error, times))

    def clear_errors(self) -> None:
        """Remove every rule added by :meth:`set_error`."""
        self._errors.clear()

    def clear_records(self) -> None:
        """Forget everything recorded so far (calls, messages, acks, ...); keeps rules and sockets.

        ``connection_count`` is reset to the number of currently open connections.
        """
        open_now = len([c for c in self._connections if not c.closed])
        self._reset_records()
        self.connection_count = open_now

    # ------------------------------------------------------------------ queries

    def calls_for(self, method: str, *, include_failed: bool = False) -> list[dict[str, Any]]:
        """Recorded calls of ``method`` answered with HTTP 200 (plus injected failures if
        ``include_failed``)."""
        return [c for c in self.calls if c["method"] == method and (include_failed or c["status"] == 200)]

    def message_state(self, ts: str) -> dict[str, Any] | None:
        """The message posted with ``ts`` with every ``chat.update`` applied (a copy), or ``None``."""
        for msg in self.messages:
            if msg["ts"] == ts:
                state = dict(msg)
                break
        else:
            return None
        for upd in self.updates:
            if upd["ts"] == ts:
                if upd["text"] is not None:
                    state["text"] = upd["text"]
                if upd["blocks"] is not None:
                    state["blocks"] = upd["blocks"]
        return state

    def thread_replies(self, thread_ts: str) -> list[dict[str, Any]]:
        """Messages posted with ``thread_ts`` (the replies of that thread), in order."""
        return [m for m in self.messages if m["thread_ts"] == thread_ts]

    @property
    def connected(self) -> bool:
        """True while at least one Socket Mode websocket is open."""
        return any(not c.closed for c in self._connections)

    # ------------------------------------------------------------------ waiting

    async def _wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        try:
            async with asyncio.timeout(timeout), self._cond:
                return await self._cond.wait_for(predicate)
        except TimeoutError:
            seen = [c["method"] for c in self.calls]
            raise TimeoutError(
                f"FakeSlack: timed out after {timeout}s waiting for {what}; calls seen: {seen}"
            ) from None

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    async def wait_connected(self, timeout: float = 5.0, *, count: int | None = None) -> None:
        """Wait until a websocket is open and ``hello`` was sent on it.

        With ``count``, wait until at least ``count`` connections were accepted in total
        (``connection_count >= count``) and one is open.
        """

        def ready() -> bool:
            if count is not None and self.connection_count < count:
                return False
            return self.connected

        await self._wait(ready, timeout, f"a socket mode connection (count={count})")

    async def wait_for_call(
        self,
        method: str,
        predicate: Callable[[dict[str, Any]], bool] | None = None,
        timeout: float = 5.0,
        *,
        include_failed: bool = False,
    ) -> dict[str, Any]:
        """Return the first recorded call of ``method`` (HTTP 200 only unless ``include_failed``)
        for which ``predicate(call)`` is true, waiting up to ``timeout`` seconds for it."""

        def find() -> dict[str, Any] | None:
            for call in self.calls_for(method, include_failed=include_failed):
                if predicate is None or predicate(call):
                    return call
            return None

        return await self._wait(find, timeout, f"a {method} call")

    async def wait_for_ephemeral(
        self, predicate: Callable[[dict[str, Any]], bool] | None = None, timeout: float = 5.0
    ) -> dict[str, Any]:
        """The first ``chat.postEphemeral`` call (HTTP 200) for which ``predicate(call)`` is true: an answer
        only its user sees (a denial, a usage error, a pointer to a thread)."""

        def find() -> dict[str, Any] | None:
            for call in self.calls:
                if call["method"] == "chat.postEphemeral" and call["status"] == 200 and (
                        predicate is None or predicate(call)):
                    return call
            return None

        return await self._wait(find, timeout, "a chat.postEphemeral call")

    async def wait_for_answer(
        self, predicate: Callable[[dict[str, Any]], bool] | None = None, timeout: float = 5.0
    ) -> dict[str, Any]:
        """The first ``chat.postMessage`` or ``chat.update`` call (HTTP 200) for which ``predicate(call)``
        is true: an answer arrives either way (a slow command's placeholder is edited into its answer).
        The call's ``"method"`` says which; for an update, ``params["ts"]`` is the message edited."""

        def find() -> dict[str, Any] | None:
            for call in self.calls:
                if call["method"] in ("chat.postMessage", "chat.update") and call["status"] == 200 and (
                        predicate is None or predicate(call)):
                    return call
            return None

        return await self._wait(find, timeout, "a chat.postMessage / chat.update call")

    async def wait_for_ack(self, envelope_id: str, timeout: float = 5.0) -> tuple[Any, float]:
        """Wait for the client's ack of ``envelope_id``.

        Returns ``(payload, seconds)``: the ack's ``payload`` (``None`` if the ack had none) and
        the seconds between the push and the ack's arrival.
        """
        await self._wait(lambda: envelope_id in self.acks, timeout, f"ack of {envelope_id}")
        payload, acked_at = self.acks[envelope_id]
        return payload, acked_at - self.envelopes[envelope_id]["pushed_at"]

    async def wait_for_response(
        self,
        rid: str | None = None,
        predicate: Callable[[Any], bool] | None = None,
        timeout: float = 5.0,
    ) -> Any:
        """Wait for a POST to a response_url (``rid``: that id only) whose body matches
        ``predicate``; return the body."""

        def find() -> Any:
            for r, body in self.responses:
                if (rid is None or r == rid) and (predicate is None or predicate(body)):
                    return (body,)
            return None

        found = await self._wait(find, timeout, f"a response_url POST (rid={rid})")
        return found[0]

    # ------------------------------------------------------------------ socket mode pushes

    async def push_envelope(
        self,
        type: str,
        payload: dict[str, Any],
        envelope_id: str | None = None,
        retry_attempt: int = 0,
        retry_reason: str = "",
        *,
        accepts_response_payload: bool | None = None,
        connection: int | None = None,
    ) -> str:
        """Queue a Socket Mode envelope; it is sent on the open connection (or on the next one); with
        ``connection`` (a connection's ``number``), only on that connection (as Slack picks one connection of an
        app for each envelope).

        Returns the envelope id. ``retry_attempt``/``retry_reason`` are included for
        ``events_api`` envelopes (as Slack does) or whenever ``retry_attempt`` > 0.
        """
        n = next(self._env_counter)
        envelope_id = envelope_id or f"env-{n}-{uuid.uuid4().hex[:12]}"
        if accepts_response_payload is None:
            accepts_response_payload = type == "slash_commands" or (
                type == "interactive" and payload.get("type") in ("view_submission", "block_suggestion")
            )
        envelope: dict[str, Any] = {
            "envelope_id": envelope_id,
            "type": type,
            "payload": payload,
            "accepts_response_payload": accepts_response_payload,
        }
        if type == "events_api" or retry_attempt:
            envelope["retry_attempt"] = retry_attempt
            envelope["retry_reason"] = retry_reason
        self.envelopes[envelope_id] = {
            "type": type,
            "payload": payload,
            "envelope": envelope,
            "pushed_at": time.monotonic(),
            "sent_at": None,
            "connection": None,
        }
        if connection is not None:
            self._targets[envelope_id] = connection
        async with self._cond:
            self._outbox.append(json.dumps(envelope))
            self._cond.notify_all()
        return envelope_id

    async def push_slash_command(
        self,
        command: str = "/gpu",
        text: str = "status",
        user_id: str = "U1",
        channel_id: str = "C1",
        response_url: str | None = None,
        connection: int | None = None,
        **extra: Any,
    ) -> str:
        """Push a ``slash_commands`` envelope with a realistic payload; return its envelope id.

        ``response_url`` defaults to ``fake.response_url(<envelope id>)`` so the replies sent
        through Bolt's ``respond()`` appear in :attr:`responses` under the envelope id.
        ``extra`` keys override/add payload fields.
        """
        envelope_id = f"env-{next(self._env_counter)}-{uuid.uuid4().hex[:12]}"
        payload: dict[str, Any] = {
            "token": "fake-verification-token",
            "team_id": TEAM_ID,
            "team_domain": TEAM_DOMAIN,
            "channel_id": channel_id,
            "channel_name": self._channel(channel_id)["name"],
            "user_id": user_id,
            "user_name": self._user(user_id)["name"],
            "command": command,
            "text": text,
            "api_app_id": APP_ID,
            "is_enterprise_install": "false",
            "response_url": response_url or self.response_url(envelope_id),
            "trigger_id": self._trigger_id(),
        }
        payload.update(extra)
        return await self.push_envelope("slash_commands", payload, envelope_id=envelope_id, connection=connection)

    async def push_event(
        self,
        event: dict[str, Any],
        *,
        event_id: str | None = None,
        retry_attempt: int = 0,
        retry_reason: str = "",
    ) -> str:
        """Push an ``events_api`` envelope wrapping ``event`` in an ``event_callback``; return the
        envelope id. ``event_ts`` is filled in if missing."""
        now = time.time()
        event = dict(event)
        event.setdefault("event_ts", f"{now:.6f}")
        payload = {
            "token": "fake-verification-token",
            "team_id": TEAM_ID,
            "context_team_id": TEAM_ID,
            "context_enterprise_id": None,
            "api_app_id": APP_ID,
            "event": event,
            "type": "event_callback",
            "event_id": event_id or f"Ev{uuid.uuid4().hex[:10].upper()}",
            "event_time": int(now),
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": TEAM_ID,
                    "user_id": BOT_USER_ID,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
            "event_context": f"4-fake-{uuid.uuid4().hex[:16]}",
        }
        return await self.push_envelope(
            "events_api", payload, retry_attempt=retry_attempt, retry_reason=retry_reason
        )

    async def push_app_mention(
        self,
        text: str = f"<@{BOT_USER_ID}> status",
        user_id: str = "U1",
        channel_id: str = "C1",
        thread_ts: str | None = None,
    ) -> str:
        """Push an ``app_mention`` event (a convenience over :meth:`push_event`)."""
        ts = self._next_ts()
        event: dict[str, Any] = {
            "type": "app_mention",
            "user": user_id,
            "text": text,
            "ts": ts,
            "channel": channel_id,
            "event_ts": ts,
            "team": TEAM_ID,
        }
        if thread_ts:
            event["thread_ts"] = thread_ts
        return await self.push_event(event)

    async def push_interactive(self, payload: dict[str, Any]) -> str:
        """Push an ``interactive`` envelope (``block_actions``, ``view_submission``, ...).

        Missing ``team``, ``api_app_id``, ``token`` and ``trigger_id`` are filled in (on a copy).
        Returns the envelope id.
        """
        payload = dict(payload)
        payload.setdefault("team", {"id": TEAM_ID, "domain": TEAM_DOMAIN})
        payload.setdefault("api_app_id", APP_ID)
        payload.setdefault("token", "fake-verification-token")
        payload.setdefault("trigger_id", self._trigger_id())
        return await self.push_envelope("interactive", payload)

    async def push_block_action(
        self,
        action_id: str,
        value: str = "",
        *,
        user_id: str = "U1",
        channel_id: str = "C1",
        message_ts: str | None = None,
        block_id: str = "b1",
        response_url: str | None = None,
    ) -> str:
        """Push a realistic ``block_actions`` payload for a button click; return the envelope id.

        ``message_ts`` defaults to the last posted message's ts. ``response_url`` defaults to
        ``fake.response_url("act-<n>")`` (read it back from ``fake.envelopes[env_id]["payload"]``).
        """
        message_ts = message_ts or (self.messages[-1]["ts"] if self.messages else self._next_ts())
        action_ts = f"{time.time():.6f}"
        rid = f"act-{next(self._trigger_counter)}"
        payload = {
            "type": "block_actions",
            "user": {"id": user_id, "username": self._user(user_id)["name"], "team_id": TEAM_ID},
            "api_app_id": APP_ID,
            "container": {
                "type": "message",
                "message_ts": message_ts,
                "channel_id": channel_id,
                "is_ephemeral": False,
            },
            "channel": {"id": channel_id, "name": self._channel(channel_id)["name"]},
            # as Slack does: a message in a thread carries its thread_ts
            "message": {"type": "message", "ts": message_ts, "user": BOT_USER_ID, "bot_id": BOT_ID,
                        **({"thread_ts": thread} if (thread := (self.message_state(message_ts) or {}).get("thread_ts"))
                           else {})},
            "response_url": response_url or self.response_url(rid),
            "actions": [
                {
                    "type": "button",
                    "action_id": action_id,
                    "block_id": block_id,
                    "value": value,
                    "action_ts": action_ts,
                    "text": {"type": "plain_text", "text": action_id},
                }
            ],
        }
        return await self.push_interactive(payload)

    async def redeliver(self, envelope_id: str, *, retry_reason: str = "timeout") -> None:
        """Queue an already pushed envelope again, unchanged but for the retry fields, as Slack does
        with an envelope whose ack it did not get (e.g. the socket dropped): same ``envelope_id``,
        same payload (same ``trigger_id``/``event_id``), ``retry_attempt`` one higher. It is sent on
        the open connection, or on the next one."""
        envelope = dict(self.envelopes[envelope_id]["envelope"])
        envelope["retry_attempt"] = int(envelope.get("retry_attempt") or 0) + 1
        envelope["retry_reason"] = retry_reason
        self.envelopes[envelope_id]["envelope"] = envelope
        async with self._cond:
            self._outbox.append(json.dumps(envelope))
            self._cond.notify_all()

    def ack_count(self, envelope_id: str) -> int:
        """How many acks of ``envelope_id`` the client sent (over every connection)."""
        return sum(1 for m in self.client_messages if m.get("envelope_id") == envelope_id)

    async def wait_for_ack_count(self, envelope_id: str, count: int, timeout: float = 5.0) -> None:
        """Wait until the client has acked ``envelope_id`` at least ``count`` times."""
        await self._wait(lambda: self.ack_count(envelope_id) >= count, timeout, f"{count} acks of {envelope_id}")

    async def send_disconnect(self, reason: str = "refresh_requested") -> None:
        """Send Slack's ``{"type": "disconnect", "reason": ...}`` on every open connection."""
        msg = json.dumps({"type": "disconnect", "reason": reason, "debug_info": {"host": "fake-slack"}})
        for conn in list(self._connections):
            if not conn.closed:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await conn.ws.send_str(msg)

    async def drop_websocket(self, *, abrupt: bool = True) -> int:
        """Close the open Socket Mode connection(s) from the server side; return how many.

        ``abrupt=True`` aborts the TCP connection without a websocket close frame (a network
        drop); ``abrupt=False`` sends a normal close frame.
        """
        dropped = 0
        for conn in list(self._connections):
            if not conn.closed:
                await self._close_connection(conn, abrupt=abrupt)
                dropped += 1
        return dropped

    # ------------------------------------------------------------------ helpers

    def _next_ts(self) -> str:
        """A fresh message ts: the current time in microseconds, strictly increasing (as Slack's are)."""
        n = next(self._ts_counter)
        micros = max(int(time.time() * 1_000_000), self._last_ts_us + 1, _TS_BASE * 1_000_000 + n)
        self._last_ts_us = micros
        return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"

    def _trigger_id(self) -> str:
        return f"{next(self._trigger_counter)}.{int(time.time())}.{uuid.uuid4().hex[:16]}"

    def _user(self, user_id: str) -> dict[str, Any]:
        if user_id not in self.users:
            name = BOT_NAME if user_id == BOT_USER_ID else f"user-{user_id.lower()}"
            self.users[user_id] = {
                "id": user_id,
                "team_id": TEAM_ID,
                "name": name,
                "real_name": name.title(),
                "tz": "UTC",
                "tz_offset": 0,
                "is_admin": False,
                "is_bot": user_id == BOT_USER_ID,
                "deleted": False,
                "profile": {"display_name": name, "real_name": name.title(), "email": f"{name}@example.com"},
            }
        return self.users[user_id]

    def _channel(self, channel_id: str) -> dict[str, Any]:
        if channel_id not in self.channels:
            is_im = channel_id.startswith("D")
            self.channels[channel_id] = {
                "id": channel_id,
                "name": "directmessage" if is_im else f"channel-{channel_id.lower()}",
                "is_channel": not is_im,
                "is_im": is_im,
                "is_private": channel_id.startswith("G"),
                "is_member": True,
                "is_archived": False,
            }
        return self.channels[channel_id]

    async def _close_connection(self, conn: _Connection, *, abrupt: bool) -> None:
        if conn.closed:
            return
        conn.closed = True
        if abrupt and conn.transport is not None:
            conn.transport.abort()
        else:
            try:
                await asyncio.wait_for(conn.ws.close(code=1001, message=b"going away"), 2.0)
            except (TimeoutError, ConnectionError, RuntimeError):
                if conn.transport is not None:
                    conn.transport.abort()
        await self._notify()

    # ------------------------------------------------------------------ HTTP handlers

    @staticmethod
    def _decode(params: dict[str, Any]) -> dict[str, Any]:
        for key in _JSON_STRING_PARAMS:
            val = params.get(key)
            if isinstance(val, str) and val[:1] in ("[", "{"):
                with contextlib.suppress(ValueError):
                    params[key] = json.loads(val)
        return params

    async def _read_params(self, request: web.Request) -> dict[str, Any]:
        params: dict[str, Any] = dict(request.query)
        if request.can_read_body:
            if request.content_type == "application/json":
                body = await request.json()
                if isinstance(body, dict):
                    params.update(body)
            elif request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
                form = await request.post()
                for key in form:
                    val = form.get(key)
                    params[key] = val if isinstance(val, str) else getattr(val, "filename", val)
            else:
                await request.read()
        return self._decode(params)

    async def _handle_api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        params = await self._read_params(request)
        auth = request.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else params.get("token")
        call: dict[str, Any] = {
            "method": method,
            "params": params,
            "token": token,
            "headers": dict(request.headers),
            "time": time.monotonic(),
            "status": 200,
            "response": None,
        }
        now = time.monotonic()
        failure = next((f for f in self._failures if f.active(now) and f.matches(method)), None)
        if failure is not None:
            if failure.remaining is not None:
                failure.remaining -= 1
            call["status"] = failure.status
            if failure.status == 429:
                body: Any = {"ok": False, "error": "ratelimited"}
                headers = {} if failure.retry_after is None else {"Retry-After": str(failure.retry_after)}
                resp: web.Response = web.json_response(body, status=429, headers=headers)
            else:
                body = f"{failure.status} fake server error"
                resp = web.Response(text=body, status=failure.status, content_type="text/plain")
            call["response"] = body
            self.calls.append(call)
            self.failed_calls.append(call)
            await self._notify()
            return resp

        result = self._answer(method, params, token)
        call["response"] = result
        self.calls.append(call)
        await self._notify()
        return web.json_response(result)

    def _answer(self, method: str, params: dict[str, Any], token: str | None) -> dict[str, Any]:
        for err in self._errors:
            if err.method == method and (err.remaining is None or err.remaining > 0):
                if err.remaining is not None:
                    err.remaining -= 1
                return {"ok": False, "error": err.error}
        if not token:
            return {"ok": False, "error": "not_authed"}
        handler = getattr(self, "_api_" + method.replace(".", "_"), None)
        if handler is None:
            return {"ok": True}
        return handler(params, token)

    def _api_usergroups_users_list(self, params: dict[str, Any], token: str) -> dict[str, Any]:
        gid = params.get("usergroup")
        if gid not in self.usergroups:
            return {"ok": False, "error": "no_such_subteam"}
        return {"ok": True, "users": list(self.usergroups[gid])}

    def _api_auth_test(self, params: dict[str, Any], token: str) -> dict[str, Any]:
        return {
            "ok": True,
            "url": f"https://{TEAM_DOMAIN}.slack.com/",
            "team": TEAM_DOMAIN,
            "user": BOT_NAME,
            "team_id": TEAM_ID,
            "user_id": BOT_USER_ID,
            "bot_id": BOT_ID,
            "is_enterprise_install": False,
        }

    def _api_apps_connections_open(self, params: dict[str, Any], token: str) -> dict[str, Any]:
        if not token.startswith("xapp-"):
            return {"ok": False, "error": "not_allowed_token_type"}
        n = next(self._link_counter)
        self._link_issued[str(n)] = time.monotonic()
        return {"ok": True, "url": f"ws://{self.host}:{self.port}/link/?n={n}"}

    def _api_chat_postMessage(self, params: dict[str, Any], token: str) -> dict[str, Any]:
        channel = params.get("channel")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        if not params.get("text") and not params.get("blocks") and not params.get("attachments"):
            return {"ok": False, "error": "no_text"}
        ts = self._next_ts()
        thread_ts = params.get("thread_ts") or None
        msg = {
            "channel": channel,
            "ts": ts,
            "thread_ts": thread_ts,
            "text": params.get("text"),
            "blocks": params.get("blocks"),
            "params": params,
            "user": BOT_USER_ID,
            "bot_id": BOT_ID,
        }
        self.messages.append(msg)
        echo: dict[str, Any] = {
            "type": "message",
            "user": BOT_USER_ID,
            "bot_id": BOT_ID,
            "text": params.get("text") or "",
            "ts": ts,
            "team": TEAM_ID,
        }
        if thread_ts:
            echo["thread_ts"] = thread_ts
        if params.get("blocks") is not None:
            echo["blocks"] = params["blocks"]
        return {"ok": True, "channel": channel, "ts": ts, "message": echo}

    def _api_chat_update(self, params: dict[str, Any], token: str) -> dict[str, Any]:
        ts = params.get("ts")
        channel = params.get("channel")
        if not any(m["ts"] == ts for m in self.messages):
            return {"ok": False, "error": "message_not_found"}
        self.updates.append(
            {
                "channel": channel,
                "ts": ts,
                "text": params.get("text"),
                "blocks": params.get("blocks"),
                "params": params,
            }
        )
        state = self.message_state(ts) or {}
        return {
            "ok": True,
            "channel": channel,
            "ts": ts,
            "text": state.get("text") or "",
            "message": {
                "type": "message",
                "user": BOT_USER_ID,
                "bot_id": BOT_ID,
                "text": state.get("text") or "",
            },
        }

    def _api_chat_postEphemeral(self, params: dict[str, Any], token: str) -> dict[str, Any]:
        message_ts = self._next_ts()
        self.ephemerals.append(
            {
                "channel": params.get("channel"),
                "user": params.get("user"),
                "text": params.get("text"),
                "blocks": params.get("blocks"),
                "thread_ts": params.get("thread_ts") or None,
                "message_ts": message_ts,
                "params": params,
            }
        )
        return {"ok": True, "message_ts": message_ts}

    def _api_chat_delete(self, params: dict[str, Any], token: str) -> dict[str, Any]:
        channel, ts = str(params.get("channel") or ""), str(params.get("ts") or "")
        if not any(m["channel"] == channel and m["ts"] == ts for m in self.messages):
            return {"ok": False, "error": "message_not_found"}
        self.deletions.append((channel, ts))
        return {"ok": True, "channel": channel, "ts": ts}

    def _reaction(self, op: str, params: dict[str, Any]) -> dict[str, Any]:
        self.reactions.append(
            (op, params.get("channel", ""), params.get("timestamp", ""), params.get("name", ""))
        )
        return {"ok": True}

    def _api_reactions_add(self, params: dict[str, Any], token: str) -> dict[str, Any]:
        return self._reaction("add", params)

    def _api_reactions_remove(self, params: dict[str, Any], token: str) -> dict[str, Any]:
        return self._reaction("remove", params)

    def _history_item(self, msg: dict[str, Any], with_metadata: bool) -> dict[str, Any]:
        state = self.message_state(msg["ts"]) or msg
        item = {"type": "message", "user": BOT_USER_ID, "bot_id": BOT_ID, "ts": msg["ts"],
                "text": state.get("text") or ""}
        if msg["thread_ts"]:
            item["thread_ts"] = msg["thread_ts"]
        meta = msg["params"].get("metadata")
        if with_metadata and isinstance(meta, dict):
            item["metadata"] = meta
        return item

    @staticmethod
    def _truthy(value: Any) -> bool:
        return str(value).lower() in ("1", "true")

    def _api_conversations_history(self, params: dict[str, Any], token: str) -> dict[str, Any]:
        """Top-level messages of a channel newer than ``oldest``, newest first (metadata only with
        ``include_all_metadata``), as Slack's conversations.history answers."""
        channel, oldest = params.get("channel"), float(params.get("oldest") or 0)
        found = [m for m in self.messages if m["channel"] == channel and float(m["ts"]) > oldest
                 and (not m["thread_ts"] or m["thread_ts"] == m["ts"])]
        meta = self._truthy(params.get("include_all_metadata"))
        return {"ok": True, "messages": [self._history_item(m, meta) for m in reversed(found)], "has_more": False}

    def _api_conversations_replies(self, params: dict[str, Any], token: str) -> dict[str, Any]:
        """The parent and replies of thread ``ts`` (replies newer than ``oldest``), oldest first."""
        channel, ts, oldest = params.get("channel"), params.get("ts"), float(params.get("oldest") or 0)
        found = [m for m in self.messages if m["channel"] == channel
                 and (m["ts"] == ts or (m["thread_ts"] == ts and float(m["ts"]) > oldest))]
        if not found:
            return {"ok": False, "error": "thread_not_found"}
        meta = self._truthy(params.get("include_all_metadata"))
        return {"ok": True, "messages": [self._history_item(m, meta) for m in found], "has_more": False}

    def _api_conversations_info(self, params: dict[str, Any], token: str) -> dict[str, Any]:
        channel = params.get("channel")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        return {"ok": True, "channel": self._channel(channel)}

    def _api_users_info(self, params: dict[str, Any], token: str) -> dict[str, Any]:
        user = params.get("user")
        if not user:
            return {"ok": False, "error": "user_not_found"}
        return {"ok": True, "user": self._user(user)}

    def _api_files_getUploadURLExternal(self, params: dict[str, Any], token: str) -> dict[str, Any]:
        file_id = f"F{next(self._file_counter):06d}"
        length = params.get("length")
        self.files[file_id] = {
            "id": file_id,
            "filename": params.get("filename"),
            "length": int(length) if length not in (None, "") else None,
            "title": None,
            "channel_id": None,
            "thread_ts": None,
            "initial_comment": None,
            "completed": False,
        }
        return {"ok": True, "upload_url": f"{self.base_url}/upload/{file_id}", "file_id": file_id}

    def _api_files_completeUploadExternal(self, params: dict[str, Any], token: str) -> dict[str, Any]:
        items = params.get("files") or []
        if not isinstance(items, list):
            return {"ok": False, "error": "invalid_arguments"}
        out = []
        for item in items:
            meta = self.files.get(item.get("id"))
            if meta is None:
                return {"ok": False, "error": "file_not_found"}
            meta.update(
                {
                    "title": item.get("title") or meta["filename"],
                    "channel_id": params.get("channel_id"),
                    "thread_ts": params.get("thread_ts") or None,
                    "initial_comment": params.get("initial_comment"),
                    "completed": True,
                }
            )
            out.append(
                {
                    "id": meta["id"],
                    "name": meta["filename"],
                    "title": meta["title"],
                    "size": len(self.uploads.get(meta["id"], b"")),
                    "user": BOT_USER_ID,
                }
            )
        return {"ok": True, "files": out}

    async def _handle_upload(self, request: web.Request) -> web.StreamResponse:
        file_id = request.match_info["file_id"]
        data = await request.read()
        self.uploads[file_id] = data
        await self._notify()
        return web.Response(text=f"OK - {len(data)}", content_type="text/plain")

    async def _handle_response(self, request: web.Request) -> web.StreamResponse:
        rid = request.match_info["rid"]
        raw = await request.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        self.responses.append((rid, body))
        await self._notify()
        return web.Response(text="ok", content_type="text/plain")

    # ------------------------------------------------------------------ websocket

    def refuse_websockets(self, for_seconds: float, *, link_ttl_s: float | None = None) -> None:
        """Answer websocket connections with HTTP 503 for ``for_seconds`` (an outage of Slack's Socket Mode
        edge). With ``link_ttl_s``, a websocket URL also expires that many seconds after it was issued
        (HTTP 410 from then on), as Slack's temporary Socket Mode URLs do."""
        self._ws_refused_until = time.monotonic() + for_seconds
        self._link_ttl_s = link_ttl_s

    async def _handle_ws(self, request: web.Request) -> web.StreamResponse:
        if self._closing:
            raise web.HTTPServiceUnavailable()
        n = request.query.get("n", "")
        ttl = getattr(self, "_link_ttl_s", None)
        issued = self._link_issued.get(n)
        if ttl is not None and issued is not None and time.monotonic() - issued > ttl:
            raise web.HTTPGone()
        if time.monotonic() < getattr(self, "_ws_refused_until", 0.0):
            raise web.HTTPServiceUnavailable()
        ws = web.WebSocketResponse(timeout=2.0, autoping=True)
        transport = request.transport
        await ws.prepare(request)
        task = asyncio.current_task()
        if task is not None:
            self._ws_tasks.add(task)
        self.connection_count += 1
        conn = _Connection(
            number=self.connection_count,
            ws=ws,
            transport=transport,
            link_n=request.query.get("n"),
            connected_at=time.monotonic(),
        )
        sender: asyncio.Task[None] | None = None
        try:
            if self.hello_delay:
                await asyncio.sleep(self.hello_delay)
            await ws.send_json(
                {
                    "type": "hello",
                    "num_connections": 1,
                    "debug_info": {
                        "host": "fake-slack",
                        "build_number": 1,
                        "approximate_connection_time": 18060,
                    },
                    "connection_info": {"app_id": APP_ID},
                }
            )
            self._connections.append(conn)
            await self._notify()
            sender = asyncio.create_task(self._sender(conn))
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                try:
                    data = json.loads(msg.data)
                except ValueError:
                    continue
                if not isinstance(data, dict):
                    continue
                self.client_messages.append(data)
                if "envelope_id" in data:
                    self.acks[data["envelope_id"]] = (data.get("payload"), time.monotonic())
                await self._notify()
        except (ConnectionError, RuntimeError):
            pass
        finally:
            conn.closed = True
            if sender is not None:
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sender
            if conn in self._connections:
                self._connections.remove(conn)
            if task is not None:
                self._ws_tasks.discard(task)
            await self._notify()
        return ws

    def _next_for(self, conn: _Connection) -> int | None:
        """The index in the queue of the first envelope `conn` may carry (not one meant for another connection)."""
        if not self._targets:
            return 0 if self._outbox else None
        for i, raw in enumerate(self._outbox):
            target = self._targets.get(json.loads(raw)["envelope_id"])
            if target is None or target == conn.number:
                return i
        return None

    async def _sender(self, conn: _Connection) -> None:
        while not conn.closed:
            async with self._cond:
                await self._cond.wait_for(lambda: self._next_for(conn) is not None or conn.closed)
                if conn.closed:
                    return
                i = self._next_for(conn)
                assert i is not None
                raw = self._outbox[i]
                del self._outbox[i]
            try:
                await conn.ws.send_str(raw)
            except (ConnectionError, RuntimeError):
                self._outbox.appendleft(raw)  # deliver on the next connection
                return
            env_id = json.loads(raw)["envelope_id"]
            if env_id in self.envelopes:
                self.envelopes[env_id]["sent_at"] = time.monotonic()
                self.envelopes[env_id]["connection"] = conn.number
