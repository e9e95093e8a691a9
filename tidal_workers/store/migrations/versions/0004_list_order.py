"""list order: a creation sequence on files and batches; an input file's row may go before its batches'

Rows created in the same second got ``created_at`` ties broken by their random ids; ``seq`` numbers them in
creation order (PostgreSQL: one sequence; SQLite: max + 1 under its single writer). Existing rows are numbered
by (created_at, id), the order lists showed before. The foreign key from batches.input_file_id to files goes, so
the retention sweep can delete an expired input file's row while its batch's row stays.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

SEQUENCE = "tidal_list_seq"
TABLES = ("batches", "files")  # batches first: its rebuild on SQLite drops the reference to files
#: SQLite's foreign keys have no names; batch mode names them by this convention so one can be dropped.
NAMING = {"fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s"}


def _input_file_fk() -> str:
    for fk in sa.inspect(op.get_bind()).get_foreign_keys("batches"):
        if fk["constrained_columns"] == ["input_file_id"]:
            return fk["name"] or "fk_batches_input_file_id_files"
    raise RuntimeError("batches.input_file_id has no foreign key to drop")


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        op.execute(f"CREATE SEQUENCE {SEQUENCE}")
    fk = _input_file_fk()
    for table in TABLES:
        with op.batch_alter_table(table) as batch_op:
            batch_op.add_column(sa.Column("seq", sa.BigInteger(), nullable=True))
        op.execute(
            f"UPDATE {table} SET seq = ranked.n FROM "
            f"(SELECT id, row_number() OVER (ORDER BY created_at, id) AS n FROM {table}) AS ranked "
            f"WHERE {table}.id = ranked.id"
        )
    if postgres:
        op.execute(
            f"SELECT setval('{SEQUENCE}', greatest(1, "
            + ", ".join(f"(SELECT coalesce(max(seq), 0) FROM {table})" for table in TABLES)
            + "))"
        )
    for table in TABLES:
        with op.batch_alter_table(table, naming_convention=NAMING) as batch_op:
            if table == "batches":
                batch_op.drop_constraint(fk, type_="foreignkey")
            batch_op.alter_column("seq", existing_type=sa.BigInteger(), nullable=False)
            batch_op.create_index(f"ix_{table}_tenant_seq", ["tenant_id", "seq"], unique=False)
            batch_op.create_index(f"ix_{table}_seq", ["seq"], unique=False)


def downgrade() -> None:
    for table in reversed(TABLES):
        with op.batch_alter_table(table) as batch_op:
            batch_op.drop_index(f"ix_{table}_seq")
            batch_op.drop_index(f"ix_{table}_tenant_seq")
            batch_op.drop_column("seq")
    with op.batch_alter_table("batches") as batch_op:
        batch_op.create_foreign_key("fk_batches_input_file_id_files", "files", ["input_file_id"], ["id"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP SEQUENCE {SEQUENCE}")
