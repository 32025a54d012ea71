"""One pipeline for every route: a click is a command like any other (one role check, one audit row), the
console can do what a button does, every route gives a command the same meaning, and a button acts on the
launch it was made for."""

from __future__ import annotations

import io
import json

import pytest

from bot.config import Config
from bot.console import ConsoleSurface, run_command_line
from bot.core.models import LaunchState
from bot.wiring import build_runtime
from handlers import Request, filters
from tests.support.builders import FAST_WATCH, OTHER_OPERATOR, VIEWER, launch_config
from tests.support.procs import kill_launches, pids_of_launch, wait_log

pytestmark = pytest.mark.timeout(240)


def count_role_checks(bot) -> list[str]:
    """Make the bot's dispatcher record each role check (the command name) in the returned list."""
    seen: list[str] = []

    def counted(spec, call, ctx):
        seen.append(spec.name)
        filters.role_filter(spec, call, ctx)

    bot.runtime.dispatcher.filters = [counted if f is filters.role_filter else f
                                      for f in bot.runtime.dispatcher.filters]
    return seen


async def test_a_click_passes_one_role_check_and_writes_one_audit_row(bot):
    await bot.chat.say("/launch base mode=hang workers=1")
    await wait_log(bot.launch(1).log_path, "Load weight end")
    ask = await bot.chat.say("/kill 1")
    assert [b["label"] for b in ask.buttons()] == ["Kill", "Cancel"]
    checks = count_role_checks(bot)
    rows_before = len(bot.commands())
    denied = await bot.chat.click("Kill", on=ask, user=VIEWER)
    assert "Permission denied" in denied.text and denied.audit == "denied"
    assert checks == ["confirm"] and len(bot.commands()) == rows_before + 1
    killed = await bot.chat.click("Kill", on=ask)
    assert "Killed base#1" in killed.text and "released" in killed.text, killed.text
    assert checks == ["confirm", "confirm"] and len(bot.commands()) == rows_before + 2
    row = bot.commands()[-1]
    assert (row.action, row.result, row.user_id, row.channel, row.args["source"]) == (
        "command:confirm", "released", bot.chat.user, "C1", "button")
    assert [e.result for e in bot.events(action="kill")] == ["released"]  # the kill itself, as an action
    late = await bot.chat.click("Cancel", on=ask, user=OTHER_OPERATOR)
    assert "already confirmed by <@U0OPERATOR>" in late.text and late.audit == "stale"
    assert checks == ["confirm", "confirm", "cancel"] and len(bot.commands()) == rows_before + 3


async def test_a_forged_click_is_audited_and_answered_by_nothing(bot):
    rows_before = len(bot.commands())
    answer = await bot.runtime.dispatcher.click(Request(user_id="U0OPERATOR", channel_id="C1"),
                                                "gpubot_kill_confirm", "1|rm -rf")
    assert answer.message is None and answer.audit == "invalid"
    (row,) = bot.commands()[rows_before:]
    assert (row.action, row.result, row.args["source"]) == ("command:button", "invalid", "button")


async def test_the_console_can_confirm_and_cancel_a_typed_kill(gpu_config):
    out = io.StringIO()
    runtime = build_runtime(gpu_config, surface=ConsoleSurface(out), poll_s=0.2, start_check_s=0.5)
    await runtime.start(watch=False)
    try:
        for line in ("/launch base mode=hang workers=1", "/kill 1"):
            assert await run_command_line(line, runtime)
        assert "[Kill]" in out.getvalue() and "confirm 1" in out.getvalue()
        assert pids_of_launch(runtime.launches.get(1))  # asking killed nothing
        assert await run_command_line("confirm 1", runtime)
        assert "Killed base#1" in out.getvalue() and runtime.launches.get(1).state == LaunchState.KILLED
        await run_command_line("/launch base mode=hang workers=1", runtime)
        await run_command_line("/kill 2", runtime)
        await run_command_line("cancel 2", runtime)
        assert "kill of launch 2: nothing was stopped" in out.getvalue()
        await run_command_line("confirm 2", runtime)
        assert "this kill was already cancelled by console" in out.getvalue()
        assert runtime.launches.get(2).state == LaunchState.RUNNING and pids_of_launch(runtime.launches.get(2))
        # asked, then killed with --yes: the old confirmation has nothing left to do, and says so
        await run_command_line("/kill 2", runtime)
        await run_command_line("/kill 2 --yes", runtime)
        assert runtime.launches.get(2).state == LaunchState.KILLED
        await run_command_line("confirm 3", runtime)
        assert "this kill was not needed: base#2 already ended (killed) and nothing of it runs" in out.getvalue()
        await run_command_line("confirm 3", runtime)  # and it stays decided
        again = out.getvalue().rsplit("confirm 3", 1)[-1]
        assert "this kill was not needed: it was closed when its launch had already ended" in again, again
        assert "cancelled by" not in again  # nobody cancelled it
    finally:
        kill_launches(runtime.store.launches.recent())
        await runtime.close()


async def test_snooze_means_the_same_on_every_route(bot):
    await bot.chat.say("/launch base mode=hang workers=1")
    thread = bot.launch(1).thread_ts
    # (what is typed, in which thread: None at channel level, minutes)
    for text, where, minutes in [("/gpu snooze 1 5", None, 5), ("!gpu snooze 1 7", None, 7),
                                 ("!snooze 9", thread, 9), ("@gpubot gpu snooze 11", thread, 11),
                                 ("@gpubot snooze 1 13", None, 13), ("!gpubot snooze 15", thread, 15)]:
        before = bot.launch(1).snoozed_until or 0
        answer = await bot.chat.say(text, thread=where)
        assert f"Alerts of base#1 snoozed: for {minutes} min" in answer.text, (text, answer.text)
        shown = json.dumps(answer.post.message.blocks)
        assert ":zzz:" in shown and ":warning:" not in shown, shown  # a success, not an error
        after = bot.launch(1).snoozed_until
        assert after is not None and after > before, text
        assert answer.thread == thread, text  # answered in the launch's thread


async def test_buttons_of_an_old_alert_act_on_their_own_launch(make_bot, gpu_config):
    bot = await make_bot(gpu_config, watch=True, watch_policy=FAST_WATCH)
    await bot.chat.say("/launch base mode=hang workers=1")
    old_alert = await bot.chat.wait_post(lambda p: "base#1 on gpu-host-1: silent_hang" in p.text, 40,
                                         what="the silent_hang alert of base#1")
    assert {b["label"]: b["value"] for b in old_alert.buttons()} == {
        "Probe": "1", "Stack dump": "1", "Kill": "1", "Relaunch": "1", "Snooze 15 min": "1"}
    relaunched = await bot.chat.say("!relaunch", thread=bot.launch(1).thread_ts)
    assert "Launched base#2" in relaunched.text, relaunched.text
    # every button of base#1's old alert says base#1 has ended and names the live base#2; none acts on base#2
    for label in ("Probe", "Snooze 15 min", "Kill", "Relaunch", "Stack dump"):
        answer = await bot.chat.click(label, on=old_alert)
        assert "base#1 has ended" in answer.text and "base#2 is live" in answer.text, (label, answer.text)
        assert answer.audit == "stale"
    assert not bot.launch(1).snoozed_until and not bot.launch(2).snoozed_until
    assert bot.launch(2).state == LaunchState.RUNNING and pids_of_launch(bot.launch(2))
    assert [la.id for la in bot.runtime.launches.live()] == [2]


async def test_a_second_install_suggests_its_own_commands(make_bot, ssh_server, fake_gpu, tmp_path):
    data = launch_config(ssh_server, fake_gpu, tmp_path).model_dump()
    data["slack"] = {"slash_commands": {"gpu": "/gpu-staging", "gpubot": "/gpubot-staging", "kill": "/kill-staging",
                                        "probe": "/probe-staging", "launch": "/launch-staging",
                                        "relaunch": "/relaunch-staging"},
                     "bot_name": "gpubot-staging", "command_prefix": "?"}
    bot = await make_bot(Config.model_validate(data))
    launched = await bot.chat.say("/launch-staging base mode=hang workers=1")
    assert launched.text.startswith("Launched base#1"), launched.text
    ask = await bot.chat.say("/kill-staging 1")
    assert "`/kill-staging 1 --yes`" in ask.text and "`/kill 1" not in ask.text, ask.text
    assert "/kill-staging 1 --yes" in str(ask.post.blocks)
    helped = await bot.chat.say("/gpubot-staging")
    assert "/gpu-staging status [HOST...|all]" in helped.text and "\n  /gpu status" not in helped.text
    assert "/kill-staging [LAUNCH|VARIANT]" in helped.text
    refused = await bot.chat.say("/launch-staging base")  # a refusal's hint names this install's /kill
    assert "`/kill-staging 1`" in refused.text, refused.text
    assert await bot.chat.say("!gpu status") is None  # the other install's prefix and router


async def test_a_kill_confirmation_expires_after_an_hour_on_the_bots_clock(gpu_config):
    from tests.support.clock import ManualClock

    clock = ManualClock()
    out = io.StringIO()
    runtime = build_runtime(gpu_config, surface=ConsoleSurface(out), poll_s=0.2, start_check_s=0.5, clock=clock)
    await runtime.start(watch=False)
    try:
        for line in ("/launch base mode=hang workers=1", "/kill 1", "/kill 1"):
            assert await run_command_line(line, runtime)
        clock.advance(3599)  # confirmation 1 is still young
        assert await run_command_line("cancel 1", runtime)
        assert "kill of launch 1: nothing was stopped" in out.getvalue()
        clock.advance(2)  # confirmation 2 is now older than an hour
        assert await run_command_line("confirm 2", runtime)
        assert "this kill was expired (older than 60 min); type the kill again" in out.getvalue()
        assert runtime.launches.get(1).state == LaunchState.RUNNING and pids_of_launch(runtime.launches.get(1))
        assert runtime.launches.get(1).created_at == pytest.approx(clock.time() - 3601, abs=5)
    finally:
        kill_launches(runtime.store.launches.recent())
        await runtime.close()


async def test_bad_numbers_and_unknown_options_are_named_as_such(bot):
    await bot.chat.say("/launch base mode=hang workers=1")
    big = await bot.chat.say("/gpu snooze 1 1e9")
    assert "minutes" in big.text and "no live launch" not in big.text, big.text
    negative = await bot.chat.say("/gpu logs 1 -5")
    assert "N must be 1..5000" in negative.text, negative.text
    bogus = await bot.chat.say("/gpu stack 1 --native --bogus")
    assert "`--bogus` is no option of stack (it takes --native)" in bogus.text, bogus.text
    await bot.chat.say("/kill 1 --yes")
    ended = await bot.chat.say("/gpu snooze 1 15")
    assert "base#1 has ended" in ended.text and "nothing to snooze" in ended.text, ended.text
