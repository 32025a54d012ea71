"""HTTP mode: Bolt's aiohttp web app with request signing, served on loopback."""

from __future__ import annotations

import time
from urllib.parse import urlencode

import aiohttp
import pytest
from aiohttp import web
from slack_sdk.signature import SignatureVerifier

pytestmark = pytest.mark.timeout(60)
SECRET = "test-signing-secret"


@pytest.fixture
async def http_stack(slack_stacks, ssh_config):
    """The bot in HTTP mode (no socket), its Bolt web app served on a loopback port; the site is cleaned up
    before the stack is stopped (slack_stacks' finalizer)."""
    stack = await slack_stacks(ssh_config, socket_mode=False, signing_secret=SECRET)
    runner = web.AppRunner(stack.app.web_app(path="/slack/events"))
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        yield stack, f"http://127.0.0.1:{port}/slack/events"
    finally:
        await runner.cleanup()


def slash_body(stack, text: str) -> str:
    return urlencode({
        "token": "x", "team_id": "T1", "team_domain": "t", "channel_id": "C1", "channel_name": "gpu",
        "user_id": "U1", "user_name": "alice", "command": "/gpu", "text": text,
        "response_url": stack.fake.response_url("http-1"), "trigger_id": "1.2.3", "api_app_id": "A1",
    })


def signed_headers(body: str, secret: str = SECRET, ts: int | None = None) -> dict:
    ts = int(time.time()) if ts is None else ts
    sig = SignatureVerifier(secret).generate_signature(timestamp=str(ts), body=body)
    return {"X-Slack-Request-Timestamp": str(ts), "X-Slack-Signature": sig,
            "Content-Type": "application/x-www-form-urlencoded"}


async def test_signed_request_is_served_and_answered(http_stack):
    stack, url = http_stack
    body = slash_body(stack, "status")
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as s, s.post(url, data=body, headers=signed_headers(body)) as r:
        # 200 is the ack: Bolt answers 404 when a listener has not acked within Slack's 3 s
        assert r.status == 200
        acked = time.monotonic() - t0
        answered_before_ack = [c for c in stack.fake.calls if c["method"] in ("chat.postMessage", "chat.update")]
    print(f"acked after {acked:.3f} s")
    assert answered_before_ack == []  # ack first: the work (an SSH probe) runs after it
    call = await stack.fake.wait_for_answer(lambda c: "GPU status" in (c["params"].get("text") or ""), timeout=30)
    assert call["params"]["channel"] == "C1"


@pytest.mark.parametrize("variant", ["bad-secret", "stale", "tampered"])
async def test_badly_signed_request_is_rejected(http_stack, variant):
    stack, url = http_stack
    body = slash_body(stack, "status")
    if variant == "bad-secret":
        headers = signed_headers(body, secret="wrong")
    elif variant == "stale":
        headers = signed_headers(body, ts=int(time.time()) - 600)
    else:
        headers = signed_headers(body)
        body = body.replace("status", "probe")
    async with aiohttp.ClientSession() as s, s.post(url, data=body, headers=headers) as r:
        assert r.status == 401
    await stack.settled()
    assert stack.fake.calls_for("chat.postMessage") == [] and stack.fake.calls_for("chat.update") == []
    assert stack.runtime.audit.events() == []  # never dispatched: no command was even refused
