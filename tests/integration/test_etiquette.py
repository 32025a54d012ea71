"""Slack etiquette and the small things, as chat transcripts: denials and usage errors to the asker alone,
answers that say who asked, `/gpu NOSUCHHOST`, `/gpu logs 3`, one bot per state directory, `--version`, and
the console's attachments folder."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.adapters.statelock import StateDirLocked, StateLock
from bot.cli import main
from bot.console import ConsoleSurface
from bot.present.render import Message
from bot.wiring import build_runtime
from tests.support.builders import VIEWER
from tests.support.procs import wait_log

pytestmark = pytest.mark.timeout(240)


async def test_a_denial_and_a_usage_error_go_to_the_asker_alone(bot):
    denied = await bot.chat.say("/launch base", user=VIEWER)
    assert "Permission denied" in denied.text and denied.post.ephemeral_to == VIEWER
    usage = await bot.chat.say("/gpu logs 1 2 3")
    assert usage.audit == "invalid" and usage.post.ephemeral_to == bot.chat.user
    unknown = await bot.chat.say("/gpu frobnicate")
    assert unknown.post.ephemeral_to == bot.chat.user
    # answers for everyone stay in the channel, and say who asked (a slash command leaves no message)
    status = await bot.chat.say("/gpu status")
    assert status.post.ephemeral_to is None and status.text.endswith(f"(asked by <@{bot.chat.user}>)")
    assert status.post.blocks[-1]["elements"][0]["text"] == f"<@{bot.chat.user}> asked: `/gpu status`"


async def test_an_unknown_host_is_answered_with_the_host_list(bot):
    answer = await bot.chat.say("/gpu NOSUCHHOST")
    assert answer.text.startswith("Unknown host or command: 'NOSUCHHOST'. Hosts: gpu-host-1.")
    assert answer.audit == "unknown"
    assert len(answer.text.splitlines()) <= 3 and "/gpu status" in answer.text  # the host list, not the whole help
    garbage = await bot.chat.say("/gpu %%%")  # not even a name: a usage error, to the asker alone
    assert "Try `/gpu help`" in garbage.text and garbage.post.ephemeral_to == bot.chat.user


async def test_gpu_logs_with_a_lone_number_names_the_launch_outside_its_thread(bot):
    await bot.chat.say("/launch base mode=hang workers=1")
    la = bot.launch(1)
    await wait_log(la.log_path, "Load weight end")
    outside = await bot.chat.say("/gpu logs 1")
    assert "(base#1;" in outside.text and "Load weight end" in outside.text, outside.text
    assert outside.text.startswith("Last ") and not outside.text.startswith("Last 1 lines"), outside.text
    inside = await bot.chat.say("!logs 1", thread=la.thread_ts)  # in the thread: 1 line
    assert inside.text.startswith("Last 1 lines of") and "(base#1;" in inside.text, inside.text


async def test_one_bot_per_state_directory(gpu_config, tmp_path):
    holder = StateLock(gpu_config.state_dir).acquire()
    try:
        with pytest.raises(StateDirLocked) as e:
            build_runtime(gpu_config, surface=ConsoleSurface(io.StringIO()))
        assert f"pid {os.getpid()}" in str(e.value) and gpu_config.state_dir in str(e.value)
    finally:
        holder.release()
    rt = build_runtime(gpu_config, surface=ConsoleSurface(io.StringIO()))  # free again: it starts
    try:
        with pytest.raises(StateDirLocked):
            StateLock(gpu_config.state_dir).acquire()
    finally:
        await rt.close()
    StateLock(gpu_config.state_dir).acquire().release()  # closing gave it back


def test_version():
    out = CliRunner().invoke(main, ["--version"])
    assert out.exit_code == 0 and out.output.startswith("gpubot ") and out.output.strip().split()[-1][0].isdigit()


async def test_the_console_saves_attachments_to_a_folder_it_prints(tmp_path):
    out = io.StringIO()
    surface = ConsoleSurface(out, attach_dir=tmp_path / "att")
    await surface.post("console", Message(text="a chart", files=[("../../etc/timeline.png", b"\x89PNG...")]))
    await surface.upload("console", "stack dump.txt", b"Thread 1")
    printed = out.getvalue()
    saved = sorted((tmp_path / "att").iterdir())
    assert [p.read_bytes() for p in saved] == [b"\x89PNG...", b"Thread 1"]
    assert all(str(p) in printed for p in saved) and all(p.parent == tmp_path / "att" for p in saved)


async def test_a_bare_wait_in_the_console_gets_its_usage(gpu_config):
    from bot.console import run_command_line

    out = io.StringIO()
    rt = build_runtime(gpu_config, surface=ConsoleSurface(out))
    try:
        for line in ("wait", "wait abc", "wait 1 2"):
            assert await run_command_line(line, rt) is True
        assert out.getvalue().count("usage: wait SECONDS") == 3 and "Unknown" not in out.getvalue()
    finally:
        await rt.close()


@pytest.mark.parametrize("fault", ["corrupted database", "a malformed page", "state_dir is a file",
                                   "state_dir under a file"])
def test_an_unusable_database_or_state_directory_is_one_clear_line_and_exit_2(tmp_path, fault):
    import subprocess
    import sys

    from bot.demo.run import write_try_config

    config = write_try_config(str(tmp_path / "try"))
    state = tmp_path / "try" / "state"
    state.parent.mkdir(exist_ok=True)
    if fault == "corrupted database":
        state.mkdir()
        (state / "gpubot.db").write_bytes(os.urandom(40_000))
        named = str(state / "gpubot.db")
    elif fault == "a malformed page":  # a real database with one of its pages overwritten
        from bot.adapters.store import Store

        state.mkdir()
        store = Store(f"sqlite:///{state / 'gpubot.db'}")
        for i in range(300):
            store.events.add(user_id="U1", action="command:status", args={"i": i, "pad": "x" * 200}, result="ok",
                             detail=None, launch_id=None, host=None, channel="C1")
        store.close()
        with open(state / "gpubot.db", "r+b") as f:
            f.seek(4096 * 3)
            f.write(b"\xff" * 4096)
        named = str(state / "gpubot.db")
    elif fault == "state_dir is a file":
        state.write_text("not a directory\n")
        named = str(state)
    else:
        state.write_text("a file\n")
        text = Path(config).read_text().replace(f"state_dir: {state}", f"state_dir: {state}/inner")
        Path(config).write_text(text)
        named = f"{state} is not a directory"  # the file in the way, not the directory that cannot be made
    assert f"state_dir: {state}" in Path(config).read_text()
    proc = subprocess.run([sys.executable, "-m", "bot.cli", "console", "--config", str(config)], input="/help\n",
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


async def test_a_launch_while_the_database_is_locked_says_so_and_starts_nothing(make_bot, gpu_config):
    import sqlite3

    bot = await make_bot(gpu_config)
    holder = sqlite3.connect(bot.runtime.store.db.path, timeout=0, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        answer = await bot.chat.say("/launch base workers=1")
    finally:
        holder.rollback()
        holder.close()
    assert answer.text.startswith("Database unavailable"), answer.text
    assert "database is locked" in answer.text and "Try again" in answer.text
    assert bot.runtime.store.launches.get(1) is None  # nothing recorded, so nothing was started
    again = await bot.chat.say("/launch base workers=1")
    assert "Launched base#1" in again.text, again.text
