"""A bot taken for gone while it ran a command (frozen, its command taken over and answered by the leader) wakes up
and finishes it: through the real Bolt app against the fake Slack, nothing of its own answer goes out, and the
leader's answer in its progress message stays (never edited again, never deleted)."""

from __future__ import annotations

import asyncio

import pytest

from handlers import Source

pytestmark = pytest.mark.timeout(120)


async def test_a_woken_bot_leaves_the_leaders_answer_in_its_placeholder_alone(slack):
    runtime, store = slack.runtime, slack.runtime.store
    taken: list[int] = []

    async def work(request):
        # slow: the progress message (the placeholder) is posted and noted in the journal
        await asyncio.sleep(slack.bot.config.slack.progress_after_s + 1.0)
        entry = next(e for e in store.commands.unsettled(not_owner="nobody") if e.id == request.command_id)
        assert entry.placeholder
        # frozen here: the leader takes the command over and answers it in its placeholder
        assert store.commands.take(entry, detail="taken over")
        taken.append(entry.id)
        await runtime.surface.update(entry.channel, entry.placeholder,
                                     runtime.renderer.error("Not finished", "CUTOFF-MARK was cut off", None))
        # awake: the command runs to its end; its finish finds the command taken
        return await runtime.dispatcher.run_text(request, "help")

    ts = await slack.bot.run(user_id="U0OPERATOR", channel_id="C1", thread_ts=None, source=Source.SLASH,
                             word="help", work=work, text="/gpu help")
    assert ts is None and taken
    await slack.settled()
    fake = slack.fake
    cut = [c for c in fake.calls_for("chat.update") if "CUTOFF-MARK" in str(c["params"])]
    assert len(cut) == 1, [c["method"] for c in fake.calls]
    assert not fake.calls_for("chat.delete") and not fake.calls_for("chat.postEphemeral")
    edits = [c for c in fake.calls_for("chat.update") if c["params"].get("ts") == cut[0]["params"]["ts"]]
    assert edits == cut  # the help answer never replaced it
    [row] = [e for e in runtime.audit.events() if e.action.startswith("command:")]
    assert row.result == "interrupted"  # as the leader's take wrote it: the woken bot's finish changed nothing


async def test_a_typed_secret_param_is_masked_in_the_command_written_ahead(slack_stacks, ssh_server, fake_gpu,
                                                                         tmp_path):
    """The journal row and the `running` audit row are written before the dispatcher parses the command: the value
    of a `secret: true` param typed in it (no known token shape) is masked there too."""
    from tests.support.builders import launch_config

    data = launch_config(ssh_server, fake_gpu, tmp_path).model_dump(mode="json", exclude_none=True)
    data["variants"]["base"]["params"] = {**data["variants"]["base"].get("params", {}),
                                          "key": {"type": "str", "secret": True, "default": "none"}}
    stack = await slack_stacks(type(launch_config(ssh_server, fake_gpu, tmp_path)).model_validate(data))
    seen: list[str] = []

    async def work(request):
        entry = stack.runtime.store.commands.get(request.command_id)
        seen.append(entry.text)
        seen.extend(str(e.args) for e in stack.runtime.audit.events() if e.result == "running")
        return await stack.runtime.dispatcher.run_text(request, "help")

    await stack.bot.run(user_id="U0OPERATOR", channel_id="C1", thread_ts=None, source=Source.SLASH, word="launch",
                        work=work, text="/launch base key=OpaqueVal9876xyzQ")
    assert len(seen) == 2 and "/launch base key=" in seen[0]
    assert not any("OpaqueVal9876xyzQ" in s for s in seen), seen
