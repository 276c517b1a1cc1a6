"""probe capacity: each model's measured step and probe costs, and the limits set for it

Its own history (``alembic_version_probe_capacity``), apart from the probe tables.

Revision ID: probe_capacity_0001
Revises:
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "probe_capacity_0001"
down_revision = None
branch_labels = ("probe_capacity",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "probe_capacity",
        sa.Column("model_id", sa.String(200), primary_key=True),
        sa.Column("measurement", sa.JSON),
        sa.Column("limits", sa.JSON),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("probe_capacity")
