"""Smoke tests of the SGLang HiCache harness (chunkstore/testing/sglang_harness.py), against SGLang's own
``file`` backend (HiCacheFile), for each host layout.

Run in the SGLang environment:
    .venv-sglang/bin/python -m pytest -q -p no:cacheprovider tests/integrations/test_sglang_harness.py
Skipped entirely where SGLang is not installed (the main suite).
"""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("sglang")
torch = pytest.importorskip("torch")

from chunkstore.testing import sglang_harness as H

pytestmark = pytest.mark.sglang

NUM_PAGES = 5
PAGE_SIZE = 16


@pytest.fixture
def file_dir(tmp_path, monkeypatch):
    """HiCacheFile's directory: SGLang reads it from SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR."""
    d = tmp_path / "hicache-file"
    monkeypatch.setenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", str(d))
    return d


@pytest.fixture(params=H.CONTROLLER_KINDS)
def kind(request):
    """Both controllers: SGLang's HiCacheController and the HybridCacheController a server builds."""
    return request.param


@pytest.fixture
def make(tmp_path, file_dir, kind):
    """make(layout) -> a harness over the file backend; every harness is closed (threads joined) at the end."""
    made = []

    def _make(layout, **kw):
        h = H.make_controller(
            tmp_path,
            layout=layout,
            storage_backend="file",
            backend_extra_config={},
            page_size=PAGE_SIZE,
            controller_kind=kind,
            **kw,
        )
        made.append(h)
        return h

    before = set(threading.enumerate())
    yield _make
    for h in made:
        h.close()
    leftover = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not leftover, f"threads left running: {leftover}"


def _assert_pages(h, host_indices, expected):
    got = H.read_host_pages(h, host_indices)
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert H.pages_equal(a, b), f"page {i} differs"


@pytest.mark.parametrize("layout", H.LAYOUTS)
def test_host_page_roundtrip(make, layout):
    """The layout-generic host accessors read back what they wrote, in the right slots only."""
    h = make(layout)
    idx, pages = H.fill_host_pages(h, 3, seed=1)
    assert idx.numel() == 3 * PAGE_SIZE
    _assert_pages(h, idx, pages)
    other, other_pages = H.fill_host_pages(h, 2, seed=2)
    _assert_pages(h, idx, pages)
    _assert_pages(h, other, other_pages)
    # get_data_page (what SGLang's copying interface hands a backend) sees the same bytes
    flat = h.host_pool.get_data_page(int(idx[0]), flat=False)
    assert flat.numel() == pages[0].numel()


@pytest.mark.parametrize("layout", H.LAYOUTS)
def test_write_through_then_prefetch(make, file_dir, layout):
    h = make(layout)
    assert type(h.storage_backend).__name__ == "HiCacheFile"
    tokens = H.make_tokens(NUM_PAGES, PAGE_SIZE, seed=3)
    idx, pages = H.fill_host_pages(h, NUM_PAGES, seed=4)

    assert H.write_through(h, tokens, idx) == NUM_PAGES * PAGE_SIZE
    assert h.last_write.hash_value == H.page_hashes(h, tokens)
    assert len(list(file_dir.glob("*.bin"))) == NUM_PAGES

    fetched, new_idx = H.prefetch(h, tokens)
    assert fetched == NUM_PAGES * PAGE_SIZE
    assert h.last_prefetch.hash_value == H.page_hashes(h, tokens)
    assert set(new_idx.tolist()).isdisjoint(idx.tolist())  # fresh host slots
    _assert_pages(h, new_idx, pages)

    # a longer request hits only the stored prefix; an unknown one misses
    longer = tokens + H.make_tokens(2, PAGE_SIZE, seed=5)
    fetched, part = H.prefetch(h, longer)
    assert fetched == NUM_PAGES * PAGE_SIZE
    _assert_pages(h, part, pages)
    assert H.prefetch(h, H.make_tokens(2, PAGE_SIZE, seed=6))[0] == 0
    assert H.drain_queues(h) == dict.fromkeys(
        ("prefetch_hit_queue", "ack_prefetch_queue", "ack_backup_queue", "host_mem_release_queue"), 0
    )


@pytest.mark.parametrize("layout", H.LAYOUTS)
def test_chained_write_continues_the_hash_chain(make, layout):
    """A second node written with last_hash = the first node's last page hash is found by a prefetch of
    the whole sequence (the controller hashes it as one chain)."""
    h = make(layout)
    first, second = H.make_tokens(2, PAGE_SIZE, seed=7), H.make_tokens(3, PAGE_SIZE, seed=8)
    idx1, pages1 = H.fill_host_pages(h, 2, seed=9)
    idx2, pages2 = H.fill_host_pages(h, 3, seed=10)
    H.write_through(h, first, idx1)
    H.write_through(h, second, idx2, last_hash=H.page_hashes(h, first)[-1])
    fetched, new_idx = H.prefetch(h, first + second)
    assert fetched == 5 * PAGE_SIZE
    _assert_pages(h, new_idx, pages1 + pages2)


@pytest.mark.parametrize("layout", H.LAYOUTS)
def test_restart_prefetches_what_the_first_controller_wrote(make, layout):
    tokens = H.make_tokens(NUM_PAGES, PAGE_SIZE, seed=11)
    h1 = make(layout)
    idx, pages = H.fill_host_pages(h1, NUM_PAGES, seed=12)
    assert H.write_through(h1, tokens, idx) == NUM_PAGES * PAGE_SIZE
    h1.close()
    assert h1.storage_backend is None

    h2 = make(layout)
    fetched, new_idx = H.prefetch(h2, tokens)
    assert fetched == NUM_PAGES * PAGE_SIZE
    _assert_pages(h2, new_idx, pages)
