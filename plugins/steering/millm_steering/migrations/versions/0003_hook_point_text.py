"""steering: an SAE's hook point (blocks.<N>.hook_resid_post, 24+ characters) as unbounded text

It was VARCHAR(16): SQLite never enforces a length, PostgreSQL does, and refused every SAE with a 500.

Revision ID: steering_0003
Revises: steering_0002
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "steering_0003"
down_revision = "steering_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":  # lengths are not enforced there: no table rebuild
        return
    op.alter_column("steering_saes", "hook_point", type_=sa.Text, existing_type=sa.String(16), existing_nullable=False)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    op.alter_column("steering_saes", "hook_point", type_=sa.String(16), existing_type=sa.Text, existing_nullable=False)
