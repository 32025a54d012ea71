"""Answers survive database faults: a write lock held far past the busy timeout by another process's
connection, and a full database (SQLite's own `database or disk is full`, from a page limit on the bot's
connections after the free pages are used up). The real Bolt app over Socket Mode, the real outbox and SQLite;
the fault is real SQLite behaviour, not a stub."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3

import pytest
from sqlalchemy import event

from tests.support.procs import wait_until
from tests.support.slack import text_of

pytestmark = pytest.mark.timeout(120)


def _write_lock(path: str) -> sqlite3.Connection:
    """Another connection holding the database's write lock (BEGIN IMMEDIATE) until it is rolled back."""
    holder = sqlite3.connect(path, timeout=0, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    return holder


def _directly_sent(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "sending it straight to Slack" in r.getMessage()]


async def test_a_write_lock_held_past_the_busy_timeout_loses_no_answer_and_the_audit_row_follows(slack, caplog):
    caplog.set_level(logging.INFO)
    holder = _write_lock(slack.runtime.store.db.path)
    try:
        env = await slack.fake.push_slash_command("/gpu", "status", user_id="U1", channel_id="C1")
        await slack.fake.wait_for_ack(env, 20)
        call = await slack.fake.wait_for_answer(lambda c: text_of(c).startswith("GPU status"), timeout=60)
        assert holder.in_transaction  # delivered while the lock was still held
        assert call["params"]["channel"] == "C1"
        assert _directly_sent(caplog), "the answer should have gone around the locked outbox"
        assert not [e for e in slack.runtime.audit.events() if e.action == "command:status"]  # not yet
    finally:
        holder.rollback()
        holder.close()
    # the audit row was not dropped: written again, with backoff, once the lock is gone
    await wait_until(lambda: [e for e in slack.runtime.audit.events() if e.action == "command:status"], 60,
                     what="the audit row of /gpu status")
    # and the bot goes on queueing normally
    env = await slack.fake.push_slash_command("/gpu", "help", user_id="U1", channel_id="C1")
    await slack.settled(env)
    assert slack.runtime.store.outbox.pending_count() == 0


async def test_a_full_database_loses_no_answer(slack, caplog):
    caplog.set_level(logging.INFO)
    db = slack.runtime.store.db
    filler = sqlite3.connect(db.path, isolation_level=None)
    try:
        # cap the database at its size, then fill the room left in its pages with done (never sent) outbox rows
        # of shrinking size until SQLite says full: any row the bot writes now needs a page more
        pages = filler.execute("PRAGMA page_count").fetchone()[0] + 2
        filler.execute(f"PRAGMA max_page_count={pages}")
        for size in (8000, 2000, 500, 100, 20):
            with contextlib.suppress(sqlite3.OperationalError):
                while True:
                    filler.execute("INSERT INTO outbox (channel, kind, text, key, state, attempts, next_at, "
                                   "created_at, needs_lookup) VALUES ('Cfill', 'post', ?, 'k', 'sent', 0, 0, 0, 0)",
                                   ("x" * size,))
        with pytest.raises(sqlite3.OperationalError, match="full"):
            filler.execute("INSERT INTO outbox (channel, kind, text, key, state, attempts, next_at, created_at, "
                           "needs_lookup) VALUES ('Cfill', 'post', ?, 'k', 'sent', 0, 0, 0, 0)", ("x" * 200,))

        def cap(dbapi_conn, _record):
            dbapi_conn.execute(f"PRAGMA max_page_count={pages}")

        event.listen(db.engine, "connect", cap)
        db.engine.dispose()  # every connection from now on is capped
        env = await slack.fake.push_slash_command("/gpu", "status", user_id="U1", channel_id="C1")
        await slack.fake.wait_for_ack(env, 20)
        call = await slack.fake.wait_for_answer(lambda c: text_of(c).startswith("GPU status"), timeout=60)
        assert call["params"]["channel"] == "C1"
        assert _directly_sent(caplog), "the outbox write should have failed with a full database"
        assert any("full" in r.getMessage() for r in caplog.records)
    finally:
        event.remove(db.engine, "connect", cap)
        db.engine.dispose()
        filler.close()


async def test_a_database_that_cannot_be_read_any_more_still_answers_a_thread_command(slack, caplog):
    """The file is overwritten while the bot runs (a corrupted database): a command typed in a thread (which looks
    up the thread's launch) is still answered in that thread."""
    import shutil

    db = slack.runtime.store.db
    db.engine.dispose()
    with sqlite3.connect(db.path) as c:  # everything into the main file, so that it alone can be put back
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    backup = db.path + ".bak"
    shutil.copyfile(db.path, backup)
    try:
        with open(db.path, "r+b") as f:
            f.write(b"\xff" * 4096)  # the header page: "file is not a database" for every new connection
        db.engine.dispose()
        await slack.fake.push_event({"type": "message", "channel": "C1", "user": "U2", "ts": "1700000100.000300",
                                     "thread_ts": "1700000000.000100", "text": "!gpu help"})
        call = await slack.fake.wait_for_answer(lambda c: "help" in text_of(c).lower() or "unavailable" in text_of(c),
                                                timeout=60)
        assert call["params"].get("thread_ts") == "1700000000.000100"
    finally:
        db.engine.dispose()
        for extra in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(db.path + extra)
        shutil.copyfile(backup, db.path)
