"""KV pages for benchmarks: where the bytes come from (``KVSource``) and a seeded synthetic generator.

Invariants: the same (source, identity, num_pages, seed) always yields the same bytes; pages have
the store's page-first layout ``(num_layers, 2, page_size, num_kv_heads, head_dim)`` in the
identity's dtype. Synthetic KV mimics what makes real KV compress as it does: per-channel scales
that vary over orders of magnitude (log-normal) and a few large, biased outlier channels, mostly in
K. ``plane_entropies_bits`` measures the order-0 bound that any coder of the byte planes faces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from chunkstore.choices import Choice
from chunkstore.disk.identity import ModelIdentity
from chunkstore.disk.page_io import TORCH_DTYPES


class KVSource(Choice):
    """Where benchmark KV comes from. Only synthetic KV exists so far; KV computed by the
    built-in model will be another member, dispatched in ``make_pages``."""

    SYNTHETIC = "synthetic"

    @classmethod
    def label(cls) -> str:
        return "KV source"


@dataclass(frozen=True, slots=True)
class SyntheticKV:
    """Shape of the synthetic distribution: value = scale * (randn + bias) per channel.

    A channel is one (layer, K or V, kv head, dim). ``log_scale_sigma`` spreads channel scales
    log-normally around a per-(layer, K/V) level spread by ``layer_sigma``; an outlier channel
    is ``outlier_gain`` times larger and carries a bias of +-``outlier_bias`` (in its own
    standard deviations), as the large, one-signed channels of K do after RoPE.
    """

    log_scale_sigma: float = 0.5
    layer_sigma: float = 0.4
    k_outlier_fraction: float = 0.02
    v_outlier_fraction: float = 0.005
    outlier_gain: float = 8.0
    outlier_bias: float = 2.0

    def channel_params(self, identity: ModelIdentity, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale, bias), each float32 of shape (num_layers, 2, 1, num_kv_heads, head_dim):
        broadcastable against a page."""
        layers, heads, dim = identity.num_layers, identity.num_kv_heads, identity.head_dim
        level = torch.randn((layers, 2, 1, 1, 1), generator=gen) * self.layer_sigma
        log_scale = level + torch.randn((layers, 2, 1, heads, dim), generator=gen) * self.log_scale_sigma
        scale = torch.exp(log_scale)
        bias = torch.zeros_like(scale)
        for kv, fraction in ((0, self.k_outlier_fraction), (1, self.v_outlier_fraction)):
            is_outlier = torch.rand((layers, 1, heads, dim), generator=gen) < fraction
            sign = torch.where(torch.rand((layers, 1, heads, dim), generator=gen) < 0.5, -1.0, 1.0)
            scale[:, kv] = torch.where(is_outlier, scale[:, kv] * self.outlier_gain, scale[:, kv])
            bias[:, kv] = torch.where(is_outlier, sign * self.outlier_bias, bias[:, kv])
        return scale, bias


def synthetic_pages(identity: ModelIdentity, num_pages: int, seed: int,
                    params: SyntheticKV | None = None,
                    on_page: Callable[[], None] | None = None) -> torch.Tensor:
    """``num_pages`` pages as one contiguous tensor (num_pages, *identity.page_shape).

    Generated a page at a time in float32 so peak extra memory is one float32 page.
    ``on_page`` is called after each page (progress). Raises ValueError for num_pages < 1.
    """
    if num_pages < 1:
        raise ValueError(f"num_pages must be >= 1, got {num_pages}")
    params = params or SyntheticKV()
    gen = torch.Generator().manual_seed(seed)
    scale, bias = params.channel_params(identity, gen)
    shift = bias * scale  # scale * (randn + bias) in one fused pass
    out = torch.empty((num_pages, *identity.page_shape), dtype=TORCH_DTYPES[identity.kv_dtype])
    work = torch.empty(identity.page_shape, dtype=torch.float32)
    for i in range(num_pages):
        torch.randn(identity.page_shape, generator=gen, out=work)
        torch.addcmul(shift, work, scale, out=work)
        out[i].copy_(work)
        if on_page is not None:
            on_page()
    return out


def make_pages(source: KVSource, identity: ModelIdentity, num_pages: int, seed: int,
               on_page: Callable[[], None] | None = None) -> torch.Tensor:
    """Pages of KV from ``source``; see synthetic_pages for the shape and the arguments."""
    if source is KVSource.SYNTHETIC:
        return synthetic_pages(identity, num_pages, seed, on_page=on_page)
    raise ValueError(f"KV source {source.value!r} has no generator")


def plane_entropies_bits(pages: torch.Tensor, itemsize: int,
                         on_page: Callable[[], None] | None = None) -> list[float]:
    """Shannon entropy (bits per byte) of each byte plane's histogram over all ``pages``."""
    hist = np.zeros((itemsize, 256), dtype=np.int64)
    for page in pages:
        grid = page.contiguous().view(torch.uint8).reshape(-1, itemsize).numpy()
        for p in range(itemsize):
            hist[p] += np.bincount(grid[:, p], minlength=256)
        if on_page is not None:
            on_page()
    out = []
    for h in hist:
        q = h[h > 0] / h.sum()
        out.append(float(-(q * np.log2(q)).sum()))
    return out


def entropy_bound_ratio(entropies_bits: Sequence[float]) -> float:
    """The best ratio an order-0 coder of the byte planes can reach: 8 * itemsize / sum(H)."""
    total = sum(entropies_bits)
    return 8 * len(entropies_bits) / total if total > 0 else float("inf")
