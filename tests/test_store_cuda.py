"""The store with CUDA tensors: pages put from the device and loaded into device destinations are
bit-identical (the store stages through host memory). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from chunkstore import ChunkStore
from chunkstore.testing.tensors import same_bytes

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_put_from_and_load_into_cuda_tensors(tmp_path, identity, chain):
    pages, tensors = chain
    on_gpu = [t.cuda() for t in tensors]
    with ChunkStore(tmp_path, identity) as store:
        assert store.put(pages, on_gpu).ok
        outs = [torch.zeros_like(t) for t in on_gpu]
        assert store.get_into(pages, outs) == [True] * len(pages)
        torch.cuda.synchronize()
        assert all(o.is_cuda and same_bytes(o.cpu(), t) for o, t in zip(outs, tensors))


def test_put_of_pages_on_the_device_and_in_host_memory_at_once(tmp_path, identity, chain):
    pages, tensors = chain  # (the device pages of one put come over in one copy; mixed, one each)
    mixed = [t.cuda() if i % 2 else t for i, t in enumerate(tensors)]
    with ChunkStore(tmp_path, identity) as store:
        assert store.put(pages, mixed).ok
        got = store.get(pages)
        assert all(same_bytes(g, t) for g, t in zip(got, tensors))


def test_a_corrupt_chunk_never_reaches_a_cuda_destination(tmp_path, identity, chain):
    pages, tensors = chain
    with ChunkStore(tmp_path, identity) as store:
        store.put(pages, tensors)
        path = store.payloads.path_for(pages[1].key)
        data = bytearray(path.read_bytes())
        data[-3] ^= 0x10
        path.write_bytes(bytes(data))
        sentinel = torch.full_like(tensors[1], 7).cuda()
        assert store.get_into(pages[1:2], [sentinel]) == [False]
        assert same_bytes(sentinel.cpu(), torch.full_like(tensors[1], 7))  # untouched on a miss
