"""64-bit integers for sizes, counts and counters on PostgreSQL, whose INTEGER is 32-bit (a
namespace's bytes pass 2^31 at 2 GiB). SQLite's INTEGER is 64-bit already: nothing changes there.
The stats history's, where an older index has that table, are the management API's to widen (its
own revision h0001) since that table became the API's own.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Spelled out (not imported from the schema modules): a migration is frozen once released.
_WIDE = {
    "chunks": ("raw_bytes", "stored_bytes", "hit_count"),
    "namespace_usage": ("num_chunks", "raw_bytes", "stored_bytes"),
    "namespace_quotas": ("quota_bytes",),
    "counters": ("value",),
}


def _retype(kind: type) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, columns in _WIDE.items():
        for name in columns:
            op.alter_column(table, name, type_=kind())


def upgrade() -> None:
    _retype(sa.BigInteger)


def downgrade() -> None:
    _retype(sa.Integer)
