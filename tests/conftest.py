"""Shared fixtures: a tiny model identity and deterministic KV pages for it."""

from __future__ import annotations

import pytest

from chunkstore import ChunkStore, ModelIdentity, chain_pages
from tests.helpers import TINY, kv_pages


@pytest.fixture
def identity() -> ModelIdentity:
    return TINY


@pytest.fixture
def store(tmp_path, identity):
    s = ChunkStore(tmp_path / "store", identity)
    yield s
    s.close()


@pytest.fixture
def chain(identity):
    """Ten pages of one prefix with their KV."""
    pages = chain_pages(identity, list(range(identity.page_size * 10)))
    return pages, kv_pages(identity, len(pages))
