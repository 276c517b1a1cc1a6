"""steering: registered SAEs, profiles, the steering lock

Revision ID: steering_0001
Revises:
Create Date: 2026-01-01
"""

import sqlalchemy as sa
from alembic import op

revision = "steering_0001"
down_revision = None
branch_labels = ("steering",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "steering_saes",
        sa.Column("sae_id", sa.String(200), primary_key=True),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("d_in", sa.Integer, nullable=False),
        sa.Column("d_sae", sa.Integer, nullable=False),
        sa.Column("layer", sa.Integer, nullable=False),
        sa.Column("hook_point", sa.String(16), nullable=False),
        sa.Column("architecture", sa.String(16), nullable=False),
        sa.Column("cfg", sa.JSON, nullable=False),
        sa.Column("created", sa.Integer, nullable=False),
    )
    op.create_table(
        "steering_profiles",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("sae_id", sa.String(200), sa.ForeignKey("steering_saes.sae_id"), nullable=False),
        sa.Column("layer", sa.Integer, nullable=False),
        sa.Column("features", sa.JSON, nullable=False),
        sa.Column("created", sa.Integer, nullable=False),
    )
    op.create_table(
        "steering_lock",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("model_id", sa.String(400), nullable=False),
        sa.Column("locked", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("steering_lock")
    op.drop_table("steering_profiles")
    op.drop_table("steering_saes")
