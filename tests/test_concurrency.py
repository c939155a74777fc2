"""Concurrency on real stores: writer and reader threads on the same keys under eviction, and two
processes on one folder (one writer at a time, readers beside it)."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from chunkstore.cli import main
from chunkstore.disk.files import ChunkFiles, Durability
from chunkstore.disk.maintenance import check_file, evict_bytes, verify
from chunkstore.disk.store import ChunkStore, StoreBusyError
from chunkstore.testing import crash_soak as soak
from tests.helpers.faults import FaultyPayloads
from tests.helpers.races import (checked_read, guarded, lose_the_read_race, one_page, race_a_damaged_read, random_chain,
                                 read_buffers, run_threads, store_again_meanwhile)

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

RUN_S = 5.0


def _open(path, **kw) -> ChunkStore:
    return ChunkStore(path, soak.SOAK_IDENTITY, durability=Durability.NONE, **kw)


def test_writers_and_readers_on_the_same_keys(tmp_path):
    """4 writers (put, evict, delete a namespace) and 4 readers (get, get_into, exists) on the same
    keys for a few seconds; capacity keeps eviction running. Every read is a miss or exactly the
    page's bytes, and writers race each other on the same keys too."""
    store = _open(tmp_path / "s", capacity_bytes=32 << 10, num_workers=4)
    expected = {p.key: soak.expected_page(p.key) for p in soak.all_pages()}
    deadline = time.monotonic() + RUN_S
    errors: list[str] = []
    counts = {"puts": 0, "stored": 0, "hits": 0, "misses": 0, "evictions": 0}
    lock = threading.Lock()

    @guarded(errors)
    def writer(i: int, rng: random.Random) -> None:
        while time.monotonic() < deadline:
            r = rng.random()
            if r < 0.03:
                store.delete_namespace(soak.NAMESPACES[1])
            elif r < 0.08:
                n = evict_bytes(store, rng.randint(1, 4096)).num_chunks
                with lock:
                    counts["evictions"] += n
            else:
                pages = random_chain(rng)
                result = store.put(pages, [expected[p.key] for p in pages])
                if result.failed:
                    raise AssertionError(f"put failed: {result.failed}")
                with lock:
                    counts["puts"] += 1
                    counts["stored"] += len(result.stored)

    @guarded(errors)
    def reader(i: int, rng: random.Random) -> None:
        outs = read_buffers()
        while time.monotonic() < deadline:
            got = checked_read(store, rng, expected, outs)
            with lock:
                counts["hits"] += sum(t is not None for t in got)
                counts["misses"] += sum(t is None for t in got)

    threads = [threading.Thread(target=writer, args=(i, i)) for i in range(4)]
    threads += [threading.Thread(target=reader, args=(100 + i, 100 + i)) for i in range(4)]
    run_threads(threads, RUN_S + 120)
    assert errors == []
    assert counts["puts"] > 20 and counts["stored"] > 20 and counts["hits"] > 20 and counts["misses"] > 0
    assert counts["evictions"] > 0 or store.stats().evictions > 0
    report = verify(store)
    assert (report.corrupt, report.missing) == (0, 0)
    assert store.stats().stored_bytes <= 32 << 10
    store.close()
    with _open(tmp_path / "s", capacity_bytes=32 << 10) as again:
        assert soak.check_store(again) == []


def _open_faulty(path, **kw) -> tuple[ChunkStore, FaultyPayloads]:
    payloads = FaultyPayloads(ChunkFiles(path, Durability.NONE))
    return _open(path, payloads=payloads, **kw), payloads


def _assert_kept(store, page, want) -> None:
    try:
        assert store.exists([page.key]) == [True]  # the chunk stored meanwhile stays
        assert store.payloads.exists(page.key)
        assert soak.same_bytes(store.get([page])[0], want)
    finally:
        store.close()


def test_a_read_racing_evict_and_restore_keeps_the_restored_chunk(tmp_path):
    store, payloads = _open_faulty(tmp_path / "s", num_workers=2)
    page, want = one_page(0)
    assert store.put([page], [want]).ok
    # Between this reader's index lookup and its open(): a writer evicts the chunk and stores it
    # again. The open() fails in the gap, so the reader sees no file.
    lose_the_read_race(payloads, page, lambda: store_again_meanwhile(store, page, want))
    assert store.get([page]) == [None]  # losing the race may cost this read
    payloads.clear()
    _assert_kept(store, page, want)


def test_a_corrupt_read_racing_evict_and_restore_keeps_the_restored_chunk(tmp_path):
    store, payloads = _open_faulty(tmp_path / "s", num_workers=2)
    page, want = one_page(1)
    assert store.put([page], [want]).ok
    path = payloads.inner.path_for(page.key)
    path.write_bytes(b"rot" + path.read_bytes()[3:])
    # The reader reads the corrupt file; a writer replaces it meanwhile.
    race_a_damaged_read(payloads, page, lambda: store_again_meanwhile(store, page, want))
    assert store.get([page]) == [None]
    payloads.clear()
    _assert_kept(store, page, want)


def test_concurrent_puts_of_one_key_do_not_share_a_temp_file(tmp_path):
    # One pool thread: both temp writes run on it, one after the other.
    store, payloads = _open_faulty(tmp_path / "s", num_workers=1)
    page, want = one_page(2)
    a_written, b_half_written, b_resume = threading.Event(), threading.Event(), threading.Event()
    results = {}

    def writing_segment(key, index):
        if a_written.is_set() and index == 1:  # the second put: half its file is out, the rest waits
            b_half_written.set()
            assert b_resume.wait(20)

    payloads.hook("staged", lambda key: a_written.set())
    payloads.hook("stage_segment", writing_segment)
    a = threading.Thread(target=lambda: results.setdefault("a", store.put([page], [want])))
    b = threading.Thread(target=lambda: results.setdefault("b", store.put([page], [want])))
    try:
        with store.exclusive():  # both puts write their temp file before either publishes
            a.start()
            assert a_written.wait(20)
            b.start()
            assert b_half_written.wait(20)
        a.join(60)  # the first put publishes and commits
        assert results["a"].stored == [page.key]
        check = check_file(store, page.key)
    finally:
        b_resume.set()
        b.join(60)
        store.close()
    assert check.is_ok, f"a page put() reported stored has a bad file: {check.text}"


_HOLDER = textwrap.dedent("""
    import sys
    from chunkstore.testing import crash_soak as soak
    from chunkstore.disk.store import ChunkStore
    with ChunkStore(sys.argv[1], soak.SOAK_IDENTITY) as store:
        pages = soak.chain_for("default", (2, 1, 0))
        assert store.put(pages, [soak.expected_page(p.key) for p in pages]).ok
        store.flush()
        print("open", flush=True)
        sys.stdin.readline()
    print("closed", flush=True)
""")


def test_second_writer_process_is_refused_while_readers_work(tmp_path, capsys):
    path = tmp_path / "s"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = holder.stdout.readline().strip()
        assert line == "open", holder.communicate(timeout=60)[1][-3000:]
        pages = soak.chain_for("default", (2, 1, 0))
        with pytest.raises(StoreBusyError):
            _open(path)
        assert main(["verify", "--repair", "--disk-path", str(path)]) == 2
        assert "another process is writing" in capsys.readouterr().err
        with ChunkStore(path, soak.SOAK_IDENTITY, read_only=True) as ro:
            got = ro.get(pages)
            assert all(t is not None and soak.same_bytes(t, soak.expected_page(p.key)) for p, t in zip(pages, got))
            with pytest.raises(PermissionError):
                ro.put(pages, got)
        assert main(["stats", "--disk-path", str(path)]) == 0  # read-only, beside the writer
        assert "chunks             3" in capsys.readouterr().out
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "closed"
        assert holder.wait(timeout=60) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    with _open(path) as store:  # the lock went with the process
        assert store.longest_prefix([p.key for p in pages]) == 3


def test_second_writer_in_the_same_process_is_refused(tmp_path):
    with _open(tmp_path / "s") as first:
        with pytest.raises(StoreBusyError):
            _open(tmp_path / "s")
        assert first.put(soak.chain_for("default", (0,)), [soak.expected_page(b"x" * 32)]).ok
    _open(tmp_path / "s").close()  # closing releases it
