"""probe sessions: sessions, turns (keys and transcripts), and each event's session and turn

Revision ID: probes_sessions_0001
Revises: probes_0001
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "probes_sessions_0001"
down_revision = "probes_0001"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "probe_sessions",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(128), nullable=False, unique=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("ambiguous", sa.Boolean, nullable=False),
        sa.Column("previous_session_id", sa.String(128)),
        sa.Column("turns", sa.Integer, nullable=False),
        sa.Column("fired", sa.Integer, nullable=False),
        sa.Column("started_at", TZ, nullable=False),
        sa.Column("last_active_at", TZ, nullable=False, index=True),
    )
    op.create_table(
        "probe_session_turns",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(128), nullable=False, index=True),
        sa.Column("turn", sa.Integer, nullable=False),
        sa.Column("request_id", sa.String(64)),
        sa.Column("trace_id", sa.String(32)),
        sa.Column("endpoint", sa.String(32), nullable=False),
        sa.Column("exact_key", sa.String(64), index=True),
        sa.Column("loose_key", sa.String(64), index=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("user_text", sa.Text),
        sa.Column("reply_text", sa.Text),
        sa.Column("transcript_at", TZ, index=True),
    )
    with op.batch_alter_table("probe_events") as batch:
        batch.add_column(sa.Column("session_id", sa.String(128)))
        batch.add_column(sa.Column("turn", sa.Integer))
        batch.create_index("ix_probe_events_session_id", ["session_id"])
        batch.create_index("ix_probe_events_created_at", ["created_at"])


def downgrade() -> None:
    with op.batch_alter_table("probe_events") as batch:
        batch.drop_index("ix_probe_events_created_at")
        batch.drop_index("ix_probe_events_session_id")
        batch.drop_column("turn")
        batch.drop_column("session_id")
    op.drop_table("probe_session_turns")
    op.drop_table("probe_sessions")
