"""How long does a `/gpu status` answer take when the bot's database refuses writes? Prints figures and
ratios; asserts nothing.

The real Bolt app over Socket Mode against the local fake Slack, a real SSH server on loopback with the
replaying fake nvidia-smi, and the bot's real SQLite database, in three conditions:
  A. a healthy database (the answer goes through the outbox table);
  B. another connection holds the database's write lock for LOCK_S seconds (15 by default), taken right before
     the command: the outbox row waits out SQLite's busy timeout, then the answer goes straight to Slack;
  C. a full database (a page limit on the bot's connections after the free pages are used up).
For each: seconds from the slash command to the answer at fake Slack, and whether it came while the fault held.

Run: .venv/bin/python -m benchmarks.answer_under_db_faults [--rounds N] [--lock-s S]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from sqlalchemy import event

from bot.config import Config
from bot.demo.fakegpu import install_fake_gpu
from tests.support.builders import ssh_host
from tests.support.fakes.ssh_server import LoopbackSSHServer
from tests.support.slack import start_stack, text_of


async def _answer_s(stack, text: str = "status") -> float:
    t0 = time.monotonic()
    await stack.fake.push_slash_command("/gpu", text, user_id="U1", channel_id="C1")
    await stack.fake.wait_for_answer(lambda c: text_of(c).startswith("GPU status") and c["time"] >= t0, timeout=120)
    return time.monotonic() - t0


def _fill(path: str) -> sqlite3.Connection:
    """Fill the database's pages to a page limit (see tests/e2e/test_database_faults.py); returns the
    connection (close it to end the fault; the filler rows stay, done and never sent)."""
    c = sqlite3.connect(path, isolation_level=None)
    c.execute(f"PRAGMA max_page_count={c.execute('PRAGMA page_count').fetchone()[0] + 2}")
    for size in (8000, 2000, 500, 100, 20):
        with contextlib.suppress(sqlite3.OperationalError):
            while True:
                c.execute("INSERT INTO outbox (channel, kind, text, key, state, attempts, next_at, created_at, "
                          "needs_lookup) VALUES ('Cfill', 'post', ?, 'k', 'sent', 0, 0, 0, 0)", ("x" * size,))
    return c


async def main(rounds: int, lock_s: float) -> None:
    with tempfile.TemporaryDirectory(prefix="gpubot-bench-") as tmp:
        gpu = install_fake_gpu(Path(tmp) / "fakegpu", gpu_count=1)
        env = {"PATH": f"{gpu.bin_dir}:/usr/bin:/bin"}
        async with LoopbackSSHServer(Path(tmp) / "ssh", env=env) as srv:
            stack = await start_stack(Config(hosts={"gpu-host-1": ssh_host(srv)}, default_host="gpu-host-1"))
            try:
                await _answer_s(stack)  # warm: SSH connection, templates
                healthy = [await _answer_s(stack) for _ in range(rounds)]
                locked, held = [], []
                for _ in range(rounds):
                    holder = sqlite3.connect(stack.runtime.store.db.path, timeout=0, isolation_level=None)
                    holder.execute("BEGIN IMMEDIATE")
                    t_lock = time.monotonic()
                    locked.append(await _answer_s(stack))
                    held.append(time.monotonic() - t_lock < lock_s)
                    await asyncio.sleep(max(0.0, lock_s - (time.monotonic() - t_lock)))
                    holder.rollback()
                    holder.close()
                    await stack.settled()
                db = stack.runtime.store.db
                filler = _fill(db.path)
                pages = filler.execute("PRAGMA max_page_count").fetchone()[0]

                def cap(dbapi_conn, _record):
                    dbapi_conn.execute(f"PRAGMA max_page_count={pages}")

                event.listen(db.engine, "connect", cap)
                db.engine.dispose()
                full = [await _answer_s(stack) for _ in range(rounds)]
                event.remove(db.engine, "connect", cap)
                db.engine.dispose()
                filler.close()
            finally:
                await stack.stop()
    med = statistics.median
    print(f"/gpu status answer, median of {rounds} (seconds from the slash command to the answer at Slack):")
    print(f"  A. healthy database         {med(healthy):6.2f} s")
    print(f"  B. write lock held {lock_s:.0f} s     {med(locked):6.2f} s   ratio B/A {med(locked) / med(healthy):5.1f}"
          f"   answered while the lock held: {sum(held)}/{rounds}")
    print(f"  C. database full            {med(full):6.2f} s   ratio C/A {med(full) / med(healthy):5.1f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lock-s", type=float, default=15.0)
    a = p.parse_args()
    asyncio.run(main(a.rounds, a.lock_s))
