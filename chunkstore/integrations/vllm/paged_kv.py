"""PagedKV: vLLM's per-layer paged KV tensors read and written as chunkstore pages.

Invariants: a page is ``(layers, 2, block, heads, dim)`` (the store's page shape) with K in half 0
and V in half 1, as the backend's attention reads them, whatever vLLM's layout, so a data folder
written by a CPU engine means the same to a CUDA one; each batch of blocks is one indexed copy
per layer (no loop per token or per block); a layout it cannot tell apart from another is
refused, never guessed.
"""

from __future__ import annotations

import torch

from chunkstore.disk import ModelIdentity


class PagedKV:
    """vLLM gives every backend's layer as ``(blocks, heads, block, 2 * dim)``; what the last axis
    holds is the backend's: the CPU attention reads a block as ``(heads, 2 * block, dim)``, K rows
    then V rows (``kv_split="rows"``), the CUDA backends split each token's row into K then V
    (``kv_split="token"``). An MLA layer (``is_mla``) holds one latent row of C values per token,
    ``(blocks, 1, block, C)`` or ``(blocks, block, C)``, stored as two halves (heads 1, dim C/2).
    Older vLLM releases gave ``(2, blocks, block, heads, dim)`` (K and V first), known too. Raises
    ValueError for another layout, for one it cannot tell apart (two blocks), or for fewer or more
    layers than the model has."""

    def __init__(self, kv_caches: dict[str, torch.Tensor], identity: ModelIdentity, *, kv_split: str = "rows",
                 is_mla: bool = False):
        if kv_split not in ("rows", "token"):
            raise ValueError(f"kv_split must be 'rows' or 'token', got {kv_split!r}")
        self.layers = list(kv_caches.values())
        _, _, size, heads, dim = identity.page_shape
        if len(self.layers) != identity.num_layers:
            raise ValueError(f"{len(self.layers)} KV cache layers, the model has {identity.num_layers}")
        first = self.layers[0]
        shape = tuple(first.shape)
        if is_mla and heads == 1 and shape[1:] in ((1, size, 2 * dim), (size, 2 * dim)):
            self.layout = "mla"
        elif not is_mla and first.dim() == 4 and shape[1:] == (heads, size, 2 * dim):
            self.layout = "cpu" if kv_split == "rows" else "token"
        elif (not is_mla and first.dim() == 5 and shape[0] == 2 and shape[1] != 2
              and shape[2:] == (size, heads, dim)):  # (2, blocks, ...), not (blocks, 2, ...)
            self.layout = "flash"
        else:
            raise ValueError(f"unknown paged KV layout {shape} for blocks of {size} tokens, "
                             f"{heads} heads of {dim}{' (MLA)' if is_mla else ''}")
        self.page_shape = identity.page_shape
        self.dtype = first.dtype
        self.device = first.device

    def gather(self, block_ids: list[int], *, device: torch.device | str = "cpu") -> torch.Tensor:
        """A copy of the blocks as pages, ``(n, *page_shape)`` on ``device``."""
        n, (_, _, size, heads, dim) = len(block_ids), self.page_shape
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        out = torch.empty((n, *self.page_shape), dtype=self.dtype, device=device)
        for layer, kv in enumerate(self.layers):
            blocks = kv.index_select(1 if self.layout == "flash" else 0, idx)  # a contiguous copy
            if self.layout == "cpu":  # (n, H, P, 2D) is (n, H, 2, P, D): per head P rows of K, then of V
                out[:, layer] = blocks.view(n, heads, 2, size, dim).permute(0, 2, 3, 1, 4)
            elif self.layout == "token":  # (n, H, P, 2D) is (n, H, P, 2, D): per token K, then V
                out[:, layer] = blocks.view(n, heads, size, 2, dim).permute(0, 3, 2, 1, 4)
            elif self.layout == "flash":  # (2, n, P, H, D) -> (n, 2, P, H, D)
                out[:, layer] = blocks.transpose(0, 1)
            else:  # (n, [1,] P, 2 * C/2) -> (n, 2, P, 1, C/2)
                out[:, layer] = blocks.view(n, size, 2, dim).permute(0, 2, 1, 3).unsqueeze(3)
        return out

    def scatter(self, block_ids: list[int], pages: torch.Tensor) -> None:
        """Write ``pages`` (``(n, *page_shape)``) into the blocks."""
        n, (_, _, size, heads, dim) = len(block_ids), self.page_shape
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        for layer, kv in enumerate(self.layers):
            src = pages[:, layer].to(self.device)
            if self.layout == "cpu":  # (n, 2, P, H, D) -> (n, H, 2, P, D), viewed as (n, H, P, 2D)
                kv.index_copy_(0, idx, src.permute(0, 3, 1, 2, 4).reshape(n, heads, size, 2 * dim))
            elif self.layout == "token":  # (n, 2, P, H, D) -> (n, H, P, 2, D), viewed as (n, H, P, 2D)
                kv.index_copy_(0, idx, src.permute(0, 3, 2, 1, 4).reshape(n, heads, size, 2 * dim))
            elif self.layout == "flash":
                kv.index_copy_(1, idx, src.transpose(0, 1))
            else:  # (n, 2, P, 1, C/2) -> (n, P, C), viewed as the layer's (n, [1,] P, C)
                rows = src.squeeze(3).permute(0, 2, 1, 3).reshape(n, size, 2 * dim)
                kv.index_copy_(0, idx, rows.view(n, *kv.shape[1:]))
