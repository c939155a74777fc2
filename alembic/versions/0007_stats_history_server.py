"""Formerly: the stats history gained a server key (each server of a shared tier writes, reads and
trims only its own samples). The table is the management API's own now
(chunkstore/api/migrations; its revision h0001 adds the key, '' for the rows before, to a table
made before): this revision changes nothing.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-10
"""

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass  # the management API's own migrations keep its table


def downgrade() -> None:
    pass
