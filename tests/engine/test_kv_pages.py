"""The pool <-> DynamicCache mapping: exact round trips and the documented index correspondence."""

from __future__ import annotations

import pytest
import torch

from chunkstore.engine.kv_pages import forward, layer_kv, load_pages, new_kv_cache, store_pages
from tests.helpers.engine import PAGE_SIZE, random_ids


def model_kv(loaded, num_tokens: int):
    kv = new_kv_cache()
    with torch.inference_mode():
        forward(loaded.model, torch.tensor([random_ids(num_tokens, seed=11)], device=loaded.device), kv,
                start_position=0)
    return kv


def empty_pool(loaded, num_pages: int) -> torch.Tensor:
    shape = (num_pages, loaded.num_layers, 2, PAGE_SIZE, loaded.num_kv_heads, loaded.head_dim)
    return torch.full(shape, float("nan"), dtype=loaded.dtype, device=loaded.device)  # the device pool's place


def test_store_pages_layout_is_page_first(tiny):
    kv = model_kv(tiny, 3 * PAGE_SIZE + 5)
    buffer = empty_pool(tiny, 8)
    slots = torch.tensor([6, 1])
    store_pages(buffer, slots, kv, first_page=1)  # pages 1 and 2 of the sequence
    layers = layer_kv(kv)
    for i, slot in enumerate(slots.tolist()):
        for layer, (k, v) in enumerate(layers):
            for t in (0, 7, PAGE_SIZE - 1):
                pos = (1 + i) * PAGE_SIZE + t
                assert torch.equal(buffer[slot, layer, 0, t], k[0, :, pos])  # (kv_heads, head_dim)
                assert torch.equal(buffer[slot, layer, 1, t], v[0, :, pos])
    untouched = [s for s in range(8) if s not in slots.tolist()]
    assert torch.isnan(buffer[untouched]).all()


@pytest.mark.parametrize("loaded_name", ["tiny", "tiny_bf16"])
def test_round_trip_is_bit_exact(loaded_name, request):
    loaded = request.getfixturevalue(loaded_name)
    kv = model_kv(loaded, 4 * PAGE_SIZE)
    buffer = empty_pool(loaded, 6)
    slots = torch.tensor([5, 0, 3, 2])
    store_pages(buffer, slots, kv, first_page=0)
    back = new_kv_cache()
    load_pages(buffer, slots, back)
    assert back.get_seq_length() == 4 * PAGE_SIZE
    for (k, v), (k2, v2) in zip(layer_kv(kv), layer_kv(back), strict=True):
        assert torch.equal(k, k2) and torch.equal(v, v2)


def test_misuse_is_refused(tiny):
    kv = model_kv(tiny, PAGE_SIZE + 3)
    buffer = empty_pool(tiny, 4)
    with pytest.raises(ValueError, match="holds 19"):
        store_pages(buffer, torch.tensor([0, 1]), kv, first_page=0)
    with pytest.raises(ValueError, match="empty KV cache"):
        load_pages(buffer, torch.tensor([0]), kv)
    with pytest.raises(ValueError, match="pool holds"):
        store_pages(buffer.to(torch.bfloat16), torch.tensor([0]), kv, first_page=0)
    with pytest.raises(ValueError, match="starts at position 0"):
        forward(tiny.model, torch.tensor([[1]], device=tiny.device), kv, start_position=0)
