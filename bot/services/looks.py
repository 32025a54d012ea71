"""What one check of a launch saw (bot.services.watch): `Look`, one probe and what the rules made of it, and
`CheckOutcome`, what the check did; `Superseded`, raised where another bot recorded a change first."""

from __future__ import annotations

from dataclasses import dataclass

from bot.core.diagnose import Observation, Verdict
from bot.core.models import Launch, Snapshot
from bot.core.records import CheckRecord


@dataclass
class Look:
    """One probe of a launch and what the rules made of it: the launch (its processes remembered), the snapshot,
    the Observation, the record to store and the verdict."""

    la: Launch
    snap: Snapshot
    obs: Observation
    record: CheckRecord
    verdict: Verdict
    ending: bool = False


@dataclass
class CheckOutcome:
    """What one check saw: the verdict, whether it was news (posted), and the launch afterwards."""

    verdict: Verdict | None
    alerted: bool
    launch: Launch | None
    error: str | None = None


class Superseded(Exception):
    """Another writer changed a launch's alert state between a check's read and its write."""
