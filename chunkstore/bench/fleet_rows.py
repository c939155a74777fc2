"""``chunkstore bench fleet --index-rows 10M``: the shared tier's index at 100k, 1M, ... rows. A
database per size on one throwaway PostgreSQL server is bulk-loaded (COPY, not puts) with
conversation chains; then, per size, the time to plan the eviction of 1% of the rows; the prefix
lookup's latency (random chains, then the same chains again, warm); the lookups of other random
chains once the indexes are read into PostgreSQL's buffers (what a database whose buffers hold
its indexes serves in steady state, and what ``pg_prewarm``'s autoprewarm restores after a
restart); and the index's size on disk.

Invariants: rows are what a fleet's puts leave (chains of ``chain_pages`` pages, four tenants,
each chain's pages last read together, older chains first); the store's own methods run the
lookups and the plans (the bench writes the rows only), on a store whose payloads are a folder
(a plan and a lookup read the index alone); after each load the table is vacuumed and analysed,
as autovacuum would have it; a plan changes nothing; the sizes' lookups alternate, a few at a
time, so that a drift in the machine's speed, or the caches a load has just filled, fall on no
size alone (the ratio of the largest to the smallest is the target); the server's
``shared_buffers`` hold every size's table and indexes (FLEET.md's sizing), unless
``pg_settings`` says otherwise. Targets are reported, never asserted.
"""

from __future__ import annotations

import hashlib
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from chunkstore.bench.common import Row, Target, record_targets, table_lines, verdict, verdict_line

PROG = "chunkstore bench fleet"
FIRST_ROWS = 100_000
COPY_BATCH_ROWS = 1_000_000  # rows per COPY statement (and transaction)
LOOKUP_P50_TARGET = 1.5  # lookup p50 at the largest size / at the smallest
PLAN_TARGET_S = 2.0  # planning the eviction of 1% of the rows
PLAN_REPEAT_LIMIT_S = 10.0  # a plan slower than this is not timed again
LOOKUP_ROUNDS = 5  # each size's lookups in this many turns, the sizes alternating
ROW_BYTES = 430  # a row with its share of the five indexes takes about 426 bytes: the buffers are sized by it
_COLUMNS = (("key", "bytea"), ("parent_key", "bytea"), ("namespace", "text"), ("num_tokens", "int4"),
            ("raw_bytes", "int8"), ("stored_bytes", "int8"), ("created_at", "float8"),
            ("last_access_at", "float8"), ("hit_count", "int8"), ("pinned", "bool"))
ROOT_KEY = b"\0" * 32
T = TypeVar("T")


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


def bulk_load(url: str, num_chains: int, cfg: RowsConfig, page_bytes: int) -> None:
    """COPY the chains' rows in, COPY_BATCH_ROWS per statement, then VACUUM ANALYZE."""
    with _connect(url, prepare_threshold=None) as conn:
        step = max(1, COPY_BATCH_ROWS // cfg.chain_pages)
        for start in range(0, num_chains, step):
            with conn.cursor().copy(f"COPY chunks ({', '.join(n for n, _ in _COLUMNS)}) FROM STDIN (FORMAT BINARY)") \
                    as copy:
                copy.set_types([t for _, t in _COLUMNS])
                for row in chain_rows(start, min(num_chains, start + step), cfg.chain_pages, page_bytes):
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


@dataclass
class _Size:
    """One size's database, its store and what was measured of it."""

    rows: int
    num_chains: int
    url: str
    store: Any  # a Store
    rng: random.Random
    lookup_s: list[float] = field(default_factory=list)
    warm_s: list[float] = field(default_factory=list)
    in_buffers_s: list[float] = field(default_factory=list)

    def random_chains(self, n: int, chain_pages: int) -> list[list[bytes]]:
        return [[chain_key(c, i) for i in range(chain_pages)]
                for c in (self.rng.randrange(self.num_chains) for _ in range(n))]


def measure_plans(store, rows: int, cfg: RowsConfig) -> dict:
    """Eviction plans of ``evict_fraction`` of the rows: the median of ``cfg.plans``."""
    from chunkstore.disk.eviction import EvictionSelection

    victims = max(1, int(rows * cfg.evict_fraction))
    plan_s, planned = [], 0
    for _ in range(cfg.plans):
        began = time.perf_counter()
        plan = store.plan_eviction(EvictionSelection(max_chunks=victims))
        plan_s.append(time.perf_counter() - began)
        planned = plan.num_chunks
        if plan_s[-1] > PLAN_REPEAT_LIMIT_S:  # one slow plan says enough
            break
    return {"plan_chunks": planned, "plan_s": statistics.median(plan_s), "plan_s_all": plan_s}


def lookup_rounds(sizes: Sequence[T], total: int) -> Iterator[tuple[T, int]]:
    """(size, lookups) in LOOKUP_ROUNDS rounds, every size in each, the order turned a step each
    round: what the machine's speed does meanwhile falls on every size alike."""
    for r in range(LOOKUP_ROUNDS):
        n = total * (r + 1) // LOOKUP_ROUNDS - total * r // LOOKUP_ROUNDS
        for i in range(len(sizes)):
            yield sizes[(i + r) % len(sizes)], n


def measure_lookups(sizes: list[_Size], cfg: RowsConfig) -> None:
    """Lookups of random whole chains (every key a hit), then the same chains again; then, every
    index read into PostgreSQL's buffers, lookups of other random chains; each in rounds over
    the sizes (``lookup_rounds``)."""
    for size in sizes:
        for keys in size.random_chains(20, cfg.chain_pages):  # the store's pool connected
            size.store.longest_prefix(keys)
    for size, n in lookup_rounds(sizes, cfg.lookups):
        chains = size.random_chains(n, cfg.chain_pages)
        size.lookup_s += _timed_lookups(size.store, chains)
        size.warm_s += _timed_lookups(size.store, chains)  # the same chains again: their pages in the buffers
    for size in sizes:
        prewarm_indexes(size.url)
    for size, n in lookup_rounds(sizes, cfg.lookups):
        size.in_buffers_s += _timed_lookups(size.store, size.random_chains(n, cfg.chain_pages))


def huge_pages_in_use_bytes() -> int | None:
    """Bytes of the machine's reserved huge pages in use (PostgreSQL's buffers, when it took
    them: its ``huge_pages = try``), from /proc/meminfo; None where there is none."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        total, free, reserved = (int(fields[f"HugePages_{k}"]) for k in ("Total", "Free", "Rsvd"))
        return (total - free + reserved) * int(fields["Hugepagesize"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def run_rows_bench(cfg: RowsConfig) -> dict:
    import contextlib

    from chunkstore.disk.identity import ModelIdentity
    from chunkstore.disk.store_spec import StoreSpec, open_store
    from chunkstore.testing.postgres import PostgresServer

    from chunkstore.bench.fleet_scale import SIM_IDENTITY

    identity = ModelIdentity(**SIM_IDENTITY)
    settings = {"shared_buffers": buffers_for(sum(cfg.sizes())), **cfg.pg_settings}
    points, sizes = [], []
    with tempfile.TemporaryDirectory(prefix="chunkstore-bench-fleet-rows-") as tmp, \
            PostgresServer(Path(tmp) / "postgres", settings=settings) as pg, contextlib.ExitStack() as stores:
        huge_bytes = huge_pages_in_use_bytes()
        for rows in cfg.sizes():
            chains = rows // cfg.chain_pages
            rows = chains * cfg.chain_pages
            if cfg.show_progress:
                print(f"{PROG}: loading an index of {rows:,} rows ...", file=sys.stderr)
            url = pg.create_database(f"rows_{rows}")
            store = stores.enter_context(open_store(StoreSpec(Path(tmp) / f"store_{rows}", index_url=url), identity))
            began = time.perf_counter()  # (the store made the tables)
            bulk_load(url, chains, cfg, identity.page_size_bytes)
            load_s = time.perf_counter() - began
            sizes.append(_Size(rows, chains, url, store, random.Random(rows)))
            points.append({"rows": rows, "lookup_keys": cfg.chain_pages, "load_s": load_s, **sizes_on_disk(url)})
        if cfg.show_progress:
            print(f"{PROG}: planning evictions, then lookups in {LOOKUP_ROUNDS} rounds over the sizes ...",
                  file=sys.stderr)
        for point, size in zip(points, sizes):
            point.update(measure_plans(size.store, size.rows, cfg))
        measure_lookups(sizes, cfg)
    for point, size in zip(points, sizes):
        point.update({"lookup_ms": _p50_p99_ms(size.lookup_s), "warm_lookup_ms": _p50_p99_ms(size.warm_s),
                      "in_buffers_lookup_ms": _p50_p99_ms(size.in_buffers_s)})
    result = {"setting": f"chains of {cfg.chain_pages} pages, COPY-loaded, a database per size; lookups of one "
                         f"chain's {cfg.chain_pages} keys ({cfg.lookups} per size, in {LOOKUP_ROUNDS} rounds over "
                         f"the sizes), eviction plans of {cfg.evict_fraction:.0%} of the rows; PostgreSQL on "
                         "127.0.0.1" + "".join(f", {k}={v}" for k, v in settings.items())
                         + ("" if huge_bytes is None else f"; huge pages in use: {huge_bytes >> 20} MB"),
              "huge_pages_in_use_bytes": huge_bytes, "points": points}
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
