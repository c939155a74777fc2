"""Seal keys for a sealed store: each namespace's random data key (AES-256-GCM, the chunks' cipher)
and naming key (the keyed hash that names its chunks), wrapped together by the store's master key
(chunkstore/disk/sealing.py). A row's ``key_id`` is public (every sealed chunk names it); its
``wrapped`` blob opens only with the master key ``master_key_id`` names. Deleting a namespace's
row crypto-shreds the namespace: nothing it sealed can be read again, wherever a copy lies.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "seal_keys",
        sa.Column("namespace", sa.String, primary_key=True),
        sa.Column("key_id", sa.LargeBinary(8), nullable=False),
        sa.Column("master_key_id", sa.String, nullable=False),
        sa.Column("wrapped", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_seal_keys_key_id", "seal_keys", ["key_id"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_seal_keys_key_id", "seal_keys")
    op.drop_table("seal_keys")
