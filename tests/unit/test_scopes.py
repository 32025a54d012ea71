"""Processes found by their systemd scope, kills through the scope, and remembered PIDs checked by their start
time (pure parts; the scripts themselves run in tests/integration/test_scopes.py)."""

from __future__ import annotations

import sqlite3

import pytest

from bot.adapters.store import Store
from bot.core.lifecycle import (
    Started,
    cgroup_name,
    parse_launch_output,
    scope_unit,
    signal_script,
    unit_cleanup_script,
)
from bot.core.models import Launch, LaunchState, ProcessInfo, Snapshot
from bot.core.observe import own_processes, remember_processes
from bot.core.probe import parse_launch_tags, parse_proc_stat_starts
from tests.support.builders import launch_row


def launch(**kw) -> Launch:
    """The shared running launch (tests.support.builders.launch_row) with `kw` applied."""
    return launch_row(**kw)


def test_a_process_in_the_launch_scope_carries_its_tag_whatever_its_environment_says():
    text = "\n".join([
        "/proc/100/environ:GPUBOT_LAUNCH=3-abc",
        "/proc/200/cgroup:/gpubot-3-abc.scope",  # cgroup v2: env cleared, still in the scope
        "/proc/201/cgroup:/gpubot-3-abc.scope",  # cgroup v1: one line per hierarchy naming the scope
        "/proc/201/cgroup:/gpubot-3-abc.scope",
        "/proc/300/environ:GPUBOT_LAUNCH=7-def",
        "/proc/300/cgroup:/gpubot-3-abc.scope",  # the environment wins where both say something
        "/proc/400/cgroup:/gpubot-x y.scope",  # not a unit name of ours
        "/proc/abc/cgroup:/gpubot-3-abc.scope",
    ])
    assert parse_launch_tags(text) == {100: "3-abc", 200: "3-abc", 201: "3-abc", 300: "7-def"}


def test_a_scope_member_in_its_own_session_is_the_launch_s_process():
    table = [ProcessInfo(pid=99, ppid=1, pgid=99, sid=99, stat="S", args="sh"),
             ProcessInfo(pid=100, ppid=99, pgid=99, sid=99, stat="S", args="python -m server"),
             ProcessInfo(pid=200, ppid=1, pgid=200, sid=200, stat="S", args="helper"),
             ProcessInfo(pid=201, ppid=200, pgid=200, sid=200, stat="S", args="helper child")]
    tags = parse_launch_tags("/proc/99/environ:GPUBOT_LAUNCH=3-abc\n/proc/100/environ:GPUBOT_LAUNCH=3-abc\n"
                             "/proc/200/cgroup:/gpubot-3-abc.scope\n")
    snap = Snapshot(host="h", clock=2000.0, table=table, launch_tags=tags)
    assert [p.pid for p in own_processes(snap, launch())] == [99, 100, 200, 201]
    stranger = Snapshot(host="h", clock=2000.0, table=table, launch_tags={99: "3-abc", 100: "3-abc"})
    assert [p.pid for p in own_processes(stranger, launch())] == [99, 100]


def test_the_kill_signals_the_whole_scope_through_its_manager():
    system = signal_script([5], 4, "TERM", unit="gpubot-3-abc.scope", manager="system")
    # the plain kills first: a wedged systemd (bounded to 5 s) cannot keep them from running
    assert system.index("kill -TERM -4") < system.index("kill -TERM 5") < system.index(
        "timeout -k 1 5 systemctl --no-ask-password kill --signal=SIGTERM -- gpubot-3-abc.scope")
    user = signal_script([5], None, "KILL", unit="gpubot-3-abc.scope", manager="user")
    assert "systemctl --user --no-ask-password kill --signal=SIGKILL -- gpubot-3-abc.scope" in user
    assert "systemctl" not in signal_script([5], 4, "TERM")
    for unit, manager in (("gpubot-3-abc.scope; reboot", "system"), ("sshd.service", "system"),
                          ("gpubot-3-abc.scope", "root")):
        with pytest.raises(ValueError):
            signal_script([5], 4, "TERM", unit=unit, manager=manager)


def test_the_launch_output_names_the_scope_only_with_its_manager():
    assert parse_launch_output("PGID=10\nPID=12\nUNIT=gpubot-3-abc.scope\nMANAGER=user\n") == Started(
        12, 10, "gpubot-3-abc.scope", "user")
    assert parse_launch_output("PGID=10\nPID=12\nUNIT=gpubot-3-abc.scope\n") == Started(12, 10)
    assert parse_launch_output("PGID=10\nPID=12\nUNIT=sshd.service\nMANAGER=system\n") == Started(12, 10)
    assert scope_unit("3-abc") == "gpubot-3-abc.scope" and scope_unit("3 abc") is None and scope_unit("") is None


def test_a_remembered_pid_counts_only_for_the_process_that_was_seen():
    table = [ProcessInfo(pid=4242, ppid=1, pgid=4242, sid=4242, stat="S", elapsed_s=300, args="helper")]
    snap = Snapshot(host="h", clock=2000.0, table=table)  # started at 1700, after the launch (1000)
    first, starts = remember_processes(launch(), snap, table)
    assert first == {4242: 1700.0} and starts == {}
    assert remember_processes(launch(seen_pids=first), snap, table) is None  # nothing new
    same = Snapshot(host="h", clock=2600.0, table=[ProcessInfo(pid=4242, ppid=1, stat="S", elapsed_s=901)])
    assert [p.pid for p in own_processes(same, launch(seen_pids=first))] == [4242]  # one second of slack
    # the seen process ended and a stranger, also younger than the launch, got its PID
    reused = Snapshot(host="h", clock=2600.0, table=[ProcessInfo(pid=4242, ppid=1, stat="S", elapsed_s=60)])
    assert own_processes(reused, launch(seen_pids=first)) == []
    # an older record without a start time falls back to "started after the launch"
    assert [p.pid for p in own_processes(reused, launch(seen_pids={4242: None}))] == [4242]


def test_seen_pids_of_an_older_database_are_read_and_kept(tmp_path):
    url = f"sqlite:///{tmp_path}/gpubot.db"
    store = Store(url)
    la = store.launches.create(host="h", variant="base", params={}, command="c", log_path=None, port=None,
                               gpus=[], created_by="U1")
    store.close()
    with sqlite3.connect(tmp_path / "gpubot.db") as db:  # what an older gpubot wrote: a list of PIDs
        db.execute("UPDATE launches SET seen_pids_json = '[41, 42]' WHERE id = ?", (la.id,))
    store = Store(url)
    try:
        assert store.launches.get(la.id).seen_pids == {41: None, 42: None}
        after = store.launches.update(la.id, seen_pids={41: None, 42: 1700.0, 43: 1800.5})
        assert after.seen_pids == {41: None, 42: 1700.0, 43: 1800.5}
        store.launches.update(la.id, unit="gpubot-1-x.scope", unit_manager="system")
        assert store.launches.get(la.id).unit == "gpubot-1-x.scope"
    finally:
        store.close()


def test_a_corrupt_seen_pids_record_reads_as_what_can_be_kept():
    from bot.adapters.store.launches import _seen_pids

    assert _seen_pids('{"²": 1, "5": 1e999, "6": 2.5, "x": 1}') == {5: None, 6: 2.5}
    assert _seen_pids("[" * 100000) == {} and _seen_pids("null") == {} and _seen_pids("not json") == {}
    assert _seen_pids('[1, true, "2", -3]') == {1: None}


def test_an_ended_launch_s_old_group_number_taken_by_a_stranger_is_not_adopted():
    # the launch ended at 1500 (bot clock); its group 99 emptied, then a stranger got PID 99, called setsid
    # and exited, leaving its child in the leaderless group 99
    stranger = [ProcessInfo(pid=700, ppid=1, pgid=99, sid=99, stat="S", elapsed_s=30, args="sleep 300")]
    snap = Snapshot(host="h", clock=2000.0, local_clock=2000.0, table=stranger)
    ended = launch(state=LaunchState.EXITED, ended_at=1500.0)
    assert own_processes(snap, ended) == []
    # a real leftover of the same launch is older than its end: still the launch's
    leftover = [ProcessInfo(pid=700, ppid=1, pgid=99, sid=99, stat="S", elapsed_s=900, args="worker")]
    assert [p.pid for p in own_processes(Snapshot(host="h", clock=2000.0, table=leftover), ended)] == [700]
    # while the launch lives, a leaderless group of its own number is what is left of it
    assert [p.pid for p in own_processes(snap, launch())] == [700]


def test_ages_against_the_bot_s_own_times_never_mix_the_two_clocks():
    from bot.core.observe import ended_by, start_time

    p = ProcessInfo(pid=5, elapsed_s=100)
    assert start_time(Snapshot(host="h", clock=1000.0), p) == 900.0 and start_time(Snapshot(host="h"), p) is None
    ended = launch(state=LaunchState.EXITED, ended_at=1500.0)
    # the host's clock is 120 s ahead of the bot's: the age needed comes from the bot's clock alone
    assert ended_by(Snapshot(host="h", clock=1720.0, local_clock=1600.0), ended) == 98.0
    assert ended_by(Snapshot(host="h", clock=1720.0), ended) == 218.0  # no bot time recorded: the host's
    assert ended_by(Snapshot(host="h", clock=1720.0, local_clock=1600.0), launch()) is None
    # a remembered PID without a start time: its age against the launch's age, both measured, no clock mixed
    young = Snapshot(host="h", clock=9000.0, local_clock=1100.0,
                     table=[ProcessInfo(pid=4242, ppid=1, stat="S", elapsed_s=50, args="helper")])
    assert [q.pid for q in own_processes(young, launch(seen_pids={4242: None}))] == [4242]
    old = Snapshot(host="h", clock=9000.0, local_clock=1100.0,
                   table=[ProcessInfo(pid=4242, ppid=1, stat="S", elapsed_s=500, args="stranger")])
    assert own_processes(old, launch(seen_pids={4242: None})) == []  # older than the launch: not ours


def test_a_member_of_the_launch_s_own_cgroup_carries_its_tag():
    text = "\n".join([
        "/proc/500/cgroup:/gpubot-3-abc.launch",  # `env -i` and setsid: only its cgroup says whose it is
        "/proc/501/cgroup:/gpubot-3-abc.launchx",
        "/proc/502/cgroup:/gpubot-3-abc.launch/sub",
    ])
    assert parse_launch_tags(text) == {500: "3-abc"}
    assert cgroup_name("3-abc") == "gpubot-3-abc.launch" and cgroup_name("3/abc") is None


def test_the_launch_output_names_its_own_cgroup_only_with_the_cgroup_manager():
    assert parse_launch_output("PGID=10\nUNIT=gpubot-3-abc.launch\nMANAGER=cgroup\nPID=12\n") == Started(
        12, 10, "gpubot-3-abc.launch", "cgroup")
    # a scope name with the cgroup manager, or a cgroup name with systemd's: neither is believed
    assert parse_launch_output("PGID=10\nPID=12\nUNIT=gpubot-3-abc.scope\nMANAGER=cgroup\n") == Started(12, 10)
    assert parse_launch_output("PGID=10\nPID=12\nUNIT=gpubot-3-abc.launch\nMANAGER=system\n") == Started(12, 10)


def test_a_kill_of_a_launch_s_cgroup_uses_cgroup_kill_for_sigkill_and_its_members_otherwise():
    kill = signal_script([5], 4, "KILL", unit="gpubot-3-abc.launch", manager="cgroup")
    assert 'echo 1 > "$m/gpubot/gpubot-3-abc.launch"/cgroup.kill' in kill
    assert kill.index("kill -KILL -4") < kill.index("cgroup.kill")
    term = signal_script([5], 4, "TERM", unit="gpubot-3-abc.launch", manager="cgroup")
    assert "cgroup.kill" not in term and 'kill -TERM $(cat "$m/gpubot/gpubot-3-abc.launch"/cgroup.procs)' in term
    for unit, manager in (("gpubot-3-abc.scope", "cgroup"), ("gpubot-3-abc.launch", "system"),
                          ("gpubot-../../x.launch", "cgroup")):
        with pytest.raises(ValueError):
            signal_script([5], 4, "TERM", unit=unit, manager=manager)
    assert "rmdir" in unit_cleanup_script("gpubot-3-abc.launch", "cgroup")
    assert unit_cleanup_script("gpubot-3-abc.scope", "system") is None and unit_cleanup_script(None, None) is None


def test_a_pid_with_a_known_start_time_is_signalled_only_while_it_is_still_that_process():
    script = signal_script([5, 6], None, "TERM", starts={6: 123456})
    assert "kill -TERM 5 " in script and "kill -TERM 5 6" not in script
    assert '[ "$(st 6)" = 123456 ] && kill -TERM 6' in script


def test_start_times_are_read_after_the_last_parenthesis_of_the_command_name():
    rest = " ".join(["S"] + ["1"] * 18 + ["98765"] + ["0"] * 10)  # field 22 is the 20th after the name
    text = "\n".join([f"4242 (python3) {rest}", f"4243 (a) b) (c) {rest}", "garbage", f"x (y) {rest}", ""])
    assert parse_proc_stat_starts(text) == {4242: 98765, 4243: 98765}


def test_a_remembered_pid_with_an_exact_start_time_counts_only_for_that_very_process():
    table = [ProcessInfo(pid=4242, ppid=1, pgid=4242, sid=4242, stat="S", elapsed_s=300, args="helper")]
    seen = Snapshot(host="h", clock=2000.0, table=table, start_ticks={4242: 170000})
    pids, starts = remember_processes(launch(), seen, table)
    assert starts == {4242: 170000}
    la = launch(seen_pids=pids, seen_starts=starts)
    # a stranger got the PID within the same second: the epoch times agree, the ticks do not
    reused = Snapshot(host="h", clock=2000.5, table=table, start_ticks={4242: 170040})
    assert own_processes(reused, la) == []
    assert [p.pid for p in own_processes(Snapshot(host="h", clock=2600.0, table=table, start_ticks={4242: 170000}),
                                         la)] == [4242]
    # recorded exactly but not read now: not provably ours
    assert own_processes(Snapshot(host="h", clock=2000.5, table=table), la) == []


def test_seen_start_ticks_are_stored_beside_the_pids_and_read_back(tmp_path):
    from bot.adapters.store.launches import _seen_pids, _seen_starts

    store = Store(f"sqlite:///{tmp_path}/gpubot.db")
    try:
        la = store.launches.create(host="h", variant="base", params={}, command="c", log_path=None, port=None,
                                   gpus=[], created_by="U1")
        after = store.launches.update(la.id, seen_pids={41: 1700.0}, seen_starts={41: 99})
        assert after.seen_pids == {41: 1700.0} and after.seen_starts == {41: 99}
        after = store.launches.update(la.id, seen_pids={41: 1700.0, 42: None})  # the ticks are kept
        assert after.seen_starts == {41: 99} and after.seen_pids == {41: 1700.0, 42: None}
    finally:
        store.close()
    # an older gpubot reads the same object: the `starts` key is no PID and is skipped
    assert _seen_pids('{"41": 1700.0, "starts": {"41": 99}}') == {41: 1700.0}
    assert _seen_starts('{"starts": {"41": 99, "x": 1, "42": 1.5, "43": true}}') == {41: 99}
    assert _seen_starts("[1, 2]") == {} and _seen_starts("nope") == {}


def test_a_server_gone_while_its_wrapper_has_not_written_the_status_is_still_ending():
    from bot.core.models import GpuProcess, GpuSection
    from bot.core.observe import server_ending

    la = launch()  # server pid 100, wrapper (session leader) 99, GPU 0
    wrapper = ProcessInfo(pid=99, ppid=1, pgid=99, sid=99, stat="S", args="sh -c exec 3>&2 2>/dev/null ...")
    other = ProcessInfo(pid=7, ppid=1, stat="S", args="init")
    snap = Snapshot(host="h", clock=2000.0, table=[other, wrapper])
    assert server_ending(snap, la, [wrapper], None)  # the wrapper is about to write it
    assert not server_ending(snap, la, [wrapper], 137)  # written: the end is known
    assert not server_ending(snap, la, [], None)  # no wrapper left to write it: judge what is there
    server = ProcessInfo(pid=100, ppid=99, pgid=99, sid=99, stat="S", args="python -m sglang")
    assert not server_ending(Snapshot(host="h", clock=2000.0, table=[wrapper, server]), la, [wrapper, server], None)
    # the status is written but GPU 0's memory still belongs to the dead server's PID: being freed
    gpu = GpuSection(ok=True, processes=[GpuProcess(pid=100, gpu_index=0, used_memory_mib=14800)])
    assert server_ending(Snapshot(host="h", clock=2000.0, table=[other], gpu=gpu), la, [], 137)
    # a foreign holder that is listed and alive is not the launch's teardown
    listed = GpuSection(ok=True, processes=[GpuProcess(pid=7, gpu_index=0, used_memory_mib=500)])
    assert not server_ending(Snapshot(host="h", clock=2000.0, table=[other], gpu=listed), la, [], 137)
    assert not server_ending(Snapshot(host="h", clock=2000.0, table=[]), la, [], None)  # no process table


def test_remembered_processes_that_ended_are_forgotten_on_a_look_at_the_whole_table():
    table = [ProcessInfo(pid=4242, ppid=1, pgid=4242, sid=4242, stat="S", elapsed_s=300, args="helper")]
    snap = Snapshot(host="h", clock=2000.0, table=table, start_ticks={4242: 5})
    la = launch(seen_pids={4242: 1700.0, 31: 1500.0, 32: 1600.0}, seen_starts={4242: 5, 31: 3})
    # a look at a few PIDs only (a cheap liveness check) cannot tell that 31 and 32 ended
    assert remember_processes(la, snap, table) is None
    pids, starts = remember_processes(la, snap, table, whole_table=True)
    assert pids == {4242: 1700.0} and starts == {4242: 5}
    # an empty table (ps failed) forgets nothing
    assert remember_processes(la, Snapshot(host="h", clock=2000.0), [], whole_table=True) is None
