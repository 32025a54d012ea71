"""Table `launches`: one row per launch of a variant on a host, and its repository."""

from __future__ import annotations

import json
import logging
import math
import re
import secrets
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from sqlalchemy import Float, ForeignKey, Integer, String, Text, bindparam, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from bot.adapters.store.db import Base, Database
from bot.core.clock import SYSTEM_CLOCK, Clock
from bot.core.models import LIVE_STATES, TERMINAL_STATES, Launch, LaunchState

log = logging.getLogger(__name__)


class LaunchRow(Base):
    """Table `launches` (times are epoch seconds; params and gpus as JSON)."""

    __tablename__ = "launches"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    host: Mapped[str] = mapped_column(String(64), index=True)
    variant: Mapped[str] = mapped_column(String(64), index=True)
    params_json: Mapped[str] = mapped_column(Text, default="{}")
    command: Mapped[str] = mapped_column(Text, default="")
    log_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    port: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpus_json: Mapped[str] = mapped_column(Text, default="[]")
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pgid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    sid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    state: Mapped[str] = mapped_column(String(32), default=LaunchState.STARTING.value, index=True)
    state_detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_by: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    channel: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    thread_ts: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    relaunch_of: Mapped[int | None] = mapped_column(Integer, ForeignKey("launches.id"), nullable=True)
    tag: Mapped[str] = mapped_column(String(64), default="", index=True)
    alert_state: Mapped[str | None] = mapped_column(String(32), nullable=True)
    snoozed_until: Mapped[float | None] = mapped_column(Float, nullable=True)
    ready_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    unreachable_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    seen_pids_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    unit: Mapped[str | None] = mapped_column(String(128), nullable=True)
    unit_manager: Mapped[str | None] = mapped_column(String(16), nullable=True)
    #: Its Slurm job id (bot.core.slurm), None for a launch started over SSH.
    job_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    #: Where its ranks run, rank order (JSON list of node or host names); None for a launch on `host` alone.
    nodes_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: How often Slurm had requeued its job at the last check that read it; None before (or for no job).
    job_restarts: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: The launch's secret param values, encrypted (bot.adapters.secretbox); None when it had none.
    sealed_secrets: Mapped[str | None] = mapped_column(Text, nullable=True)


#: One launch by id (SQLAlchemy Core: the row's columns by name, as `_launch` reads them).
_GET_BY_ID = select(LaunchRow.__table__).where(LaunchRow.__table__.c.id == bindparam("id"))


def _launch(row: Any) -> Launch:
    return Launch(
        id=row.id, host=row.host, variant=row.variant, params=json.loads(row.params_json or "{}"),
        command=row.command, log_path=row.log_path, port=row.port, gpus=json.loads(row.gpus_json or "[]"),
        pid=row.pid, pgid=row.pgid, sid=row.sid, state=LaunchState(row.state), state_detail=row.state_detail,
        created_by=row.created_by, created_at=row.created_at, ended_at=row.ended_at, channel=row.channel,
        thread_ts=row.thread_ts, relaunch_of=row.relaunch_of, tag=row.tag or "", alert_state=row.alert_state,
        snoozed_until=row.snoozed_until, ready_at=row.ready_at, unreachable_since=row.unreachable_since,
        seen_pids=_seen_pids(row.seen_pids_json), seen_starts=_seen_starts(row.seen_pids_json), unit=row.unit,
        unit_manager=row.unit_manager, job_id=row.job_id, nodes=json.loads(row.nodes_json or "[]"),
        job_restarts=row.job_restarts,
    )


def _readable(row: Any) -> Launch | None:
    """The launch of a row, or None (logged) for a damaged row (a state no release knows, JSON that does not
    parse): one bad row of an old launch must not break every command that lists launches."""
    try:
        return _launch(row)
    except (ValueError, TypeError, KeyError, RecursionError) as e:  # JSONDecodeError is a ValueError
        log.error("launch row %s is damaged and is skipped: %s: %s", getattr(row, "id", "?"), type(e).__name__, e)
        return None


def _readable_all(rows: Any) -> list[Launch]:
    """The launches of `rows`, damaged rows left out (see `_readable`)."""
    return [la for la in map(_readable, rows) if la is not None]


def _seen_starts(text: str | None) -> dict[int, int]:
    """`seen_pids_json`'s `starts` object -> PID -> start time in clock ticks after boot (/proc/PID/stat). A
    record without one (an older gpubot's), or anything malformed, gives an empty dict; bad entries are dropped."""
    try:
        data = json.loads(text or "{}")
    except (ValueError, RecursionError):
        return {}
    starts = data.get("starts") if isinstance(data, dict) else None
    if not isinstance(starts, dict):
        return {}
    return {int(k): v for k, v in starts.items()
            if re.fullmatch(r"[0-9]{1,10}", str(k)) and 0 < int(k) < 2**31 and type(v) is int and 0 <= v < 2**63}


def _seen_pids(text: str | None) -> dict[int, float | None]:
    """`seen_pids_json` -> PID -> start time: a JSON object (`{"123": 1700000000.0}`), or the list of PIDs an
    older gpubot stored (start times unknown). Anything else is an empty record."""
    try:
        data = json.loads(text or "{}")
    except (ValueError, RecursionError):
        return {}
    if isinstance(data, list):
        return {p: None for p in data if type(p) is int and 0 < p < 2**31}
    out: dict[int, float | None] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            if re.fullmatch(r"[0-9]{1,10}", str(k)) and 0 < int(k) < 2**31:
                ok = type(v) in (int, float) and math.isfinite(v)
                out[int(k)] = float(v) if ok else None
    return out


class LaunchRepository:
    """Launches and their incident threads. Every method is one transaction; returns detached `Launch`
    copies. Raises sqlalchemy errors only for a broken database."""

    def __init__(self, db: Database, clock: Clock = SYSTEM_CLOCK):
        self._db = db
        self._clock = clock
        # `get` answers from memory while this process wrote no launch since it read one: a watch check reads its
        # launch twice, hundreds of times a minute, and launches change rarely. Every write moves the generation.
        # Only where this process is the database's one writer (SQLite: the state directory's lock); on a database
        # that several bots share (PostgreSQL) another bot's writes are invisible to it, so every read goes through.
        # A write of one launch (by its id) moves only that launch's generation; any other write (a new launch, a
        # thread moved) moves them all. `recent` lists are read again after any write.
        self._memo = db.url.startswith("sqlite")
        self._generation = 0
        self._list_generation = 0
        self._row_generation: dict[int, int] = {}
        self._rows: dict[int, tuple[tuple[int, int], Launch]] = {}
        self._recent: tuple[int, int, list[Launch]] | None = None  # (list generation, limit, launches): `recent`

    def _move(self, launch_id: int | None) -> None:
        """Move the generation of launch `launch_id` (every launch's with None) and of the lists."""
        self._list_generation += 1
        if launch_id is None:
            self._generation += 1
        else:
            self._row_generation[launch_id] = self._row_generation.get(launch_id, 0) + 1

    def _row_key(self, launch_id: int) -> tuple[int, int]:
        return self._generation, self._row_generation.get(launch_id, 0)

    @contextmanager
    def _writing(self, launch_id: int | None = None) -> Iterator[Session]:
        """A write transaction (of launch `launch_id` alone, when given); the launches it may change that were read
        before it are read again afterwards (`get`, `recent`)."""
        self._move(launch_id)
        try:
            with self._db.transaction() as s:
                yield s
        finally:
            self._move(launch_id)

    def create(self, *, host: str, variant: str, params: dict[str, Any], command: str, log_path: str | None,
               port: int | None, gpus: list[int], created_by: str, channel: str | None = None,
               thread_ts: str | None = None, relaunch_of: int | None = None,
               sealed_secrets: str | None = None, nodes: list[str] | None = None) -> Launch:
        """Insert a launch in state `starting` with a fresh tag `<id>-<12 hex>` (unique across bots and
        databases: the id alone repeats in a fresh state_dir) and return it. `sealed_secrets`: its secret param
        values, already encrypted (bot.adapters.secretbox)."""
        with self._writing() as s:
            row = LaunchRow(host=host, variant=variant, params_json=json.dumps(params, sort_keys=True),
                            command=command, log_path=log_path, port=port, gpus_json=json.dumps(gpus),
                            created_by=created_by, created_at=self._clock.time(), channel=channel,
                            thread_ts=thread_ts, relaunch_of=relaunch_of, state=LaunchState.STARTING.value,
                            sealed_secrets=sealed_secrets, nodes_json=json.dumps(nodes) if nodes else None)
            s.add(row)
            s.flush()
            row.tag = f"{row.id}-{secrets.token_hex(6)}"
            s.flush()
            return _launch(row)

    def sealed_secrets(self, launch_id: int | None = None, limit: int = 2000,
                       after_id: int | None = None) -> list[tuple[int, str]]:
        """(launch id, sealed secrets) of launch `launch_id`, or of the newest `limit` launches that have them (with
        `after_id`: only those with a greater id)."""
        with self._db.transaction() as s:
            q = select(LaunchRow.id, LaunchRow.sealed_secrets).where(LaunchRow.sealed_secrets.is_not(None))
            if launch_id is not None:
                q = q.where(LaunchRow.id == launch_id)
            if after_id is not None:
                q = q.where(LaunchRow.id > after_id)
            return [(int(i), str(t)) for i, t in s.execute(q.order_by(LaunchRow.id.desc()).limit(limit))]

    def update(self, launch_id: int, **fields: Any) -> Launch:
        """Set columns of a launch (`params`/`gpus`/`seen_pids` are JSON-encoded; entering a terminal state sets
        `ended_at` once) and return the new version. Raises KeyError for an unknown id."""
        out = self.update_if(launch_id, {}, **fields)
        assert out is not None
        return out

    def update_if(self, launch_id: int, expect: Mapping[str, Any], **fields: Any) -> Launch | None:
        """`update`, only while the launch's columns still hold `expect` (column -> value; `state` as a
        LaunchState or its value): None, with nothing written, when another writer changed one since (the row is
        locked while it is compared, `SELECT ... FOR UPDATE` on PostgreSQL). Raises KeyError for an unknown id."""
        with self._writing(launch_id) as s:
            row = s.get(LaunchRow, launch_id, with_for_update=bool(expect))
            if row is None:
                raise KeyError(launch_id)
            for k, v in expect.items():
                have = getattr(row, k)
                if (LaunchState(v).value if k == "state" else v) != have:
                    return None
            for k, v in fields.items():
                if k == "params":
                    row.params_json = json.dumps(v, sort_keys=True)
                elif k == "gpus":
                    row.gpus_json = json.dumps(v)
                elif k == "nodes":
                    row.nodes_json = json.dumps(list(v)) if v else None
                elif k in ("seen_pids", "seen_starts"):
                    # one JSON object: PID -> epoch start (read by every release), and `starts`: PID -> ticks
                    pids = dict(v) if k == "seen_pids" else _seen_pids(row.seen_pids_json)
                    starts = dict(fields["seen_starts"]) if "seen_starts" in fields else \
                        _seen_starts(row.seen_pids_json)
                    data: dict[str, Any] = {str(p): t for p, t in sorted(pids.items())}
                    if starts:
                        data["starts"] = {str(p): t for p, t in sorted(starts.items())}
                    row.seen_pids_json = json.dumps(data)
                elif k == "state":
                    row.state = LaunchState(v).value
                else:
                    setattr(row, k, v)
            if "state" in fields and LaunchState(fields["state"]) in TERMINAL_STATES and row.ended_at is None:
                row.ended_at = self._clock.time()
            return _launch(row)

    def get(self, launch_id: int) -> Launch | None:
        """The launch with this id, or None: a copy of what this process last read, when it wrote no launch since
        (see `__init__`), else read (a Core read: every watch check looks at its launch twice)."""
        cached = self._rows.get(launch_id) if self._memo else None
        if cached is not None and cached[0] == self._row_key(launch_id):
            return replace(cached[1])
        generation = self._row_key(launch_id)
        with self._db.reading() as c:
            row = c.execute(_GET_BY_ID, {"id": launch_id}).first()
        if row is None:
            self._rows.pop(launch_id, None)
            return None
        la = _readable(row)
        if la is None:
            return None
        if len(self._rows) >= 10_000:
            self._rows.clear()
        self._rows[launch_id] = (generation, la)
        return replace(la)

    def replace_thread_ts(self, old: str, new: str) -> int:
        """Point launches whose incident thread is `old` (an outbox reference `q:<id>`) at the real Slack ts
        `new`. Returns how many launches changed."""
        with self._writing() as s:
            res = s.execute(update(LaunchRow).where(LaunchRow.thread_ts == old).values(thread_ts=new))
            return int(res.rowcount or 0)

    def for_thread(self, channel: str, thread_ts: str) -> Launch | None:
        """The newest launch whose incident thread is (channel, thread_ts), or None."""
        with self._db.transaction() as s:
            row = s.scalars(select(LaunchRow).where(LaunchRow.channel == channel, LaunchRow.thread_ts == thread_ts)
                            .order_by(LaunchRow.id.desc())).first()
            return _readable(row) if row else None

    def live(self, host: str | None = None, variant: str | None = None) -> list[Launch]:
        """Launches in a live state, newest first, optionally on one host and/or of one variant."""
        with self._db.transaction() as s:
            q = select(LaunchRow).where(LaunchRow.state.in_([st.value for st in LIVE_STATES]))
            if host is not None:
                q = q.where(LaunchRow.host == host)
            if variant is not None:
                q = q.where(LaunchRow.variant == variant)
            return _readable_all(s.scalars(q.order_by(LaunchRow.id.desc())))

    def in_state(self, state: LaunchState) -> list[Launch]:
        """Every launch in `state`, oldest first."""
        with self._db.transaction() as s:
            q = select(LaunchRow).where(LaunchRow.state == LaunchState(state).value).order_by(LaunchRow.id)
            return _readable_all(s.scalars(q))

    def recent(self, limit: int = 20) -> list[Launch]:
        """The newest `limit` launches, newest first: copies of what this process last read, when it wrote no
        launch since (see `__init__`; every `/gpu status` attributes GPU holders to them), else read."""
        cached = self._recent if self._memo else None
        if cached is not None and cached[0] == self._list_generation and cached[1] == limit:
            return [replace(la) for la in cached[2]]
        generation = self._list_generation
        with self._db.transaction() as s:
            launches = _readable_all(s.scalars(select(LaunchRow).order_by(LaunchRow.id.desc()).limit(limit)))
        self._recent = (generation, limit, launches)
        return [replace(la) for la in launches]
