"""Poison items: items.engine_deaths, the engine deaths each item was at the engine for

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # No death was counted before this revision: every existing item starts at 0.
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.add_column(sa.Column("engine_deaths", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.drop_column("engine_deaths")
