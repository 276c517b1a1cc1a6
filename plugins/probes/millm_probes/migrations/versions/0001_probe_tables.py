"""probe tables: probes, acknowledgements, parity reports, recalibrations, events

Revision ID: probes_0001
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "probes_0001"
down_revision = None
branch_labels = ("probes",)
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "probes",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("behaviour", sa.String(200)),
        sa.Column("version", sa.String(100)),
        sa.Column("provenance_probe_id", sa.String(200)),
        sa.Column("definition", sa.Text, nullable=False),
        sa.Column("detector_digest", sa.String(80), nullable=False),
        sa.Column("detector_digest_source", sa.String(16), nullable=False),
        sa.Column("decision", sa.JSON),
        sa.Column("decision_digest", sa.String(80), nullable=False),
        sa.Column("decision_digest_source", sa.String(16), nullable=False),
        sa.Column("decision_revision", sa.Integer, nullable=False),
        sa.Column("threshold_revision", sa.Integer, nullable=False),
        sa.Column("armed", sa.Boolean, nullable=False),
        sa.Column("armed_at", TZ),
        sa.Column("armed_load_id", sa.String(32)),
        sa.Column("disarmed_reason", sa.String(40)),
        sa.Column("created_at", TZ, nullable=False),
    )
    op.create_table(
        "probe_acknowledgements",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "probe_id", sa.String(32), sa.ForeignKey("probes.id", ondelete="CASCADE"), nullable=False, index=True
        ),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("rung", sa.Integer, nullable=False),
        sa.Column("model_load_id", sa.String(32)),
        sa.Column("created_at", TZ, nullable=False),
    )
    op.create_table(
        "probe_parity_reports",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column(
            "probe_id", sa.String(32), sa.ForeignKey("probes.id", ondelete="CASCADE"), nullable=False, index=True
        ),
        sa.Column("status", sa.String(24), nullable=False),
        sa.Column("model_id", sa.String(200)),
        sa.Column("model_load_id", sa.String(32)),
        sa.Column("report", sa.JSON, nullable=False),
        sa.Column("created_at", TZ, nullable=False),
    )
    op.create_table(
        "probe_recalibrations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "probe_id", sa.String(32), sa.ForeignKey("probes.id", ondelete="CASCADE"), nullable=False, index=True
        ),
        sa.Column("previous", sa.JSON),
        sa.Column("decision", sa.JSON),
        sa.Column("decision_digest", sa.String(80), nullable=False),
        sa.Column("decision_revision", sa.Integer, nullable=False),
        sa.Column("threshold_revision", sa.Integer, nullable=False),
        sa.Column("created_at", TZ, nullable=False),
    )
    op.create_table(
        "probe_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("result_id", sa.String(36), nullable=False, unique=True),
        sa.Column("probe_id", sa.String(32), index=True),
        sa.Column("request_id", sa.String(64)),
        sa.Column("trace_id", sa.String(32), nullable=False, index=True),
        sa.Column("window", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("fired", sa.Boolean),
        sa.Column("result", sa.JSON, nullable=False),
        sa.Column("detail", sa.JSON),
        sa.Column("created_at", TZ, nullable=False),
    )


def downgrade() -> None:
    for table in ("probe_events", "probe_recalibrations", "probe_parity_reports", "probe_acknowledgements", "probes"):
        op.drop_table(table)
