"""TieredCache with its device pool on CUDA: the device -> host -> disk -> host -> device round trip
and a warm start stay bit-identical through the pinned host pool and the side-stream copies
(backups wait for the compute that wrote the pages; hits wait for their load-back). Skipped without
a CUDA device."""

from __future__ import annotations

import pytest
import torch

from tests.cache.test_tiered import (
    assert_consistent, assert_hit, assert_tree_bytes, force_evict, lookup, make_config, open_cache, serve,
    settle, toks, tree_pages,
)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
@pytest.mark.parametrize("share", [0.0, 1.0])
def test_round_trip_on_cuda_is_bit_identical(tmp_path, policy, share):
    config = make_config(tmp_path, write_policy=policy, disk_load_host_share=share, device_size="9pages",
                         host_size="18pages")
    a, b = toks(1, 2, 3, 4, 5, 6), toks(7, 8, 9)
    with open_cache(config, device="cuda") as cache:
        assert cache.device_pool.device.type == "cuda" and cache.host_pool.is_pinned
        serve(cache, a)
        serve(cache, b)  # the device is full
        settle(cache)
        assert_tree_bytes(cache)  # backups copied what the compute stream wrote
        force_evict(cache, "device", 9)
        force_evict(cache, "host", 9)  # both down to disk only
        assert tree_pages(cache, "device") == tree_pages(cache, "host") == 0
        assert cache.peek(a) == (0, 0, 24) and cache.peek(b) == (0, 0, 12)

        hit = cache.match(a)  # disk -> host -> device on the side streams
        try:
            assert (hit.num_tokens, hit.disk_tokens) == (24, 24)
            assert_hit(cache, hit, a)
            other = lookup(cache, b)  # loads into host slots a's load may just have given back
            assert other.num_tokens == 12
            assert_hit(cache, hit, a)
        finally:
            cache.release(hit)
        assert_consistent(cache)
        cache.close(flush=True)

    with open_cache(config, device="cuda") as cache:
        for tokens in (b, a):
            hit = lookup(cache, tokens)
            assert hit.num_tokens == hit.disk_tokens == len(tokens)
        assert_consistent(cache)


def test_scattered_slots_on_cuda(tmp_path):
    """Load-backs into scattered (non-consecutive) device slots, from scattered host slots."""
    config = make_config(tmp_path, device_size="12pages", host_size="24pages")
    prefixes = [toks(i, i + 1) for i in range(1, 12, 2)]
    with open_cache(config, device="cuda") as cache:
        for round_ in range(3):
            for i, tokens in enumerate(prefixes):
                serve(cache, tokens)
                if (i + round_) % 2:
                    force_evict(cache, "device", 3)
                if (i + round_) % 3 == 0:
                    settle(cache)
                    force_evict(cache, "host", 2)
        for tokens in prefixes:
            assert lookup(cache, tokens).num_tokens == 8
        assert_consistent(cache)
