"""Helpers the tests share (fixtures stay in the conftest files): a tiny model identity and
deterministic KV pages for it. The per-area helpers are this package's modules.
"""

from __future__ import annotations

import torch

from chunkstore import ModelIdentity

TINY = ModelIdentity("tiny-test", "bfloat16", num_layers=2, num_kv_heads=2, head_dim=16, page_size=4)


def kv_pages(identity: ModelIdentity, num_pages: int, seed: int = 0) -> list[torch.Tensor]:
    """KV-like pages: normal values with per-channel scales, in the identity's dtype."""
    g = torch.Generator().manual_seed(seed)
    shape = identity.page_shape
    scale = torch.exp(torch.randn((shape[0], shape[1], 1, shape[3], shape[4]), generator=g) * 0.8)
    dtype = getattr(torch, identity.kv_dtype)
    return [(torch.randn(shape, generator=g) * scale).to(dtype) for _ in range(num_pages)]
