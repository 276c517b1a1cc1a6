"""batch lease: the replica running a batch, until when

Revision ID: batch_lease_0001
Revises: batch_0001

Its own revision id: another branch may add batch_0002 on batch_0001 too; Alembic upgrades
every head, so the two live side by side until a merge revision joins them.
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "batch_lease_0001"
down_revision = "batch_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("batches") as table:
        table.add_column(sa.Column("lease_owner", sa.String(200)))
        table.add_column(sa.Column("lease_expires_at", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("batches") as table:
        table.drop_column("lease_expires_at")
        table.drop_column("lease_owner")
