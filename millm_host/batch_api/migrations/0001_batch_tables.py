"""batch tables: files, batches, batch lines

Revision ID: batch_0001
Revises:
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "batch_0001"
down_revision = None
branch_labels = ("batch",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "batch_files",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False, index=True),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Integer, nullable=False, index=True),
    )
    op.create_table(
        "batches",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("input_file_id", sa.String(40), nullable=False),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False, index=True),
        sa.Column("model", sa.String(255)),
        sa.Column("metadata", sa.JSON),
        sa.Column("errors", sa.JSON),
        sa.Column("output_file_id", sa.String(40)),
        sa.Column("error_file_id", sa.String(40)),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("completed", sa.Integer, nullable=False),
        sa.Column("failed", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Integer, nullable=False, index=True),
        sa.Column("expires_at", sa.Integer, nullable=False),
        *(
            sa.Column(name, sa.Integer)
            for name in (
                "in_progress_at",
                "finalizing_at",
                "completed_at",
                "failed_at",
                "expired_at",
                "cancelling_at",
                "cancelled_at",
            )
        ),
    )
    op.create_table(
        "batch_lines",
        sa.Column("batch_id", sa.String(40), sa.ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("line", sa.Integer, primary_key=True),
        sa.Column("custom_id", sa.String(512), nullable=False),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("request", sa.JSON),
        sa.Column("result", sa.JSON),
    )


def downgrade() -> None:
    op.drop_table("batch_lines")
    op.drop_table("batches")
    op.drop_table("batch_files")
