"""steering: imported clusters and circuits, with their persistent dials

Revision ID: steering_0002
Revises: steering_0001
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "steering_0002"
down_revision = "steering_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "steering_clusters",
        sa.Column("cluster_id", sa.String(200), primary_key=True),
        sa.Column("profile_name", sa.String(200), sa.ForeignKey("steering_profiles.name"), nullable=False, unique=True),
        sa.Column("document", sa.JSON, nullable=False),
        sa.Column("intensity", sa.Float, nullable=False),
        sa.Column("created", sa.Integer, nullable=False),
    )
    op.create_table(
        "steering_circuits",
        sa.Column("circuit_id", sa.String(200), primary_key=True),
        sa.Column("document", sa.JSON, nullable=False),
        sa.Column("intensity", sa.Float, nullable=False),
        sa.Column("created", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("steering_circuits")
    op.drop_table("steering_clusters")
