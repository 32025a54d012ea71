"""The command journal (table `commands`, bot.adapters.store.commands): a command and its audit row are written
ahead of its work, and the outbox rows of its answer carry its id (`outbox.command_id`), so that the leader answers
the commands of a bot that died while it ran them, once.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "commands",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("owner", sa.String(300), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("user_id", sa.String(64), nullable=False),
        sa.Column("channel", sa.String(64), nullable=False),
        sa.Column("thread_ts", sa.String(32), nullable=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("audit_id", sa.Integer, nullable=True),
        sa.Column("placeholder", sa.String(32), nullable=True),
        sa.Column("expects_answer", sa.Integer, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float, nullable=True),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_commands_state", "commands", ["state"])
    with op.batch_alter_table("outbox") as batch:
        batch.add_column(sa.Column("command_id", sa.Integer, nullable=True))
    op.create_index("ix_outbox_command_id", "outbox", ["command_id"])


def downgrade() -> None:
    op.drop_index("ix_outbox_command_id", "outbox")
    with op.batch_alter_table("outbox") as batch:
        batch.drop_column("command_id")
    op.drop_index("ix_commands_state", "commands")
    op.drop_table("commands")
