"""Failover of two real `gpubot run` processes on one PostgreSQL database against the fake Slack (issue 26): the
leader is SIGKILLed while 60 answers are being sent and 3 launches are watched. Nothing is lost or posted twice,
the watches go on under the new leader with one alert per state change, the per-channel pacing holds across the
handover, and each bot's /healthz and /metrics say which one leads."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from cryptography.fernet import Fernet

from bot.adapters.store import Store
from tests.support.builders import OPERATOR, three_watched_variants
from tests.support.fakes.slack_server import BOT_USER_ID, FakeSlack
from tests.support.procs import wait_until
from tests.support.service import ServiceBot, stop_everything

pytestmark = pytest.mark.timeout(300)

SECRET = "Qx7-not-a-known-shape-4cXv9LmTz2Rk"  # no pattern knows it: only its value masks it
INTERVAL_S = 0.4  # slack.post_interval_s: 60 answers in 2 channels take 12 s to send
SILENCE_S = 8.0
ALERT_RE = re.compile(r"^(v\d#\d+) on gpu-host-1: (silent_hang|[a-z_]+)", re.M)


def service_config(ssh_server, fake_gpu, tmp_path: Path, database_url: str) -> Path:
    """Three hang variants on 2 GPUs each of the loopback host (6 fake GPUs), watched every 0.5 s."""
    data = three_watched_variants(ssh_server, fake_gpu, tmp_path, SILENCE_S)
    # v1 takes a secret param, passed under an ordinary flag: masked by value only, sealed in its row
    data["variants"]["v1"]["command"] += " --served-model-name {{ api_key }}"
    data["variants"]["v1"]["params"]["api_key"] = {"type": "str", "secret": True, "default": "none-given"}
    data["permissions"] = {"operators": [OPERATOR]}
    data["slack"] = {"post_interval_s": INTERVAL_S, "progress_after_s": 5.0}
    data["database_url"] = database_url
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def posts(fake: FakeSlack, channel: str) -> list[dict]:
    return [c for c in fake.calls if c["method"] in ("chat.postMessage", "chat.update")
            and c["params"].get("channel") == channel and c.get("status") == 200]


def queued_answers(url: str, channels: tuple[str, ...]) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return int(c.execute(sa.text("SELECT count(*) FROM outbox WHERE channel IN :chs")
                                 .bindparams(sa.bindparam("chs", expanding=True)), {"chs": list(channels)}).scalar())
    finally:
        engine.dispose()


async def test_sigkill_of_the_leader_loses_nothing_repeats_nothing_and_keeps_watching(
        ssh_server, fake_gpu, tmp_path, pg_url):
    config = service_config(ssh_server, fake_gpu, tmp_path, pg_url)
    store: Store | None = None
    bots: list[ServiceBot] = []
    async with FakeSlack() as fake:
        try:
            a, b = await _leader_and_follower(fake, config, tmp_path, bots)
            assert re.search(r"^gpubot_leader 0\.0$", await b.metrics(), re.M)
            assert re.search(r"^gpubot_leader 1\.0$", await a.metrics(), re.M)

            # three watched launches (the commands reach either bot; only the leader checks them)
            for i in (1, 2, 3):
                extra = f" api_key={SECRET}" if i == 1 else ""
                await fake.push_slash_command("/launch", f"v{i} mode=hang workers=1{extra}", user_id=OPERATOR,
                                              channel_id="C1")
            store = Store(pg_url)
            await wait_until(lambda: len([la for la in store.launches.recent() if la.pid]) == 3, 60,
                             what=lambda: f"three launches running; {_slack_state(fake)}; logs:\n{a.output()}\n"
                                          f"{b.output()}")

            # 60 answers in two channels, queued by both bots, sent by the leader INTERVAL_S apart per channel
            asked: list[tuple[str, str]] = []
            envelopes = []
            for n in range(60):
                channel = ("C2", "C3")[n % 2]
                envelopes.append(await fake.push_app_mention(f"<@{BOT_USER_ID}> help", user_id=OPERATOR,
                                                             channel_id=channel))
                asked.append((channel, fake.envelopes[envelopes[-1]]["payload"]["event"]["ts"]))
            for env_id in envelopes[:10]:  # Slack's retries, taken by either bot: acted on once all the same
                await fake.redeliver(env_id)
            await wait_until(lambda: queued_answers(pg_url, ("C2", "C3")) >= 60, 60,
                             what="the 60 answers queued")
            await wait_until(lambda: len(posts(fake, "C2")) + len(posts(fake, "C3")) >= 6, 60,
                             what="the leader sending them")
            sent_before = len(posts(fake, "C2")) + len(posts(fake, "C3"))
            await a.kill()  # SIGKILL: no clean shutdown, the leader's session and advisory lock die with it
            killed = time.monotonic()
            assert sent_before < 60, "the answers were all sent before the leader died: nothing was in flight"
            await wait_until(lambda: _role_is(b, "leader"), 30, what=f"bot b taking over; its log:\n{b.output()}")
            print(f"{sent_before} of 60 answers sent when the leader was killed; bot b led "
                  f"{time.monotonic() - killed:.2f} s later")
            for env_id in envelopes[10:20]:  # retried now, to bot b alone: their claims in the database stand
                await fake.redeliver(env_id)

            def answered() -> Counter:
                mine = {ts for _, ts in asked}
                return Counter(m["thread_ts"] for m in fake.messages if m.get("thread_ts") in mine)

            await wait_until(lambda: len(answered()) == 60, 120,
                             what=f"all 60 answered; {len(answered())} so far; b's log:\n{b.output()}")
            # the launches' hangs are alerted (whichever bot led when they came due), and the watch goes on
            await wait_until(lambda: len(_alerts(fake)) >= 3, 90,
                             what=lambda: f"three hang alerts; {_watch_state(store, fake)}; b's log:\n{b.output()}")
            checks = _observations(pg_url)
            await wait_until(lambda: _observations(pg_url) >= checks + 6, 60, what="more checks under bot b")
            await asyncio.sleep(0)  # a duplicate alert of the last checks would be posted by now
            # a sync point: b still answers, and masks the secret of a launch either bot made, on its command line
            await fake.push_slash_command("/probe", "gpu-host-1 match=served-model-name", user_id=OPERATOR,
                                          channel_id="C4")
            await wait_until(lambda: posts(fake, "C4"), 60, what="the probe's answer")
            shown = json.dumps([c["params"] for c in fake.calls])
            assert "served-model-name" in shown and SECRET not in shown
            with sa.create_engine(pg_url).connect() as c:
                row = c.execute(sa.text("SELECT params_json, sealed_secrets FROM launches WHERE variant = 'v1'")).one()
            assert SECRET not in row[0] and row[1] and SECRET not in row[1]  # sealed, never in the clear

            counts = answered()
            assert set(counts.values()) == {1}, {ts: n for ts, n in counts.items() if n != 1}  # 0 lost, 0 twice
            names = sorted(la.name for la in store.launches.recent())
            assert sorted(v for v, _ in _alerts(fake)) == names, _alerts(fake)  # one alert each, no repeat
            for channel in ("C1", "C2", "C3"):
                times = [c["time"] for c in posts(fake, channel)]
                gaps = [t2 - t1 for t1, t2 in itertools.pairwise(times)]
                assert gaps and min(gaps) >= INTERVAL_S - 0.03, (channel, sorted(gaps)[:5])
            m = await b.metrics()
            assert re.search(r"^gpubot_leader 1\.0$", m, re.M)
            assert re.search(r'^gpubot_commands_total\{command="probe",result="ok"\} \d', m, re.M), m
        finally:
            await stop_everything(bots, store, pg_url)


def _journal(url: str, channel: str) -> list[tuple[str, str]]:
    """(state, owner) of the commands written ahead in `channel`."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return [tuple(r) for r in c.execute(sa.text("SELECT state, owner FROM commands WHERE channel = :ch "
                                                        "ORDER BY id"), {"ch": channel})]
    finally:
        engine.dispose()


def _audited(url: str, channel: str) -> list[tuple[str, str, str | None]]:
    """(action, result, detail) of the `command:*` audit rows of `channel`."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return [tuple(r) for r in c.execute(sa.text(
                "SELECT action, result, detail FROM events WHERE channel = :ch AND action LIKE 'command:%' "
                "ORDER BY id"), {"ch": channel})]
    finally:
        engine.dispose()


async def test_a_command_whose_leader_is_sigkilled_while_running_it_is_answered_once_with_its_audit_row(
        ssh_server, fake_gpu, tmp_path, pg_url):
    """`/launch` reaches the leader (Slack picks its connection), which writes it ahead and is SIGKILLed as soon as
    its journal row is there (about 0.2-0.7 s after the ack here; printed), while it still runs it: the new leader
    answers it in its channel, once, saying it was cut off and what it had recorded; its one audit row reads
    `interrupted`, never `running`; the launch it may have started is settled and followed, and nothing about it is
    posted twice."""
    config = service_config(ssh_server, fake_gpu, tmp_path, pg_url)
    bots: list[ServiceBot] = []
    store: Store | None = None
    async with FakeSlack() as fake:
        try:
            a, b = await _leader_and_follower(fake, config, tmp_path, bots)
            env_id = await fake.push_slash_command("/launch", "v2 mode=hang workers=1", user_id=OPERATOR,
                                                   channel_id="C5", connection=a.connection)
            await fake.wait_for_ack_count(env_id, 1, timeout=30)
            acked = fake.acks[env_id][1]
            await wait_until(lambda: _journal(pg_url, "C5"), 30, what=f"the command written ahead; a:\n{a.output()}")
            state_at_kill = _journal(pg_url, "C5")[0][0]
            await a.kill()
            after_ack = time.monotonic() - acked
            print(f"bot a SIGKILLed {after_ack:.2f} s after it acked /launch; its command was {state_at_kill}")
            assert state_at_kill == "running", "the command ended before the kill: nothing was cut off"

            def answers() -> list[str]:
                return [m.get("text") or "" for m in fake.messages if m.get("channel") == "C5"
                        and not m.get("thread_ts")]

            await wait_until(lambda: any("cut off" in t for t in answers()), 90,
                             what=lambda: f"the new leader's answer; C5: {answers()}; b's log:\n{b.output()}")
            assert _journal(pg_url, "C5")[0][0] == "recovered"
            rows = _audited(pg_url, "C5")
            assert [(act, res) for act, res, _ in rows] == [("command:launch", "interrupted")], rows
            assert "stopped" in (rows[0][2] or ""), rows
            # whatever launch it recorded is settled by the new leader (never left `starting` without a PID)
            store = Store(pg_url)
            rows_now = store.launches.recent
            await wait_until(lambda: all(la.state.value != "starting" for la in rows_now()), 60,
                             what=lambda: f"the launch settled: {[(la.name, la.state) for la in rows_now()]}")
            # a sync point: b answers the next command in C5; the cut-off one is still answered once
            await fake.push_slash_command("/gpu", "help", user_id=OPERATOR, channel_id="C5")
            await wait_until(lambda: len(answers()) >= 2, 60, what=lambda: f"the help answer; C5: {answers()}")
            cut = [t for t in answers() if "cut off" in t]
            assert len(cut) == 1 and "/launch v2 mode=hang workers=1" in cut[0], answers()
            print(f"the new leader's answer: {cut[0]!r}")
            assert not any(t.startswith("Launched v2") for t in answers()), answers()
        finally:
            await stop_everything(bots, store, pg_url)


async def _leader_and_follower(fake: FakeSlack, config: Path, tmp_path: Path,
                               bots: list[ServiceBot]) -> tuple[ServiceBot, ServiceBot]:
    """Two `gpubot run` of `config` against `fake` (added to `bots`, for the finalizer), sharing their sealing key:
    bot a started first and leading (its Socket Mode connection's number in `a.connection`), bot b following, both
    connected."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SLACK_BOT_TOKEN": "xoxb-test",
           "SLACK_APP_TOKEN": "xapp-test", "SLACK_API_URL": fake.api_url,
           "GPUBOT_SECRET_KEY": Fernet.generate_key().decode()}
    a = await ServiceBot("a", config, env, tmp_path).start()
    bots.append(a)
    await wait_until(lambda: _role_is(a, "leader"), 60, what=f"bot a leading; its log:\n{a.output()}")
    await fake.wait_connected(30, count=1)
    a.connection = next(c.number for c in fake._connections if not c.closed)
    b = await ServiceBot("b", config, env, tmp_path).start()
    bots.append(b)
    await wait_until(lambda: _role_is(b, "follower"), 60, what=f"bot b following; its log:\n{b.output()}")
    await fake.wait_connected(30, count=2)
    return a, b


def _slack_state(fake: FakeSlack) -> str:
    """What the fake Slack did so far, for a failure message."""
    methods = [c["method"] for c in fake.calls]
    conns = [(c.number, "closed" if c.closed else "open") for c in fake._connections]
    return (f"calls {methods}, envelopes not yet sent {len(fake._outbox)}, acks {len(fake.acks)}, "
            f"connections {conns} of {fake.connection_count}")


def _watch_state(store: Store, fake: FakeSlack) -> str:
    """The launches' rows and the thread replies posted so far, for a failure message."""
    rows = [(la.name, la.state, la.alert_state, la.state_detail) for la in store.launches.recent()]
    replies = [(m.get("thread_ts"), (m.get("text") or "")[:120]) for m in fake.messages
               if m.get("thread_ts") and m.get("channel") == "C1"]
    return f"launches {rows}; thread replies {replies[-12:]}"


async def _role_is(bot: ServiceBot, role: str) -> bool:
    return await bot.role() == role


def _alerts(fake: FakeSlack) -> list[tuple[str, str]]:
    """(launch, verdict) of every alert posted in a launch's thread (its first line names both; the thread's root
    names the launch's state the same way, but is no reply)."""
    out = []
    for m in fake.messages:
        hit = ALERT_RE.match(m.get("text") or "") if m.get("thread_ts") else None
        if hit and hit.group(2) != "recovered":
            out.append((hit.group(1), hit.group(2)))
    return out


def _observations(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return int(c.execute(sa.text("SELECT count(*) FROM observations")).scalar())
    finally:
        engine.dispose()


async def test_a_sigstopped_leader_is_replaced_within_its_lease_and_sends_nothing_twice_after_sigcont(
        ssh_server, fake_gpu, tmp_path, pg_url):
    """Two real `gpubot run` on one PostgreSQL database: the leader is frozen (SIGSTOP of its process group, as a
    paused VM) for 30 s while answers are being sent. Its session, and so its advisory lock, lives on; its lease
    (10 s) runs out and the follower ends that session and leads; every answer is sent once, those asked while the
    leader was frozen too; woken (SIGCONT), the old leader steps down and sends nothing twice."""
    config = service_config(ssh_server, fake_gpu, tmp_path, pg_url)
    bots: list[ServiceBot] = []
    async with FakeSlack() as fake:
        try:
            a, b = await _leader_and_follower(fake, config, tmp_path, bots)
            asked: list[str] = []
            envelopes: list[str] = []

            async def ask(n: int, channel: str) -> None:
                for _ in range(n):
                    env_id = await fake.push_app_mention(f"<@{BOT_USER_ID}> help", user_id=OPERATOR,
                                                         channel_id=channel)
                    envelopes.append(env_id)
                    asked.append(fake.envelopes[env_id]["payload"]["event"]["ts"])

            async def as_slack_retries() -> bool:
                """As Slack does: send again an envelope no bot acknowledged within 3 s of its last sending (the
                frozen bot's socket took it; a retry may go to that socket again); True once every envelope is
                acknowledged."""
                now = time.monotonic()
                for env_id in envelopes:
                    sent = fake.envelopes[env_id].get("sent_at") or fake.envelopes[env_id]["pushed_at"]
                    last = max(sent, retried.get(env_id, 0.0))
                    if env_id not in fake.acks and now - last > 3:  # (a send to the frozen socket may never end)
                        retried[env_id] = now
                        await fake.redeliver(env_id)
                return all(e in fake.acks for e in envelopes)

            retried: dict[str, float] = {}

            def answered() -> Counter:
                mine = set(asked)
                return Counter(m["thread_ts"] for m in fake.messages if m.get("thread_ts") in mine)

            await ask(20, "C2")
            await wait_until(lambda: len(answered()) >= 3, 60, what="the leader sending answers")
            assert a.proc is not None
            os.killpg(a.proc.pid, signal.SIGSTOP)
            frozen = time.monotonic()
            await wait_until(lambda: _role_is(b, "leader"), 60, what=f"bot b taking over; its log:\n{b.output()}")
            took = time.monotonic() - frozen
            print(f"bot b led {took:.1f} s after the leader was frozen (lease 10 s)")
            assert took <= 10 + 15, took  # the lease, a heartbeat or two, and a loaded machine's slack
            # as Slack does with a connection that stops answering its pings: it is dropped (the live bot
            # connects again, the frozen one cannot until it wakes)
            await fake.drop_websocket()
            await wait_until(lambda: any(not c.closed for c in fake._connections), 60, what="bot b connected again")
            await ask(10, "C3")  # asked while the old leader is frozen: the new one answers
            await wait_until(as_slack_retries, 60, what=lambda: (
                f"every envelope acknowledged: {[e for e in envelopes if e not in fake.acks]} not; "
                f"{_slack_state(fake)}; b's log:\n{b.output()}"))
            await wait_until(lambda: len(answered()) == 30, 120,
                             what=lambda: f"all 30 answered, {len(answered())} so far; b's log:\n{b.output()}")
            await asyncio.sleep(max(0.0, 30 - (time.monotonic() - frozen)))  # frozen for 30 s in all
            os.killpg(a.proc.pid, signal.SIGCONT)
            await wait_until(lambda: _role_is(a, "follower"), 60, what=f"bot a stepping down; its log:\n{a.output()}")
            await ask(1, "C4")  # a sync point: answered by the leader after the old one woke up
            await wait_until(lambda: len(answered()) == 31, 60, what="the last answer")
            counts = answered()
            assert set(counts.values()) == {1}, {ts: n for ts, n in counts.items() if n != 1}  # 0 lost, 0 twice
            assert await b.role() == "leader"
            assert "lease" in a.output() and "ended its database session" in b.output() + a.output(), b.output()
        finally:
            await stop_everything(bots, None, pg_url)
