"""Reading the watcher's alerts in a test bot's chat: which posts are alerts, waiting for a verdict or for
more checks."""

from __future__ import annotations

import re
from typing import Any

from tests.support.procs import wait_until

_HEAD = re.compile(r"^\S+#\d+ on \S+: (\w+)\b.*\(after ")


def is_alert(post: Any, verdict: str | None = None) -> bool:
    """An alert of the watcher (`base#1 on gpu-host-1: silent_hang in ... (after 5s)`, on any host), optionally of
    one verdict."""
    head = post.text.splitlines()[0] if post.text else ""
    m = _HEAD.match(head)
    return post.thread_ts is not None and m is not None and (verdict is None or m.group(1) == verdict)


def alerts(bot: Any, verdict: str | None = None) -> list:
    """The alerts posted so far (of one verdict)."""
    return [p for p in bot.chat.posts if is_alert(p, verdict)]


async def wait_alert(bot: Any, launch_id: int, verdicts: set[str], timeout: float = 90.0):
    """Wait until launch `launch_id`'s posted verdict is one of `verdicts` and its alert is in the thread (the
    verdict is recorded before the alert is posted, and the alert's chart is drawn in another process); returns
    the launch."""
    def posted():
        la = bot.launch(launch_id)
        if la.alert_state not in verdicts:
            return None
        # news without an alert of their own, while the launch lives (an ended launch's `unknown` is posted)
        quiet = la.alert_state in ("loading", "unknown") and la.live
        return la if quiet or any(is_alert(p, la.alert_state) for p in bot.chat.posts) else None

    try:
        return await wait_until(posted, timeout, what=f"a {verdicts} alert for launch {launch_id}")
    except AssertionError as e:  # say what it is instead, and what was posted
        la = bot.launch(launch_id)
        posts = [p for p in bot.chat.posts if is_alert(p)]
        said = [p.text.split("\n", 1)[0] for p in posts][-3:]
        last = full_text(posts[-1])[:4000] if posts else ""
        raise AssertionError(f"{e}; it is {la.alert_state!r} ({la.state}), alerts: {said}\n"
                             f"the last one in full:\n{last}") from None


async def wait_checks(bot: Any, launch_id: int, more: int = 3):
    """Wait until `more` further checks of the launch have been recorded (so anything they would post, they
    posted)."""
    start = len(bot.store.observations.list(launch_id))
    await wait_until(lambda: len(bot.store.observations.list(launch_id)) >= start + more,
                     what=f"{more} more checks of launch {launch_id}")


def full_text(post: Any) -> str:
    """An alert's text and its attached full evidence file (the alert itself shows the key lines only)."""
    files = [data.decode("utf-8", "replace") for name, data in post.files if name.endswith("-evidence.txt")]
    return "\n".join([post.text, *files])
