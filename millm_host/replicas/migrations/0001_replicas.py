"""replicas: one row per running replica

Revision ID: replicas_0001
Revises:
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "replicas_0001"
down_revision = None
branch_labels = ("replicas",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "millm_replicas",
        sa.Column("replica_id", sa.String(200), primary_key=True),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("heartbeat_at", sa.Float, nullable=False, index=True),
        sa.Column("converged", sa.Boolean, nullable=False),
        sa.Column("reasons", sa.JSON),
    )


def downgrade() -> None:
    op.drop_table("millm_replicas")
