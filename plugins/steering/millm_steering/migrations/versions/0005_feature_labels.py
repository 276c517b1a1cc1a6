"""steering: feature labels (explanations imported from Neuronpedia or SAELens), per SAE

Revision ID: steering_labels_0001
Revises: steering_desired_0001

Its own revision id, as steering_desired_0001 has: another branch may add a revision on the same parent.
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "steering_labels_0001"
down_revision = "steering_desired_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "steering_feature_labels",
        sa.Column("sae_id", sa.String(200), sa.ForeignKey("steering_saes.sae_id"), primary_key=True),
        sa.Column("feature", sa.Integer, primary_key=True),
        sa.Column("label", sa.Text, nullable=False),
        sa.Column("folded", sa.Text, nullable=False),
        sa.Column("explainer", sa.Text, nullable=True),
        sa.Column("method", sa.Text, nullable=True),
        sa.Column("score", sa.Float, nullable=True),
        sa.Column("imported", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("steering_feature_labels")
