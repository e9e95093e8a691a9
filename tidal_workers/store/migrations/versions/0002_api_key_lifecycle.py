"""api key lifecycle: an id, a name, a hint, where the key comes from, last use and revocation

Revision ID: 0002
Revises: 0001
"""

import hashlib

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

DEV_KEY_HASH = hashlib.sha256(b"tidal-dev-key").hexdigest()


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch_op:
        batch_op.add_column(sa.Column("id", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("name", sa.String(length=128), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("hint", sa.String(length=16), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("source", sa.String(length=16), nullable=False, server_default="config"))
        batch_op.add_column(sa.Column("last_used_at", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("revoked_at", sa.BigInteger(), nullable=True))
    # Keys stored before this revision came from TIDAL_API_KEYS (or dev mode): their id is derived from the digest,
    # which is unique, and says nothing of the key.
    op.execute("UPDATE api_keys SET id = 'key_' || substr(key_hash, 1, 16)")
    op.execute(f"UPDATE api_keys SET source = 'dev', name = 'dev mode' WHERE key_hash = '{DEV_KEY_HASH}'")
    with op.batch_alter_table("api_keys") as batch_op:
        batch_op.alter_column("id", existing_type=sa.String(length=32), nullable=False)
        batch_op.create_index("ix_api_keys_id", ["id"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch_op:
        batch_op.drop_index("ix_api_keys_id")
        for column in ("revoked_at", "last_used_at", "source", "hint", "name", "id"):
            batch_op.drop_column(column)
