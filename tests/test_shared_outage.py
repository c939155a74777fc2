"""A shared tier whose database goes away: every lookup is a miss and every put fails cleanly (no
exception to the caller, nothing half-written, one log line per interval), and the store serves
again once the database is back. The database here is a PostgreSQL server of the test's own, in a
folder its server user can keep (so that its data outlives a stop)."""

from __future__ import annotations

import logging

from chunkstore import ChunkStore
from chunkstore.disk.objects import ObjectPayloads
from chunkstore.testing.tensors import same_bytes


def test_a_database_that_goes_away_is_a_miss_and_the_store_recovers(tmp_path, identity, chain, moto_s3, bucket_url,
                                                                    restartable_postgres, caplog):
    pages, tensors = chain
    url = restartable_postgres.create_database("outage")
    with ChunkStore(tmp_path / "a", identity, index_url=url, payloads=ObjectPayloads(moto_s3.config(bucket_url)),
                    failure_log_interval_s=3600) as store:
        assert store.put(pages[:5], tensors[:5]).ok
        restartable_postgres.stop()
        caplog.set_level(logging.WARNING, logger="chunkstore.disk.store")
        assert store.get(pages[:5]) == [None] * 5
        assert store.longest_prefix([p.key for p in pages]) == 0
        result = store.put(pages[5:], tensors[5:])
        assert set(result.failed) == {p.key for p in pages[5:]}
        assert all("index unavailable" in why for why in result.failed.values())
        assert store.get(pages[:5]) == [None] * 5
        reads = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reads of the store")]
        assert len(reads) == 1 and "index lookup" in reads[0]  # once, then summarised
        restartable_postgres.start()
        got = store.get(pages[:5])  # the pool reconnects (pre-ping)
        assert all(same_bytes(g, t) for g, t in zip(got, tensors[:5]))
        assert store.put(pages[5:], tensors[5:]).ok
        assert store.longest_prefix([p.key for p in pages]) == len(pages)
    assert any("succeed again" in r.getMessage() for r in caplog.records)
