"""Shared fixtures: a tiny model identity and deterministic KV pages for it."""

from __future__ import annotations

import pytest
import torch

from chunkstore import ChunkStore, ModelIdentity, chain_pages

TINY = ModelIdentity("tiny-test", "bfloat16", num_layers=2, num_kv_heads=2, head_dim=16, page_size=4)


def kv_pages(identity: ModelIdentity, num_pages: int, seed: int = 0) -> list[torch.Tensor]:
    """KV-like pages: normal values with per-channel scales, in the identity's dtype."""
    g = torch.Generator().manual_seed(seed)
    shape = identity.page_shape
    scale = torch.exp(torch.randn((shape[0], shape[1], 1, shape[3], shape[4]), generator=g) * 0.8)
    dtype = getattr(torch, identity.kv_dtype)
    return [(torch.randn(shape, generator=g) * scale).to(dtype) for _ in range(num_pages)]


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
