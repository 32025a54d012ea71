"""Decisions taken once across bots (issue 26): the `deliveries` table decides which bot of a database acts on a
Slack delivery, on SQLite and on PostgreSQL, including two bots claiming the same delivery at the same moment; an
outbox row another bot is sending is taken back only once its claim is stale."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from bot.adapters.store import Store
from bot.adapters.store.deliveries import KEEP_S
from tests.support.clock import ManualClock

pytestmark = pytest.mark.timeout(120)


def test_a_delivery_is_claimed_once_until_its_claim_expires(db_url):
    clock = ManualClock()
    store = Store(db_url, clock)
    try:
        assert store.deliveries.claim("cmd:1.2.3") is True
        assert store.deliveries.claim("cmd:1.2.3") is False  # Slack's retry
        assert store.deliveries.claim("cmd:4.5.6") is True  # another delivery
        assert store.deliveries.claim("click:a", ttl_s=3.0) is True
        clock.advance(1.0)
        assert store.deliveries.claim("click:a", ttl_s=3.0) is False  # a double click
        clock.advance(3.0)
        assert store.deliveries.claim("click:a", ttl_s=3.0) is True  # a click seconds later is a new one
        assert store.deliveries.claim("cmd:1.2.3") is False  # the hour has not passed
        clock.advance(KEEP_S + 1)
        assert store.deliveries.prune() == 3
        assert store.deliveries.claim("cmd:1.2.3") is True
        assert store.deliveries.claim("x" * 500) is True and store.deliveries.claim("x" * 300) is False  # cut to 200
    finally:
        store.close()


def test_two_bots_claiming_the_same_deliveries_at_once_take_each_exactly_once(db_url):
    bots = [Store(db_url), Store(db_url)]
    keys = [f"act:{i}" for i in range(60)]
    start = threading.Barrier(2)
    try:
        def claim_all(store: Store) -> list[str]:
            start.wait()
            return [k for k in keys if store.deliveries.claim(k)]

        with ThreadPoolExecutor(2) as pool:
            won = list(pool.map(claim_all, bots))
        assert sorted(won[0] + won[1]) == sorted(keys)  # every delivery acted on, none twice
    finally:
        for s in bots:
            s.close()


def test_a_row_another_bot_is_sending_is_not_taken_back_until_its_claim_is_stale(db_url):
    """A new leader finds a row `sending`: it is left to the bot that claimed it (which may still be sending it to
    Slack) until STALE_CLAIM_S after the claim; that bot's late result never overwrites what the new sender wrote."""
    from bot.services.outbox import STALE_CLAIM_S

    clock = ManualClock()
    a, b = Store(db_url, clock), Store(db_url, clock)
    try:
        row = a.outbox.add(channel="C1", kind="post", text="deploy answer")
        assert a.outbox.claim(row) is not None  # bot a sends it...
        clock.advance(STALE_CLAIM_S - 5)
        assert b.outbox.requeue_interrupted(claimed_before=clock.time() - STALE_CLAIM_S) == 0  # ...b leaves it
        clock.advance(10)
        assert b.outbox.requeue_interrupted(claimed_before=clock.time() - STALE_CLAIM_S) == 1  # abandoned: taken
        assert b.outbox.get(row).state == "pending" and b.outbox.get(row).needs_lookup  # looked up before a resend
        assert b.outbox.claim(row) is not None
        assert b.outbox.set(row, only_if="sending", state="sent", result_ts="1.2") is True
        assert a.outbox.set(row, only_if="sending", state="pending", error="interrupted") is False  # a, late
        assert a.outbox.get(row).state == "sent"
    finally:
        a.close()
        b.close()
