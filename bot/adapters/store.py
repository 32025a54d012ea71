"""State that survives a restart: launches, their incident threads, and the audit trail (events).

SQLite through SQLAlchemy 2.0 ORM is the embedded default: a file `gpubot.db` in the config's
`state_dir`; any SQLAlchemy URL can be given instead. Every write is its own short transaction, so a
crash never leaves half a launch. The Store is synchronous (SQLite on the event loop is fine at chat-ops
volumes: a few writes per command).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    Text,
    create_engine,
    event,
    inspect,
    select,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from bot.core.redact import redact

#: Launch states. `starting` until the process is confirmed, `running` while it lives, then one of the
#: terminal states. `kill_failed` means processes still hold GPU memory after a kill.
LIVE_STATES = ("starting", "running", "kill_failed")
#: A kill in progress: not watched, not live for new commands; it ends as killed / kill_failed / its old state.
TERMINAL_STATES = ("killed", "exited", "failed")


class Base(DeclarativeBase):
    """SQLAlchemy declarative base of gpubot's tables."""


class LaunchRow(Base):
    """Table `launches`: one row per launch of a variant on a host (times are epoch seconds)."""

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
    state: Mapped[str] = mapped_column(String(32), default="starting", index=True)
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


class ObservationRow(Base):
    """Table `observations`: one compact record per readiness check of a launch (JSON; times epoch s)."""

    __tablename__ = "observations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    launch_id: Mapped[int] = mapped_column(Integer, ForeignKey("launches.id"), index=True)
    at: Mapped[float] = mapped_column(Float, default=time.time)
    data_json: Mapped[str] = mapped_column(Text, default="{}")


class EventRow(Base):
    """Table `events`: the audit trail and each launch's timeline (who did what, with which args, result)."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, default=time.time, index=True)
    user_id: Mapped[str] = mapped_column(String(64), default="")
    action: Mapped[str] = mapped_column(String(64))
    args_json: Mapped[str] = mapped_column(Text, default="{}")
    result: Mapped[str] = mapped_column(String(32), default="ok")
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    launch_id: Mapped[int | None] = mapped_column(Integer, ForeignKey("launches.id"), nullable=True, index=True)
    host: Mapped[str | None] = mapped_column(String(64), nullable=True)
    channel: Mapped[str | None] = mapped_column(String(64), nullable=True)


class ConfirmationRow(Base):
    """Table `confirmations`: a typed kill waiting for its [Kill] / [Cancel] click. `state` pending ->
    confirmed | cancelled, claimed once (so two clicks never act twice). For a pid kill, `command` is the
    process's command line when asked: a reused pid is refused. Times are epoch seconds."""

    __tablename__ = "confirmations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    launch_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    host: Mapped[str] = mapped_column(String(64), default="")
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    command: Mapped[str | None] = mapped_column(Text, nullable=True)
    asked_by: Mapped[str] = mapped_column(String(64), default="")
    state: Mapped[str] = mapped_column(String(16), default="pending")
    decided_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    decided_at: Mapped[float | None] = mapped_column(Float, nullable=True)


@dataclass
class Confirmation:
    """A detached copy of a ConfirmationRow."""

    id: int
    launch_id: int | None
    host: str
    pid: int | None
    command: str | None
    asked_by: str
    state: str
    decided_by: str | None
    created_at: float


class OutboxRow(Base):
    """Table `outbox`: every message to Slack, written before it is sent (bot/outbox.py sends it).

    `kind` is post / update / upload. `thread_ts` and `target_ts` hold a Slack ts, or `q:<id>`: the ts of
    outbox row <id> once that row is sent. `state`: pending -> sending -> sent, or failed (a permanent
    Slack error, `error` says which) or superseded (an update replaced by a newer one of the same message).
    Times are epoch seconds.
    """

    __tablename__ = "outbox"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    channel: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    thread_ts: Mapped[str | None] = mapped_column(String(32), nullable=True)
    target_ts: Mapped[str | None] = mapped_column(String(32), nullable=True)
    text: Mapped[str] = mapped_column(Text, default="")
    blocks_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    filename: Mapped[str | None] = mapped_column(String(255), nullable=True)
    content: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    key: Mapped[str] = mapped_column(String(40), default="")
    state: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_at: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    sent_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    result_ts: Mapped[str | None] = mapped_column(String(32), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: 1 while an earlier attempt may have reached Slack (5xx, timeout, crash): look before posting again.
    needs_lookup: Mapped[int] = mapped_column(Integer, default=0)


@dataclass
class Launch:
    """A launch as the rest of the bot sees it (a detached copy of its row). Times are epoch seconds."""

    id: int
    host: str
    variant: str
    params: dict[str, Any]
    command: str
    log_path: str | None
    port: int | None
    gpus: list[int]
    pid: int | None
    pgid: int | None
    sid: int | None
    state: str
    state_detail: str | None
    created_by: str
    created_at: float
    ended_at: float | None
    channel: str | None
    thread_ts: str | None
    relaunch_of: int | None = None
    tag: str = ""
    alert_state: str | None = None
    snoozed_until: float | None = None

    @property
    def live(self) -> bool:
        """True while the launch may still have processes (not killed, exited or failed)."""
        return self.state in LIVE_STATES

    @property
    def name(self) -> str:
        """Short display name, e.g. `base#12`."""
        return f"{self.variant}#{self.id}"


@dataclass
class Event:
    """One audit entry (see EventRow)."""

    id: int
    at: float
    user_id: str
    action: str
    args: dict[str, Any] = field(default_factory=dict)
    result: str = "ok"
    detail: str | None = None
    launch_id: int | None = None
    host: str | None = None
    channel: str | None = None


def _launch(row: LaunchRow) -> Launch:
    return Launch(
        id=row.id, host=row.host, variant=row.variant, params=json.loads(row.params_json or "{}"),
        command=row.command, log_path=row.log_path, port=row.port, gpus=json.loads(row.gpus_json or "[]"),
        pid=row.pid, pgid=row.pgid, sid=row.sid, state=row.state, state_detail=row.state_detail,
        created_by=row.created_by, created_at=row.created_at, ended_at=row.ended_at, channel=row.channel,
        thread_ts=row.thread_ts, relaunch_of=row.relaunch_of, tag=row.tag or "", alert_state=row.alert_state,
        snoozed_until=row.snoozed_until,
    )


def _event(row: EventRow) -> Event:
    return Event(id=row.id, at=row.at, user_id=row.user_id, action=row.action,
                 args=json.loads(row.args_json or "{}"), result=row.result, detail=row.detail,
                 launch_id=row.launch_id, host=row.host, channel=row.channel)


def default_url(state_dir: str) -> str:
    """SQLite URL of `gpubot.db` in `state_dir` (created with mode 0700 if missing)."""
    d = Path(os.path.expanduser(state_dir))
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return f"sqlite:///{d / 'gpubot.db'}"


class Store:
    """Launches, incident threads and events in one database. Raises sqlalchemy errors only on a broken
    database (disk full, unreadable file)."""

    def __init__(self, url: str):
        self.url = url
        self.engine: Engine = create_engine(url, future=True)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        Base.metadata.create_all(self.engine)
        self._add_missing_columns()
        if url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
            try:  # launches hold params and commands: readable by the bot's user only
                os.chmod(url[len("sqlite:///"):], 0o600)
            except OSError:
                pass
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def _add_missing_columns(self) -> None:
        """Bring a database made by an older gpubot up to date: add columns that newer versions declare
        (additive changes only; every new column is nullable or has a default)."""
        insp = inspect(self.engine)
        with self.engine.begin() as conn:
            for table in Base.metadata.sorted_tables:
                have = {c["name"] for c in insp.get_columns(table.name)}
                for col in table.columns:
                    if col.name in have:
                        continue
                    ddl_type = col.type.compile(dialect=self.engine.dialect)
                    default = col.default.arg if col.default is not None and not callable(col.default.arg) else None
                    clause = f" DEFAULT {default!r}" if isinstance(default, (str, int, float)) else ""
                    conn.exec_driver_sql(f'ALTER TABLE "{table.name}" ADD COLUMN "{col.name}" {ddl_type}{clause}')

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        with self._sessions.begin() as s:
            yield s

    # launches -----------------------------------------------------------------------------------
    def create_launch(self, *, host: str, variant: str, params: dict[str, Any], command: str,
                      log_path: str | None, port: int | None, gpus: list[int], created_by: str,
                      channel: str | None = None, thread_ts: str | None = None,
                      relaunch_of: int | None = None) -> Launch:
        """Insert a launch in state `starting` and return it (with its new id)."""
        with self._tx() as s:
            row = LaunchRow(host=host, variant=variant, params_json=json.dumps(params, sort_keys=True),
                            command=command, log_path=log_path, port=port, gpus_json=json.dumps(gpus),
                            created_by=created_by, created_at=time.time(), channel=channel,
                            thread_ts=thread_ts, relaunch_of=relaunch_of, state="starting")
            s.add(row)
            s.flush()
            # unique across bots and databases: the id alone would repeat in a fresh state_dir
            row.tag = f"{row.id}-{secrets.token_hex(6)}"
            s.flush()
            return _launch(row)

    def update_launch(self, launch_id: int, **fields: Any) -> Launch:
        """Set columns of a launch (`params`/`gpus` are JSON-encoded) and return the new version.

        Raises KeyError for an unknown id.
        """
        with self._tx() as s:
            row = s.get(LaunchRow, launch_id)
            if row is None:
                raise KeyError(launch_id)
            for k, v in fields.items():
                if k == "params":
                    row.params_json = json.dumps(v, sort_keys=True)
                elif k == "gpus":
                    row.gpus_json = json.dumps(v)
                else:
                    setattr(row, k, v)
            if fields.get("state") in TERMINAL_STATES and row.ended_at is None:
                row.ended_at = time.time()
            return _launch(row)

    def set_started(self, launch_id: int, pid: int) -> Launch:
        """Record the started process (PID = PGID = SID). The state becomes `running` only if it is still
        `starting` (compare-and-set): a launch cancelled meanwhile keeps its state. Returns the launch."""
        with self._tx() as s:
            row = s.get(LaunchRow, launch_id)
            if row is None:
                raise KeyError(launch_id)
            row.pid = row.pgid = row.sid = pid
            if row.state == "starting":
                row.state = "running"
            return _launch(row)

    def get_launch(self, launch_id: int) -> Launch | None:
        """The launch with this id, or None."""
        with self._tx() as s:
            row = s.get(LaunchRow, launch_id)
            return _launch(row) if row else None

    def replace_thread_ts(self, old: str, new: str) -> int:
        """Point launches whose incident thread is `old` (an outbox reference `q:<id>`) at the real Slack
        ts `new`, once the root message is posted. Returns the number of launches changed."""
        with self._tx() as s:
            res = s.execute(update(LaunchRow).where(LaunchRow.thread_ts == old).values(thread_ts=new))
            return int(res.rowcount or 0)

    def launch_for_thread(self, channel: str, thread_ts: str) -> Launch | None:
        """The launch whose incident thread is (channel, thread_ts), or None."""
        with self._tx() as s:
            row = s.scalars(select(LaunchRow).where(LaunchRow.channel == channel, LaunchRow.thread_ts == thread_ts)
                            .order_by(LaunchRow.id.desc())).first()
            return _launch(row) if row else None

    def live_launches(self, host: str | None = None, variant: str | None = None) -> list[Launch]:
        """Launches in a live state, newest first, optionally on one host and/or of one variant."""
        with self._tx() as s:
            q = select(LaunchRow).where(LaunchRow.state.in_(LIVE_STATES))
            if host is not None:
                q = q.where(LaunchRow.host == host)
            if variant is not None:
                q = q.where(LaunchRow.variant == variant)
            return [_launch(r) for r in s.scalars(q.order_by(LaunchRow.id.desc()))]

    def recent_launches(self, limit: int = 20) -> list[Launch]:
        """The newest launches, newest first."""
        with self._tx() as s:
            return [_launch(r) for r in s.scalars(select(LaunchRow).order_by(LaunchRow.id.desc()).limit(limit))]

    # observations -------------------------------------------------------------------------------
    def add_observation(self, launch_id: int, data: dict[str, Any]) -> None:
        """Append one check's compact record (JSON-serialisable dict) for a launch."""
        with self._tx() as s:
            s.add(ObservationRow(launch_id=launch_id, at=time.time(), data_json=json.dumps(data, default=str)))

    def observations(self, launch_id: int, limit: int = 10_000) -> list[dict[str, Any]]:
        """The launch's observation records, oldest first (at most the newest `limit`)."""
        with self._tx() as s:
            rows = list(s.scalars(select(ObservationRow).where(ObservationRow.launch_id == launch_id)
                                  .order_by(ObservationRow.id.desc()).limit(limit)))
        return [json.loads(r.data_json) for r in reversed(rows)]

    def last_observation(self, launch_id: int) -> dict[str, Any] | None:
        """The newest observation record of the launch that is not an error, or None."""
        for rec in reversed(self.observations(launch_id, limit=20)):
            if "error" not in rec:
                return rec
        return None

    # confirmations ------------------------------------------------------------------------------
    def add_confirmation(self, *, asked_by: str, host: str, launch_id: int | None = None, pid: int | None = None,
                         command: str | None = None) -> int:
        """Record a kill that waits for confirmation. Returns its id (the [Kill] / [Cancel] button value)."""
        with self._tx() as s:
            row = ConfirmationRow(asked_by=asked_by, host=host, launch_id=launch_id, pid=pid, command=command,
                                  created_at=time.time())
            s.add(row)
            s.flush()
            return int(row.id)

    def claim_confirmation(self, conf_id: int, *, state: str, user_id: str,
                           max_age_s: float) -> tuple[Confirmation | None, bool]:
        """Decide confirmation `conf_id` (`state` confirmed or cancelled) if it is still pending and younger
        than `max_age_s` seconds, atomically. Returns (the confirmation or None if unknown, whether this
        call decided it)."""
        with self._tx() as s:
            res = s.execute(update(ConfirmationRow).where(
                ConfirmationRow.id == conf_id, ConfirmationRow.state == "pending",
                ConfirmationRow.created_at >= time.time() - max_age_s,
            ).values(state=state, decided_by=user_id, decided_at=time.time()))
            row = s.get(ConfirmationRow, conf_id)
            conf = None if row is None else Confirmation(
                id=row.id, launch_id=row.launch_id, host=row.host, pid=row.pid, command=row.command,
                asked_by=row.asked_by, state=row.state, decided_by=row.decided_by, created_at=row.created_at)
            return conf, bool(res.rowcount)

    # events -------------------------------------------------------------------------------------
    def add_event(self, *, user_id: str, action: str, args: dict[str, Any] | None = None, result: str = "ok",
                  detail: str | None = None, launch_id: int | None = None, host: str | None = None,
                  channel: str | None = None) -> Event:
        """Append an audit entry and return it."""
        with self._tx() as s:
            row = EventRow(at=time.time(), user_id=user_id, action=action,
                           args_json=json.dumps(_redacted(args or {}), sort_keys=True, default=str), result=result,
                           detail=redact(detail) if detail else detail, launch_id=launch_id, host=host,
                           channel=channel)
            s.add(row)
            s.flush()
            return _event(row)

    def events(self, *, launch_id: int | None = None, action: str | None = None, limit: int = 1000) -> list[Event]:
        """Events in time order, optionally for one launch and/or one action."""
        with self._tx() as s:
            q = select(EventRow)
            if launch_id is not None:
                q = q.where(EventRow.launch_id == launch_id)
            if action is not None:
                q = q.where(EventRow.action == action)
            return [_event(r) for r in s.scalars(q.order_by(EventRow.id).limit(limit))]

    def close(self) -> None:
        """Dispose of the engine's connections."""
        self.engine.dispose()


def _redacted(obj: Any) -> Any:
    """`obj` with every string redacted (bot.core.redact): the audit trail never stores a secret."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {k: _redacted(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_redacted(v) for v in obj]
    return obj


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=2000")
    cur.close()
