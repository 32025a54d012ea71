"""The edges of a Slurm job's life in its checks (bot/services/watch_spans.py `_job_side`, `_job_requeued`,
`_rank_not_alive`, `_rank_hosts`) and of a Slurm kill (bot/services/runners/slurm.py, bot/core/lifecycle.py `kill_end`),
found by an adversarial review: on a Watcher built without its services (fakes for its rows, Slurm and notices
only: the logic under test is the real one)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

from bot.core.models import Launch, LaunchState
from bot.core.ranks import NodeLook
from bot.core.slurm import SlurmJob
from bot.services.watch import Watcher
from tests.support.builders import launch_row


class Rows:
    def __init__(self, la: Launch) -> None:
        self.la = la
        self.writes: list[dict] = []

    def get(self, _id: int) -> Launch:
        return self.la

    def update(self, _id: int, **fields) -> Launch:
        self.writes.append(fields)
        self.la = replace(self.la, **fields)
        return self.la

    def update_if(self, _id: int, expect: dict, **fields) -> Launch | None:
        if any(getattr(self.la, k) != v for k, v in expect.items()):
            return None
        return self.update(_id, **fields)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def time(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t


def watcher(la: Launch, jobs: list[SlurmJob]) -> tuple[Watcher, Rows, list[str], list[int]]:
    """A Watcher whose Slurm answers `jobs` in turn (the last one again once they run out)."""
    w = Watcher.__new__(Watcher)
    rows = Rows(la)
    notices: list[str] = []
    calls: list[int] = []

    async def job(_la, max_age_s: float = 0.0):
        calls.append(1)
        return jobs.pop(0) if len(jobs) > 1 else jobs[0]

    async def node_states(_nodes):
        return {}

    async def show(*_a, **_k):
        return None

    async def notice(_la, icon, text, hint):
        notices.append(f"{icon} {text} | {hint}")

    w._launch_rows = rows
    w._clock = Clock()
    w._history = SimpleNamespace(add=lambda *a: None)
    w.launches = SimpleNamespace(slurm=SimpleNamespace(job=job, slurm=lambda h: SimpleNamespace(
        node_states=node_states)), config=SimpleNamespace(hosts={}))
    w._threads = SimpleNamespace(show=show)
    w._notice = notice
    w._interval = lambda la: 5.0
    w.watch = lambda la, **k: None
    w._cheap, w._memos, w._busy, w._rank_hosts_down, w._unrecorded, w._gone_waited = {}, {}, {}, {}, {}, {}
    w._gone_failures = {}
    w.ending_wait_s, w.ending_poll_s = 0.0, 0.0
    return w, rows, notices, calls


def slurm_job(state: str, restarts: int | None, nodes: tuple[str, ...] = ("n1", "n2")) -> SlurmJob:
    return SlurmJob(job_id="12", state=state, nodes=nodes if state != "PENDING" else (), restarts=restarts)


def running_launch(**kw) -> Launch:
    fields = dict(job_id="12", nodes=["n1", "n2"], host="login", ready_at=900.0, alert_state="ready",
                  pid=None, pgid=None, sid=None)
    return launch_row(**{**fields, **kw})


def test_a_restart_count_that_goes_down_is_never_stored_and_a_requeue_is_told_once():
    """A stale squeue answer (another bot's board, or Slurm's own count going down) never lowers job_restarts: the
    next read of the true count is no new requeue."""
    la = running_launch(job_restarts=0)
    jobs = [slurm_job("RUNNING", 1, ("n3", "n4")),   # requeued (and already running again)
            slurm_job("RUNNING", 0),                   # a stale answer: the count as it was
            slurm_job("RUNNING", 1, ("n3", "n4"))]     # the true count again
    w, rows, notices, _ = watcher(la, jobs)

    async def go():
        out = []
        for _ in range(3):
            _la, _job, done = await w._job_side(rows.la, [])
            out.append(done)
        return out

    asyncio.run(go())
    requeues = [n for n in notices if n.startswith(":repeat:")]
    assert len(requeues) == 1, notices
    assert {"job_restarts": 0} not in rows.writes and rows.la.job_restarts == 1


def test_completing_after_a_requeue_is_not_running_again_and_its_dying_ranks_are_not_judged():
    """Right after `scontrol requeue` squeue says COMPLETING with the restart count grown and the old NodeList (seen
    on Slurm 22.05 here): the requeue is told; at the next check the job is still COMPLETING on the old nodes: that
    is its old run ending, shown as the job's state, never 'running again', and no rank is judged."""
    la = running_launch(job_restarts=0)
    jobs = [slurm_job("COMPLETING", 1), slurm_job("COMPLETING", 1)]
    w, rows, notices, _ = watcher(la, jobs)

    async def go():
        first = await w._job_side(rows.la, [])
        second = await w._job_side(rows.la, [])
        return first, second

    first, second = asyncio.run(go())
    assert first[2] is not None  # the requeue decided the first check
    assert second[2] is not None, "the second check must not probe the ranks of a job Slurm is still ending"
    assert not any("again (after" in n for n in notices), notices
    assert rows.la.ready_at is None and rows.la.nodes == [] and "COMPLETING" in (rows.la.state_detail or "")
    assert len([n for n in notices if "waits in" in n or n.startswith(":repeat:")]) == 1, notices


def test_a_requeue_before_the_first_read_is_told():
    """A job just submitted is recorded with no requeue (job_restarts 0, runners/slurm.py): a job requeued before
    the first check that reads it is told; a launch of an older release (None) is recorded quietly."""
    la = running_launch(job_restarts=0, ready_at=None, alert_state=None, nodes=[])
    w, rows, notices, _ = watcher(la, [slurm_job("PENDING", 1)])
    asyncio.run(w._job_side(rows.la, []))
    assert rows.la.job_restarts == 1 and [n for n in notices if n.startswith(":repeat:")], notices
    old = running_launch(job_restarts=None, ready_at=None, alert_state=None)
    w, rows, notices, _ = watcher(old, [slurm_job("RUNNING", 1, ("n1", "n2"))])
    asyncio.run(w._job_side(rows.la, []))
    assert rows.la.job_restarts == 1 and not [n for n in notices if n.startswith(":repeat:")], notices


def test_rank_host_down_state_is_forgotten_at_a_requeue():
    """A rank's host told unreachable is forgotten at a requeue (the job's next run has nodes of its own)."""
    la = running_launch(job_restarts=0)
    w, rows, notices, _ = watcher(la, [slurm_job("PENDING", 1)])
    ranks = [(0, "n1", "n1"), (1, "n2", "n2")]
    down = [NodeLook(0, "n1", True), NodeLook(1, "n2", None, error="ssh: timed out")]

    async def go():
        await w._rank_hosts(rows.la, ranks, down)
        await w._rank_hosts(rows.la, ranks, down)
        await w._job_side(rows.la, [])  # requeued
    asyncio.run(go())
    assert any("n2 (rank 1" in n and "cannot be reached" in n for n in notices)
    assert any(n.startswith(":repeat:") for n in notices)
    assert la.id not in w._rank_hosts_down


def test_a_rank_gone_waits_for_slurm_once_not_at_every_check():
    """`_rank_not_alive` waits for Slurm (ending_wait_s, a fresh squeue every ending_poll_s) the first time a set of
    ranks is seen gone; later checks of the same ranks gone read the job once (of the check interval)."""
    la = running_launch(job_restarts=0, alert_state="silent_hang")
    w, rows, _notices, calls = watcher(la, [slurm_job("RUNNING", 0)])
    w.ending_wait_s, w.ending_poll_s = 10.0, 1.0
    slept: list[float] = []

    async def fake_sleep(s):
        slept.append(s)
        w._clock.t += s

    looked = SimpleNamespace(obs=SimpleNamespace(process_alive=True), verdict=None)
    looks = [NodeLook(0, "n1", True), NodeLook(1, "n2", False)]
    import bot.services.watch_spans as watch_mod
    real = watch_mod.asyncio.sleep
    watch_mod.asyncio.sleep = fake_sleep
    try:
        for _ in range(3):
            assert asyncio.run(w._rank_not_alive(rows.la, looked, looks, [])) is None
    finally:
        watch_mod.asyncio.sleep = real
    assert 10 <= len(calls) <= 13 and 9 <= sum(slept) <= 10, (len(calls), sum(slept))


def test_a_slurm_launch_a_kill_left_kill_failed_is_no_news_when_its_job_ends():
    """/kill of a Slurm launch: scancel worked (cancelled_job), one rank's config host could not be reached for the
    leftovers -> kill_failed ('incomplete'). The next check finds the job CANCELLED: the deliberate stop is no
    news (no alert) and the launch stays kill_failed (a kill again verifies what is left)."""
    from bot.core.lifecycle import KillOutcome, kill_end

    out = KillOutcome(target="base#3", cancelled_job="12", error="n2: ssh: connect timed out", partial=True)
    state, detail, result = kill_end(out, LaunchState.RUNNING, None)
    assert (state, result) == (LaunchState.KILL_FAILED, "incomplete")

    la = running_launch(job_restarts=0, state=state, state_detail=detail)
    w, rows, _notices, _ = watcher(la, [SlurmJob(job_id="12", state="CANCELLED", nodes=("n1", "n2"), restarts=0,
                                                exit_code=0, signal=15,
                                                fields={"JobId": "12", "JobState": "CANCELLED"})])
    sent: list[str] = []

    async def compose(after, verdict, record, **k):
        return verdict.verdict

    async def send(la, verdict, alert):
        sent.append(alert)
        return True

    def transition(la, event, to=None, **fields):
        rows.la = replace(rows.la, state=to, **fields)
        return rows.la

    async def ranks_failure(*a, **k):
        return None

    w._alerts = SimpleNamespace(compose=compose, send=send)
    w.launches.transition = transition
    w._ranks_failure = ranks_failure
    w.unwatch = lambda _id: None
    asyncio.run(w._job_side(rows.la, []))
    assert sent == [], sent
    assert rows.la.state == LaunchState.KILL_FAILED


def test_a_slurm_kill_whose_job_is_still_completing_is_kill_failed():
    """scancel was accepted and the job is ending (COMPLETING past SCANCEL_WAIT_S: a process stuck in D state, a
    slow epilog) on nodes that are no config host: the kill is incomplete, the launch kill_failed (never left
    running and ready while Slurm kills its ranks)."""
    import bot.services.runners.slurm as spans_mod
    from bot.core.lifecycle import KillOutcome, kill_end
    from bot.services.runners.slurm import SlurmRunner

    class Client:
        async def cancel(self, job_id):
            return None

        async def show(self, job_id):
            return SlurmJob(job_id="12", state="RUNNING" if not self.cancelled else "COMPLETING", nodes=("n1", "n2"))

        cancelled = False

        async def cancel(self, job_id):  # noqa: F811
            self.cancelled = True

    s = SlurmRunner.__new__(SlurmRunner)
    s.slurm = lambda login: Client()
    s.ranks = lambda la: [(0, "n1", None), (1, "n2", None)]
    s.poll_s, s.config = 0.0, SimpleNamespace(hosts={})
    old, spans_mod.SCANCEL_WAIT_S = spans_mod.SCANCEL_WAIT_S, 0.0
    try:
        out = asyncio.run(s.stop(running_launch(), KillOutcome(target="base#3")))
    finally:
        spans_mod.SCANCEL_WAIT_S = old
    assert out.error and "still COMPLETING after scancel" in out.error and not out.cancelled_job
    state, detail, result = kill_end(out, LaunchState.RUNNING, None)
    assert (state, result) == (LaunchState.KILL_FAILED, "incomplete"), (state, detail)


def test_killing_an_ended_slurm_launch_does_not_say_its_job_was_cancelled():
    """/kill of a Slurm launch whose job had already ended by itself (FAILED: its OOM; a stale Kill button): no
    scancel is sent and the kill never says the job was cancelled."""
    from bot.core.lifecycle import KillOutcome, kill_end
    from bot.present.views import kill_view
    from bot.services.runners.slurm import SlurmRunner
    from tests.support.names import renderer

    class Client:
        async def cancel(self, job_id):
            return None

        async def show(self, job_id):
            return SlurmJob(job_id="12", state="FAILED", nodes=("n1", "n2"), exit_code=1)

    s = SlurmRunner.__new__(SlurmRunner)
    s.slurm = lambda login: Client()
    s.ranks = lambda la: [(0, "n1", None), (1, "n2", None)]
    s.poll_s, s.config = 0.0, SimpleNamespace(hosts={})
    ended = running_launch(state=LaunchState.FAILED, state_detail="Rank 0 on node n1: GPU memory exhausted")
    out = asyncio.run(s.stop(ended, KillOutcome(target="base#3")))
    text = renderer().render("kill_result", **kill_view(out, [0])).text
    assert "cancelled" not in text and out.cancelled_job is None, text
    assert kill_end(out, LaunchState.FAILED, ended.state_detail)[0] == LaunchState.FAILED


def test_a_kill_whose_host_drops_before_any_signal_keeps_the_launch_s_state(monkeypatch):
    """ProcessKiller.stop lists the processes before signal_and_wait sends anything; a RemoteError there (the SSH
    connection drops at the signal step) is a kill that failed: the launch keeps its state, nothing 'stopped'."""
    import bot.services.runners.kill as launches_mod
    from bot.adapters.remote import RemoteError
    from bot.core.lifecycle import KillOutcome, kill_end
    from bot.core.models import ProcessInfo
    from bot.services.runners.kill import ProcessKiller

    procs = [ProcessInfo(pid=100, ppid=1, pgid=99, sid=99, stat="Sl", pcpu=50.0, rss_kib=1, elapsed_s=10,
                         cpu_time_s=5, args="python -m vllm"),
             ProcessInfo(pid=101, ppid=100, pgid=99, sid=99, stat="Sl", pcpu=50.0, rss_kib=1, elapsed_s=10,
                         cpu_time_s=5, args="python worker")]
    svc = ProcessKiller.__new__(ProcessKiller)

    async def snapshot(host, req):
        return SimpleNamespace(table=procs, gpu=SimpleNamespace(ok=False, gpus=[], processes=[], error="x"),
                               start_ticks={})

    async def signal_and_wait(*a, **k):
        raise RemoteError("h", "ssh: connection lost")

    svc.probes = SimpleNamespace(snapshot=snapshot, processes_of=lambda la, snap: procs, stat_pids=lambda la: (),
                                 tagged=lambda la, snap: [100, 101])
    svc.signal_and_wait = signal_and_wait
    svc._rows = SimpleNamespace(update=lambda *a, **k: None)
    monkeypatch.setattr(launches_mod, "remember_processes", lambda *a, **k: None)
    monkeypatch.setattr(launches_mod, "group_confirmed", lambda *a, **k: True)
    monkeypatch.setattr(launches_mod, "ended_by", lambda *a, **k: None)
    la = launch_row()
    out = KillOutcome(target=la.name, host=la.host)
    try:
        asyncio.run(svc.stop(la, out))
    except RemoteError as e:  # what LaunchService._kill_locked does
        out.error = str(e)
    state, detail, result = kill_end(out, LaunchState.RUNNING, None)
    assert (state, result) == (LaunchState.RUNNING, "error"), (state, detail)
    assert detail.startswith("kill failed: "), detail


def test_a_rank_that_stays_gone_is_read_once_not_at_every_check():
    """The ranks gone while rank 0 runs are read in full once per set of ranks gone: a rank that stays gone costs
    no probe at the next checks (its failure is kept), a second rank gone is read, and rank 0 gone forgets it."""
    la = running_launch(job_restarts=0)
    w, rows, _notices, _calls = watcher(la, [slurm_job("RUNNING", 0)])
    reads: list[int] = []
    oom = SimpleNamespace(verdict="oom", confidence="high")

    async def rank_failure(_la, rank, node, host, history):
        reads.append(rank)
        return rank, node, oom

    w._rank_failure = rank_failure
    alive = SimpleNamespace(obs=SimpleNamespace(process_alive=True))
    ranks = [(0, "n1", "n1"), (1, "n2", "n2"), (2, "n3", "n3")]
    one = [NodeLook(0, "n1", True), NodeLook(1, "n2", False), NodeLook(2, "n3", True)]
    two = [NodeLook(0, "n1", True), NodeLook(1, "n2", False), NodeLook(2, "n3", False)]

    async def go():
        got = [await w._gone_failure(rows.la, alive, one, ranks, []) for _ in range(3)]
        got.append(await w._gone_failure(rows.la, alive, two, ranks, []))
        gone0 = SimpleNamespace(obs=SimpleNamespace(process_alive=False))
        got.append(await w._gone_failure(rows.la, gone0, two, ranks, []))
        return got

    got = asyncio.run(go())
    assert reads == [1, 1, 2], reads  # once for rank 1 alone, then once for ranks 1 and 2
    assert got[:3] == [(1, "n2", oom)] * 3 and got[3] == (1, "n2", oom) and got[4] is None
    assert la.id not in w._gone_failures


def test_a_hanging_rank_host_is_said_out_since_the_last_look_it_answered():
    """A host that hangs fails each look only at the probe's deadline (30 s later here): its outage counts from the
    last look it answered, not from the end of the first look that failed."""
    la = running_launch(job_restarts=0)
    w, rows, notices, _ = watcher(la, [])
    ranks = [(0, "n1", "n1"), (1, "n2", "n2")]
    up = [NodeLook(0, "n1", True), NodeLook(1, "n2", True)]
    hung = [NodeLook(0, "n1", True), NodeLook(1, "n2", None, error="ssh: timed out after 30 s")]

    async def go():
        await w._rank_hosts(rows.la, ranks, up)  # t=1000: answered
        for _ in range(2):  # each failed look ends 35 s after the one before (interval 5 s + deadline 30 s)
            w._clock.t += 35
            await w._rank_hosts(rows.la, ranks, hung)
        w._clock.t += 5
        await w._rank_hosts(rows.la, ranks, up)  # t=1075
    asyncio.run(go())
    assert [n.split(" | ")[0] for n in notices][-1].endswith("is reachable again (it was not for 1m15s)"), notices
