"""Comparing KV by its bytes: pages are moved bit for bit, so a comparison by value would be wrong
(NaN != NaN, -0.0 == 0.0). Shared by the test suite, the crash soak and the benchmarks."""

from __future__ import annotations

import torch


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` as a uint8 CPU tensor (any device, any layout)."""
    return t.detach().cpu().contiguous().view(torch.uint8)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` hold the same bytes (shape and dtype's width included)."""
    return a.shape == b.shape and a.element_size() == b.element_size() and torch.equal(bits(a), bits(b))
