"""ChunkStore behaviour on real files: round trips, persistence, dedup, eviction, pins, quotas,
namespaces, identity checks and stats."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from chunkstore import ChunkStore, Codec, ModelIdentity, ModelMismatchError, chain_pages
from chunkstore.disk.files import ChunkFiles
from chunkstore.disk.maintenance import evict_bytes
from chunkstore.disk.page_io import TORCH_DTYPES, page_arrays, page_tensor_bytes
from tests.helpers.faults import FaultyPayloads
from chunkstore.testing.tensors import same_bytes
from tests.helpers import TINY, kv_pages


def test_put_get_round_trip(store, chain):
    pages, tensors = chain
    result = store.put(pages, tensors)
    assert result.ok and len(result.stored) == len(pages)
    got = store.get(pages)
    assert all(g is not None and same_bytes(g, t) for g, t in zip(got, tensors))
    outs = [torch.zeros_like(t) for t in tensors]
    assert store.get_into(pages, outs) == [True] * len(pages)
    assert all(same_bytes(o, t) for o, t in zip(outs, tensors))


@pytest.mark.parametrize("dtype", sorted(TORCH_DTYPES))
@pytest.mark.parametrize("codec", list(Codec))
def test_round_trip_every_dtype_and_codec(tmp_path, dtype, codec):
    ident = ModelIdentity("rt", dtype, 2, 2, 16, 4)
    pages = chain_pages(ident, list(range(12)))
    g = torch.Generator().manual_seed(1)
    if dtype == "uint8":
        tensors = [torch.randint(0, 256, ident.page_shape, generator=g, dtype=torch.uint8) for _ in pages]
    else:
        tensors = [torch.randn(ident.page_shape, generator=g).to(TORCH_DTYPES[dtype]) for _ in pages]
    with ChunkStore(tmp_path, ident, codec=codec) as s:
        assert s.put(pages, tensors).ok
        got = s.get(pages)
    assert all(same_bytes(a, b) for a, b in zip(got, tensors))


def test_page_arrays_are_views_of_cpu_pages(chain):
    _, tensors = chain
    arrays = page_arrays(tensors)
    for t, a in zip(tensors, arrays):
        assert a.ctypes.data == t.data_ptr()  # no copy of a page in host memory
        assert bytes(a) == bytes(page_tensor_bytes(t.clone()))


def test_persistence_in_a_new_process(tmp_path, identity, chain):
    pages, tensors = chain
    with ChunkStore(tmp_path, identity) as s:
        assert s.put(pages, tensors).ok
    expected = [t.view(torch.uint8).flatten().tolist() for t in tensors]
    (tmp_path / "expected.json").write_text(json.dumps({"tokens": list(range(40)), "bytes": expected}))
    script = textwrap.dedent(f"""
        import json, sys, torch
        from chunkstore import ChunkStore, chain_pages
        from chunkstore.disk.store import read_identity
        root = {str(tmp_path)!r}
        ident = read_identity(root)
        doc = json.load(open(root + "/expected.json"))
        with ChunkStore(root, ident) as s:
            got = s.get(chain_pages(ident, doc["tokens"]))
        ok = all(g is not None and g.view(torch.uint8).flatten().tolist() == e
                 for g, e in zip(got, doc["bytes"]))
        print("OK" if ok and len(got) == len(doc["bytes"]) else "MISMATCH")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "OK"


def test_dedup_writes_nothing(store, chain):
    pages, tensors = chain
    store.put(pages[:4], tensors[:4])
    mtimes = [store.payloads.path_for(p.key).stat().st_mtime_ns for p in pages[:4]]
    result = store.put(pages, tensors)
    assert sorted(result.deduplicated) == sorted(p.key for p in pages[:4])
    assert len(result.stored) == 6
    assert [store.payloads.path_for(p.key).stat().st_mtime_ns for p in pages[:4]] == mtimes
    assert store.stats().dedup_hits == 4
    # a batch naming the same key twice stores it once
    again = chain_pages(store.identity, list(range(100, 104)))
    r = store.put(again * 2, kv_pages(store.identity, 1, seed=5) * 2)
    assert len(r.stored) == 1 and len(r.deduplicated) == 1


def test_exists_and_longest_prefix(store, chain):
    pages, tensors = chain
    store.put(pages[:6], tensors[:6])
    keys = [p.key for p in pages]
    assert store.exists(keys) == [True] * 6 + [False] * 4
    assert store.longest_prefix(keys) == 6
    store.put(pages[8:], tensors[8:])
    assert store.longest_prefix(keys) == 6
    assert store.longest_prefix([]) == 0


def test_rejects_pages_of_the_wrong_layout(store, chain):
    pages, tensors = chain
    with pytest.raises(ValueError, match="dtype"):
        store.put(pages[:1], [tensors[0].float()])
    with pytest.raises(ValueError, match="shape"):
        store.put(pages[:1], [tensors[0].reshape(-1)])
    with pytest.raises(ValueError, match="pages but"):
        store.put(pages[:2], tensors[:1])
    assert store.stats().num_chunks == 0


def test_miss_is_none_and_counted(store, chain):
    pages, tensors = chain
    store.put(pages[:2], tensors[:2])
    got = store.get(pages[:3])
    assert got[2] is None and got[0] is not None
    stats = store.stats()
    assert (stats.hits, stats.misses) == (2, 1)


def test_capacity_evicts_lru_leaf_first(tmp_path, identity):
    a = chain_pages(identity, list(range(16)))          # 4 pages
    b = chain_pages(identity, list(range(1000, 1016)))  # 4 pages
    ta, tb = kv_pages(identity, 4, 1), kv_pages(identity, 4, 2)
    c = chain_pages(identity, list(range(2000, 2008)))
    tc = kv_pages(identity, 2, 3)
    with ChunkStore(tmp_path, identity) as probe:  # learn each page's stored size
        probe.put(a + b + c, ta + tb + tc)
        size = {k: r.stored_bytes for k, r in probe.chunk_rows([p.key for p in a + b + c]).items()}
    # a and b fit; c fits only after b's leaf and one byte more are gone: two pages must go
    capacity = sum(size.values()) - size[b[3].key] - 1
    with ChunkStore(tmp_path / "cap", identity, capacity_bytes=capacity) as s:
        s.put(a, ta)
        s.put(b, tb)
        s.get(a)  # a is now more recently used than b
        r = s.put(c, tc)
        assert r.ok
        assert s.stats().stored_bytes <= capacity
        # b went first, from its leaf: its last two pages are gone, its prefix stays
        assert s.exists([p.key for p in b]) == [True, True, False, False]
        assert all(s.exists([p.key for p in a]))
        assert s.stats().evictions == 2


def test_eviction_never_takes_an_ancestor_before_its_descendants(store, identity):
    pages = chain_pages(identity, list(range(identity.page_size * 6)))
    store.put(pages, kv_pages(identity, 6))
    store.get(pages[-1:])  # the leaf is the most recently used, ancestors older
    for n in range(6, 0, -1):
        evict_bytes(store, 1)
        present = store.exists([p.key for p in pages])
        assert present == [True] * (n - 1) + [False] * (6 - n + 1)


def test_pinned_chunks_are_never_evicted(store, chain):
    pages, tensors = chain
    store.put(pages, tensors)
    assert store.pin([pages[-1].key]) == 1
    result = evict_bytes(store, 10**12)
    assert result.num_chunks == 0  # the pinned leaf keeps its whole prefix
    store.unpin([pages[-1].key])
    assert evict_bytes(store, 10**12).num_chunks == 10


def test_capacity_too_small_fails_cleanly(tmp_path, identity, chain):
    pages, tensors = chain
    with ChunkStore(tmp_path, identity, capacity_bytes=100) as s:
        r = s.put(pages[:2], tensors[:2])
        assert set(r.failed) == {p.key for p in pages[:2]}
        assert "capacity" in next(iter(r.failed.values()))
        assert s.exists([p.key for p in pages[:2]]) == [False, False]
        assert len(s.payloads.leftovers()) == 0


def test_namespaces_never_share_chunks(store, identity):
    tokens = list(range(identity.page_size * 3))
    a = chain_pages(identity, tokens, namespace="alice")
    b = chain_pages(identity, tokens, namespace="bob")
    assert not {p.key for p in a} & {p.key for p in b}
    store.put(a, kv_pages(identity, 3))
    assert store.exists([p.key for p in b]) == [False] * 3
    assert store.get(b) == [None] * 3
    usage = {n.namespace: n for n in store.stats().namespaces}
    assert usage["alice"].num_chunks == 3 and usage["bob"].num_chunks == 0 and usage["bob"].misses == 3


def test_quota_evicts_within_the_namespace(store, identity):
    a = chain_pages(identity, list(range(16)), namespace="a")
    b_old = chain_pages(identity, list(range(8)), namespace="b")
    b_new = chain_pages(identity, list(range(500, 508)), namespace="b")
    store.put(a, kv_pages(identity, 4, 1))
    store.put(b_old, kv_pages(identity, 2, 2))
    per_page = store.stats().stored_bytes // 6
    store.set_quota("b", int(per_page * 2.5))
    r = store.put(b_new, kv_pages(identity, 2, 3))
    assert r.ok
    assert store.exists([p.key for p in b_old]) == [False, False]  # its leaf first, then its root
    usage = {n.namespace: n for n in store.stats().namespaces}
    assert usage["b"].stored_bytes <= usage["b"].quota_bytes
    assert usage["a"].num_chunks == 4  # the other namespace is untouched
    with pytest.raises(ValueError):
        store.set_quota("b", -1)


def test_a_quota_set_after_puts_binds_the_next_put(store, identity):
    # The writer reads a namespace's quota once and keeps it; a change must reach the next put,
    # and a reader in another process (read_only) sees the file.
    b = chain_pages(identity, list(range(32)), namespace="b")
    store.put(b[:2], kv_pages(identity, 2, 2))  # quota read (none) and kept
    per_page = store.stats().stored_bytes // 2
    store.set_quota("b", int(per_page * 2.5))
    r = store.put(b[2:4], kv_pages(identity, 2, 3))
    assert set(r.failed) == {p.key for p in b[2:4]} and "quota" in r.failed[b[2].key]
    store.set_quota("b", None)
    assert store.put(b[2:4], kv_pages(identity, 2, 3)).ok
    store.set_quota("b", per_page * 3)
    reader = ChunkStore(store.root, identity, read_only=True)
    try:
        assert {n.namespace: n.quota_bytes for n in reader.stats().namespaces}["b"] == per_page * 3
        assert reader.quota("b") == per_page * 3
    finally:
        reader.close()


def test_a_put_never_evicts_the_prefix_it_extends(store, identity):
    b = chain_pages(identity, list(range(16)), namespace="b")
    store.put(b[:2], kv_pages(identity, 2, 2))
    per_page = store.stats().stored_bytes // 2
    store.set_quota("b", int(per_page * 2.5))
    r = store.put(b[2:], kv_pages(identity, 2, 3))  # would only fit behind a hole
    assert set(r.failed) == {p.key for p in b[2:]} and "quota" in r.failed[b[2].key]
    assert store.exists([p.key for p in b]) == [True, True, False, False]
    assert len(store.payloads.leftovers()) == 0


def test_delete_namespace(store, identity):
    a = chain_pages(identity, list(range(16)), namespace="a")
    b = chain_pages(identity, list(range(16)), namespace="b")
    store.put(a, kv_pages(identity, 4))
    store.put(b, kv_pages(identity, 4))
    store.pin([a[0].key])
    result = store.delete_namespace("a")
    assert result.num_chunks == 4
    assert store.exists([p.key for p in a]) == [False] * 4
    assert all(store.exists([p.key for p in b]))
    assert not any(store.payloads.path_for(p.key).exists() for p in a)


def test_refuses_another_model(tmp_path, identity):
    with ChunkStore(tmp_path, identity):
        pass
    other = ModelIdentity("other-model", "bfloat16", 2, 2, 16, 4)
    with pytest.raises(ModelMismatchError, match="other"):
        ChunkStore(tmp_path, other)
    with ChunkStore(tmp_path, other, allow_other_models=True) as s:
        pages = chain_pages(other, list(range(4)))
        assert s.put(pages, kv_pages(other, 1)).ok


def test_one_writer_process_at_a_time(tmp_path, identity, chain):
    pages, tensors = chain
    with ChunkStore(tmp_path, identity) as s:
        s.put(pages, tensors)
        script = (f"from chunkstore import ChunkStore, StoreBusyError\nfrom chunkstore.disk.store import read_identity\n"
                  f"try:\n    ChunkStore({str(tmp_path)!r}, read_identity({str(tmp_path)!r}))\n"
                  f"except StoreBusyError:\n    print('BUSY')\n")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == "BUSY", out.stderr
        with ChunkStore(tmp_path, identity, read_only=True) as r:
            assert all(same_bytes(g, t) for g, t in zip(r.get(pages), tensors))
            with pytest.raises(PermissionError):
                r.put(pages, tensors)


def test_stats_survive_reopen(tmp_path, identity, chain):
    pages, tensors = chain
    with ChunkStore(tmp_path, identity) as s:
        s.put(pages, tensors)
        s.get(pages[:3])
        s.get(chain_pages(identity, [9] * 4))
    with ChunkStore(tmp_path, identity) as s:
        st = s.stats()
        assert (st.num_chunks, st.hits, st.misses) == (10, 3, 1)
        assert st.raw_bytes == 10 * identity.page_size_bytes
        assert st.compression_ratio == pytest.approx(st.raw_bytes / st.stored_bytes)
        rows = s.chunk_rows([pages[0].key])
        assert rows[pages[0].key].hit_count == 1


def test_bad_arguments(tmp_path, identity):
    with pytest.raises(ValueError, match="capacity"):
        ChunkStore(tmp_path, identity, capacity_bytes=0)
    with pytest.raises(ValueError, match="valid values"):
        Codec.parse("lz4")
    with pytest.raises(FileNotFoundError):
        ChunkStore(tmp_path / "nothing", identity, read_only=True)


def test_rejects_a_page_whose_key_is_not_its_hash(store, chain):
    from chunkstore import PageRef

    pages, tensors = chain
    forged = PageRef(key=pages[1].key, parent_key=pages[0].parent_key, token_ids=pages[0].token_ids,
                     namespace=pages[0].namespace)
    with pytest.raises(ValueError, match="not the hash"):
        store.put([forged], tensors[:1])
    assert store.exists([pages[1].key]) == [False]


@pytest.mark.parametrize("direct_reads", [True, False])
def test_direct_and_buffered_reads_agree(tmp_path, identity, chain, direct_reads):
    pages, tensors = chain
    with ChunkStore(tmp_path, identity) as s:
        s.put(pages, tensors)
    with ChunkStore(tmp_path, identity, direct_reads=direct_reads) as s:
        assert all(same_bytes(g, t) for g, t in zip(s.get(pages), tensors))
        # a truncated file is short whichever way it is read: a miss, quarantined
        path = s.payloads.path_for(pages[2].key)
        path.write_bytes(path.read_bytes()[:-1000])
        assert s.get(pages[2:3]) == [None]
        assert s.stats().quarantined == 1


def test_a_short_direct_read_falls_back_to_a_buffered_one(tmp_path, identity, chain, monkeypatch):
    import os as os_module

    pages, tensors = chain
    with ChunkStore(tmp_path, identity) as s:
        s.put(pages, tensors)
        if not s.payloads.direct_reads:
            pytest.skip("this file system refuses O_DIRECT")
        real_preadv = os_module.preadv
        monkeypatch.setattr("chunkstore.disk.files.os.preadv", lambda fd, bufs, off: min(1, real_preadv(fd, bufs, off)))
        got = s.get(pages)
        assert all(g is not None and same_bytes(g, t) for g, t in zip(got, tensors))
        assert s.stats().quarantined == 0


def test_an_unexpected_error_in_a_put_leaves_no_temp_file(tmp_path, identity, chain):
    pages, tensors = chain
    payloads = FaultyPayloads(ChunkFiles(tmp_path))
    with ChunkStore(tmp_path, identity, payloads=payloads) as store:
        payloads.fail("stage", lambda: RuntimeError("a bug in an encoder"), key=pages[3].key)
        with pytest.raises(RuntimeError, match="bug"):
            store.put(pages, tensors)
        assert len(store.payloads.leftovers()) == 0
        assert store.exists([p.key for p in pages]) == [False] * len(pages)


@pytest.mark.timeout(120)  # a leaked buffer shows as a hang
def test_a_read_that_fails_unexpectedly_gives_its_buffer_back(tmp_path, identity, chain):
    pages, tensors = chain
    payloads = FaultyPayloads(ChunkFiles(tmp_path))
    with ChunkStore(tmp_path, identity, io_threads=2, payloads=payloads) as s:  # 8 read buffers in all
        s.put(pages, tensors)
        payloads.fail("read", lambda: RuntimeError("bug"))
        for _ in range(3):  # more failed pages than there are buffers
            with pytest.raises(RuntimeError):
                s.get(pages)
        payloads.clear()
        assert all(same_bytes(g, t) for g, t in zip(s.get(pages), tensors))  # no buffer leaked: no hang


def test_gc_spares_the_temp_files_of_puts_in_flight(store, chain):
    from chunkstore.disk.maintenance import gc

    pages, tensors = chain
    mine = store.payloads.stage(pages[0].key, [b"in flight"])
    dead = store.payloads.tmp_dir / f"tmp-{pages[1].key.hex()}-999999999-0"
    dead.write_bytes(b"left by a crashed writer")
    assert gc(store).temps_removed == 1
    assert mine.handle.exists() and not dead.exists()


def test_another_models_index_file_in_a_store_folder_is_refused(tmp_path, capsys):
    """An index.db copied from another model's store: the store, and every store command, refuse
    it (naming both models) instead of reading or changing the other store's rows."""
    import shutil

    from chunkstore.cli import main

    other = ModelIdentity("another-model", "bfloat16", num_layers=2, num_kv_heads=2, head_dim=16, page_size=4)
    for root, ident in ((tmp_path / "a", TINY), (tmp_path / "b", other)):
        with ChunkStore(root, ident) as s:
            assert s.put(chain_pages(ident, list(range(8))), kv_pages(ident, 2)).ok
    for f in (tmp_path / "a").glob("index.db*"):
        f.unlink()
    shutil.copy(tmp_path / "b" / "index.db", tmp_path / "a" / "index.db")
    with pytest.raises(ModelMismatchError, match="another-model.*this store's.*tiny-test"):
        ChunkStore(tmp_path / "a", TINY)
    for argv in (["stats"], ["gc"], ["evict", "--bytes", "1000"]):
        assert main([*argv, "--disk-path", str(tmp_path / "a")]) == 2
        assert "another-model" in capsys.readouterr().err
