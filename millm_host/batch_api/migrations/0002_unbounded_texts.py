"""batch: a line's custom_id, which clients write without a length bound, unbounded

SQLite never enforces a VARCHAR length; PostgreSQL does, and refused these with a 500.

Revision ID: batch_0002
Revises: batch_0001
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "batch_0002"
down_revision = "batch_0001"
branch_labels = None
depends_on = None

COLUMNS = [("batch_lines", "custom_id", 512, False)]


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":  # lengths are not enforced there: no table rebuild
        return
    for table, column, length, nullable in COLUMNS:
        op.alter_column(table, column, type_=sa.Text, existing_type=sa.String(length), existing_nullable=nullable)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, column, length, nullable in COLUMNS:
        op.alter_column(table, column, type_=sa.String(length), existing_type=sa.Text, existing_nullable=nullable)
