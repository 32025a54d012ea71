"""Launches across nodes: a launch's Slurm job id (`launches.job_id`) and the nodes its ranks run on
(`launches.nodes_json`), both empty for a launch on one host.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("launches") as batch:
        batch.add_column(sa.Column("job_id", sa.String(32), nullable=True))
        batch.add_column(sa.Column("nodes_json", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("launches") as batch:
        batch.drop_column("nodes_json")
        batch.drop_column("job_id")
