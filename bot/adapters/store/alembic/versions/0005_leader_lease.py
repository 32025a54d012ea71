"""The leader's lease on a shared PostgreSQL database (table `leader_lease`, bot.adapters.store.lease): a leader
that misses its renewals (frozen) loses the lead within the lease.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leader_lease",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("backend_pid", sa.Integer, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leader_lease")
