"""Scale: a store of 1M indexed chunks opens without loading anything and stays within memory.

The rows are inserted directly (no chunk files): opening and `exists` touch only the index.
Timing is reported by `chunkstore bench store`, never asserted here; memory is asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from chunkstore import ChunkStore, chain_pages
from chunkstore.disk.index import ChunkRow
from tests.helpers import TINY

NUM_ROWS = 1_000_000


def fill_index(store: ChunkStore, num_rows: int, batch: int = 100_000) -> None:
    """Bulk-insert synthetic rows through the raw DB-API connection (the SQL the index uses)."""
    import hashlib
    import sqlite3

    now = 1.7e9
    conn = sqlite3.connect(store.root / "index.db")  # beside the store's own connections (WAL)
    try:
        for start in range(0, num_rows, batch):
            rows = []
            for i in range(start, min(start + batch, num_rows)):
                key = hashlib.blake2b(i.to_bytes(8, "little"), digest_size=32).digest()
                rows.append((key, key[::-1], "default", 4, 1024, 900, now + i, now + i))
            conn.executemany(
                "INSERT INTO chunks (key, parent_key, namespace, num_tokens, raw_bytes, stored_bytes,"
                " created_at, last_access_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            conn.commit()
    finally:
        conn.close()


@pytest.mark.slow
def test_million_chunk_store_opens_lazily_within_memory(tmp_path):
    root = tmp_path / "big"
    with ChunkStore(root, TINY) as store:
        fill_index(store, NUM_ROWS)
        chain = chain_pages(TINY, list(range(4 * 128)))
        store.adopt([ChunkRow(key=p.key, parent_key=p.parent_key, namespace="default", num_tokens=4,
                                     raw_bytes=1024, stored_bytes=900, created_at=0.0, last_access_at=0.0)
                            for p in chain[:100]])
    script = textwrap.dedent(f"""
        import json, time
        from chunkstore import ChunkStore, chain_pages
        from chunkstore.disk.store import read_identity

        def rss_mb():
            for line in open("/proc/self/status"):
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024

        ident = read_identity({str(root)!r})
        keys = [p.key for p in chain_pages(ident, list(range(4 * 128)))]
        before = rss_mb()
        t0 = time.perf_counter()
        store = ChunkStore({str(root)!r}, ident)
        n = store.longest_prefix(keys)
        first_s = time.perf_counter() - t0
        for _ in range(200):
            store.exists(keys)
        stats = store.stats()
        print(json.dumps(dict(prefix=n, first_s=first_s, growth_mb=rss_mb() - before, chunks=stats.num_chunks)))
        store.close()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["prefix"] == 100
    assert doc["chunks"] == NUM_ROWS + 100
    assert doc["growth_mb"] < 200, doc
    print(f"1M-chunk store: first lookup {doc['first_s']:.3f} s after open, RSS +{doc['growth_mb']:.0f} MB")
