"""The phase split (freeze / thaw): batches.phase_split, kv_stored_bytes, kv_byte_seconds and kv_accounted_at

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Batches that exist at upgrade time were never split: `never` keeps them running whole.
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("phase_split", sa.String(8), server_default="never", nullable=False))
        batch_op.add_column(sa.Column("kv_stored_bytes", sa.BigInteger(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("kv_byte_seconds", sa.Double(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("kv_accounted_at", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_column("kv_accounted_at")
        batch_op.drop_column("kv_byte_seconds")
        batch_op.drop_column("kv_stored_bytes")
        batch_op.drop_column("phase_split")
