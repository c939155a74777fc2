"""``chunkstore bench fleet --index-rows 10M``: the shared tier's index as it fills. One database on
a throwaway PostgreSQL server is bulk-loaded (COPY, not puts) with conversation chains, up to
100k, 1M, ... rows; at each size: the prefix lookup's latency (random chains, then the same
chains again, warm), the time to plan the eviction of 1% of the rows, the lookups of other
random chains once the indexes are read into PostgreSQL's buffers (what a database whose
buffers hold its indexes serves in steady state, and what ``pg_prewarm``'s autoprewarm restores
after a restart), and the index's size on disk.

Invariants: rows are what a fleet's puts leave (chains of ``chain_pages`` pages, four tenants,
each chain's pages last read together, older chains first); the store's own methods run the
lookups and the plans (the bench writes the rows only), on a store whose payloads are a folder
(a plan and a lookup read the index alone); after each load the table is vacuumed and analysed,
as autovacuum would have it; a plan changes nothing; the server's ``shared_buffers`` hold the
largest size's table and indexes (FLEET.md's sizing), unless ``pg_settings`` says otherwise.
Targets are reported, never asserted.
"""

from __future__ import annotations

import hashlib
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from chunkstore.bench.common import Row, Target, record_targets, table_lines, verdict, verdict_line

PROG = "chunkstore bench fleet"
FIRST_ROWS = 100_000
COPY_BATCH_ROWS = 1_000_000  # rows per COPY statement (and transaction)
LOOKUP_P50_TARGET = 1.5  # lookup p50 at the largest size / at the smallest
PLAN_TARGET_S = 2.0  # planning the eviction of 1% of the rows
PLAN_REPEAT_LIMIT_S = 10.0  # a plan slower than this is not timed again
ROW_BYTES = 400  # a row with its share of the four indexes takes about 392 bytes: the buffers are sized by it
_COLUMNS = (("key", "bytea"), ("parent_key", "bytea"), ("namespace", "text"), ("num_tokens", "int4"),
            ("raw_bytes", "int8"), ("stored_bytes", "int8"), ("created_at", "float8"),
            ("last_access_at", "float8"), ("hit_count", "int8"), ("pinned", "bool"))
ROOT_KEY = b"\0" * 32


@dataclass(frozen=True, slots=True)
class RowsConfig:
    max_rows: int = 10_000_000
    chain_pages: int = 20  # pages of one conversation's prefix
    lookups: int = 500  # timed lookups of one chain's keys at each size
    plans: int = 3  # timed eviction plans at each size (the median counts; one, when it took > 10 s)
    evict_fraction: float = 0.01
    show_progress: bool = True
    pg_settings: dict = field(default_factory=dict)  # the throwaway PostgreSQL's (e.g. shared_buffers)

    def __post_init__(self) -> None:
        if self.max_rows < 1000 or self.chain_pages < 1 or self.lookups < 1 or self.plans < 1:
            raise ValueError("--index-rows takes at least 1k rows")

    def sizes(self) -> list[int]:
        """100k, 1M, ... (tenfold) below ``max_rows``, then ``max_rows``."""
        out, n = [], FIRST_ROWS
        while n < self.max_rows:
            out.append(n)
            n *= 10
        return [*out, self.max_rows]


def chain_key(chain: int, page: int) -> bytes:
    return hashlib.sha256(f"chain {chain} page {page}".encode()).digest()


def chain_rows(first_chain: int, last_chain: int, chain_pages: int, page_bytes: int):
    """The rows of chains [first_chain, last_chain): chain c last read at c seconds (older
    chains first), its pages created one second apart before that."""
    for c in range(first_chain, last_chain):
        parent = ROOT_KEY
        for i in range(chain_pages):
            key = chain_key(c, i)
            yield (key, parent, f"tenant-{c % 4}", 16, page_bytes, page_bytes + 128, float(c - chain_pages + i),
                   float(c), 1, False)
            parent = key


def _connect(url: str, **options):
    """A psycopg connection to the database of the SQLAlchemy ``url`` (the bench's own statements)."""
    import psycopg
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return psycopg.connect(host=u.host, port=u.port, user=u.username, dbname=u.database, **options)


def bulk_load(url: str, first_chain: int, last_chain: int, cfg: RowsConfig, page_bytes: int) -> None:
    """COPY the chains' rows in, COPY_BATCH_ROWS per statement, then VACUUM ANALYZE."""
    with _connect(url, prepare_threshold=None) as conn:
        step = max(1, COPY_BATCH_ROWS // cfg.chain_pages)
        for start in range(first_chain, last_chain, step):
            with conn.cursor().copy(f"COPY chunks ({', '.join(n for n, _ in _COLUMNS)}) FROM STDIN (FORMAT BINARY)") \
                    as copy:
                copy.set_types([t for _, t in _COLUMNS])
                for row in chain_rows(start, min(last_chain, start + step), cfg.chain_pages, page_bytes):
                    copy.write_row(row)
            conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE chunks")


def buffers_for(max_rows: int) -> str:
    """``shared_buffers`` that hold the table and indexes of ``max_rows`` rows: 128 MB steps,
    PostgreSQL's default at least."""
    step = 128 << 20
    return f"{max(1, -(-max_rows * ROW_BYTES // step)) * 128}MB"


def prewarm_indexes(url: str) -> None:
    """Every index of the chunks table read into PostgreSQL's buffers (``pg_prewarm``)."""
    with _connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
        conn.execute("SELECT pg_prewarm(indexrelid) FROM pg_index WHERE indrelid = 'chunks'::regclass")


def sizes_on_disk(url: str) -> dict:
    with _connect(url, autocommit=True) as conn:
        table, indexes, database = conn.execute(
            "SELECT pg_total_relation_size('chunks'), pg_indexes_size('chunks'), pg_database_size(current_database())"
        ).fetchone()
    return {"table_bytes": table, "indexes_bytes": indexes, "database_bytes": database}


def _timed_lookups(store, chains: list[list[bytes]]) -> list[float]:
    """Seconds of each chain's lookup; every chain must be found whole."""
    out = []
    for keys in chains:
        began = time.perf_counter()
        found = store.longest_prefix(keys)
        out.append(time.perf_counter() - began)
        if found != len(keys):
            raise RuntimeError(f"a lookup of a loaded chain found {found} of its {len(keys)} pages")
    return out


def _p50_p99_ms(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    return {"p50": statistics.median(ordered) * 1e3, "p99": ordered[int(0.99 * (len(ordered) - 1))] * 1e3}


def measure_size(store, url: str, rows: int, num_chains: int, cfg: RowsConfig) -> dict:
    """Lookups of random whole chains (every key a hit), eviction plans of ``evict_fraction``,
    then lookups of other random chains with the indexes in PostgreSQL's buffers."""
    import random

    from chunkstore.disk.eviction import EvictionSelection

    rng = random.Random(rows)

    def random_chains() -> list[list[bytes]]:
        return [[chain_key(c, i) for i in range(cfg.chain_pages)]
                for c in (rng.randrange(num_chains) for _ in range(cfg.lookups))]

    chains = random_chains()
    for keys in chains[:20]:  # the store's pool connected
        store.longest_prefix(keys)
    lookup_s = _timed_lookups(store, chains)
    warm_s = _timed_lookups(store, chains)  # the same chains again: their index pages now in the buffers
    victims = max(1, int(rows * cfg.evict_fraction))
    plan_s, planned = [], 0
    for _ in range(cfg.plans):
        began = time.perf_counter()
        plan = store.plan_eviction(EvictionSelection(max_chunks=victims))
        plan_s.append(time.perf_counter() - began)
        planned = plan.num_chunks
        if plan_s[-1] > PLAN_REPEAT_LIMIT_S:  # one slow plan says enough
            break
    prewarm_indexes(url)
    in_buffers_s = _timed_lookups(store, random_chains())
    return {"rows": rows, "lookup_keys": cfg.chain_pages, "lookup_ms": _p50_p99_ms(lookup_s),
            "warm_lookup_ms": _p50_p99_ms(warm_s), "in_buffers_lookup_ms": _p50_p99_ms(in_buffers_s),
            "plan_chunks": planned, "plan_s": statistics.median(plan_s), "plan_s_all": plan_s}


def run_rows_bench(cfg: RowsConfig) -> dict:
    from chunkstore.disk.identity import ModelIdentity
    from chunkstore.disk.store_spec import StoreSpec, open_store
    from chunkstore.testing.postgres import PostgresServer

    from chunkstore.bench.fleet_scale import SIM_IDENTITY

    identity = ModelIdentity(**SIM_IDENTITY)
    settings = {"shared_buffers": buffers_for(cfg.max_rows), **cfg.pg_settings}
    points = []
    with tempfile.TemporaryDirectory(prefix="chunkstore-bench-fleet-rows-") as tmp, \
            PostgresServer(Path(tmp) / "postgres", settings=settings) as pg:
        url = pg.create_database("rows")
        with open_store(StoreSpec(Path(tmp) / "store", index_url=url), identity) as store:
            loaded_chains = 0
            for rows in cfg.sizes():
                chains = rows // cfg.chain_pages
                if cfg.show_progress:
                    print(f"{PROG}: loading the index to {chains * cfg.chain_pages:,} rows ...", file=sys.stderr)
                began = time.perf_counter()
                bulk_load(url, loaded_chains, chains, cfg, identity.page_size_bytes)
                load_s = time.perf_counter() - began
                loaded_chains = chains
                point = measure_size(store, url, chains * cfg.chain_pages, chains, cfg)
                points.append({**point, "load_s": load_s, **sizes_on_disk(url)})
    result = {"setting": f"chains of {cfg.chain_pages} pages, COPY-loaded; lookups of one chain's "
                         f"{cfg.chain_pages} keys ({cfg.lookups} per size), eviction plans of "
                         f"{cfg.evict_fraction:.0%} of the rows; PostgreSQL on 127.0.0.1"
                         + "".join(f", {k}={v}" for k, v in settings.items()),
              "points": points}
    small, large = points[0], points[-1]
    result["in_buffers_lookup_p50_largest_vs_smallest"] = (large["in_buffers_lookup_ms"]["p50"]
                                                          / small["in_buffers_lookup_ms"]["p50"])
    record_targets(result, [
        Target("lookup_p50_largest_vs_smallest", large["lookup_ms"]["p50"] / small["lookup_ms"]["p50"], "<=",
               LOOKUP_P50_TARGET),
        Target("plan_s_largest", large["plan_s"], "<=", PLAN_TARGET_S),
    ])
    return result


def format_rows_table(result: dict) -> str:
    rows: list[Row] = []
    for p in result["points"]:
        rows.append((f"{p['rows']:,} rows: lookup p50 / p99 ms", f"{p['lookup_ms']['p50']:.2f}",
                     f"{p['lookup_ms']['p99']:.2f}", ""))
        rows.append(("  the same chains again (warm): p50 / p99 ms", f"{p['warm_lookup_ms']['p50']:.2f}",
                     f"{p['warm_lookup_ms']['p99']:.2f}", ""))
        rows.append((f"  plan of {p['plan_chunks']:,} evictions (s)", f"{p['plan_s']:.2f}", "", ""))
        rows.append(("  other chains, the indexes in the buffers: p50 / p99 ms",
                     f"{p['in_buffers_lookup_ms']['p50']:.2f}", f"{p['in_buffers_lookup_ms']['p99']:.2f}", ""))
        rows.append(("  table with indexes / indexes (MB)", f"{p['table_bytes'] / 1e6:.0f}",
                     f"{p['indexes_bytes'] / 1e6:.0f}", ""))
    rows.append(("lookup p50, largest / smallest", f"{result['targets']['lookup_p50_largest_vs_smallest']['value']:.2f}",
                 *verdict(result, "lookup_p50_largest_vs_smallest")))
    rows.append(("  with the indexes in the buffers", f"{result['in_buffers_lookup_p50_largest_vs_smallest']:.2f}",
                 "", ""))
    rows.append(("plan at the largest size (s)", f"{result['targets']['plan_s_largest']['value']:.2f}",
                 *verdict(result, "plan_s_largest")))
    return "\n".join([result["setting"], "", *table_lines(rows, value_width=9, target_width=9), "",
                      verdict_line(result)])
