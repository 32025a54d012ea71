"""Which launch a command means: a reference (`12`, `#12`, `base#12`, a variant name), else the launch of the thread
it was typed in, else the only live launch. What it cannot resolve it says as a LaunchError that names the live
launches (at most 10), so the next command can name one.
"""

from __future__ import annotations

from typing import Protocol

from bot.config import Config
from bot.core.lifecycle import LaunchError
from bot.core.models import Launch


class LaunchRows(Protocol):
    """What a lookup reads of the launches (bot.adapters.store.launches.LaunchRepository's reads)."""

    def get(self, launch_id: int) -> Launch | None: ...

    def live(self, host: str | None = None, variant: str | None = None) -> list[Launch]: ...

    def for_thread(self, channel: str, thread_ts: str) -> Launch | None: ...


def find_launch(config: Config, rows: LaunchRows, ref: str | None, *, channel: str | None = None,
                thread_ts: str | None = None, allow_only_live: bool = True) -> Launch:
    """Resolve a launch reference: `12`, `#12`, `base#12`, a variant name (its live launch), or nothing: the
    launch of this thread; otherwise (outside a thread, or in a thread that is no launch's) the only live
    launch when `allow_only_live`. Raises LaunchError naming the live launches."""
    la = _find(rows, ref, channel=channel, thread_ts=thread_ts, allow_only_live=allow_only_live)
    if la.host not in config.hosts:
        raise LaunchError(f"{la.name} ran on host {la.host!r}, which is no longer in the config")
    return la


def _find(rows: LaunchRows, ref: str | None, *, channel: str | None, thread_ts: str | None,
          allow_only_live: bool) -> Launch:
    if ref:
        text = ref.strip()
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise LaunchError(f"no launch {text[:40]!r}: not valid text; {_live_list(rows)}") from None
        prefix, _, num = text.rpartition("#") if "#" in text else ("", "", text)
        if num.isascii() and num.isdigit() and len(num) <= 12:
            la = rows.get(int(num))
            if la is None or (prefix and prefix != la.variant):
                raise LaunchError(f"no launch {text[:40]!r}; {_live_list(rows)}")
            return la
        live = rows.live(variant=text)
        if len(live) == 1:
            return live[0]
        if len(live) > 1:
            raise LaunchError(f"{text[:40]!r} has {len(live)} live launches: "
                              + ", ".join(f"{la.name} on {la.host}" for la in live) + "; name one")
        raise LaunchError(f"no live launch of {text[:40]!r}; {_live_list(rows)}")
    if channel and thread_ts:
        la = rows.for_thread(channel, thread_ts)
        if la is not None:
            return la
    if allow_only_live:  # the same outside a thread and in a thread that is no launch's
        live = rows.live()
        if len(live) == 1:
            return live[0]
    if channel and thread_ts:
        raise LaunchError(f"this thread belongs to no launch: name one; {_live_list(rows)}")
    raise LaunchError(f"name the launch (id or variant); {_live_list(rows)}")


def _live_list(rows: LaunchRows) -> str:
    live = rows.live()
    if not live:
        return "no launch is live"
    return "live launches: " + ", ".join(f"{la.name} on {la.host}" for la in live[:10])
