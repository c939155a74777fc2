"""Helpers of the engine's tests: cache settings over tmp_path stores and seeded token ids."""

from __future__ import annotations

import torch

from chunkstore.cache.config import CacheConfig

PAGE_SIZE = 16


def cache_config(tmp_path, *, device_pages: int = 256, host_pages: int | None = None, **kwargs) -> CacheConfig:
    """Settings over a store in ``tmp_path / "disk"``, sizes in pages of PAGE_SIZE tokens."""
    host = f"{host_pages}pages" if host_pages is not None else None
    return CacheConfig(page_size=PAGE_SIZE, device_size=f"{device_pages}pages", host_size=host,
                       disk_path=tmp_path / "disk", **kwargs)


def random_ids(num_tokens: int, seed: int) -> list[int]:
    """Byte token ids (0-255) from a fixed seed."""
    return torch.randint(0, 256, (num_tokens,), generator=torch.Generator().manual_seed(seed)).tolist()
