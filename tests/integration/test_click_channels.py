"""Clicks go through the one pipeline of typed commands: with `permissions.channels` set, a button clicked in
another channel or in a DM is refused like a typed command there, and every attempt is audited with the
channel the click came from (not the launch's)."""

from __future__ import annotations

import pytest

from bot.present.actions import ActionId
from handlers import Request, Source
from tests.support.builders import launch_config

pytestmark = pytest.mark.timeout(120)


async def test_a_click_outside_the_allowed_channels_is_refused_and_audited_there(make_bot, ssh_server, fake_gpu,
                                                                                tmp_path):
    cfg = launch_config(ssh_server, fake_gpu, tmp_path)
    cfg.permissions.channels = ["C1"]
    bot = await make_bot(cfg)
    launched = await bot.chat.say("/launch base mode=hang workers=1")
    assert "Launched base#1" in launched.text, launched.text
    la = bot.launch(1)
    for channel in ("C0OTHER", "D0DIRECT"):  # another channel, a DM with the bot
        request = Request(user_id=bot.chat.user, channel_id=channel, source=Source.BUTTON, message_ts="1.5")
        reply = await bot.runtime.dispatcher.click(request, ActionId.KILL.value, str(la.id))
        assert reply.audit == "denied" and reply.private_to == bot.chat.user, reply
        event = bot.events("command:kill")[-1]
        assert (event.result, event.channel) == ("denied", channel)
    assert bot.launch(1).live  # nothing was killed
    # the same click in the allowed channel acts, and is audited there
    ok = await bot.runtime.dispatcher.click(Request(user_id=bot.chat.user, channel_id="C1", source=Source.BUTTON,
                                                    message_ts="1.5"), ActionId.KILL.value, str(la.id))
    assert ok.audit != "denied" and bot.events("command:kill")[-1].channel == "C1"
    assert not bot.launch(1).live
    kills = [e for e in bot.events("kill")]
    assert kills and kills[-1].channel == "C1"
