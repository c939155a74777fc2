"""Publish claims for a shared tier: a writer claims a key here before it uploads the key's object,
and its row in ``chunks`` (the only claim that a chunk exists) replaces the claim in one
transaction. A claim lapses at ``expires_at`` (a dead writer's), so another writer may take it.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chunk_claims",
        sa.Column("key", sa.LargeBinary(32), primary_key=True),
        sa.Column("writer", sa.String, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_chunk_claims_expires_at", "chunk_claims", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_chunk_claims_expires_at", "chunk_claims")
    op.drop_table("chunk_claims")
