"""py-spy stack dumps: a REAL deliberately blocked Python process dumped through the LocalExecutor, the
failure modes (py-spy missing, no such process, ptrace denied, sudo refused, timeout, non-JSON output) and
the rendering within Block Kit limits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.adapters.remote import LocalExecutor
from bot.core.stackdump import (
    MISSING_MSG,
    PTRACE_MSG,
    SUDO_REFUSED_MSG,
    Frame,
    ProcessDump,
    ThreadDump,
    dump_script,
    full_text,
    parse_dump_output,
    render_stack_dump,
    stackdump_context,
    summarize,
    take_stack_dump,
)
from bot.present.render import MAX_BLOCKS, MAX_HEADER_TEXT, MAX_MESSAGE_TEXT, MAX_SECTION_TEXT, render

pytestmark = pytest.mark.timeout(60)

VENV_BIN = Path(sys.executable).parent
PY_SPY = VENV_BIN / "py-spy"

BLOCKED = textwrap.dedent("""\
    import threading
    import time

    lock = threading.Lock()


    def hold_lock_forever():
        lock.acquire()
        time.sleep(3600)


    def blocked_on_lock():
        with lock:  # LOCK LINE
            pass


    def main_sleep():
        threading.Thread(target=hold_lock_forever, name="holder", daemon=True).start()
        time.sleep(0.2)
        threading.Thread(target=blocked_on_lock, name="blocked-worker", daemon=True).start()
        print("ready", flush=True)
        time.sleep(3600)


    main_sleep()
""")
LOCK_LINE = next(i for i, line in enumerate(BLOCKED.splitlines(), 1) if "LOCK LINE" in line)


@pytest.fixture
def blocked_process(tmp_path):
    """A Python process with a thread blocked on a threading.Lock and the main thread in time.sleep;
    killed by PID at teardown."""
    script = tmp_path / "blocked_target.py"
    script.write_text(BLOCKED)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()


def local(*extra: Path) -> LocalExecutor:
    return LocalExecutor("me", extra_path=[str(p) for p in extra])


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


# ----------------------------------------------------------------------------------------- real dumps


async def test_real_dump_of_a_blocked_process(blocked_process):
    if not PY_SPY.is_file():
        pytest.skip(f"py-spy is not installed in the venv ({PY_SPY})")
    ex = local(VENV_BIN)
    deadline = time.monotonic() + 15
    while True:
        [dump] = await take_stack_dump(ex, [blocked_process.pid], timeout_s=10)
        if not dump.ok and dump.error == PTRACE_MSG:
            pytest.skip("py-spy cannot attach here (ptrace not permitted: Yama ptrace_scope or no SYS_PTRACE)")
        assert dump.ok, dump.error
        by_name = {t.name: t for t in dump.threads}
        worker = by_name.get("blocked-worker")
        if (worker and worker.frames and worker.frames[0].name == "blocked_on_lock") or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)  # the worker has not reached the lock yet

    assert dump.pid == blocked_process.pid
    assert set(by_name) == {"MainThread", "holder", "blocked-worker"}
    worker, holder, main = by_name["blocked-worker"], by_name["holder"], by_name["MainThread"]
    # innermost first: the blocked worker sits on the `with lock:` line
    assert worker.frames[0].name == "blocked_on_lock"
    assert worker.frames[0].file == "blocked_target.py" and worker.frames[0].line == LOCK_LINE
    assert worker.frames[0].path is not None and worker.frames[0].path.endswith("blocked_target.py")
    assert holder.frames[0].name == "hold_lock_forever"
    assert [f.name for f in main.frames[:2]] == ["main_sleep", "<module>"]
    assert main.os_thread_id == blocked_process.pid
    assert not worker.active and not worker.owns_gil and worker.state == "idle"
    assert [t.os_thread_id for t in dump.threads] == sorted(t.os_thread_id for t in dump.threads)

    lines = summarize([dump])
    assert lines[0].startswith(f"pid {blocked_process.pid}: 3 threads")
    assert f"    blocked_on_lock (blocked_target.py:{LOCK_LINE})" in lines
    assert any(line.startswith("  Thread ") and '"blocked-worker" (idle)' in line for line in lines)
    assert "    main_sleep (blocked_target.py:" in "\n".join(lines)
    text = full_text([dump])
    assert f"blocked_on_lock ({worker.frames[0].path}:{LOCK_LINE})" in text
    assert "Thread._bootstrap" in text  # every frame, not just the top 3

    msg = render_stack_dump("me", [dump])
    assert msg.ok and f"blocked_on_lock (blocked_target.py:{LOCK_LINE})" in json.dumps(msg.blocks)
    assert msg.files and msg.files[0][0] == "stackdump-me.txt"
    assert f"blocked_on_lock ({worker.frames[0].path}:{LOCK_LINE})".encode() in msg.files[0][1]
    assert_block_kit_limits(msg)


async def test_real_native_dump_and_mixed_pids(blocked_process):
    if not PY_SPY.is_file():
        pytest.skip(f"py-spy is not installed in the venv ({PY_SPY})")
    missing = gone_pid()
    dumps = await take_stack_dump(local(VENV_BIN), [blocked_process.pid, missing, blocked_process.pid],
                                  native=True, timeout_s=10)
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
    if not PY_SPY.is_file():
        pytest.skip(f"py-spy is not installed in the venv ({PY_SPY})")
    pid = gone_pid()
    [dump] = await take_stack_dump(local(VENV_BIN), [pid], timeout_s=10)
    assert not dump.ok and dump.pid == pid and dump.threads == []
    assert dump.error == "no such process: it is not running on the host"


async def test_not_a_python_process_gets_a_clear_error():
    if not PY_SPY.is_file():
        pytest.skip(f"py-spy is not installed in the venv ({PY_SPY})")
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        [dump] = await take_stack_dump(local(VENV_BIN), [proc.pid], timeout_s=10)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
    assert not dump.ok
    assert dump.error in ("not a Python process (py-spy found no Python interpreter in it)", PTRACE_MSG)


# ----------------------------------------------------------------------------------------- failure modes


async def test_missing_py_spy_by_path(tmp_path):
    dumps = await take_stack_dump(local(tmp_path), [os.getpid(), 1], py_spy=str(tmp_path / "nope" / "py-spy"))
    assert [(d.pid, d.ok, d.error) for d in dumps] == [(os.getpid(), False, MISSING_MSG), (1, False, MISSING_MSG)]
    msg = render_stack_dump("me", dumps)
    assert not msg.ok and not msg.files and "py-spy is not installed on the host" in msg.text


async def test_missing_py_spy_on_path(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    [dump] = await take_stack_dump(local(empty), [os.getpid()], py_spy="gpubot-test-no-such-py-spy")
    assert dump.error == MISSING_MSG


async def test_permission_denied_maps_to_the_ptrace_fix(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_tool(bin_dir, "py-spy", "echo 'Permission Denied: Try running again with elevated permissions by going "
                                 "'\\''sudo env \"PATH=$PATH\" !!'\\''' >&2; exit 1")
    [dump] = await take_stack_dump(local(bin_dir), [os.getpid()], py_spy=str(bin_dir / "py-spy"))
    assert dump.error == PTRACE_MSG


async def test_sudo_asking_for_a_password_is_reported(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_tool(bin_dir, "py-spy", "echo '[]'")
    fake_tool(bin_dir, "sudo", textwrap.dedent("""\
        [ "$1" = -n ] || { echo "sudo called without -n" >&2; exit 2; }
        echo "sudo: a password is required" >&2
        exit 1"""))
    [dump] = await take_stack_dump(local(bin_dir), [os.getpid()], sudo=True, py_spy=str(bin_dir / "py-spy"))
    assert dump.error == SUDO_REFUSED_MSG


async def test_sudo_runs_the_resolved_py_spy_path(tmp_path):
    bin_dir = tmp_path / "bin"
    calls = tmp_path / "calls"
    fake_tool(bin_dir, "py-spy", f'echo "$*" >> {calls}; echo \'[{{"thread_name": "t", "os_thread_id": 7, '
                                 '"active": true, "owns_gil": true, "frames": [{"name": "f", "filename": "/a/b.py", '
                                 '"short_filename": "b.py", "line": 3}]}]\'')
    fake_tool(bin_dir, "sudo", f'echo "sudo $*" >> {calls}; [ "$1" = -n ] && shift; exec "$@"')
    [dump] = await take_stack_dump(local(bin_dir), [1234], sudo=True, native=True)
    assert dump.ok, dump.error
    assert dump.threads == [ThreadDump("t", 7, True, True, [Frame("f", "b.py", 3, "/a/b.py")])]
    assert dump.threads[0].state == "active+gil"
    assert calls.read_text().splitlines() == [f"sudo -n {bin_dir / 'py-spy'} dump --pid 1234 --json --native",
                                              "dump --pid 1234 --json --native"]


async def test_hung_py_spy_is_killed_and_reported(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_tool(bin_dir, "py-spy", "exec sleep 30")
    start = time.monotonic()
    [dump] = await take_stack_dump(local(bin_dir), [os.getpid()], timeout_s=1)
    assert time.monotonic() - start < 10
    assert not dump.ok and dump.error and dump.error.startswith("py-spy did not finish within 1 s")


async def test_non_json_output_is_reported(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_tool(bin_dir, "py-spy", "echo 'Process 1: python'; echo 'Thread 1 (idle)'")
    [dump] = await take_stack_dump(local(bin_dir), [os.getpid()])
    assert not dump.ok and dump.error and "not its JSON thread list" in dump.error and "Process 1" in dump.error


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
    render_stack_dump("me", dumps)


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


def test_render_stays_within_block_kit_limits_and_attaches_the_full_dump():
    dumps = [big_dump(100 + i) for i in range(8)] + [ProcessDump(9, False, error=PTRACE_MSG)]
    msg = render("stackdump", **stackdump_context("gpu-host-1" * 30, dumps, native=True))
    assert_block_kit_limits(msg)
    assert msg.files  # cut, so render attached the full text
    full = render_stack_dump("gpu-host-1", dumps)
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
    msg = render("stackdump", **stackdump_context("h1", dumps))
    assert_block_kit_limits(msg)
    assert not msg.files
    assert msg.blocks[0] == {"type": "header", "text": {"type": "plain_text", "text": "Stack dump: h1: 1/2 dumped"}}
    assert msg.blocks[1]["text"]["text"] == ":mag: *pid 42*: 1 thread, 0 active, no thread holds the GIL"
    assert msg.blocks[2]["text"]["text"] == ('```  Thread 42 "MainThread" (idle)\n    wait (threading.py:320)\n'
                                             "    serve (srv.py:9)\n    main (srv.py:20)\n    … 1 more frame```")
    assert msg.blocks[3]["text"]["text"] == f":x: *pid 43*: {SUDO_REFUSED_MSG}"
    assert msg.text.splitlines()[0] == "Stack dump on h1: 1 of 2 processes dumped"
    assert "pid 43: sudo -n refused: add a NOPASSWD sudoers entry for py-spy dump" in msg.text
