"""Button clicks: every gpubot button goes through the dispatcher as the command it stands for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slack_bolt.async_app import AsyncApp

from bot.present.actions import ActionId, click_command
from handlers import Source

if TYPE_CHECKING:
    from bot.slack.bot import SlackBot


def register(app: AsyncApp, bot: SlackBot) -> None:
    """Alert buttons ([Probe] [Stack dump] [Kill] [Relaunch] [Snooze]) and [Kill] [Cancel] under a typed
    kill: ack, drop a redelivered click or a double click, then `Dispatcher.click` in the clicked message's
    thread (roles are checked there, on the server: a confirm dialog is only client-side)."""

    async def on_click(ack, body, action) -> None:
        """One button click: ack, dedupe, dispatch."""
        await ack()
        container = body.get("container") or {}
        channel = (body.get("channel") or {}).get("id") or container.get("channel_id", "")
        msg_ts = container.get("message_ts")
        user = (body.get("user") or {}).get("id", "")
        action_id, value = str(action.get("action_id", "")), str(action.get("value", ""))
        if not await bot.first_delivery(f"act:{msg_ts}:{action.get('action_ts')}",
                                        click=f"click:{msg_ts}:{action_id}:{value}:{user}"):
            return  # the same click delivered twice, or a double click
        bot.spawn(bot.run(user_id=user, channel_id=channel, source=Source.BUTTON, message_ts=msg_ts,
                          thread_ts=(body.get("message") or {}).get("thread_ts") or msg_ts,
                          word=(click_command(action_id, value) or "button").split()[0],
                          work=lambda r: bot.dispatcher.click(r, action_id, value),
                          text=f"[button] {click_command(action_id, value) or action_id}"))

    for action_id in ActionId:
        app.action(str(action_id))(on_click)
