"""probes: texts clients write without a length bound (a definition's version, provenance probe id; a model id) unbounded

SQLite never enforces a VARCHAR length; PostgreSQL does, and refused these with a 500.

Revision ID: probes_texts_0001
Revises: probes_sessions_0001
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "probes_texts_0001"
down_revision = "probes_sessions_0001"
branch_labels = None
depends_on = None

COLUMNS = [
    ("probes", "version", 100),
    ("probes", "provenance_probe_id", 200),
    ("probe_parity_reports", "model_id", 200),
]


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":  # lengths are not enforced there: no table rebuild
        return
    for table, column, length in COLUMNS:
        op.alter_column(table, column, type_=sa.Text, existing_type=sa.String(length), existing_nullable=True)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, column, length in COLUMNS:
        op.alter_column(table, column, type_=sa.String(length), existing_type=sa.Text, existing_nullable=True)
