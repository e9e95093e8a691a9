"""Claiming by phase: items.phase (whole, prefill or decode)

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Items that exist at upgrade time were never split: they run whole.
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.add_column(sa.Column("phase", sa.String(8), server_default="whole", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.drop_column("phase")
