"""Deliveries: the Slack deliveries a bot of this database took (table `deliveries`), so that one Slack retries,
to the same bot or to another bot on the database, is acted on once.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deliveries",
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("at", sa.Float, nullable=False),
    )
    op.create_index("ix_deliveries_at", "deliveries", ["at"])


def downgrade() -> None:
    op.drop_index("ix_deliveries_at", "deliveries")
    op.drop_table("deliveries")
