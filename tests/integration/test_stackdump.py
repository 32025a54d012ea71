"""py-spy stack dumps: a REAL deliberately blocked Python process, launched by the bot and dumped through the
StackService and `!stack` (local host), the failure modes (py-spy missing, no such process, ptrace denied,
sudo refused, timeout, non-JSON output) and the rendering within Block Kit limits."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.adapters.remote import Executor, LocalExecutor
from bot.config import Config
from bot.core.models import Launch, LaunchState
from bot.core.shell import KILL_AFTER_S
from bot.core.stackdump import (
    MISSING_MSG,
    PTRACE_MSG,
    SCRIPT_MARGIN_S,
    SUDO_REFUSED_MSG,
    Frame,
    ProcessDump,
    ThreadDump,
    check_pids,
    dump_script,
    finish_dumps,
    full_text,
    parse_dump_output,
    script_budget_s,
    summarize,
)
from bot.present.render import MAX_BLOCKS, MAX_HEADER_TEXT, MAX_MESSAGE_TEXT, MAX_SECTION_TEXT
from bot.present.stackdump import stack_dump_message, stackdump_context
from bot.services.stacks import StackDump
from tests.support.bots import TestBot
from tests.support.builders import OPERATOR
from tests.support.names import renderer
from tests.support.procs import wait_log, wait_until

pytestmark = pytest.mark.timeout(60)

VENV_BIN = Path(sys.executable).parent
PY_SPY = VENV_BIN / "py-spy"
RENDERER = renderer()

BLOCKED = textwrap.dedent("""\
    import threading
    import time

    lock = threading.Lock()
    held = threading.Event()


    def hold_lock_forever():
        lock.acquire()
        held.set()
        time.sleep(3600)


    def blocked_on_lock():
        with lock:  # LOCK LINE
            pass


    def main_sleep():
        threading.Thread(target=hold_lock_forever, name="holder", daemon=True).start()
        held.wait()
        threading.Thread(target=blocked_on_lock, name="blocked-worker", daemon=True).start()
        print("ready", flush=True)
        time.sleep(3600)


    main_sleep()
""")
LOCK_LINE = next(i for i, line in enumerate(BLOCKED.splitlines(), 1) if "LOCK LINE" in line)


def needs_py_spy() -> None:
    if not PY_SPY.is_file():
        pytest.skip(f"py-spy is not installed in the venv ({PY_SPY})")


def fake_tool(directory: Path, name: str, body: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def gone_pid() -> int:
    """A pid that certainly does not exist: a child that has exited and been reaped."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def alive(pid: int) -> bool:
    """True while /proc/<pid> exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# ----------------------------------------------------------------------------------------- a bot that dumps


def stack_config(tmp_path: Path, fake_gpu, *, py_spy: str = "py-spy", sudo: bool = False) -> Config:
    """Local host `me` (py-spy as `py_spy`, through `sudo -n` when `sudo`) and variants to dump: `blocked` (the
    BLOCKED script), `sleeper` (one `sleep`: not a Python process) and `pair` (two `sleep`s in one session)."""
    script = tmp_path / "blocked_target.py"
    script.write_text(BLOCKED)
    pair = tmp_path / "pair.sh"
    pair.write_text("sleep 3600 &\nexec sleep 3600\n")
    log = str(tmp_path / "logs" / "{{ variant }}-{{ launch_id }}.log")
    commands = {
        "blocked": f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}",
        "sleeper": "sleep 3600",
        "pair": f"sh {shlex.quote(str(pair))}",
    }
    return Config.model_validate({
        "hosts": {"me": {"local": True, "use_nvml": False, "nvidia_smi": str(fake_gpu.nvidia_smi),
                         "py_spy": py_spy, "py_spy_sudo": sudo, "log_dirs": [str(tmp_path)]}},
        "variants": {name: {"host": "me", "command": cmd, "log": log, "gpus": []} for name, cmd in commands.items()},
        "state_dir": str(tmp_path / "state"),
        "permissions": {"operators": [OPERATOR]},
    })


StackBotFactory = Callable[..., Awaitable[TestBot]]


@pytest.fixture
def stack_bot(make_bot, tmp_path, fake_gpu) -> StackBotFactory:
    """`await stack_bot(py_spy=..., sudo=..., extra_path=[...])`: a bot on `stack_config`; `extra_path` goes
    first on the local host's PATH. make_bot's finalizer kills every process its launches left."""

    async def start(*, py_spy: str = "py-spy", sudo: bool = False, extra_path: list[Path] | None = None) -> TestBot:
        return await make_bot(stack_config(tmp_path, fake_gpu, py_spy=py_spy, sudo=sudo),
                              extra_path=[str(p) for p in extra_path or []])

    return start


async def launch_pids(bot: TestBot, la: Launch) -> list[int]:
    """The live processes of `la` as the stack service dumps them (one probe): its wrapper shell left out."""
    snap = await bot.runtime.launches.probe_launch(la, tail_lines=1)
    return sorted(p.pid for p in bot.runtime.launches.launch_processes_of(la, snap) if p.pid != la.pgid)


async def launch(bot: TestBot, variant: str, *, processes: int = 1) -> Launch:
    """`/launch VARIANT` in the chat; returns the launch once `processes` of its processes run."""
    answer = await bot.chat.say(f"/launch {variant}")
    assert answer is not None
    (la,) = bot.runtime.launches.live() or [None]
    assert la is not None, answer.text
    assert la.variant == variant and la.state == LaunchState.RUNNING, answer.text

    async def started() -> bool:
        return len(await launch_pids(bot, la)) == processes

    await wait_until(started, what=f"{processes} processes of {la.name}")
    return la


async def dump(bot: TestBot, la: Launch, *, native: bool = False, timeout_s: int = 20) -> StackDump:
    """The stack service's dump of `la` (what `!stack` shows)."""
    return await bot.runtime.stacks.dump(la, native=native, user=OPERATOR, channel="C1", timeout_s=timeout_s)


async def run_dump_script(executor: Executor, pids: list[int], *, native: bool = False,
                          timeout_s: int = 20) -> list[ProcessDump]:
    """The dump script for pids the test picks (gone ones, duplicates), run as StackService.dump runs it."""
    pid_list = check_pids(pids)
    script = dump_script(pid_list, native=native, timeout_s=timeout_s)
    res = await executor.run("sh -s", input=script.encode(), timeout_s=script_budget_s(len(pid_list), timeout_s))
    return finish_dumps(pid_list, res.stdout, res.stderr, res.exit_status, res.exit_signal)


@pytest.fixture
def blocked_process(tmp_path):
    """The BLOCKED script started directly (not by a bot), in its own session; killed at teardown."""
    script = tmp_path / "blocked_direct.py"
    script.write_text(BLOCKED)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()


# ----------------------------------------------------------------------------------------- real dumps


async def test_real_dump_of_a_blocked_launch(stack_bot):
    needs_py_spy()
    bot = await stack_bot(py_spy=str(PY_SPY))
    la = await launch(bot, "blocked")
    await wait_log(la.log_path, "ready")

    async def worker_on_the_lock() -> ProcessDump | None:
        [d] = (await dump(bot, la, timeout_s=10)).dumps
        if not d.ok and d.error == PTRACE_MSG:
            return d
        assert d.ok, d.error
        worker = next((t for t in d.threads if t.name == "blocked-worker"), None)
        return d if worker and worker.frames and worker.frames[0].name == "blocked_on_lock" else None

    d = await wait_until(worker_on_the_lock, 30, what="the worker thread to block on the lock", every=0.2)
    if not d.ok:
        pytest.skip("py-spy cannot attach here (ptrace not permitted: Yama ptrace_scope or no SYS_PTRACE)")

    assert d.pid == la.pid
    by_name = {t.name: t for t in d.threads}
    assert set(by_name) == {"MainThread", "holder", "blocked-worker"}
    worker, holder, main = by_name["blocked-worker"], by_name["holder"], by_name["MainThread"]
    # innermost first: the blocked worker sits on the `with lock:` line
    assert worker.frames[0].name == "blocked_on_lock"
    assert worker.frames[0].file == "blocked_target.py" and worker.frames[0].line == LOCK_LINE
    assert worker.frames[0].path is not None and worker.frames[0].path.endswith("blocked_target.py")
    assert holder.frames[0].name == "hold_lock_forever"
    assert [f.name for f in main.frames[:2]] == ["main_sleep", "<module>"]
    assert main.os_thread_id == la.pid
    assert not worker.active and not worker.owns_gil and worker.state == "idle"
    assert [t.os_thread_id for t in d.threads] == sorted(t.os_thread_id for t in d.threads)

    lines = summarize([d])
    assert lines[0].startswith(f"pid {la.pid}: 3 threads")
    assert f"    blocked_on_lock (blocked_target.py:{LOCK_LINE})" in lines
    assert any(line.startswith("  Thread ") and '"blocked-worker" (idle)' in line for line in lines)
    assert "    main_sleep (blocked_target.py:" in "\n".join(lines)
    text = full_text([d])
    assert f"blocked_on_lock ({worker.frames[0].path}:{LOCK_LINE})" in text
    assert "Thread._bootstrap" in text  # every frame, not just the top 3

    # the same through the chat: `!stack` in the launch's thread, the full dump attached
    answer = await bot.chat.say("!stack", thread=bot.chat.thread_of(la.id))
    assert answer is not None and answer.post is not None
    assert answer.audit == "ok" and answer.thread == la.thread_ts
    msg = answer.post.current
    assert f"blocked_on_lock (blocked_target.py:{LOCK_LINE})" in json.dumps(msg.blocks)
    assert msg.files and msg.files[0][0] == "stackdump-me.txt"
    assert f"blocked_on_lock ({worker.frames[0].path}:{LOCK_LINE})".encode() in msg.files[0][1]
    assert_block_kit_limits(msg)
    events = bot.events("stack_dump")
    assert events and all(e.result == "ok" and e.launch_id == la.id for e in events)
    assert events[-1].args["pids"] == [la.pid]


async def test_real_native_dump_of_a_launch(stack_bot):
    needs_py_spy()
    bot = await stack_bot(py_spy=str(PY_SPY))
    la = await launch(bot, "blocked")
    await wait_log(la.log_path, "ready")
    [d] = (await dump(bot, la, native=True, timeout_s=10)).dumps
    if d.error == PTRACE_MSG:
        pytest.skip("py-spy cannot attach here (ptrace not permitted)")
    if not d.ok and "native" in (d.error or "").lower():
        pytest.skip(f"--native is not supported here: {d.error}")
    assert d.ok, d.error
    names = [f.name for t in d.threads for f in t.frames]
    assert "blocked_on_lock" in names and "main_sleep" in names


async def test_mixed_pids_are_dumped_once_each_in_order(blocked_process):
    needs_py_spy()
    missing = gone_pid()
    dumps = await run_dump_script(LocalExecutor("me", extra_path=[str(VENV_BIN)]),
                                  [blocked_process.pid, missing, blocked_process.pid], native=True, timeout_s=10)
    assert [d.pid for d in dumps] == [blocked_process.pid, missing]  # duplicates dropped, order kept
    if dumps[0].error == PTRACE_MSG:
        pytest.skip("py-spy cannot attach here (ptrace not permitted)")
    if not dumps[0].ok and "native" in (dumps[0].error or "").lower():
        pytest.skip(f"--native is not supported here: {dumps[0].error}")
    assert dumps[0].ok, dumps[0].error
    names = [f.name for t in dumps[0].threads for f in t.frames]
    assert "blocked_on_lock" in names and "main_sleep" in names
    assert dumps[1].ok is False and dumps[1].error and "no such process" in dumps[1].error


async def test_pid_that_does_not_exist_gets_a_clear_error():
    needs_py_spy()
    pid = gone_pid()
    [d] = await run_dump_script(LocalExecutor("me", extra_path=[str(VENV_BIN)]), [pid], timeout_s=10)
    assert not d.ok and d.pid == pid and d.threads == []
    assert d.error == "no such process: it is not running on the host"


async def test_a_launch_without_live_processes_is_refused(stack_bot):
    bot = await stack_bot()
    la = await launch(bot, "sleeper")
    os.kill(la.pid, signal.SIGKILL)
    await wait_until(lambda: not alive(la.pid), what=f"pid {la.pid} to exit")
    answer = await bot.chat.say(f"!stack {la.id}")
    assert answer is not None and answer.audit == "error"
    assert "no process of this launch is alive" in answer.text


async def test_not_a_python_process_gets_a_clear_error(stack_bot):
    needs_py_spy()
    bot = await stack_bot(py_spy=str(PY_SPY))
    la = await launch(bot, "sleeper")
    [d] = (await dump(bot, la, timeout_s=10)).dumps
    assert not d.ok
    assert d.error in ("not a Python process (py-spy found no Python interpreter in it)", PTRACE_MSG)


# ----------------------------------------------------------------------------------------- failure modes


async def test_missing_py_spy_by_path(stack_bot, tmp_path):
    bot = await stack_bot(py_spy=str(tmp_path / "nope" / "py-spy"))
    la = await launch(bot, "pair", processes=2)
    pids = await launch_pids(bot, la)
    sd = await dump(bot, la)
    assert [(d.pid, d.ok, d.error) for d in sd.dumps] == [(pid, False, MISSING_MSG) for pid in pids]
    assert not sd.ok
    answer = await bot.chat.say("!stack", thread=bot.chat.thread_of(la.id))
    assert answer is not None and answer.post is not None and answer.audit == "error"
    assert not answer.post.files and "py-spy is not installed on the host" in answer.text


async def test_missing_py_spy_on_path(stack_bot, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    bot = await stack_bot(py_spy="gpubot-test-no-such-py-spy", extra_path=[empty])
    la = await launch(bot, "sleeper")
    [d] = (await dump(bot, la)).dumps
    assert d.error == MISSING_MSG


async def test_permission_denied_maps_to_the_ptrace_fix(stack_bot, tmp_path):
    bin_dir = tmp_path / "bin"
    fake_tool(bin_dir, "py-spy", "echo 'Permission Denied: Try running again with elevated permissions by going "
                                 "'\\''sudo env \"PATH=$PATH\" !!'\\''' >&2; exit 1")
    bot = await stack_bot(py_spy=str(bin_dir / "py-spy"))
    la = await launch(bot, "sleeper")
    [d] = (await dump(bot, la)).dumps
    assert d.error == PTRACE_MSG


async def test_sudo_asking_for_a_password_is_reported(stack_bot, tmp_path):
    bin_dir = tmp_path / "bin"
    fake_tool(bin_dir, "py-spy", "echo '[]'")
    fake_tool(bin_dir, "sudo", textwrap.dedent("""\
        [ "$1" = -n ] || { echo "sudo called without -n" >&2; exit 2; }
        echo "sudo: a password is required" >&2
        exit 1"""))
    bot = await stack_bot(py_spy=str(bin_dir / "py-spy"), sudo=True, extra_path=[bin_dir])
    la = await launch(bot, "sleeper")
    [d] = (await dump(bot, la)).dumps
    assert d.error == SUDO_REFUSED_MSG


async def test_sudo_runs_the_resolved_py_spy_path(stack_bot, tmp_path):
    bin_dir = tmp_path / "bin"
    calls = tmp_path / "calls"
    fake_tool(bin_dir, "py-spy", f'echo "$*" >> {calls}; echo \'[{{"thread_name": "t", "os_thread_id": 7, '
                                 '"active": true, "owns_gil": true, "frames": [{"name": "f", "filename": "/a/b.py", '
                                 '"short_filename": "b.py", "line": 3}]}]\'')
    fake_tool(bin_dir, "sudo", f'echo "sudo $*" >> {calls}; [ "$1" = -n ] && shift; exec "$@"')
    bot = await stack_bot(sudo=True, extra_path=[bin_dir])  # the host's py_spy is "py-spy": found on PATH
    la = await launch(bot, "sleeper")
    [d] = (await dump(bot, la, native=True)).dumps
    assert d.ok, d.error
    assert d.threads == [ThreadDump("t", 7, True, True, [Frame("f", "b.py", 3, "/a/b.py")])]
    assert d.threads[0].state == "active+gil"
    assert calls.read_text().splitlines() == [f"sudo -n {bin_dir / 'py-spy'} dump --pid {la.pid} --json --native",
                                              f"dump --pid {la.pid} --json --native"]


@pytest.fixture
def hung_py_spy(tmp_path):
    """A fake py-spy that hangs (`sleep 3600`), writing its pid to `started`; whatever it left is killed at
    teardown (its environment carries no launch tag: the bot's finalizer would not find it)."""
    bin_dir, started = tmp_path / "hung-bin", tmp_path / "py-spy.pid"
    fake_tool(bin_dir, "py-spy", f"echo $$ > {started}; exec sleep 3600")
    yield bin_dir / "py-spy", started
    with contextlib.suppress(OSError, ValueError):
        os.kill(int(started.read_text()), signal.SIGKILL)


async def test_hung_py_spy_is_killed_and_reported(stack_bot, hung_py_spy):
    py_spy, started = hung_py_spy
    bot = await stack_bot(py_spy=str(py_spy))
    la = await launch(bot, "sleeper")
    [d] = (await dump(bot, la, timeout_s=1)).dumps  # had it waited for the sleep: the test's timeout
    assert not d.ok and d.error and d.error.startswith("py-spy did not finish within 1 s")
    pid = int(started.read_text())
    await wait_until(lambda: not alive(pid), what=f"the hung py-spy (pid {pid}) to be killed")


async def test_hung_py_spys_of_many_ranks_cost_one_timeout_not_one_each(tmp_path):
    """The dumps run at once: the script's budget is one timeout (script_budget_s), so twelve hung py-spys must
    all be reported as timed out, not cut short by the budget, as one after another would be."""
    bin_dir = tmp_path / "hung-bin"
    fake_tool(bin_dir, "py-spy", "exec sleep 3600")
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(12)]
    try:
        pids = [p.pid for p in sleepers]
        ex = LocalExecutor("me", extra_path=[str(bin_dir)])
        script = dump_script(pids, timeout_s=2, py_spy=str(bin_dir / "py-spy"))
        one_timeout = 2 + KILL_AFTER_S + 1 + SCRIPT_MARGIN_S + 1  # one after another would need 12 x 2 s
        assert script_budget_s(len(pids), 2) <= one_timeout
        res = await ex.run("sh -s", input=script.encode(), timeout_s=one_timeout)
        dumps = finish_dumps(pids, res.stdout, res.stderr, res.exit_status, res.exit_signal)
        assert [d.pid for d in dumps] == pids
        assert all(d.error and d.error.startswith("py-spy did not finish within 2 s") for d in dumps), \
            [d.error for d in dumps]
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


async def test_non_json_output_is_reported(stack_bot, tmp_path):
    bin_dir = tmp_path / "bin"
    fake_tool(bin_dir, "py-spy", "echo 'Process 1: python'; echo 'Thread 1 (idle)'")
    bot = await stack_bot(py_spy=str(bin_dir / "py-spy"))
    la = await launch(bot, "sleeper")
    [d] = (await dump(bot, la)).dumps
    assert not d.ok and d.error and "not its JSON thread list" in d.error and "Process 1" in d.error


@pytest.mark.parametrize("bad", [[], [0], [-1], ["12"], [1.5], [True], [5_000_000], "123", list(range(1, 100))])
def test_dump_script_validates_pids(bad):
    with pytest.raises(ValueError):
        dump_script(bad)


def test_dump_script_quotes_the_py_spy_path():
    s = dump_script([42, 7], sudo=True, native=True, timeout_s=5, py_spy="/opt/x y/py-spy; rm -rf /")
    assert "command -v '/opt/x y/py-spy; rm -rf /'" in s
    assert 'timeout -k 5 5 sudo -n "$PYSPY" dump --pid "$pid" --json --native' in s
    assert "for pid in 42 7; do" in s and "@@PYSPY START timeout=5 pids=42,7" in s
    assert subprocess.run(["sh", "-n"], input=s.encode(), check=False).returncode == 0


# ----------------------------------------------------------------------------------------- parser


def test_parse_cut_short_and_marker_lookalikes():
    text = "\n".join([
        "@@PYSPY START timeout=20 pids=10,11,12",
        "@@PYSPY 10 BEGIN",
        '[{"thread_name": "MainThread", "os_thread_id": 10, "active": false, "owns_gil": false, "frames": []}]',
        "@@PYSPY 10 STDERR",
        "| @@PYSPY 10 END rc=1",
        "@@PYSPY 10 END rc=0",
        "@@PYSPY 11 BEGIN",
        "[",
    ])
    d10, d11, d12 = parse_dump_output(text)
    assert d10.ok and d10.threads[0].name == "MainThread" and d10.threads[0].frames == []
    assert not d11.ok and "cut short" in (d11.error or "")
    assert not d12.ok and "cut short" in (d12.error or "")
    assert summarize([d10])[-1] == "    (no Python frames)"


MARKERS = ["@@PYSPY START timeout=20 pids=1,2", "@@PYSPY MISSING", "@@PYSPY 1 BEGIN", "@@PYSPY 1 STDERR",
           "@@PYSPY 1 END rc=0", "@@PYSPY 1 END rc=124", "@@PYSPY 2 BEGIN", "@@PYSPY 2 END rc=1",
           "@@PYSPY 99999999999999 BEGIN", "| Permission Denied", "| Error: Failed to find python version",
           "[", "]", "{}", "[{}]", '[{"frames": [{"line": "x"}, 3, {"name": null}]}]', "null", "[" * 3000,
           '[{"thread_name": 5, "os_thread_id": "x", "frames": {}}]', "1" * 5000, "\x00", "\r"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(), st.lists(st.one_of(st.sampled_from(MARKERS), st.text(max_size=40)), max_size=30)
                 .map("\n".join)))
def test_parse_never_raises(text):
    dumps = parse_dump_output(text)
    assert isinstance(dumps, list)
    for d in dumps:
        assert isinstance(d, ProcessDump) and isinstance(d.pid, int)
        assert d.ok or d.error
    summarize(dumps)
    full_text(dumps)
    stack_dump_message(RENDERER, "me", dumps)


# ----------------------------------------------------------------------------------------- rendering


def assert_block_kit_limits(msg):
    assert msg.blocks is not None and 0 < len(msg.blocks) <= MAX_BLOCKS
    assert len(msg.text) <= MAX_MESSAGE_TEXT
    for b in msg.blocks:
        assert b["type"] in ("header", "section", "context")
        if b["type"] == "header":
            assert b["text"]["type"] == "plain_text" and len(b["text"]["text"]) <= MAX_HEADER_TEXT
        if b["type"] == "section":
            assert len(b["text"]["text"]) <= MAX_SECTION_TEXT
        if b["type"] == "context":
            assert all(len(e["text"]) <= MAX_SECTION_TEXT for e in b["elements"])


def big_dump(pid: int, threads: int = 120) -> ProcessDump:
    frames = [Frame(f"fn_{i}_<&>" + "x" * 100, f"pkg/mod_{i}.py", i + 1, f"/srv/pkg/mod_{i}.py") for i in range(30)]
    return ProcessDump(pid, True, [ThreadDump(f"worker-{i} ```@channel```", 1000 + i, i % 7 == 0, i == 3, frames)
                                   for i in range(threads)])


# Redacting the ~1 MB attached text dominates (full_text redacts, then stack_dump_message again): 10-20 s
# here, more on a loaded machine.
@pytest.mark.timeout(240)
def test_render_stays_within_block_kit_limits_and_attaches_the_full_dump():
    dumps = [big_dump(100 + i) for i in range(8)] + [ProcessDump(9, False, error=PTRACE_MSG)]
    msg = RENDERER.render("stackdump", **stackdump_context("gpu-host-1" * 30, dumps, native=True))
    assert_block_kit_limits(msg)
    assert msg.files  # cut, so render attached the full text
    full = stack_dump_message(RENDERER, "gpu-host-1", dumps)
    assert_block_kit_limits(full)
    assert [name for name, _ in full.files] == ["stackdump-gpu-host-1.txt"]
    body = full.files[0][1].decode()
    assert "fn_29_<&>" in body and "/srv/pkg/mod_29.py:30" in body  # every frame, full paths, unescaped
    blocks = json.dumps(full.blocks)
    assert "&lt;&amp;&gt;" in blocks and "<&>" not in blocks  # remote text escaped for mrkdwn
    assert "`\u200b``" in json.loads(blocks)[2]["text"]["text"]  # thread names cannot close the code block


def test_render_small_summary():
    dumps = [ProcessDump(42, True, [ThreadDump("MainThread", 42, False, False,
                                               [Frame("wait", "threading.py", 320), Frame("serve", "srv.py", 9),
                                                Frame("main", "srv.py", 20), Frame("<module>", "srv.py", 30)])]),
             ProcessDump(43, False, error=SUDO_REFUSED_MSG)]
    msg = RENDERER.render("stackdump", **stackdump_context("h1", dumps))
    assert_block_kit_limits(msg)
    assert not msg.files
    assert msg.blocks[0] == {"type": "header", "text": {"type": "plain_text", "text": "Stack dump: h1: 1/2 dumped"}}
    assert msg.blocks[1]["text"]["text"] == ":mag: *pid 42*: 1 thread, 0 active, no thread holds the GIL"
    assert msg.blocks[2]["text"]["text"] == ('```  Thread 42 "MainThread" (idle)\n    wait (threading.py:320)\n'
                                             "    serve (srv.py:9)\n    main (srv.py:20)\n    … 1 more frame```")
    assert msg.blocks[3]["text"]["text"] == f":x: *pid 43*: {SUDO_REFUSED_MSG}"
    assert msg.text.splitlines()[0] == "Stack dump on h1: 1 of 2 processes dumped"
    assert "pid 43: sudo -n refused: add a NOPASSWD sudoers entry for py-spy dump" in msg.text
