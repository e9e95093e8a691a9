"""Attempt caps: items.reclaims (lease expiries each item was reclaimed after) and batches.finalize_attempts

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nothing was counted before this revision: every existing item and batch starts at 0.
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reclaims", sa.Integer(), server_default="0", nullable=False))
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("finalize_attempts", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_column("finalize_attempts")
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.drop_column("reclaims")
