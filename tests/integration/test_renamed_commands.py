"""An install with every slash command renamed and its own thread prefix suggests only its own commands: in its
answers, its launches' root messages and its alerts (commands as data: bot.core.commands)."""

from __future__ import annotations

import io
import re

import pytest

from bot.config import Config
from bot.console import console_runtime, run_command_line
from tests.support.builders import FAST_WATCH, launch_config
from tests.support.procs import kill_launches, wait_log, wait_until

pytestmark = pytest.mark.timeout(240)

RENAMED = {"gpu": "/gpu-staging", "gpubot": "/gpubot-staging", "kill": "/kill-staging", "probe": "/probe-staging",
           "launch": "/launch-staging", "relaunch": "/relaunch-staging"}
#: A default install's command names as a person would type them: a slash command (not `/gpu-staging`, not a
#: path such as `/tmp/kill`) or a thread command with the default `!` prefix.
DEFAULT_SLASH = re.compile(r"(?<![\w/.-])/(?:gpu|gpubot|kill|probe|launch|relaunch)(?![\w/.-])")
DEFAULT_THREAD = re.compile(r"(?<![\w!])!(?:probe|logs|kill|relaunch|snooze|chart|bundle|stack|confirm|cancel|help|"
                            r"status|gpu)\b")


def staging_config(ssh_server, fake_gpu, tmp_path) -> Config:
    data = launch_config(ssh_server, fake_gpu, tmp_path).model_dump()
    data["slack"] = {"slash_commands": RENAMED, "bot_name": "gpubot-staging", "command_prefix": "?"}
    return Config.model_validate(data)


def defaults_named(text: str) -> list[str]:
    """Every default command name in `text`."""
    return DEFAULT_SLASH.findall(text) + DEFAULT_THREAD.findall(text)


async def test_a_renamed_install_names_no_default_command_in_a_console_session(ssh_server, fake_gpu, tmp_path):
    out = io.StringIO()
    runtime = console_runtime(staging_config(ssh_server, fake_gpu, tmp_path), out,
                              watch_policy=FAST_WATCH, poll_s=0.2, start_check_s=0.5)
    await runtime.start(watch=False)
    answers: dict[str, str] = {}

    async def run(line: str) -> str:
        start = len(out.getvalue())
        assert await run_command_line(line, runtime)
        answers[line] = out.getvalue()[start:]
        return answers[line]

    try:
        launched = await run("/launch-staging base mode=hang workers=1")
        assert "Launched base#1" in launched, launched
        # the root message's own list of commands, in this install's words
        # (the console has no threads: each names its launch)
        assert "?probe #1 · ?logs #1 200 · ?kill #1 · ?relaunch #1" in out.getvalue(), out.getvalue()
        assert "`/probe-staging 1` · `/gpu-staging logs 1 200` · `/kill-staging 1`" in out.getvalue()
        la = runtime.launches.get(1)
        await wait_log(la.log_path, "Load weight end")
        await runtime.watcher.start()  # the hang alert, with its next steps
        await wait_until(lambda: "silent_hang" in out.getvalue(), 120, what="the hang alert")
        unknown_host = await run("/gpu-staging nosuchhost")
        assert "Unknown host or command" in unknown_host and "/gpu-staging help" in unknown_host, unknown_host
        ask = await run("/kill-staging 1")
        assert "`/kill-staging 1 --yes`" in ask and "`?confirm 1`" in ask and "`?cancel 1`" in ask, ask
        assert "Buttons, typed here: [Kill] ?confirm 1 · [Cancel] ?cancel 1" in ask, ask
        refused = await run("/launch-staging base")
        assert "`/kill-staging 1` or `/relaunch-staging 1` first" in refused, refused
        snoozed = await run("?snooze 1 15")
        assert "Snoozed" in snoozed or "snoozed" in snoozed, snoozed
        relaunched = await run("/relaunch-staging 1")
        assert "Launched base#2" in relaunched, relaunched
        helped = await run("/gpubot-staging")
        assert "/gpu-staging status [HOST...|all]" in helped and "/kill-staging [LAUNCH|VARIANT]" in helped, helped
        assert "?logs [N] in a launch thread, or /gpu-staging logs LAUNCH [N]" in helped, helped
        unknown_variant = await run("/launch-staging nosuchvariant")
        assert "nosuchvariant" in unknown_variant and "/launch-staging VARIANT" in unknown_variant, unknown_variant
        bad = await run("?kill 2 3")
        assert "/kill-staging [LAUNCH|VARIANT]" in bad, bad
        for line, text in answers.items():
            assert not defaults_named(text), (line, defaults_named(text), text)
        assert not defaults_named(out.getvalue()), defaults_named(out.getvalue())
        # the session did what it says: base#2 is live, base#1 ended by the relaunch
        assert runtime.launches.get(2).live and not runtime.launches.get(1).live
    finally:
        kill_launches(runtime.store.launches.recent())
        await runtime.close()


def test_the_default_pattern_finds_default_names_and_not_renamed_ones():
    """The test above could fail: its pattern finds a default install's commands in text."""
    assert defaults_named("try `/kill 1` or !logs 200, then /gpu status") == ["/kill", "/gpu", "!logs"]
    assert defaults_named("try `/kill-staging 1` or ?logs 200, /gpu-staging status, /tmp/kill, a!probe") == []
