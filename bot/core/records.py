"""Typed records the bot keeps: one readiness check of a launch (`CheckRecord`, table `observations`) and one
message on its way to Slack (`OutboxItem`, table `outbox`). Pure data; the store converts them at its edge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

__all__ = ["CheckRecord", "OutboxItem"]


@dataclass(slots=True)
class CheckRecord:
    """The compact record of one readiness check, kept for the next check's judgement, phase durations and the
    timeline chart (bot.core.observe builds it from a probe).

    t: when the check looked, epoch seconds on the host's clock (the bot's clock for a failed check).
    error: why the check could not look (an unreachable host, a timeout), or None; a failed check has only `t`.
    marker: the newest meaningful log line; last_progress_t: when it (or the first line) appeared, epoch s.
    log_bytes / log_lines: the server log's size and line count; log_cursor: where its line count stopped
        (bot.core.models.LogCursor.as_list), so the next check reads only what came after.
    gpu_mem_mib / gpu_util_pct / gpu_power_w: per GPU index (as a string): MiB, percent, W (None: not read).
    cpu_s: per pid (as a string): CPU seconds of the launch's processes; `PIDc`: of their ended children (observe).
    alive: any process of the launch left (None: unknown); port_open: its port listens; health: the health
        state (bot.core.parse.health: `ok`, `http_503`, `timeout`, ...); generate: the generation check's state
        (same values; None: none ran this time); exit_status: what the launch wrapper
        logged when the server ended (negative: the signal), else None.
    verdict / phase: the check's verdict, once judged.
    """

    t: float
    error: str | None = None
    marker: str | None = None
    last_progress_t: float | None = None
    log_bytes: int | None = None
    log_lines: int | None = None
    gpu_mem_mib: dict[str, float | None] = field(default_factory=dict)
    gpu_util_pct: dict[str, float | None] = field(default_factory=dict)
    gpu_power_w: dict[str, float | None] = field(default_factory=dict)
    cpu_s: dict[str, float | None] = field(default_factory=dict)
    alive: bool | None = None
    port_open: bool | None = None
    health: str | None = None
    generate: str | None = None
    exit_status: int | None = None
    log_cursor: list[Any] | None = None
    verdict: str | None = None
    phase: str | None = None

    @classmethod
    def failed(cls, t: float, reason: str) -> CheckRecord:
        """The record of a check that could not look (`reason`) at epoch `t`."""
        return cls(t=t, error=reason)

    @property
    def ok(self) -> bool:
        """True when the check looked (no `error`)."""
        return self.error is None

    def as_json(self) -> dict[str, Any]:
        """The record as a JSON-ready dict: the fields that are set (None left out)."""
        out = {}
        for name in _CHECK_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    @classmethod
    def from_json(cls, data: Any) -> CheckRecord | None:
        """A record from `as_json`'s dict (also one written by an older release: unknown keys are dropped, a
        value of the wrong type reads as unset). None when `data` is not a dict with a finite number `t`."""
        if not isinstance(data, Mapping):
            return None
        t = data.get("t")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            return None
        kept: dict[str, Any] = {"t": float(t)}
        for name, kinds in _CHECK_TYPES.items():
            value = data.get(name)
            if value is not None and isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds):
                kept[name] = _numbers_by_key(value) if name in _PER_KEY else value
        return cls(**kept)


_CHECK_FIELDS = tuple(f.name for f in fields(CheckRecord))
#: The JSON types each field but `t` accepts when read back.
_CHECK_TYPES: Mapping[str, tuple[type, ...]] = MappingProxyType({
    "error": (str,), "marker": (str,), "last_progress_t": (int, float), "log_bytes": (int,), "log_lines": (int,),
    "gpu_mem_mib": (dict,), "gpu_util_pct": (dict,), "gpu_power_w": (dict,), "cpu_s": (dict,),
    "alive": (bool,), "port_open": (bool,), "health": (str,), "generate": (str,), "exit_status": (int,),
    "log_cursor": (list,),
    "verdict": (str,), "phase": (str,),
})


#: The per-GPU / per-pid fields: str key -> number or None.
_PER_KEY = frozenset({"gpu_mem_mib", "gpu_util_pct", "gpu_power_w", "cpu_s"})


def _numbers_by_key(data: dict[Any, Any]) -> dict[str, float | None]:
    """`data` with keys as strings and only number (or None) values kept: a reading that is not a number reads as
    unset rather than reaching a chart or a comparison."""
    return {
        str(k): v
        for k, v in data.items()
        # keys are GPU indexes or PIDs: ASCII digits ('²'.isdigit() is True, and int() refuses it); a PID's ended
        # children's CPU seconds under `PIDc` (bot.core.observe.cpu_seconds)
        if str(k).isascii() and str(k).removesuffix("c").isdigit() and len(str(k)) <= 11
        and (v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)))
    }


@dataclass(slots=True)
class OutboxItem:
    """One message on its way to Slack: a row of table `outbox` (bot.adapters.store.OutboxRow has the column
    meanings), or one sent straight to Slack because its row could not be written (a negative id).

    kind: post / update / upload / delete; thread_ts and target_ts: a Slack ts or `q:<row id>`; key: the unique
    metadata key a post carries; state: pending / sending / sent / failed / superseded; times in epoch seconds.
    """

    id: int
    channel: str
    kind: str
    thread_ts: str | None = None
    target_ts: str | None = None
    text: str = ""
    blocks_json: str | None = None
    filename: str | None = None
    content: bytes | None = None
    key: str = ""
    state: str = "pending"
    attempts: int = 0
    next_at: float = 0.0
    created_at: float = 0.0
    sent_at: float | None = None
    result_ts: str | None = None
    error: str | None = None
    needs_lookup: int = 0
    user_id: str | None = None
    command_id: int | None = None
