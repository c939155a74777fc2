"""ChunkStore.delete: by key, row then file, counted as evictions; refuses (changing nothing) a set that
would leave a hole (a pinned chunk, or a stored descendant left behind); read-only stores refuse."""

from __future__ import annotations

import pytest

from chunkstore import ChunkStore, chain_pages
from tests.helpers import TINY, kv_pages


@pytest.fixture
def store(tmp_path):
    with ChunkStore(tmp_path / "s", TINY) as s:
        yield s


def put_chain(store: ChunkStore, n: int, namespace: str = "default", first: int = 0):
    pages = chain_pages(TINY, list(range(first, first + TINY.page_size * n)), namespace=namespace)
    store.put(pages, kv_pages(TINY, n))
    return pages


def test_delete_a_subtree_deepest_or_not(store):
    pages = put_chain(store, 4)
    keys = [p.key for p in pages]
    before = store.stats()
    result = store.delete([keys[1], keys[3], keys[2], b"\x00" * 32])  # any order; an unknown key is ignored
    assert result.num_chunks == 3 and result.keys == (keys[1], keys[3], keys[2])
    assert result.stored_bytes == before.stored_bytes - store.stats().stored_bytes
    assert store.exists(keys) == [True, False, False, False] and store.longest_prefix(keys) == 1
    assert store.stats().evictions == before.evictions + 3
    assert not any(store.payloads.path_for(k).exists() for k in keys[1:])
    assert store.get(pages[:1])[0] is not None


def test_delete_refuses_to_strand_descendants(store):
    keys = [p.key for p in put_chain(store, 3)]
    with pytest.raises(ValueError, match="descendants"):
        store.delete([keys[1]])
    assert store.exists(keys) == [True] * 3 and store.stats().evictions == 0


def test_delete_refuses_pinned_chunks(store):
    keys = [p.key for p in put_chain(store, 2)]
    store.pin([keys[1]])
    with pytest.raises(ValueError, match="pinned"):
        store.delete(keys)
    assert store.exists(keys) == [True, True]
    store.unpin([keys[1]])
    assert store.delete(keys).num_chunks == 2 and store.stats().num_chunks == 0


def test_delete_counts_per_namespace(store):
    other = put_chain(store, 2, namespace="other")
    put_chain(store, 1)
    store.delete([p.key for p in other])
    by_ns = {n.namespace: n for n in store.stats().namespaces}
    assert by_ns["other"].evictions == 2 and by_ns["other"].num_chunks == 0
    assert by_ns["default"].evictions == 0 and by_ns["default"].num_chunks == 1


def test_read_only_store_refuses(tmp_path):
    root = tmp_path / "s"
    with ChunkStore(root, TINY) as s:
        keys = [p.key for p in put_chain(s, 1)]
    with ChunkStore(root, TINY, read_only=True) as ro, pytest.raises(PermissionError):
        ro.delete(keys)
