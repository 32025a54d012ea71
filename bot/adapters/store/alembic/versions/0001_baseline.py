"""Baseline: gpubot's five tables, or a database made before migrations (gpubot 0.1.0 and older, no version
table) brought to the same schema.

An older database got its new columns from `ALTER TABLE ... ADD COLUMN` (nullable, sometimes with a DEFAULT) and
lacked some indexes; here each such column is filled where empty, made NOT NULL as a fresh table's is, loses the
DEFAULT a fresh table does not have, and every missing index is made. Columns this schema does not know are kept.
The tables are frozen here as they were at this revision (a later model change needs a revision of its own).

Revision ID: 0001
Revises:
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _tables() -> sa.MetaData:
    """The schema of this revision; a NOT NULL column's `default` is what fills an older database's empty cells."""
    m = sa.MetaData()
    sa.Table(
        "launches", m,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("host", sa.String(64), nullable=False, index=True, default=""),
        sa.Column("variant", sa.String(64), nullable=False, index=True, default=""),
        sa.Column("params_json", sa.Text, nullable=False, default="{}"),
        sa.Column("command", sa.Text, nullable=False, default=""),
        sa.Column("log_path", sa.Text),
        sa.Column("port", sa.Integer),
        sa.Column("gpus_json", sa.Text, nullable=False, default="[]"),
        sa.Column("pid", sa.Integer),
        sa.Column("pgid", sa.Integer),
        sa.Column("sid", sa.Integer),
        sa.Column("state", sa.String(32), nullable=False, index=True, default="starting"),
        sa.Column("state_detail", sa.Text),
        sa.Column("created_by", sa.String(64), nullable=False, default=""),
        sa.Column("created_at", sa.Float, nullable=False, default=0.0),
        sa.Column("ended_at", sa.Float),
        sa.Column("channel", sa.String(64), index=True),
        sa.Column("thread_ts", sa.String(32), index=True),
        sa.Column("relaunch_of", sa.Integer, sa.ForeignKey("launches.id")),
        sa.Column("tag", sa.String(64), nullable=False, index=True, default=""),
        sa.Column("alert_state", sa.String(32)),
        sa.Column("snoozed_until", sa.Float),
        sa.Column("ready_at", sa.Float),
        sa.Column("unreachable_since", sa.Float),
        sa.Column("seen_pids_json", sa.Text),
        sa.Column("unit", sa.String(128)),
        sa.Column("unit_manager", sa.String(16)),
        sa.Column("sealed_secrets", sa.Text),
    )
    sa.Table(
        "events", m,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float, nullable=False, index=True, default=0.0),
        sa.Column("user_id", sa.String(64), nullable=False, default=""),
        sa.Column("action", sa.String(64), nullable=False, default=""),
        sa.Column("args_json", sa.Text, nullable=False, default="{}"),
        sa.Column("result", sa.String(32), nullable=False, default="ok"),
        sa.Column("detail", sa.Text),
        sa.Column("launch_id", sa.Integer, sa.ForeignKey("launches.id"), index=True),
        sa.Column("host", sa.String(64)),
        sa.Column("channel", sa.String(64)),
    )
    sa.Table(
        "observations", m,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("launch_id", sa.Integer, sa.ForeignKey("launches.id"), nullable=False, index=True, default=0),
        sa.Column("at", sa.Float, nullable=False, default=0.0),
        sa.Column("data_json", sa.Text, nullable=False, default="{}"),
    )
    sa.Table(
        "confirmations", m,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("launch_id", sa.Integer),
        sa.Column("host", sa.String(64), nullable=False, default=""),
        sa.Column("pid", sa.Integer),
        sa.Column("command", sa.Text),
        sa.Column("asked_by", sa.String(64), nullable=False, default=""),
        sa.Column("state", sa.String(16), nullable=False, default="pending"),
        sa.Column("decided_by", sa.String(64)),
        sa.Column("created_at", sa.Float, nullable=False, default=0.0),
        sa.Column("decided_at", sa.Float),
    )
    sa.Table(
        "outbox", m,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("channel", sa.String(64), nullable=False, index=True, default=""),
        sa.Column("kind", sa.String(16), nullable=False, default="post"),
        sa.Column("thread_ts", sa.String(32)),
        sa.Column("target_ts", sa.String(32)),
        sa.Column("text", sa.Text, nullable=False, default=""),
        sa.Column("blocks_json", sa.Text),
        sa.Column("filename", sa.String(255)),
        sa.Column("content", sa.LargeBinary),
        sa.Column("key", sa.String(40), nullable=False, default=""),
        sa.Column("state", sa.String(16), nullable=False, index=True, default="pending"),
        sa.Column("attempts", sa.Integer, nullable=False, default=0),
        sa.Column("next_at", sa.Float, nullable=False, default=0.0),
        sa.Column("created_at", sa.Float, nullable=False, default=0.0),
        sa.Column("sent_at", sa.Float),
        sa.Column("result_ts", sa.String(32)),
        sa.Column("error", sa.Text),
        sa.Column("needs_lookup", sa.Integer, nullable=False, default=0),
        sa.Column("user_id", sa.String(64)),
    )
    return m


def upgrade() -> None:
    bind = op.get_bind()
    have = set(sa.inspect(bind).get_table_names())
    for table in _tables().sorted_tables:
        if table.name in have:
            _conform(bind, table)
        else:
            table.create(bind)


def _conform(bind: sa.engine.Connection, table: sa.Table) -> None:
    """Bring one existing table of an older database to `table`: missing columns added, empty cells of NOT NULL
    columns filled with the column's default, NOT NULL and the absence of a DEFAULT as in a fresh table, missing
    indexes made."""
    insp = sa.inspect(bind)
    cols = {c["name"]: c for c in insp.get_columns(table.name)}
    for col in table.columns:
        if col.name not in cols:  # nullable first: the rows already there have no value yet
            op.add_column(table.name, sa.Column(col.name, col.type, nullable=True))
            cols[col.name] = {"nullable": True, "default": None}
    t = sa.table(table.name, *(sa.column(c.name) for c in table.columns))
    for col in table.columns:
        if not col.nullable and not col.primary_key and cols[col.name]["nullable"]:
            bind.execute(t.update().where(t.c[col.name].is_(None)).values({col.name: col.default.arg}))
    indexes = {i["name"] for i in insp.get_indexes(table.name)}
    changes = [col for col in table.columns if not col.primary_key
               and (cols[col.name]["nullable"] != col.nullable or cols[col.name].get("default") is not None)]
    missing = [i for i in table.indexes if i.name not in indexes]
    if not changes and not missing:
        return
    with op.batch_alter_table(table.name) as batch:
        for col in changes:
            batch.alter_column(col.name, existing_type=col.type, nullable=col.nullable, server_default=None)
        for index in missing:
            batch.create_index(index.name, [c.name for c in index.columns], unique=bool(index.unique))


def downgrade() -> None:
    raise NotImplementedError("gpubot's baseline has no downgrade: restore the database's backup instead")
