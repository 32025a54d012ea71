"""The command journal (bot.services.journal, bot.adapters.store.commands) on a real SQLite database: a command
written ahead by a bot that is gone is answered once by the next leader, according to how far it got; a live bot's
commands and young ones are left alone; a bot taken for gone that wakes up cannot finish what was taken over."""

from __future__ import annotations

import pytest

from bot.adapters.store import Store
from bot.adapters.store.commands import TakenOver
from bot.core.redact import Redactor
from bot.services.audit import Audit
from bot.services.journal import CommandJournal
from tests.support.names import renderer
from tests.support.surfaces import RecordingSurface

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def time(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t


@pytest.fixture
def parts(tmp_path):
    clock = Clock()
    store = Store(f"sqlite:///{tmp_path}/gpubot.db", clock)  # type: ignore[arg-type]
    gone = Audit(store.events, Redactor(), commands=store.commands, owner="old-host:11")
    surface = RecordingSurface()
    alive = {"me:1", "busy-host:7"}

    async def is_alive(owner: str) -> bool:
        return owner in alive

    journal = CommandJournal(store.commands, store.launches, surface, renderer(Redactor()), is_alive,
                             owner="me:1", clock=clock, confirm_s=0.0)  # type: ignore[arg-type]
    yield store, gone, journal, surface, clock
    store.close()


async def _begin(audit: Audit, text: str, channel: str = "C1", thread_ts: str | None = None) -> int:
    command_id = await audit.begin_command(user_id="U1", channel=channel, thread_ts=thread_ts, source="slash",
                                           word=text.split()[0].lstrip("/"), text=text)
    assert command_id is not None
    return command_id


async def test_a_command_cut_off_by_its_bots_death_is_answered_once_and_audited_interrupted(parts):
    store, gone, journal, surface, clock = parts
    command_id = await _begin(gone, "/launch base api_key=sk-live-abcdefabcdefabcdefabcdef")
    [row] = [e for e in store.events.list() if e.action == "command:launch"]
    assert row.result == "running" and "abcdef" not in row.args["text"]  # written ahead, redacted
    clock.t += 0.5
    la = store.launches.create(host="gpu-host-1", variant="base", params={}, command="x", log_path=None, port=None,
                               gpus=[0], created_by="U1", channel="C1")
    clock.t += 10
    assert await journal.recover() == 1
    [post] = surface.posts
    assert post.channel == "C1" and post.thread_ts is None
    assert "cut off" in post.text and "old-host:11" in post.text and f"{la.name} (starting)" in post.text
    assert "abcdef" not in post.text
    [row] = [e for e in store.events.list() if e.action == "command:launch"]
    assert row.result == "interrupted" and "old-host:11" in (row.detail or "")
    assert store.commands.get(command_id).state == "recovered"
    assert await journal.recover() == 0 and len(surface.posts) == 1  # once
    # the bot taken for gone wakes up and finishes: its answer must not go
    assert not gone.finish_command(command_id, user_id="U1", action="command:launch", args={}, result="ok",
                                   detail=None, launch_id=None, channel="C1", expects_answer=True)
    assert [e.result for e in store.events.list() if e.action == "command:launch"] == ["interrupted"]
    with pytest.raises(TakenOver):  # nor can it queue any of it
        store.outbox.add(answer_of=(command_id, "old-host:11"), channel="C1", kind="post", text="Launched")
    assert store.outbox.pending_count("C1") == 0


async def test_a_finished_command_is_settled_quietly_when_answered_and_told_when_its_answer_was_lost(parts):
    store, gone, journal, surface, clock = parts
    answered = await _begin(gone, "/gpu status")
    lost = await _begin(gone, "/kill 3 --yes", thread_ts="1700000000.000100")
    for command_id, result in ((answered, "ok"), (lost, "released")):
        assert gone.finish_command(command_id, user_id="U1", action=f"command:{command_id}", args={"text": "t"},
                                   result=result, detail="3 processes stopped" if result == "released" else None,
                                   launch_id=None, channel="C1", expects_answer=True)
    store.outbox.add(answer_of=(answered, "old-host:11"), channel="C1", kind="post", text="the status")
    assert store.commands.get(answered).state == "answered"
    clock.t += 10
    assert await journal.recover() == 1
    [post] = surface.posts
    assert post.thread_ts == "1700000000.000100" and "Answer lost" in post.text
    assert "released" in post.text and "3 processes stopped" in post.text
    assert (store.commands.get(answered).state, store.commands.get(lost).state) == ("answered", "recovered")


async def test_a_live_bots_commands_and_young_ones_are_left_alone_and_a_placeholder_is_edited(parts):
    store, gone, journal, surface, clock = parts
    busy = Audit(store.events, Redactor(), commands=store.commands, owner="busy-host:7")
    mine = Audit(store.events, Redactor(), commands=store.commands, owner="me:1")
    await _begin(busy, "/launch big")
    await _begin(mine, "/launch mine")
    slow = await _begin(gone, "/probe gpu-host-1")
    placeholder = await surface.post("C1", renderer(Redactor()).error("working", "on it"))
    assert placeholder is not None
    store.commands.set_placeholder(slow, placeholder)
    clock.t += 1  # younger than the grace: its bot may be taking its life lock again
    assert await journal.recover() == 0
    clock.t += 10
    assert await journal.recover() == 1
    assert len(surface.posts) == 1 and "cut off" in surface.posts[0].edits[-1].text  # the placeholder edited
    states = sorted(e.state for e in store.commands.unsettled(not_owner="nobody"))
    assert states == ["running", "running"]  # the live bots' own


async def test_settled_commands_are_purged_after_a_day_and_their_audit_rows_stay(parts):
    store, _gone, journal, _surface, clock = parts
    mine = Audit(store.events, Redactor(), commands=store.commands, owner="me:1")
    old = await _begin(mine, "/gpu status")
    assert mine.finish_command(old, user_id="U1", action="command:status", args={}, result="ok", detail=None,
                               launch_id=None, channel="C1", expects_answer=True)
    store.outbox.add(answer_of=(old, "me:1"), channel="C1", kind="post", text="the status")
    clock.t += 2 * 86400
    assert await journal.recover() == 0
    assert store.commands.get(old) is None
    assert [e.result for e in store.events.list() if e.action == "command:status"] == ["ok"]


async def test_a_private_or_stale_result_is_never_told_publicly_as_lost(parts):
    store, gone, journal, surface, clock = parts
    denied = await _begin(gone, "/kill 3 --yes")
    assert gone.finish_command(denied, user_id="U1", action="command:kill", args={}, result="denied",
                               detail="viewers cannot kill", launch_id=None, channel="C1", expects_answer=True)
    old = await _begin(gone, "/probe gpu-host-1")  # begun two hours ago: its answer may have gone straight out
    clock.t += 2 * 3600
    fresh = await _begin(gone, "/launch base")
    clock.t += 10
    assert await journal.recover() == 1  # the private and the stale ones are settled without a word
    assert [store.commands.get(i).state for i in (denied, old, fresh)] == ["recovered"] * 3
    [post] = surface.posts
    assert "/launch base" in post.text and "/kill" not in post.text and "/probe" not in post.text


async def test_a_bot_seen_gone_once_is_not_taken_over_before_it_stays_gone(tmp_path):
    clock = Clock()
    store = Store(f"sqlite:///{tmp_path}/g.db", clock)  # type: ignore[arg-type]
    gone = Audit(store.events, Redactor(), commands=store.commands, owner="restarting:4")
    looks: list[str] = []

    async def is_alive(owner: str) -> bool:
        looks.append(owner)
        return len(looks) == 2  # free at the first look, held again at the second (its session came back)

    journal = CommandJournal(store.commands, store.launches, RecordingSurface(), renderer(Redactor()), is_alive,
                             owner="me:1", clock=clock, confirm_s=0.0)  # type: ignore[arg-type]
    journal.confirm_s = 3600.0
    try:
        await _begin(gone, "/gpu status")
        clock.t += 10
        assert await journal.recover() == 0  # free once: not yet gone
        assert await journal.recover() == 0  # held again
        assert [e.state for e in store.commands.unsettled(not_owner="me:1")] == ["running"]
        journal.confirm_s = 0.0
        assert await journal.recover() == 1  # free again, and (confirm 0) gone for good
    finally:
        store.close()
