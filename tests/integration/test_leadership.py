"""Two bots on one PostgreSQL database (issue 26): one leads (sends the outbox, runs the checks), the other follows
and takes over when the leader goes; decisions that must happen once are made in the database (the outbox row's
claim, a host's launch decision, a launch's kill, the alert state)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa

from bot.adapters.leader import LEADER_KEY, AdvisoryLeader, SoleLeader, leadership_for
from bot.adapters.locks import DecisionLocks, LockTimeout
from bot.adapters.store import Store
from bot.present.render import Message
from bot.wiring import build_runtime
from tests.integration.test_outbox import FakeTransport
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(120)


class Hooks:
    """Records a leadership's gains and losses."""

    def __init__(self) -> None:
        self.events: list[str] = []

    async def gain(self) -> None:
        self.events.append("gain")

    async def lose(self) -> None:
        self.events.append("lose")


def backend_pid(leader: AdvisoryLeader) -> int:
    assert leader._conn is not None
    return int(leader._conn.exec_driver_sql("SELECT pg_backend_pid()").scalar())


def terminate_backend(url: str, pid: int) -> None:
    """End one PostgreSQL session from the server side, as the death of its process would."""
    engine = sa.create_engine(url)
    with engine.connect() as c:
        assert c.exec_driver_sql(f"SELECT pg_terminate_backend({pid})").scalar()
    engine.dispose()


def counting(leader: AdvisoryLeader) -> list[int]:
    """Count the leader's tries to take the lock (in the returned list's one item)."""
    tries = [0]
    take = leader._try_acquire

    def counted() -> bool:
        tries[0] += 1
        return take()

    leader._try_acquire = counted  # type: ignore[method-assign]
    return tries


@contextlib.asynccontextmanager
async def running(leader, hooks: Hooks):
    task = asyncio.ensure_future(leader.run(hooks.gain, hooks.lose))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_sqlite_has_a_sole_leader_and_postgresql_an_advisory_one(tmp_path, pg_url):
    assert isinstance(leadership_for(sa.create_engine(f"sqlite:///{tmp_path}/x.db")), SoleLeader)
    assert isinstance(leadership_for(sa.create_engine(pg_url)), AdvisoryLeader)


async def test_one_of_two_leads_and_the_other_takes_over_when_its_session_ends(pg_url):
    a = AdvisoryLeader(sa.create_engine(pg_url), heartbeat_s=0.1)
    b = AdvisoryLeader(sa.create_engine(pg_url), heartbeat_s=0.1)
    tries = counting(b)
    ha, hb = Hooks(), Hooks()
    async with running(a, ha):
        await wait_until(lambda: a.leading, 30, what="a leading")
        async with running(b, hb):
            await wait_until(lambda: tries[0] >= 5, 30, what="b trying five times")
            assert a.leading and not b.leading and hb.events == []
            terminate_backend(pg_url, backend_pid(a))  # a's process "died": the server lets go of its lock
            t0 = time.monotonic()
            await wait_until(lambda: b.leading, 30, what="b taking over")
            took = time.monotonic() - t0
            await wait_until(lambda: "lose" in ha.events, 30, what="a stepping down")
            print(f"takeover after the leader's session ended: {took:.2f} s (heartbeat 0.1 s)")
            assert hb.events == ["gain"] and ha.events[:2] == ["gain", "lose"]
            assert not (a.leading and b.leading)


async def test_a_sigkilled_leader_process_is_replaced_within_a_few_seconds(pg_url):
    code = ("import asyncio, sqlalchemy as sa, sys\n"
            "from bot.adapters.leader import AdvisoryLeader\n"
            "async def main():\n"
            "    a = AdvisoryLeader(sa.create_engine(sys.argv[1]), heartbeat_s=0.2)\n"
            "    async def gain(): print('leading', flush=True)\n"
            "    async def lose(): pass\n"
            "    await a.run(gain, lose)\n"
            "asyncio.run(main())\n")
    proc = subprocess.Popen([sys.executable, "-c", code, pg_url], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        assert (await asyncio.to_thread(proc.stdout.readline)).strip() == "leading"
        b = AdvisoryLeader(sa.create_engine(pg_url), heartbeat_s=0.2)
        tries, hb = counting(b), Hooks()
        async with running(b, hb):
            await wait_until(lambda: tries[0] >= 2, 30, what="the follower trying twice")
            assert not b.leading
            os.kill(proc.pid, signal.SIGKILL)
            t0 = time.monotonic()
            await wait_until(lambda: b.leading, 30, what="the follower taking over")
            print(f"takeover after SIGKILL of the leader process: {time.monotonic() - t0:.2f} s")
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(10)


async def test_a_frozen_leader_loses_the_lead_within_its_lease_and_steps_down_when_it_wakes(pg_url):
    """A leader process stopped with SIGSTOP keeps its database session (and the advisory lock) alive: the follower
    finds its lease expired, ends that session and leads within the lease plus a few heartbeats; the leader, woken
    with SIGCONT, finds its lease gone and steps down, and never leads again while the other does."""
    Store(pg_url).db.engine.dispose()  # the schema, with the lease table
    lease_s = 2.0
    code = ("import asyncio, sqlalchemy as sa, sys\n"
            "from bot.adapters.leader import AdvisoryLeader\n"
            "async def main():\n"
            "    a = AdvisoryLeader(sa.create_engine(sys.argv[1]), heartbeat_s=0.2, lease_s=float(sys.argv[2]))\n"
            "    async def gain(): print('leading', flush=True)\n"
            "    async def lose(): print('lost', flush=True)\n"
            "    await a.run(gain, lose)\n"
            "asyncio.run(main())\n")
    proc = subprocess.Popen([sys.executable, "-c", code, pg_url, str(lease_s)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    said: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            said.append(line.strip())

    reader = asyncio.ensure_future(asyncio.to_thread(read))
    try:
        await wait_until(lambda: said == ["leading"], 30, what="the process leading")
        b = AdvisoryLeader(sa.create_engine(pg_url), heartbeat_s=0.2, lease_s=lease_s)
        assert b.lease_table
        hb = Hooks()
        async with running(b, hb):
            await asyncio.sleep(lease_s + 1.0)  # a live leader renews: its lease never expires
            assert not b.leading and b.sessions_ended == 0
            os.kill(proc.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            await wait_until(lambda: b.leading, 60, what="the follower taking over from the frozen leader")
            took = time.monotonic() - t0
            print(f"takeover after SIGSTOP of the leader: {took:.2f} s (lease {lease_s} s, heartbeat 0.2 s)")
            assert b.sessions_ended == 1
            os.kill(proc.pid, signal.SIGCONT)
            await wait_until(lambda: said[-1:] == ["lost"], 60, what="the woken leader stepping down")
            await asyncio.sleep(1.0)  # a few of its heartbeats: it tries the lock again and does not get it
            assert said == ["leading", "lost"] and b.leading and hb.events == ["gain"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(10)
        await reader


def test_an_expired_lease_naming_a_session_that_does_not_hold_the_lock_ends_no_session(pg_url):
    """A stale lease row (its session gone, its pid now another session's) while the lock is held by a bot that
    writes no lease (an older release): the follower ends no session, and does not lead."""
    Store(pg_url).db.engine.dispose()
    engine = sa.create_engine(pg_url)
    with engine.connect() as holder, engine.connect() as bystander:
        holder = holder.execution_options(isolation_level="AUTOCOMMIT")
        bystander = bystander.execution_options(isolation_level="AUTOCOMMIT")
        assert holder.exec_driver_sql(f"SELECT pg_try_advisory_lock({LEADER_KEY})").scalar()
        pid = int(bystander.exec_driver_sql("SELECT pg_backend_pid()").scalar())
        bystander.exec_driver_sql(
            "INSERT INTO leader_lease (name, holder, backend_pid, expires_at) "
            f"VALUES ('leader', 'gone:1', {pid}, extract(epoch from clock_timestamp()) - 60)")
        follower = AdvisoryLeader(sa.create_engine(pg_url))
        assert follower._try_acquire() is False and follower.sessions_ended == 0
        assert bystander.exec_driver_sql("SELECT 1").scalar() == 1  # its session lives
        # the lock holder's own session named in an expired row: that one is ended (a frozen leader)
        mine = int(holder.exec_driver_sql("SELECT pg_backend_pid()").scalar())
        bystander.exec_driver_sql(f"UPDATE leader_lease SET backend_pid = {mine}")
        assert follower._try_acquire() is False and follower.sessions_ended == 1
        follower._drop()
    engine.dispose()


async def test_decision_locks_are_shared_by_two_bots(pg_url):
    one, two = DecisionLocks(sa.create_engine(pg_url)), DecisionLocks(sa.create_engine(pg_url), timeout_s=0.5)
    assert one.shared and two.shared
    async with one.host("gpu-host-1"):
        assert not await two.host_free("gpu-host-1") and await two.host_free("gpu-host-2")
        with pytest.raises(LockTimeout, match="another bot holds the decision on gpu-host-1"):
            async with two.host("gpu-host-1"):
                pass
    assert await two.host_free("gpu-host-1")
    async with two.host("gpu-host-1"):  # free again: taken at once
        pass
    async with one.kill(7):
        with pytest.raises(LockTimeout):
            async with two.kill(7, wait_s=0):
                pass
        async with two.kill(8, wait_s=0):  # another launch's kill is another lock
            pass
    assert await two.kill_free(7)


def test_of_two_senders_only_one_claims_a_row(pg_url):
    a, b = Store(pg_url), Store(pg_url)
    try:
        ids = [a.outbox.add(channel="C1", kind="post", text=f"m{i}") for i in range(20)]
        claims = [(a.outbox.claim(i), b.outbox.claim(i)) for i in ids]
        assert all((x is None) != (y is None) for x, y in claims)
        assert all(b.outbox.claim(i) is None and a.outbox.claim(i) is None for i in ids)
    finally:
        a.close()
        b.close()


def test_a_launch_state_change_is_compared_and_set(pg_url):
    a, b = Store(pg_url), Store(pg_url)
    try:
        la = a.launches.create(host="h", variant="v", params={}, command="c", log_path=None, port=None, gpus=[0],
                               created_by="U1")
        assert b.launches.get(la.id).state.value == "starting"  # no stale copy: another bot wrote it
        assert a.launches.update_if(la.id, {"state": "starting"}, state="running") is not None
        assert b.launches.update_if(la.id, {"state": "starting"}, state="failed") is None  # lost the race
        assert b.launches.get(la.id).state.value == "running"
        assert b.launches.update_if(la.id, {"alert_state": None}, alert_state="ready").alert_state == "ready"
        assert a.launches.update_if(la.id, {"alert_state": None}, alert_state="ready") is None
    finally:
        a.close()
        b.close()


async def test_two_bots_send_every_message_once_across_a_handover_paced_per_channel(gpu_config, pg_url):
    config = gpu_config.model_copy(update={"slack": gpu_config.slack.model_copy(update={"post_interval_s": 0.2})})
    slack = FakeTransport()
    bots = [build_runtime(config, transport=slack, store=Store(pg_url)) for _ in range(2)]
    first, second = bots
    try:
        await first.start(watch=False)
        await wait_until(lambda: first.leading, 30, what="the first bot leading")
        await second.start(watch=False)
        for i in range(10):
            second.outbox.post("C1", Message(text=f"from the follower {i}"))
            first.outbox.post("C2", Message(text=f"from the leader {i}"))
        await wait_until(lambda: len(slack.posted()) >= 10, 60, what="ten messages sent")
        assert not second.leading and not second.outbox.sending
        first.leadership._drop()  # the leader's session ends (as a killed process's would) ...
        await first._follow()  # ... and it stops on its next heartbeat
        for i in range(10, 20):
            second.outbox.post("C1", Message(text=f"from the follower {i}"))
        await wait_until(lambda: second.leading, 30, what="the second bot taking over")
        await wait_until(lambda: len(slack.posted()) >= 30, 60, what="every message sent")
        texts = [m["text"] for m in slack.posted()]
        assert sorted(texts) == sorted({*(f"from the follower {i}" for i in range(20)),
                                        *(f"from the leader {i}" for i in range(10))})  # each once
        assert [t for t in texts if "follower" in t] == [f"from the follower {i}" for i in range(20)]  # in order
        for channel in ("C1", "C2"):
            at = [c.at for c in slack.calls_for("post", channel)]
            gaps = [b - a for a, b in itertools.pairwise(at)]
            assert min(gaps) >= 0.2 - 0.02, (channel, gaps)  # the pacing held across the handover
    finally:
        for rt in bots:
            await rt.close(flush_s=0)


async def test_two_launches_of_the_same_gpus_through_two_bots_one_is_refused_naming_the_other(gpu_config, pg_url):
    from bot.wiring import build_runtime
    from tests.support.procs import kill_launches

    slack = FakeTransport()
    bots = [build_runtime(gpu_config, transport=slack, store=Store(pg_url), start_check_s=0.3) for _ in range(2)]
    try:
        for rt in bots:
            await rt.start(watch=False)
        outcomes = await asyncio.gather(*(rt.launches.launch("base", {}, user="U0OPERATOR", channel="C1")
                                          for rt in bots))
        started = [o for o in outcomes if o.launch is not None]
        refused = [o for o in outcomes if o.launch is None]
        assert len(started) == 1 and len(refused) == 1, outcomes
        name = started[0].launch.name
        problems = "; ".join(refused[0].checks.problems) if refused[0].checks else (refused[0].error or "")
        assert name in problems, problems  # the refusal names the launch that got the GPUs
    finally:
        for rt in bots:
            await rt.close(flush_s=0)
        seen = Store(pg_url)
        kill_launches(seen.launches.recent(50))
        seen.close()


async def test_a_follower_keeps_watching_the_launches_when_the_leader_goes(gpu_config, pg_url):
    from tests.support.procs import kill_launches

    config = gpu_config.model_copy(update={"watch": gpu_config.watch.model_copy(update={"interval_s": 0.3,
                                                                                       "serving_interval_s": 0.3})})
    slack = FakeTransport()
    leader, follower = (build_runtime(config, transport=slack, store=Store(pg_url), start_check_s=0.3)
                        for _ in range(2))
    store = Store(pg_url)
    try:
        await leader.start()
        await wait_until(lambda: leader.leading, 30, what="the first bot leading")
        await follower.start()
        out = await follower.launches.launch("base", {}, user="U0OPERATOR", channel="C1")  # the follower launches
        la = out.launch
        assert la is not None, out
        checks = lambda: len(store.observations.list(la.id))  # noqa: E731
        await wait_until(lambda: checks() >= 3, 60, what="the leader checking the follower's launch")
        assert not follower.watcher.scheduler.is_watched(la.id)  # only the leader checks
        leader.leadership._drop()
        await leader._follow()
        seen = checks()
        await wait_until(lambda: follower.leading, 30, what="the follower taking over")
        await wait_until(lambda: checks() >= seen + 3, 60, what="checks going on after the handover")
        ready = [m["text"] for m in slack.posted() if "ready" in m["text"] and la.name in m["text"]]
        assert len([t for t in ready if t.startswith(f"{la.name} on")]) <= 1, ready  # one alert per change
    finally:
        for rt in (leader, follower):
            await rt.close(flush_s=0)
        kill_launches(store.launches.recent(50))
        store.close()


@pytest.mark.parametrize("answer", ["no", "an error"])
async def test_a_cancel_that_comes_with_the_database_s_answer_still_stops_the_leader(monkeypatch, answer):
    # Python 3.11's asyncio.wait_for returns the answer that came in the same turn as a cancel, and the cancel is
    # lost (python/cpython#86296): here every step does that, so only the leader's own check can stop its loop
    entered = asyncio.Event()

    async def answer_despite_cancel(aw, timeout):
        fut = asyncio.ensure_future(aw)
        entered.set()
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            return await fut

    real_wait_for = asyncio.wait_for
    monkeypatch.setattr("bot.adapters.leader.asyncio.wait_for", answer_despite_cancel)  # asyncio's own, for the test
    leader = AdvisoryLeader(sa.create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none"), heartbeat_s=0.01)
    tries = [0]

    def try_acquire() -> bool:
        tries[0] += 1
        time.sleep(0.05)  # the database's answer, in the step's thread
        if answer == "an error":
            raise OSError("connection refused")
        return False

    leader._try_acquire = try_acquire  # type: ignore[method-assign]
    task = asyncio.ensure_future(leader.run(Hooks().gain, Hooks().lose))
    await wait_until(lambda: tries[0] >= 2, 30, what="the follower to try twice")
    entered.clear()
    await entered.wait()  # the leader's task waits in a step now
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await real_wait_for(asyncio.shield(task), 10)
    assert task.done() and not leader.leading
