"""A Slurm job's requeues: how often Slurm had requeued a launch's job when a check last read it
(`launches.job_restarts`, Slurm's `Restarts` / squeue's `RestartCnt`), so that a requeue is told once, across
restarts of the bot and between two bots.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("launches") as batch:
        batch.add_column(sa.Column("job_restarts", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("launches") as batch:
        batch.drop_column("job_restarts")
