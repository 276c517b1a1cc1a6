"""steering desired state: what every replica converges to

Revision ID: steering_desired_0001
Revises: steering_0002

Its own revision id: another branch may add steering_0003 on steering_0002 too; Alembic
upgrades every head, so the two live side by side until a merge revision joins them.
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "steering_desired_0001"
down_revision = "steering_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "steering_desired",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("revision", sa.Integer, nullable=False),
        sa.Column("document", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("steering_desired")
