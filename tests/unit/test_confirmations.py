"""A typed kill's confirmation when its launch ended between the ask and the click."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.adapters.store import Store
from bot.core.lifecycle import KillOutcome, KillPreview
from bot.core.models import Launch, LaunchState, ProcessInfo
from bot.services.confirmations import ConfirmationService, ConfirmedKill, Decision


class _Launches:
    """What ConfirmationService uses of LaunchService: get, kill_preview (these processes), kill (recorded)."""

    def __init__(self, store: Store, leftovers: list[ProcessInfo]):
        self.store, self.leftovers, self.killed = store, leftovers, []

    def get(self, launch_id: int) -> Launch | None:
        return self.store.launches.get(launch_id)

    async def kill_preview(self, la: Launch) -> KillPreview:
        return KillPreview(target=la.name, host=la.host, launch_id=la.id, processes=list(self.leftovers))

    async def kill(self, la: Launch, *, user: str, channel: str | None = None) -> KillOutcome:
        self.killed.append(la.id)
        return KillOutcome(target=la.name, released=True)


def _confirm_after(tmp_path: Path, state: LaunchState, leftovers: list[ProcessInfo]):
    store = Store(f"sqlite:///{tmp_path}/s.db")
    try:
        la = store.launches.create(host="h", variant="base", params={}, command="", log_path=None, port=8000,
                                   gpus=[0], created_by="U1", channel="C1", thread_ts=None, relaunch_of=None,
                                   sealed_secrets=None)
        conf = store.confirmations.add(asked_by="U1", host="h", launch_id=la.id)
        store.launches.update(la.id, state=state, state_detail="crashed in serving")  # it ended meanwhile
        launches = _Launches(store, leftovers)
        got = asyncio.run(ConfirmationService(store.confirmations, launches).confirm(conf.id, user="U2"))
        return got, launches.killed
    finally:
        store.close()


def test_leftovers_of_a_launch_that_ended_meanwhile_are_still_killed(tmp_path):
    got, killed = _confirm_after(tmp_path, LaunchState.FAILED, [ProcessInfo(pid=42, args="python3 -m sglang")])
    assert isinstance(got, ConfirmedKill) and killed == [1]


def test_a_launch_killed_meanwhile_with_nothing_left_is_not_killed_again(tmp_path):
    got, killed = _confirm_after(tmp_path, LaunchState.KILLED, [])
    assert isinstance(got, Decision) and not got.won and killed == []
    assert got.why == "not needed: base#1 already ended (killed) and nothing of it runs"
