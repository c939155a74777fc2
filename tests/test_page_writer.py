"""PageWriter (chunkstore/integrations/writer.py), the engines' background writer, over a real store
whose writes are held through its payload seam: a page submitted is readable from its copy until
its put ends, then from the store; a failed put is a miss, never a stale copy."""

from __future__ import annotations

import pytest
import torch

from chunkstore import ChunkStore, chain_pages
from chunkstore.disk.files import ChunkFiles, Durability
from chunkstore.integrations.writer import PageWriter
from tests.helpers import kv_pages
from tests.helpers.faults import FaultyPayloads


@pytest.fixture
def faulty(tmp_path, identity):
    payloads = FaultyPayloads(ChunkFiles(tmp_path / "store", Durability.NONE))
    store = ChunkStore(tmp_path / "store", identity, payloads=payloads)
    writer = PageWriter(store)
    yield store, payloads, writer
    writer.close()
    store.close()


def test_a_page_is_readable_from_its_copy_while_its_put_runs_then_from_the_store(faulty, identity):
    store, payloads, writer = faulty
    pages = chain_pages(identity, list(range(identity.page_size * 3)))
    kv = kv_pages(identity, 3)
    keys = [p.key for p in pages]
    with payloads.held("stage") as writing:
        writer.submit(pages, [t.clone() for t in kv])
        assert writing.wait(30)  # the put runs, held before its first file
        assert store.longest_prefix(keys) == 0
        copies = writer.pending(keys)
        assert all(c is not None and torch.equal(c, t) for c, t in zip(copies, kv))
        assert writer.pending([b"\0" * 32]) == [None]
    assert writer.flush(30)
    assert store.longest_prefix(keys) == 3
    assert writer.pending(keys) == [None, None, None]  # the store answers for them now


def test_a_failed_put_leaves_a_miss_not_a_copy(faulty, identity):
    store, payloads, writer = faulty
    pages = chain_pages(identity, list(range(identity.page_size * 2)))
    payloads.fail("stage")
    writer.submit(pages, kv_pages(identity, 2))
    assert writer.flush(30)
    assert writer.pending([p.key for p in pages]) == [None, None]
    assert store.longest_prefix([p.key for p in pages]) == 0


def test_a_newer_copy_of_a_page_outlives_the_older_put(faulty, identity):
    store, payloads, writer = faulty
    page = chain_pages(identity, list(range(identity.page_size)))
    old, new = kv_pages(identity, 1, seed=1), kv_pages(identity, 1, seed=2)
    with payloads.held("stage") as writing:
        writer.submit(page, old)
        assert writing.wait(30)
        writer.submit(page, new)  # queued behind the held put of the same page
        assert writer.pending([page[0].key])[0] is new[0]
    assert writer.flush(30)
    assert writer.pending([page[0].key]) == [None]
