"""A read-only store refuses every mutation through one mechanism: every public method of
ChunkStore is listed as mutating or reading (so a new one cannot skip the guard), each mutating
one raises ReadOnlyStoreError (a PermissionError) on a read-only store, and nothing changes."""

from __future__ import annotations

import inspect

import pytest

from chunkstore.disk.seal_keys import MasterKey
from chunkstore import ChunkStore, chain_pages
from chunkstore.disk import store as store_mod
from chunkstore.disk.eviction import EvictionSelection
from chunkstore.disk.store import ChunkStore as StoreClass
from chunkstore.disk.store import ReadOnlyStoreError
from tests.helpers import TINY, kv_pages


def _public_methods() -> set[str]:
    methods = (staticmethod, classmethod)
    return {name for cls in StoreClass.__mro__[:-1] for name, value in vars(cls).items()  # inherited too
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, methods))}


def test_every_public_method_is_listed_as_mutating_or_reading():
    mutating, reading = set(store_mod.MUTATING_METHODS), set(store_mod.READING_METHODS)
    assert not mutating & reading
    assert _public_methods() == mutating | reading, "list a new method in MUTATING_METHODS or READING_METHODS"
    for name in mutating:
        assert getattr(getattr(StoreClass, name), "is_mutation", False), f"{name} is not guarded by _mutation"
    for name in reading:
        assert not getattr(getattr(StoreClass, name), "is_mutation", False), name


@pytest.fixture
def stored(tmp_path):
    root = tmp_path / "s"
    pages = chain_pages(TINY, list(range(TINY.page_size * 3)))
    with ChunkStore(root, TINY) as s:
        assert s.put(pages, kv_pages(TINY, 3)).ok
        s.set_quota("default", 10**9)
        plan = s.plan_eviction(EvictionSelection(bytes_to_free=1))
        rows = list(s.iter_rows())
    return root, pages, plan, rows


def _calls(pages, plan, rows):
    """One plausible call of every mutating method (arguments a writable store would accept)."""
    keys = [p.key for p in pages]
    return {
        "put": lambda s: s.put(pages, kv_pages(TINY, 3)),
        "evict": lambda s: s.evict(plan),
        "delete": lambda s: s.delete(keys[-1:]),
        "delete_namespace": lambda s: s.delete_namespace("default"),
        "pin": lambda s: s.pin(keys),
        "unpin": lambda s: s.unpin(keys),
        "set_quota": lambda s: s.set_quota("default", None),
        "adopt": lambda s: s.adopt(rows),
        "quarantine": lambda s: s.quarantine(keys[0], "default", "a test"),
        "drop_missing": lambda s: s.drop_missing(keys),
        "remove_leftover_temps": lambda s: s.remove_leftover_temps(),
        "purge_quarantine": lambda s: s.purge_quarantine(),
        "sweep": lambda s: s.sweep(),
        "checkpoint": lambda s: s.checkpoint(),
        "shred_namespace": lambda s: s.shred_namespace("default"),
        "rotate_seal_key": lambda s: s.rotate_seal_key(MasterKey.generate()),
    }


def test_every_mutation_is_refused_on_a_read_only_store_and_changes_nothing(stored):
    root, pages, plan, rows = stored
    calls = _calls(pages, plan, rows)
    assert set(calls) == set(store_mod.MUTATING_METHODS)  # a new mutation needs a call here too
    with ChunkStore(root, TINY, read_only=True) as ro:
        before = (list(ro.iter_rows()), ro.stats(), ro.quota("default"))
        for name, call in calls.items():
            with pytest.raises(ReadOnlyStoreError, match=f"{name}: .* read-only"):
                call(ro)
        assert (list(ro.iter_rows()), ro.stats(), ro.quota("default")) == before
        assert ro.plan_eviction(EvictionSelection(bytes_to_free=1)).keys == plan.keys  # reads still work
    with ChunkStore(root, TINY) as s:
        assert s.longest_prefix([p.key for p in pages]) == 3 and s.quota("default") == 10**9
        assert all(s.payloads.path_for(p.key).exists() for p in pages)
        assert not any(r.pinned for r in s.iter_rows())


def test_a_read_only_refusal_is_a_permission_error():
    assert issubclass(ReadOnlyStoreError, PermissionError)
