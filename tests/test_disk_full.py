"""A full disk (ENOSPC) and failing renames, simulated at the system calls chunkstore.disk.files makes
(through ChunkFiles.os_write, its write seam, or os functions patched in chunkstore.disk.files) and for
real on a small filled tmpfs (root only): the pages are reported failed, nothing becomes visible or
stays behind, stored pages still load, and writes resume once space is back; every failed write is
counted (also across failed index commits), logged rate-limited, and marks the store degraded until
a write succeeds; closing on a full disk does not raise; and a put under capacity pressure."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest
import sqlalchemy.exc

import chunkstore.disk.files as files_mod
from chunkstore import ChunkStore, chain_pages
from chunkstore.disk.maintenance import evict_bytes
from tests.helpers.faults import IndexFaults, faulty_index
from chunkstore.testing.tensors import same_bytes
from tests.fullfs import fill, small_tmpfs
from tests.helpers import kv_pages


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def _enospc(what: str = "simulated") -> OSError:
    return OSError(errno.ENOSPC, f"No space left on device ({what})")


@pytest.fixture
def index_faults() -> IndexFaults:
    return IndexFaults()


@pytest.fixture
def store(tmp_path, identity, index_faults):
    """A store whose index fails its writes while ``index_faults`` say so."""
    s = ChunkStore(tmp_path / "store", identity, index_factory=faulty_index(index_faults))
    yield s
    s.close()


@pytest.fixture
def full(store, identity):
    """A store holding one chain, and a second chain to write while the disk is full."""
    old = chain_pages(identity, list(range(identity.page_size * 4)))
    old_t = kv_pages(identity, 4, seed=1)
    assert store.put(old, old_t).ok
    new = chain_pages(identity, list(range(500, 500 + identity.page_size * 4)))
    new_t = kv_pages(identity, 4, seed=2)
    return store, old, old_t, new, new_t


def _assert_invisible(store: ChunkStore, pages) -> None:
    assert store.exists([p.key for p in pages]) == [False] * len(pages)
    assert not any(store.payloads.path_for(p.key).exists() for p in pages)
    assert len(store.payloads.leftovers()) == 0
    assert store.get(pages) == [None] * len(pages)


def _assert_loads(store: ChunkStore, pages, tensors) -> None:
    got = store.get(pages)
    assert all(t is not None and same_bytes(t, w) for t, w in zip(got, tensors))


def _failed_cleanly_then_stored(store, result, old, old_t, new, new_t) -> None:
    """The failed put left nothing of ``new`` visible and ``old`` intact; once the disk has room
    again, the same put stores it."""
    assert set(result.failed) == {p.key for p in new}
    _assert_invisible(store, new)
    _assert_loads(store, old, old_t)
    assert store.put(new, new_t).ok
    _assert_loads(store, new, new_t)


def _no_space(fd, data):
    raise _enospc()


def test_enospc_on_every_write_then_recovery(full):
    store, old, old_t, new, new_t = full
    real = store.payloads.os_write
    store.payloads.os_write = _no_space
    result = store.put(new, new_t)
    assert result.stored == [] and set(result.failed) == {p.key for p in new}
    assert all("No space" in why for why in result.failed.values())
    _assert_invisible(store, new)
    _assert_loads(store, old, old_t)
    assert store.stats().write_errors == 4
    # space comes back (here: the fault clears and some chunks are evicted): writes resume
    store.payloads.os_write = real
    assert evict_bytes(store, 1).num_chunks == 1
    result = store.put(new, new_t)
    assert result.ok and result.stored == [p.key for p in new]
    _assert_loads(store, new, new_t)
    _assert_loads(store, old[:3], old_t[:3])


def test_enospc_on_some_pages(full):
    """Only the pages whose temp file hits the full disk fail; the rest are stored."""
    store, old, old_t, new, new_t = full
    doomed = {new[1].key.hex(), new[3].key.hex()}
    real = store.payloads.os_write

    def sometimes_no_space(fd, data):
        if any(h in _fd_path(fd) for h in doomed):
            raise _enospc()
        return real(fd, data)

    store.payloads.os_write = sometimes_no_space
    result = store.put(new, new_t)
    assert set(result.failed) == {new[1].key, new[3].key}
    assert sorted(result.stored) == sorted([new[0].key, new[2].key])
    _assert_invisible(store, [new[1], new[3]])
    _assert_loads(store, [new[0], new[2]], [new_t[0], new_t[2]])
    assert store.longest_prefix([p.key for p in new]) == 1


@pytest.mark.parametrize("fault", ["zero-byte write", "enospc after a partial write"])
def test_short_writes_in_os_write(full, monkeypatch, fault):
    """The disk fills part way through a temp file: the partial file is removed."""
    store, old, old_t, new, new_t = full
    real_write = os.write
    seen: dict[int, int] = {}

    def filling_write(fd, data):
        if "/tmp/tmp-" not in _fd_path(fd):
            return real_write(fd, data)
        seen[fd] = seen.get(fd, 0) + 1
        if fault == "zero-byte write":
            return 0
        if seen[fd] == 1:  # half the file goes out (a short write), then the disk is full
            return real_write(fd, memoryview(data)[:max(1, len(data) // 2)])
        raise _enospc("write")

    monkeypatch.setattr(files_mod.os, "write", filling_write)
    result = store.put(new, new_t)
    monkeypatch.undo()
    _failed_cleanly_then_stored(store, result, old, old_t, new, new_t)


def test_enospc_in_fsync_of_a_temp_file(full, monkeypatch):
    store, old, old_t, new, new_t = full
    real_fsync = os.fsync

    def failing_fsync(fd):
        if "/tmp/tmp-" in _fd_path(fd):
            raise _enospc("fsync")
        return real_fsync(fd)

    monkeypatch.setattr(files_mod.os, "fsync", failing_fsync)
    result = store.put(new, new_t)
    monkeypatch.undo()
    _failed_cleanly_then_stored(store, result, old, old_t, new, new_t)


def test_enospc_in_fsync_of_a_chunk_folder(full, monkeypatch):
    """The renames already happened when the folder fsync fails: they are undone."""
    store, old, old_t, new, new_t = full
    chunks_dir = str(store.payloads.chunks_dir)
    real_fsync = os.fsync

    def failing_dir_fsync(fd):
        path = _fd_path(fd)
        if path.startswith(chunks_dir) and Path(path).is_dir():
            raise _enospc("fsync of a folder")
        return real_fsync(fd)

    monkeypatch.setattr(files_mod.os, "fsync", failing_dir_fsync)
    result = store.put(new, new_t)
    monkeypatch.undo()
    _failed_cleanly_then_stored(store, result, old, old_t, new, new_t)


@pytest.mark.parametrize("fail_on_call", [1, 3])
def test_failed_rename_on_publish(full, monkeypatch, fail_on_call):
    """os.replace fails on the first rename, or on the third after two succeeded: no page of the
    batch is visible and no temp or chunk file remains."""
    store, old, old_t, new, new_t = full
    real_replace = os.replace
    calls = []

    def failing_replace(src, dst, **kw):
        if "/tmp/tmp-" in str(src):
            calls.append(src)
            if len(calls) >= fail_on_call:
                raise OSError(errno.EIO, "simulated rename failure")
        return real_replace(src, dst, **kw)

    monkeypatch.setattr(files_mod.os, "replace", failing_replace)
    result = store.put(new, new_t)
    monkeypatch.undo()
    assert len(calls) == fail_on_call
    assert set(result.failed) == {p.key for p in new}
    assert all("publish failed" in why for why in result.failed.values())
    _assert_invisible(store, new)
    _assert_loads(store, old, old_t)
    assert store.put(new, new_t).ok
    _assert_loads(store, new, new_t)


def test_failed_publish_counts_write_errors(full, monkeypatch):
    store, old, old_t, new, new_t = full

    def failing_replace(src, dst, **kw):
        raise OSError(errno.ENOSPC, "simulated")

    monkeypatch.setattr(files_mod.os, "replace", failing_replace)
    result = store.put(new, new_t)
    monkeypatch.undo()
    assert len(result.failed) == 4
    assert store.stats().write_errors == 4


def test_index_full_on_insert(full, index_faults):
    store, old, old_t, new, new_t = full

    index_faults.insert = True
    result = store.put(new, new_t)
    index_faults.insert = False
    assert set(result.failed) == {p.key for p in new}
    _assert_invisible(store, new)


def test_put_under_capacity_pressure_keeps_the_prefix_it_extends(tmp_path, identity):
    root = tmp_path / "s"
    full = chain_pages(identity, list(range(identity.page_size * 2)))
    with ChunkStore(root, identity) as s:
        assert s.put(full[:1], kv_pages(identity, 1, seed=1)).ok
        one_chunk = s.stats().stored_bytes
    with ChunkStore(root, identity, capacity_bytes=int(one_chunk * 2.5)) as s:
        other = chain_pages(identity, list(range(100, 100 + identity.page_size)))
        assert s.put(other, kv_pages(identity, 1, seed=2)).ok  # the store is now nearly full
        result = s.put(full, kv_pages(identity, 2, seed=3))  # page 0 present, page 1 new
        assert result.ok
        assert s.longest_prefix([p.key for p in full]) == 2


# ---- failure accounting -------------------------------------------------------------------------

def test_every_failed_write_is_counted_and_the_store_is_degraded_until_one_succeeds(full):
    store, old, old_t, new, new_t = full
    assert store.stats().write_health.last_ok_at is not None and not store.stats().write_health.degraded
    real_write, store.payloads.os_write = store.payloads.os_write, _no_space
    for _ in range(3):  # not only the first failure: each of them
        assert len(store.put(new, new_t).failed) == 4
    s = store.stats()
    h = s.write_health
    assert (h.failures, h.failed_pages, h.degraded) == (12, 12, True) and s.write_errors == 12
    assert h.last_error == "chunk file: [ENOSPC] No space left on device (simulated)"
    assert h.last_error_at >= h.last_ok_at
    _assert_loads(store, old, old_t)  # reads go on while degraded
    assert store.stats().write_health.degraded
    store.payloads.os_write = real_write
    assert store.put(new, new_t).ok
    h = store.stats().write_health
    assert not h.degraded and h.failures == 12 and h.last_ok_at >= h.last_error_at


def test_failures_are_logged_rate_limited_with_the_reason_and_the_folder(tmp_path, identity, caplog):
    caplog.set_level(logging.WARNING, logger="chunkstore.disk.store")
    pages = chain_pages(identity, list(range(identity.page_size * 3)))
    with ChunkStore(tmp_path / "s", identity, failure_log_interval_s=3600) as store:
        real_write, store.payloads.os_write = store.payloads.os_write, _no_space
        for _ in range(4):
            store.put(pages, kv_pages(identity, 3))
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1  # the first at once; the other 11 wait for the next summary
        assert str(store.root) in lines[0] and "[ENOSPC] No space left on device" in lines[0]
        store.payloads.os_write = real_write
        assert store.put(pages, kv_pages(identity, 3)).ok  # recovery owes the summary at once
        lines = [r.getMessage() for r in caplog.records]
        assert f"11 more write(s) of the store at {store.root} failed (11 page(s))" in lines[1]
        assert "succeed again (12 failed write(s)" in lines[2]
        store.payloads.os_write = _no_space
        for _ in range(2):
            store.put(chain_pages(identity, list(range(100, 100 + identity.page_size))), kv_pages(identity, 1))
    lines = [r.getMessage() for r in caplog.records]  # closed: the summary owed is logged
    assert len(lines) == 5 and "1 more write(s)" in lines[4] and "the last: chunk file: [ENOSPC]" in lines[4]


def test_failed_index_commits_are_each_counted(full, index_faults):
    store, old, old_t, new, new_t = full

    index_faults.insert = True
    for _ in range(2):
        assert len(store.put(new, new_t).failed) == 4
    index_faults.insert = False
    h = store.stats().write_health
    assert (h.failures, h.failed_pages, h.degraded) == (2, 8, True)
    assert h.last_error == "index commit: database or disk is full"
    assert store.stats().write_errors == 8


def test_a_real_full_disk_counts_every_failure_across_failed_index_commits(tmp_path, identity, caplog):
    """On a filled tmpfs: chunk files fail with the kernel's ENOSPC, the index's commits with
    SQLite's own "database or disk is full"; the counters a failed commit carried are not lost
    (they are written once space is back), and closing on the full disk does not raise."""
    with small_tmpfs(tmp_path / "mnt", 8 << 20) as mnt:
        root = mnt / "s"
        old, old_t = chain_pages(identity, list(range(identity.page_size * 2))), kv_pages(identity, 2)
        new, new_t = chain_pages(identity, list(range(500, 500 + identity.page_size * 4))), kv_pages(identity, 4)
        with ChunkStore(root, identity) as store:
            assert store.put(old, old_t).ok
            filler = fill(mnt)
            for _ in range(2):
                result = store.put(new, new_t)
                assert len(result.failed) == 4 and all("No space left" in why for why in result.failed.values())
            with pytest.raises(sqlalchemy.exc.OperationalError, match="database or disk is full"):
                store.flush()
            h = store.stats().write_health
            assert h.degraded and (h.failures, h.failed_pages) == (9, 8)
            assert h.last_error == "index flush: database or disk is full"
            assert len(store.put(new, new_t).failed) == 4
            assert store.stats().write_errors == 12
            filler.unlink()  # space is back: the next commit writes every count
            store.flush()
        with ChunkStore(root, identity) as store:
            assert store.stats().write_errors == 12
            _assert_loads(store, old, old_t)
            _assert_invisible(store, new)
            filler = fill(mnt)
            _assert_loads(store, old, old_t)  # reads work on the full disk (their counts wait in memory)
        # closed on the full disk: the index's last commit failed, was reported, and did not raise
        assert "index flush at close: database or disk is full" in caplog.text
        filler.unlink()
        with ChunkStore(root, identity) as store:
            _assert_loads(store, old, old_t)
            assert store.put(new, new_t).ok


def test_a_failed_eviction_to_make_room_fails_the_put_and_leaves_nothing(tmp_path, identity):
    """Evicting to fit writes the index too: when that commit fails (a full disk), the put reports
    its pages failed instead of raising, and leaves no temp file behind."""
    root = tmp_path / "s"
    with ChunkStore(root, identity) as s:
        assert s.put(chain_pages(identity, list(range(identity.page_size))), kv_pages(identity, 1)).ok
        one_chunk = s.stats().stored_bytes
    faults = IndexFaults()
    with ChunkStore(root, identity, capacity_bytes=int(one_chunk * 1.5), index_factory=faulty_index(faults)) as s:
        new = chain_pages(identity, list(range(100, 100 + identity.page_size)))
        faults.delete = True
        result = s.put(new, kv_pages(identity, 1, seed=2))
        faults.delete = False
        assert set(result.failed) == {new[0].key}
        _assert_invisible(s, new)
        h = s.stats().write_health
        assert h.degraded and h.last_error == "index commit: database or disk is full"
        assert s.put(new, kv_pages(identity, 1, seed=2)).ok  # the index works again: the eviction goes through
