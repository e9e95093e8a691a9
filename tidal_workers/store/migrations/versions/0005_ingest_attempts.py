"""ingest attempts: batches.ingest_attempts and batches.ingest_started_at

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A batch `validating` at upgrade time starts with no attempt counted: its next ingest is its first.
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ingest_attempts", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("ingest_started_at", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_column("ingest_started_at")
        batch_op.drop_column("ingest_attempts")
