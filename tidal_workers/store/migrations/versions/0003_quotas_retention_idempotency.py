"""quotas, retention and idempotency: a batch's enqueued-token estimate and output expiry; idempotency keys

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Batches created before this revision count 0 tokens against the quota while they finish.
    with op.batch_alter_table("batches") as batch_op:
        batch_op.add_column(sa.Column("enqueued_tokens", sa.BigInteger(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("output_expires_after", sa.Integer(), nullable=True))
    with op.batch_alter_table("files") as batch_op:
        batch_op.create_index("ix_files_expires_at", ["expires_at"], unique=False)
    op.create_table(
        "idempotency_keys",
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("route", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("object_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "route", "key"),
    )
    with op.batch_alter_table("idempotency_keys") as batch_op:
        batch_op.create_index(batch_op.f("ix_idempotency_keys_created_at"), ["created_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("idempotency_keys") as batch_op:
        batch_op.drop_index(batch_op.f("ix_idempotency_keys_created_at"))
    op.drop_table("idempotency_keys")
    with op.batch_alter_table("files") as batch_op:
        batch_op.drop_index("ix_files_expires_at")
    with op.batch_alter_table("batches") as batch_op:
        batch_op.drop_column("output_expires_after")
        batch_op.drop_column("enqueued_tokens")
