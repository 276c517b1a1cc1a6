"""rule tables: rule sets and their attachments to behaviours

Revision ID: rulesets_0001
Revises:
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "rulesets_0001"
down_revision = None
branch_labels = ("rulesets",)
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "rule_sets",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("ruleset_id", sa.String(200), nullable=False),
        sa.Column("version", sa.String(100), nullable=False),
        sa.Column("document", sa.Text, nullable=False),
        sa.Column("digest", sa.String(80), nullable=False),
        sa.Column("status", sa.String(24), nullable=False),
        sa.Column("status_detail", sa.Text),
        sa.Column("checked_at", TZ, nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.UniqueConstraint("ruleset_id", "version"),
    )
    op.create_table(
        "rule_attachments",
        sa.Column("behaviour", sa.String(200), primary_key=True),
        sa.Column("rule_set_id", sa.String(32), sa.ForeignKey("rule_sets.id"), nullable=False, index=True),
        sa.Column("attached_at", TZ, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("rule_attachments")
    op.drop_table("rule_sets")
