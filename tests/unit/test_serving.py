"""The whole-life watch's pure rules: liveness verdicts after ready, the launch wrapper's exit line, CPU time
that is no progress, verdicts that flip back, and the bits of Slack etiquette that are text."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from bot.config import WatchPolicy
from bot.core.diagnose import Observation
from bot.core.exits import describe_exit
from bot.core.lifecycle import (
    EXIT_LINE_FORMAT,
    RenderedLaunch,
    Started,
    exit_status,
    launch_script,
    parse_launch_output,
)
from bot.core.models import GpuReading, Launch, LaunchState, ProcessInfo, Snapshot
from bot.core.observe import is_news, judge, observation_from_snapshot
from bot.core.records import CheckRecord
from bot.core.serving import ended_verdict, failing_streak, judge_serving
from bot.present.render import Message, slack_text
from tests.support.builders import launch_row
from tests.support.names import said

READY_LOG = ["[2026-12-01 10:00:00] The server is fired up and ready to roll!"]


def serving_obs(**kw) -> Observation:
    base = dict(log_lines=list(READY_LOG), log_silent_s=5.0, process_alive=True, health="ok", port=30000,
                port_open=True, gpus=[GpuReading(index=0, memory_used_mib=70000, utilization_gpu_pct=40)])
    base.update(kw)
    return Observation(**base)


def recs(*healths) -> list[dict]:
    return [CheckRecord(t=float(i), health=h) for i, h in enumerate(healths)]


def test_the_wrapper_line_gives_the_exit_status_and_signal():
    assert exit_status(["x", EXIT_LINE_FORMAT.format(rc=137), "y"]) == 137
    assert exit_status(["no line"]) is None
    assert describe_exit(137) == "killed by signal 9 (SIGKILL)" and describe_exit(1) == "exit status 1"
    assert describe_exit(143) == "killed by signal 15 (SIGTERM)"


def _gone(**kw) -> Observation:
    """A ready launch whose server is gone and whose GPU gave its memory back."""
    return serving_obs(process_alive=False, gpus=[GpuReading(index=0, memory_used_mib=500, utilization_gpu_pct=0)],
                       **kw)


def test_a_ready_launch_that_died_by_signal_is_said_with_the_signal_and_no_cause_it_cannot_show():
    term = judge_serving(_gone(), [], recs("ok"), exit_code=143)
    assert (term.verdict, term.phase) == ("crashed", "serving")
    assert "killed by signal 15 (SIGTERM)" in term.summary and "killed by signal 15" in term.evidence[0]
    assert not any("traceback" in s for s in term.next_steps)  # nothing in the log: who sent it is the question
    # a SIGKILL is the kernel OOM killer's signal, but without the kernel log that is a guess: unknown, said so
    kill = judge_serving(_gone(), [], recs("ok"), exit_code=137)
    assert (kill.verdict, kill.phase, kill.confidence, kill.runner_up) == ("unknown", "serving", "low", "host_oom")
    assert "killed by signal 9 (SIGKILL)" in kill.evidence[0] and "dmesg" in (kill.missing or "")
    ok = judge_serving(_gone(), [], recs("ok"), exit_code=0)
    assert (ok.verdict, ok.phase) == ("exited", "shutdown")
    unknown = judge_serving(_gone(), [], recs("ok"))
    assert unknown.verdict == "unknown" and any("no exit status was recorded" in e for e in unknown.evidence)
    assert unknown.missing and "exit status" in unknown.missing


def test_leftover_processes_are_named_in_a_death():
    left = [ProcessInfo(pid=4711, stat="Sl", args="python worker"), ProcessInfo(pid=4712, stat="Z", args="")]
    v = ended_verdict(_gone(processes=left), 137)
    assert any("1 leftover process " in e and "4711" in e and "4712" not in e and "`/kill LAUNCH`" in said(e)
               for e in v.evidence)
    assert not any("traceback" in s for s in v.next_steps)  # a signal with a silent log: no traceback to read
    named = ended_verdict(_gone(processes=left), 137, 7)
    assert any("`/kill 7` stops them" in said(e) for e in named.evidence)


def test_health_must_fail_n_checks_in_a_row_and_a_serving_hang_needs_timeouts_silence_and_idle_gpus():
    idle = [GpuReading(index=0, memory_used_mib=70000, utilization_gpu_pct=0)]
    one = judge_serving(serving_obs(health="http_503"), [], recs("ok", "http_503"), failures_needed=2)
    assert one.verdict == "ready"
    two = judge_serving(serving_obs(health="http_503"), [], recs("http_503", "http_503"), failures_needed=2)
    assert two.verdict == "unhealthy" and "(now: HTTP 503)" in two.summary
    hang = judge_serving(serving_obs(health="timeout", log_silent_s=300.0, gpus=idle), [],
                         recs("timeout", "timeout"), failures_needed=2, hang_silence_s=120)
    assert (hang.verdict, hang.phase) == ("silent_hang", "serving") and "times out" in hang.summary
    busy = judge_serving(serving_obs(health="timeout", log_silent_s=300.0), [], recs("timeout", "timeout"),
                         failures_needed=2, hang_silence_s=120)
    assert busy.verdict == "unhealthy"  # GPUs at 40 %: working, slow; not a hang
    talking = judge_serving(serving_obs(health="timeout", log_silent_s=3.0, gpus=idle), [],
                            recs("timeout", "timeout"), failures_needed=2, hang_silence_s=120)
    assert talking.verdict == "unhealthy"  # the log still moves


def test_failing_streak_skips_unanswered_checks():
    def rec(**kw):
        return CheckRecord(t=0.0, **kw)

    assert failing_streak([rec(health="ok"), rec(health="refused"), rec(error="ssh"), rec(health="timeout")]) == 2
    assert failing_streak([rec(health="timeout"), rec(health="ok")]) == 0
    assert failing_streak([rec(port_open=False), rec(port_open=False)]) == 2


def test_a_new_oom_while_serving_is_news_but_an_old_one_in_the_tail_is_not():
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    fresh = judge_serving(serving_obs(log_lines=[*READY_LOG, oom]), [oom], recs("ok"))
    assert fresh.verdict == "oom" and fresh.phase == "serving" and "still running" in fresh.summary
    old = judge_serving(serving_obs(log_lines=[oom, *READY_LOG]), [], recs("ok"))
    assert old.verdict == "ready"


def test_cpu_time_alone_never_leaves_silent_hang():
    hung = Observation(log_lines=["[x] Load weight end. mem usage=70.00 GB"], log_silent_s=900.0, process_alive=True,
                       cpu_time_growing=True, port_open=False)
    assert judge(hung, None, grace_s={"weight_loading": 300.0}, silence_after_s=300.0).verdict == "loading"
    stays = judge(hung, None, grace_s={"weight_loading": 300.0}, silence_after_s=300.0, posted="silent_hang")
    assert stays.verdict == "silent_hang" and any("CPU time grows" in e for e in stays.evidence)


def launch(**kw) -> Launch:
    """The shared running launch (tests.support.builders.launch_row) with `kw` applied."""
    return launch_row(**kw)


def snap(cpu: int, clock: float, *, others: bool = False, tags: bool = True) -> Snapshot:
    """A probe of the launch's two processes (PIDs 99, 100, tagged `3-abc`), another launch's too with `others`;
    without `tags` the launch's own are not in it (not started yet, or gone)."""
    table = [ProcessInfo(pid=99, ppid=1, pgid=99, sid=99, stat="S", args="sh"),
             ProcessInfo(pid=100, ppid=99, pgid=99, sid=99, stat="S", cpu_time_s=cpu, args="python -m server")]
    tags_of = {99: "3-abc", 100: "3-abc"}
    if not tags:
        table, tags_of = [], {}
    if others:
        table.append(ProcessInfo(pid=200, ppid=1, pgid=200, sid=200, stat="S", cpu_time_s=50, args="other"))
        tags_of[200] = "4-def"
    return Snapshot(host="h", clock=clock, table=table, launch_tags=tags_of, tagged_pids=[99, 100] if tags else [])


def test_cpu_growth_counts_only_above_a_rate_and_never_after_a_stack_dump():
    la = launch()
    _, first = observation_from_snapshot(snap(10, 2000.0), la, None)
    tick, _ = observation_from_snapshot(snap(11, 2030.0), la, first)  # one 1-second tick in 30 s
    assert tick.cpu_time_growing is False
    busy, _ = observation_from_snapshot(snap(25, 2030.0), la, first)  # 15 CPU seconds in 30 s
    assert busy.cpu_time_growing is True
    dumped, _ = observation_from_snapshot(snap(25, 2030.0), la, first, quiet_since=2010.0)
    assert dumped.cpu_time_growing is None  # the bot's own dump is in the window: not known


def test_a_core_busy_all_along_checked_every_second_is_growing_cpu_time():
    """Checks a second apart: ps's whole-second CPU time moves 0 to 2 per check for a core busy all along (a
    torch.compile lowering a kernel: seen on an H100 as no progress); measured over the checks of the last few
    seconds it is the core it is. A process that only ticks now and then stays no progress that way too."""
    la = launch()
    records = []
    for k, cpu in enumerate([10, 11, 11, 12, 13, 13, 14]):  # a busy core read as whole seconds, a check a second
        obs, rec = observation_from_snapshot(snap(cpu, 2000.0 + k), la, records[-1] if records else None,
                                             earlier=records)
        records.append(rec)
    assert obs.cpu_time_growing is True
    alone, _ = observation_from_snapshot(snap(14, 2006.0), la, records[-2])  # the one-second window alone
    assert alone.cpu_time_growing is False
    records = []
    for k, cpu in enumerate([10, 10, 10, 11, 11, 11, 11]):  # a polling thread's tick
        obs, rec = observation_from_snapshot(snap(cpu, 2000.0 + k), la, records[-1] if records else None,
                                             earlier=records)
        records.append(rec)
    assert obs.cpu_time_growing is False
    dumped, _ = observation_from_snapshot(snap(25, 2006.0), la, records[-1], earlier=records, quiet_since=2004.0)
    assert dumped.cpu_time_growing is None  # the bot's dump in the longer window: not known


def test_evidence_is_only_the_launch_own_processes():
    obs, rec = observation_from_snapshot(snap(10, 2000.0, others=True), launch(), None)
    assert {p.pid for p in obs.processes} == {99, 100} and 200 not in obs.launch_pids
    assert set(rec.cpu_s) == {"99", "100"}


@pytest.mark.parametrize(("verdict", "posted", "previous", "serving", "news"), [
    ("silent_hang", None, None, False, True),
    ("loading", "silent_hang", "silent_hang", False, False),  # one check of progress is not yet news
    ("loading", "silent_hang", "loading", False, True),       # two are
    ("ready", "unhealthy", "unhealthy", True, False),         # recovery needs two passing checks
    ("ready", "unhealthy", "ready", True, True),
    ("ready", None, None, False, True),                       # the first ready is news at once
    ("unknown", "loading", "loading", False, False),
    ("unhealthy", "silent_hang", "silent_hang", True, False),  # a wobbling GPU reading swaps them: not yet
    ("unhealthy", "silent_hang", "unhealthy", True, True),
])
def test_what_is_news(verdict, posted, previous, serving, news):
    assert is_news(verdict, posted, previous=previous, serving=serving) is news


def test_a_flip_back_within_one_check_posts_nothing():
    posted, prev, out = None, None, []
    for v in ["silent_hang", "loading", "silent_hang", "loading", "silent_hang"]:
        if is_news(v, posted, previous=prev):
            out.append(v)
            posted = v
        prev = v
    assert out == ["silent_hang"]


def test_launch_script_runs_the_server_under_a_wrapper_that_logs_its_end(tmp_path):
    log = tmp_path / "logs" / "s.log"
    r = RenderedLaunch(variant="v", host="h", command="sh -c 'echo started; kill -9 $$'", log_path=str(log),
                       port=None, gpus=[], env={"GPUBOT_LAUNCH": "9-x"}, workdir=None, params={})
    out = subprocess.run(["sh", "-s"], input=launch_script(r), capture_output=True, text=True, timeout=30).stdout
    started = parse_launch_output(out)
    pid = started.pid
    assert pid != started.pgid and started.unit is None  # no systemd asked for
    for _ in range(400):
        if "exited with status" in (log.read_text() if log.exists() else ""):
            break
        subprocess.run(["sleep", "0.05"])
    lines = log.read_text().splitlines()
    assert lines[0] == "started" and exit_status(lines) == 137
    assert "Killed" not in lines  # the shell's own report of the signal is not a log line
    assert not list(Path("/tmp").glob(f"gpubot-pid.*{pid}*"))


def test_parse_launch_output_falls_back_to_the_group():
    assert parse_launch_output("PGID=10\nPID=12\n") == Started(12, 10)
    assert parse_launch_output("PGID=10\nPID=\n") == Started(10, 10)
    assert parse_launch_output("nothing") is None


def test_notification_text_keeps_real_mentions_and_escapes_the_rest():
    assert slack_text("<@U0ABC> a<b & <#C0DEF> <!subteam^S0GH> <http://x|y>") == (
        "<@U0ABC> a&lt;b &amp; &lt;#C0DEF&gt; &lt;!subteam^S0GH&gt; &lt;http://x|y&gt;")


def test_an_answer_says_who_asked():
    m = Message(text="status", blocks=[{"type": "section", "text": {"type": "mrkdwn", "text": "x"}}])
    asked = m.asked_by("U0OPERATOR", "/gpu status `x`")
    assert asked.text.endswith("(asked by <@U0OPERATOR>)")
    assert asked.blocks[-1]["elements"][0]["text"].startswith("<@U0OPERATOR> asked: `/gpu status")
    assert m.asked_by("console", "/gpu status") is m


def test_the_example_config_limits_match_the_code():
    text = (Path(__file__).parents[2] / "deploy" / "config.example.yaml").read_text()
    watch = text[text.index("\nwatch:"):text.index("\nslack:")]
    limits = {int(x) for x in re.findall(r"<= (\d+)", watch)}
    from bot.config.schema import MAX_WATCH_SECONDS
    assert limits == {MAX_WATCH_SECONDS}
    defaults = WatchPolicy()
    assert f"default {defaults.serving_interval_s:.0f}" in watch and f"default {defaults.health_failures}" in watch


def test_the_launch_wrapper_is_named_not_quoted():
    from bot.present.views import short_command

    wrapper = "sh -c exec 3>&2 2>/dev/null sh -c 'exec 2>&3 3>&-; echo \"$$\" > \"$1\"; exec python x' gpubot-server"
    assert short_command(wrapper) == "sh (gpubot launch wrapper)"
    assert short_command("sh -c python x") == "sh -c python x"


def test_a_failed_ps_never_ends_a_launch():
    empty = Snapshot(host="h", clock=2000.0, table=[], launch_tags={100: "3-abc"}, tagged_pids=[100],
                     errors=["process table unavailable (ps failed or printed nothing)"])
    obs, rec = observation_from_snapshot(empty, launch(), None)
    assert obs.process_alive is True and rec.alive is True
    unknown, _ = observation_from_snapshot(Snapshot(host="h", clock=2000.0), launch(), None)
    assert unknown.process_alive is None


def test_a_launch_checked_before_its_process_was_recorded_has_not_ended():
    # a check racing the start (another bot took over the watch): no process of it yet is no proof that it is gone
    starting = launch(pid=None, pgid=None, sid=None, state=LaunchState.STARTING)
    obs, rec = observation_from_snapshot(snap(10, 2000.0, others=True, tags=False), starting, None)
    assert obs.process_alive is None and rec.alive is None
    obs, _ = observation_from_snapshot(snap(10, 2000.0, others=True), launch(pid=None, pgid=None, sid=None), None)
    assert obs.process_alive is True  # its tagged processes are alive before their pid is recorded
    rank, _ = observation_from_snapshot(snap(10, 2000.0, others=True, tags=False), launch(pid=None), None)
    assert rank.process_alive is False  # a running launch's rank (no pid of its own) whose processes are gone
    gone, _ = observation_from_snapshot(snap(10, 2000.0, others=True, tags=False), launch(), None)
    assert gone.process_alive is False  # a recorded server process that is not there has ended


def test_a_remembered_pid_now_of_another_launch_is_not_ours():
    la = launch(seen_pids={4242: None})
    table = [ProcessInfo(pid=4242, ppid=1, pgid=4242, sid=4242, stat="S", elapsed_s=300, args="python other.py"),
             ProcessInfo(pid=4243, ppid=4242, pgid=4242, sid=4242, stat="S", elapsed_s=300, args="worker")]
    other = Snapshot(host="h", clock=2000.0, table=table, launch_tags={4242: "7-def", 4243: "7-def"})
    obs, _ = observation_from_snapshot(other, la, None)
    assert obs.processes == [] and obs.process_alive is False
    untagged = Snapshot(host="h", clock=2000.0, table=table[:1])  # cleared environment, started after the launch
    obs, _ = observation_from_snapshot(untagged, la, None)
    assert [p.pid for p in obs.processes] == [4242]


def test_a_quoted_log_line_never_pings_the_channel():
    assert slack_text("hi <!channel> <!here> <@U0ABC>") == "hi &lt;!channel&gt; &lt;!here&gt; <@U0ABC>"


def test_the_lock_follows_the_database(tmp_path):
    from bot.adapters.statelock import StateLock

    assert StateLock.for_database(None, str(tmp_path)).path == tmp_path / "gpubot.lock"
    beside = StateLock.for_database(f"sqlite:///{tmp_path}/x/bot.db", "/proc/unusable")
    assert beside.path == tmp_path / "x" / "bot.db.lock"
    assert StateLock.for_database("postgresql://db/gpubot", str(tmp_path)) is None


def test_a_mention_in_a_log_line_or_command_line_never_pings_anyone():
    from bot.core.parse.log import clean_log_lines

    (line,) = clean_log_lines(b"ERROR ping <@U0CEO> and <!subteam^S0ALL> <#C0GEN> <!channel>\n")
    assert slack_text(line).count("<@") == 0 and "<!subteam" not in slack_text(line) and "<#C" not in slack_text(line)
    assert line.replace("\u2060", "") == "ERROR ping <@U0CEO> and <!subteam^S0ALL> <#C0GEN> <!channel>"
    assert slack_text("asked by <@U0OPERATOR>") == "asked by <@U0OPERATOR>"  # the bot's own mention stays


def test_a_log_silent_since_before_the_launchs_oldest_process_started_counts_from_that_start():
    """A requeued Slurm job writes to the log its first run wrote: the 10 minutes since that run's last line are no
    silence of the processes running now (20 s old); an ordinary silence (the log written after they started)
    counts in full."""
    from bot.core.models import LogInfo

    la = launch()

    def probe(age_s: int, log_age_s: float) -> Snapshot:
        table = [ProcessInfo(pid=99, ppid=1, pgid=99, sid=99, stat="S", elapsed_s=age_s, args="sh"),
                 ProcessInfo(pid=100, ppid=99, pgid=99, sid=99, stat="S", elapsed_s=age_s - 1, args="python -m x")]
        return Snapshot(host="h", clock=5000.0, table=table, launch_tags={99: "3-abc", 100: "3-abc"},
                        tagged_pids=[99, 100], log=LogInfo(path="/l", tail=["loading"], mtime=5000.0 - log_age_s))

    rerun, record = observation_from_snapshot(probe(20, 600.0), la, None)
    assert rerun.log_silent_s == 20.0 and record.last_progress_t == 4980.0
    quiet, _ = observation_from_snapshot(probe(900, 600.0), la, None)
    assert quiet.log_silent_s == 600.0
