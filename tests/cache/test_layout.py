"""KVLayout: validation at construction, page-first shapes and sizes, agreement with ModelIdentity."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from chunkstore import ModelIdentity
from chunkstore.cache import KVLayout
from chunkstore.disk.page_io import TORCH_DTYPES

LLAMA_8B = KVLayout(num_layers=32, num_kv_heads=8, head_dim=128, dtype="bfloat16", page_size=64)


def test_page_shape_is_page_first():
    assert LLAMA_8B.page_shape == (32, 2, 64, 8, 128)


def test_sizes():
    assert LLAMA_8B.bytes_per_token == 32 * 2 * 8 * 128 * 2
    assert LLAMA_8B.page_size_bytes == 8 << 20
    assert LLAMA_8B.itemsize_bytes == 2
    assert LLAMA_8B.torch_dtype is torch.bfloat16


@pytest.mark.parametrize("dtype", sorted(TORCH_DTYPES))
def test_page_size_bytes_matches_a_real_tensor(dtype):
    layout = KVLayout(num_layers=3, num_kv_heads=2, head_dim=8, dtype=dtype, page_size=4)
    t = torch.empty(layout.page_shape, dtype=layout.torch_dtype)
    assert t.numel() * t.element_size() == layout.page_size_bytes


def test_from_identity_matches_the_store_page():
    identity = ModelIdentity("m", "float16", num_layers=4, num_kv_heads=2, head_dim=16, page_size=8)
    layout = KVLayout.from_identity(identity)
    assert layout == KVLayout(4, 2, 16, "float16", 8)
    assert layout.page_shape == identity.page_shape
    assert layout.page_size_bytes == identity.page_size_bytes
    assert layout.torch_dtype == torch.float16


def test_the_cache_takes_its_layout_from_the_identity(tmp_path):
    """No second copy of the page shape: the pools' pages are the identity's pages."""
    from chunkstore.cache.config import CacheConfig
    from chunkstore.cache.tiered import TieredCache

    identity = ModelIdentity("m", "float16", num_layers=3, num_kv_heads=2, head_dim=8, page_size=4)
    config = CacheConfig(page_size=4, device_size="4pages", host_size="8pages", use_disk=False)
    with TieredCache.open(config, identity) as cache:
        assert cache.layout == KVLayout.from_identity(identity)
        for pool in (cache.device_pool, cache.host_pool):
            assert tuple(pool.buffer.shape[1:]) == identity.page_shape
            assert pool.buffer.dtype == torch.float16


def test_pages_for_bytes_rounds_down():
    size = LLAMA_8B.page_size_bytes
    assert LLAMA_8B.pages_for_bytes(0) == 0
    assert LLAMA_8B.pages_for_bytes(size - 1) == 0
    assert LLAMA_8B.pages_for_bytes(size) == 1
    assert LLAMA_8B.pages_for_bytes(10 * size + 5) == 10
    assert LLAMA_8B.pages_for_bytes(np.int64(2 * size)) == 2
    for bad in (-1, 1.5, "10", True):
        with pytest.raises(ValueError, match="num_bytes"):
            LLAMA_8B.pages_for_bytes(bad)


def test_pages_for_tokens_counts_partial_pages():
    assert [LLAMA_8B.pages_for_tokens(n) for n in (0, 1, 64, 65, 128)] == [0, 1, 1, 2, 2]


@pytest.mark.parametrize("field", ["num_layers", "num_kv_heads", "head_dim", "page_size"])
@pytest.mark.parametrize("bad", [0, -1, 2.0, "4", True, None])
def test_bad_dimensions_are_rejected(field, bad):
    kwargs = dict(num_layers=2, num_kv_heads=2, head_dim=8, dtype="bfloat16", page_size=4)
    kwargs[field] = bad
    with pytest.raises(ValueError, match=field):
        KVLayout(**kwargs)


def test_numpy_ints_become_ints():
    layout = KVLayout(np.int64(2), np.int32(2), 8, "float32", np.uint16(4))
    assert type(layout.num_layers) is int and type(layout.page_size) is int
    assert layout == KVLayout(2, 2, 8, "float32", 4)


def test_unknown_dtype_lists_valid_ones():
    with pytest.raises(ValueError, match="bfloat16"):
        KVLayout(2, 2, 8, "bf16", 4)


def test_frozen_and_hashable():
    with pytest.raises(AttributeError):
        LLAMA_8B.page_size = 32  # type: ignore[misc]
    assert len({LLAMA_8B, KVLayout(32, 8, 128, "bfloat16", 64)}) == 1
    assert "8388608 bytes" in str(LLAMA_8B)
