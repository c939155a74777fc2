"""``chunkstore bench fleet``: N servers behind a round-robin client, on one shared tier (PostgreSQL
and an S3 bucket) against N servers with private disk tiers and one server alone, on the same
multi-turn workload; then the shared tier's per-page publish and read against the object store's
raw PUT and GET, and the index query per request.

Invariants: every configuration runs the same workload (workload.py) with the same per-server
device and host pools; the client sends request k to server k mod N, so a client's next round
lands on another server (as a load balancer without affinity sends it); the servers run in this
process (one engine each, their own scheduler threads), each with its own data folder. Throughputs
are MB/s of payload bytes moved, raw and through the store measured in the same run on the same
bucket, with the store's codec off (so both move the same bytes); the raw PUTs and GETs run on as
many threads as the store uploads and reads with, in the same batches, alternating with the
store's, the same number of rounds each; a ratio is the median of the rounds' own ratios, a MB/s
figure the median round's. Targets are reported, never asserted (common.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from chunkstore.bench.common import Row, Target, record_targets, table_lines, verdict, verdict_line
from chunkstore.bench.fleet_scale import ScaleConfig
from chunkstore.bench.workload import Workload, drive
from chunkstore.output import add_output_arguments

PROG = "chunkstore bench fleet"
HIT_RATE_TARGET = 0.95  # the shared fleet's hit rate / one server's
THROUGHPUT_TARGET = 0.8  # the store's publish and read MB/s / the object store's raw PUT and GET
SEALED_TARGET = 0.9  # a sealed tier's publish and read MB/s / an unsealed one's (the network dominates)
CONFIGS = ("one-server", "private-tiers", "shared-tier")
IO_BATCH_PAGES = 128  # pages per put and per get of the publish and read measurement (the cache reads so),
# and per batch of the raw requests they are compared with
IO_WARM_PAGES = 16  # pages put and read before the measurement (its connections open)
IO_ROUNDS = 9  # rounds of the raw requests and of the store's, alternating; a ratio is the median of the rounds'


@dataclass(frozen=True, slots=True)
class FleetConfig:
    workload: Workload = field(default_factory=lambda: Workload(num_clients=8, num_rounds=4, request_length=64,
                                                                 output_length=4, max_parallel=4,
                                                                 request_rate=2.0))
    servers: int = 3
    preset: str = "tiny"
    page_size: int = 16
    device_pages: int = 64
    host_pages: int = 128
    index_url: str | None = None  # None: a throwaway PostgreSQL server (Debian's postgresql)
    object_store: str | None = None  # None: a throwaway moto S3 server; else from the AWS_* variables
    io_pages: int = 512
    show_progress: bool = True
    seal_key: Path | None = None  # a key file: publish and read through a sealed tier too, side by side


    def __post_init__(self) -> None:
        if self.servers < 2:
            raise ValueError(f"--servers must be at least 2, got {self.servers}")
        for name in ("page_size", "device_pages", "host_pages", "io_pages"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.host_pages < self.device_pages:
            raise ValueError("--host-pages must not be smaller than --device-pages")
        if (self.index_url is None) != (self.object_store is None):
            raise ValueError("give both --index-url and --object-store, or neither (throwaway local services)")
        if self.seal_key is not None and self.index_url is not None:
            raise ValueError("--seal-key runs on the throwaway local services (the sealed tier needs an index "
                             "and a bucket prefix of its own)")


# ---- the shared tier's services -------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Services:
    index_url: str
    object_store: str
    description: str
    sealed_index_url: str | None = None  # with --seal-key: the sealed tier's own index and bucket prefix
    sealed_object_store: str | None = None


@contextlib.contextmanager
def services(cfg: FleetConfig, work: Path) -> Iterator[Services]:
    """The given index and bucket, or a throwaway PostgreSQL server and S3 server (Ceph's RADOS
    Gateway where it is installed, else moto's), set into this process's AWS_* variables, which
    the servers' object store reads."""
    if cfg.index_url is not None:
        yield Services(cfg.index_url, cfg.object_store, f"{_display(cfg.index_url)} and {cfg.object_store}")
        return
    from chunkstore.testing.moto_s3 import MotoS3Server
    from chunkstore.testing.postgres import PostgresServer
    from chunkstore.testing.radosgw import RadosGateway, RadosGatewayNotInstalled

    try:
        s3_server, s3_name = RadosGateway(work / "radosgw"), "Ceph's RADOS Gateway"
    except RadosGatewayNotInstalled:
        s3_server, s3_name = MotoS3Server(log_path=work / "moto.log"), "moto's S3 server"
    with PostgresServer(work / "postgres") as pg, s3_server as s3:
        s3.create_bucket("fleet")
        with s3.in_environment():
            sealed = (pg.create_database("fleet_sealed"), "s3://fleet/bench-sealed") if cfg.seal_key else (None, None)
            yield Services(pg.create_database("fleet"), "s3://fleet/bench",
                           f"a throwaway PostgreSQL server and {s3_name} on 127.0.0.1", *sealed)


def _display(url: str) -> str:
    from chunkstore.disk.index import display_url

    return display_url(url)


# ---- the fleet runs -------------------------------------------------------------------------------

def _cache_config(cfg: FleetConfig, folder: Path, shared: Services | None):
    from chunkstore.cache.config import CacheConfig

    extra = {"index_url": shared.index_url, "object_store": shared.object_store} if shared else {}
    return CacheConfig(page_size=cfg.page_size, device_size=f"{cfg.device_pages}pages",
                       host_size=f"{cfg.host_pages}pages", use_disk=True, write_policy="write_through",
                       disk_path=folder, **extra)


def _run_config(name: str, cfg: FleetConfig, loaded, work: Path, shared: Services | None) -> dict:
    from chunkstore.bench.multiturn import engine_sender
    from chunkstore.engine import Engine, EngineConfig

    count = 1 if name == "one-server" else cfg.servers
    engines = [Engine(loaded, _cache_config(cfg, work / name / f"server-{i}", shared),
                      EngineConfig(max_queue_size=64, max_running_requests=1)) for i in range(count)]
    senders = [engine_sender(e, cfg.workload, fresh_namespaces=False) for e in engines]
    turn = iter(range(1 << 62))

    def send(client, round_index, conversation):
        return senders[next(turn) % count](client, round_index, conversation)

    try:
        result = drive(cfg.workload, send)
    finally:
        for engine in engines:
            engine.close()
    replies = [r.reply for r in result.records]
    prompt = sum(r.prompt_tokens for r in replies)
    cached = sum(r.cached_tokens for r in replies)
    disk = sum(r.tier_tokens["disk"] for r in replies)
    return {"name": name, "servers": count, "hit_rate": cached / prompt if prompt else 0.0,
            "disk_hit_rate": disk / prompt if prompt else 0.0,
            "mean_ttft_s": statistics.fmean(r.ttft_s for r in replies), "duration_s": result.duration_s}


# ---- publish and read against raw PUT and GET -------------------------------------------------------

def _measure_io(cfg: FleetConfig, loaded, shared: Services, work: Path) -> dict:
    import torch

    from chunkstore.disk.codec import Codec
    from chunkstore.disk.keys import chain_pages
    from chunkstore.disk.objects import ObjectPayloads, ObjectStoreConfig
    from chunkstore.disk.seal_keys import FileKeyProvider
    from chunkstore.disk.store import ChunkStore

    identity = loaded.identity(cfg.page_size)
    tokens = [(i * 7919) % 251 for i in range(cfg.io_pages * cfg.page_size)]
    # Each round publishes its own pages (a namespace of its own: nothing is deduplicated).
    rounds = [chain_pages(identity, tokens, namespace=f"io-{uuid.uuid4().hex[:8]}") for _ in range(IO_ROUNDS)]
    payloads = ObjectPayloads(ObjectStoreConfig(shared.object_store))
    raw = _RawObjects(shared.object_store, payloads.store_options(), cfg.io_pages)
    sealed = None
    if cfg.seal_key is not None:  # the same pages on a sealed tier, timed in the same rounds
        sealed = ChunkStore(work / "io-sealed-store", identity, index_url=shared.sealed_index_url,
                            payloads=ObjectPayloads(ObjectStoreConfig(shared.sealed_object_store)), codec=Codec.NONE,
                            seal_key=FileKeyProvider(cfg.seal_key))
    with ChunkStore(work / "io-store", identity, index_url=shared.index_url, payloads=payloads,
                    codec=Codec.NONE) as store, sealed if sealed is not None else contextlib.nullcontext():
        generator = torch.Generator().manual_seed(0)
        tensors = [torch.randn(identity.page_shape, generator=generator).to(store.torch_dtype)
                   for _ in range(cfg.io_pages)]
        raw.body = os.urandom(_stored_size(store, identity, rounds[0][0], tensors[0]))
        # Both warm first: the store's connections to the database and the bucket, and the raw
        # client's, are open before anything is timed (a server's steady state).
        warm = chain_pages(identity, list(range(IO_WARM_PAGES * cfg.page_size)), namespace=f"warm-{uuid.uuid4().hex[:8]}")
        store.put(warm, tensors[:len(warm)])
        store.get(warm)
        if sealed is not None:
            sealed.put(warm, tensors[:len(warm)])
            sealed.get(warm)
        raw.warm(max(store.num_workers, store.io_threads))
        # The raw requests and the store's alternate, IO_ROUNDS times each, on as many threads as
        # the store's own (its write workers upload, its io threads read), in the same batches of
        # IO_BATCH_PAGES (each batch done before the next starts, as a put or a get returns); a
        # ratio is the median of the rounds' own (an object store on a busy machine drifts within
        # a run, and a round's raw and store requests run seconds apart). Two more raw figures
        # show where a gap comes from: the write-once PUT (If-None-Match: *) that the publish
        # protocol asks for, the object store's own price for it; and all the pages in one stream,
        # with no batch boundaries (no drain of the threads between batches).
        raw_put_s, put_s, raw_once_s, stream_put_s, sealed_put_s = [], [], [], [], []
        for i, pages in enumerate(rounds):
            if sealed is not None and i % 2:  # the sealed tier first in every other round, last in the rest
                sealed_put_s.append(_timed_puts(sealed, pages, tensors))
            if i % 2:  # every other round the store goes first (an object store slows as it fills)
                put_s.append(_timed_puts(store, pages, tensors))
            raw_put_s.append(raw.put(store.num_workers, batch=IO_BATCH_PAGES))
            if not i % 2:
                put_s.append(_timed_puts(store, pages, tensors))
            raw_once_s.append(raw.put(store.num_workers, write_once=True, batch=IO_BATCH_PAGES))
            stream_put_s.append(raw.put(store.num_workers))
            if sealed is not None and not i % 2:
                sealed_put_s.append(_timed_puts(sealed, pages, tensors))
        outs = [torch.empty(identity.page_shape, dtype=tensors[0].dtype) for _ in range(cfg.io_pages)]
        raw_get_s, get_s, stream_get_s, sealed_get_s = [], [], [], []
        for i, pages in enumerate(rounds):
            if sealed is not None and i % 2:
                sealed_get_s.append(_timed_gets(sealed, pages, outs))
            raw_get_s.append(raw.get(store.io_threads, batch=IO_BATCH_PAGES))
            get_s.append(_timed_gets(store, pages, outs))
            stream_get_s.append(raw.get(store.io_threads))
            if sealed is not None and not i % 2:
                sealed_get_s.append(_timed_gets(sealed, pages, outs))
        rows = store.chunk_rows([p.key for p in rounds[0]])
        stored = sum(r.stored_bytes for r in rows.values())
        chains = [[p.key for p in rounds[0][:n]] for n in (8, 32, 128)]
        lookups = 30
        began = time.perf_counter()
        for i in range(lookups):
            store.longest_prefix(chains[i % len(chains)])
        lookup_s = (time.perf_counter() - began) / lookups
        threads = (store.num_workers, store.io_threads)
    mb, n = stored / 1e6, cfg.io_pages

    def vs(raw_s: list[float], store_s: list[float]) -> float:  # the median of the rounds' own ratios
        return statistics.median(r / s for r, s in zip(raw_s, store_s))

    t = {name: statistics.median(v) for name, v in (("put", put_s), ("raw_put", raw_put_s), ("raw_once", raw_once_s),
                                                    ("stream_put", stream_put_s), ("get", get_s),
                                                    ("raw_get", raw_get_s), ("stream_get", stream_get_s))}
    return {
        "pages": n, "rounds": IO_ROUNDS, "page_bytes": stored // n, "upload_threads": threads[0],
        "read_threads": threads[1], "io_batch_pages": IO_BATCH_PAGES,
        "publish_mb_s": mb / t["put"], "raw_put_mb_s": mb / t["raw_put"], "publish_vs_raw": vs(raw_put_s, put_s),
        "publish_vs_raw_rounds": [r / s for r, s in zip(raw_put_s, put_s)],
        "raw_write_once_put_mb_s": mb / t["raw_once"], "publish_vs_raw_write_once": vs(raw_once_s, put_s),
        "raw_stream_put_mb_s": mb / t["stream_put"], "publish_vs_raw_stream": vs(stream_put_s, put_s),
        "read_mb_s": mb / t["get"], "raw_get_mb_s": mb / t["raw_get"], "read_vs_raw": vs(raw_get_s, get_s),
        "read_vs_raw_rounds": [r / s for r, s in zip(raw_get_s, get_s)],
        "raw_stream_get_mb_s": mb / t["stream_get"], "read_vs_raw_stream": vs(stream_get_s, get_s),
        "publish_ms_per_page": t["put"] * 1e3 / n, "raw_put_ms_per_object": t["raw_put"] * 1e3 / n,
        "read_ms_per_page": t["get"] * 1e3 / n, "raw_get_ms_per_object": t["raw_get"] * 1e3 / n,
        "index_lookup_ms_per_request": lookup_s * 1e3,
        **({"sealed_publish_mb_s": mb / statistics.median(sealed_put_s),
            "sealed_read_mb_s": mb / statistics.median(sealed_get_s),
            "sealed_publish_vs_unsealed": vs(put_s, sealed_put_s), "sealed_read_vs_unsealed": vs(get_s, sealed_get_s),
            "sealed_publish_vs_unsealed_rounds": [u / s for u, s in zip(put_s, sealed_put_s)],
            "sealed_read_vs_unsealed_rounds": [u / s for u, s in zip(get_s, sealed_get_s)]}
           if sealed is not None else {}),
    }


def _timed_puts(store, pages, tensors) -> float:
    """Seconds to publish ``pages``, IO_BATCH_PAGES per put (as the cache's writer hands them)."""
    began = time.perf_counter()
    for i in range(0, len(pages), IO_BATCH_PAGES):
        result = store.put(pages[i:i + IO_BATCH_PAGES], tensors[i:i + IO_BATCH_PAGES])
        if result.failed:
            raise RuntimeError(f"a put failed: {next(iter(result.failed.values()))}")
    return time.perf_counter() - began


def _timed_gets(store, pages, outs) -> float:
    """Seconds to read ``pages`` back, IO_BATCH_PAGES per get; every page must hit."""
    began = time.perf_counter()
    for i in range(0, len(pages), IO_BATCH_PAGES):
        if not all(store.get_into(pages[i:i + IO_BATCH_PAGES], outs[i:i + IO_BATCH_PAGES])):
            raise RuntimeError("a page read back from the shared tier missed")
    return time.perf_counter() - began


def _stored_size(store, identity, page, tensor) -> int:
    """The bytes of one page's object (header and planes, codec off): the raw objects' size."""
    from chunkstore.disk.page_io import encode_page, page_tensor_bytes

    return encode_page(page, page_tensor_bytes(tensor), identity, store.codec, store.zstd_level)[1]


class _RawObjects:
    """The object store without chunkstore: plain PUTs and GETs of one body under fresh names, one
    request per object, no index, no codec. Each ``put`` writes a new set of names (nothing is
    overwritten); ``get`` reads the last set."""

    def __init__(self, object_store: str, options: dict, count: int):
        import obstore

        self._ob = obstore
        self._store = obstore.store.S3Store.from_url(f"{object_store}/raw-{uuid.uuid4().hex[:8]}", **options)
        self._count = count
        self._round = 0
        self.body = b""

    def _names(self) -> list[str]:
        return [f"r{self._round}/o{i}" for i in range(self._count)]

    def warm(self, threads: int) -> None:
        """Open the client's connections: one PUT and one GET per thread, untimed."""
        names = [f"warm/o{i}" for i in range(threads)]
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda n: self._ob.put(self._store, n, self.body, use_multipart=False), names))
            list(pool.map(lambda n: self._ob.get(self._store, n).bytes(), names))

    def put(self, threads: int, write_once: bool = False, batch: int | None = None) -> float:
        """Seconds to PUT a new set of names on ``threads``, ``batch`` at a time (each batch's
        requests done before the next starts, as the store's puts are), or all in one stream."""
        self._round += 1
        mode = "create" if write_once else "overwrite"
        return self._timed(threads, batch, lambda n: self._ob.put(self._store, n, self.body, mode=mode,
                                                                   use_multipart=False))

    def get(self, threads: int, batch: int | None = None) -> float:
        """Seconds to GET the last set of names, as ``put`` does."""
        return self._timed(threads, batch, lambda n: self._ob.get(self._store, n).bytes())

    def _timed(self, threads: int, batch: int | None, request) -> float:
        names = self._names()
        step = batch or len(names)
        with ThreadPoolExecutor(threads) as pool:
            began = time.perf_counter()
            for i in range(0, len(names), step):
                list(pool.map(request, names[i:i + step]))
            return time.perf_counter() - began


# ---- the benchmark ------------------------------------------------------------------------------------

def run_fleet_bench(cfg: FleetConfig) -> dict:
    from chunkstore.engine import load_model

    loaded = load_model(cfg.preset)
    with tempfile.TemporaryDirectory(prefix="chunkstore-bench-fleet-") as tmp:
        work = Path(tmp)
        with services(cfg, work) as shared:
            runs = {}
            for name in CONFIGS:
                if cfg.show_progress:
                    print(f"{PROG}: {name} ...", file=sys.stderr)
                runs[name] = _run_config(name, cfg, loaded, work, shared if name == "shared-tier" else None)
            io = _measure_io(cfg, loaded, shared, work)
    one, shared_run = runs["one-server"]["hit_rate"], runs["shared-tier"]["hit_rate"]
    result = {
        "setting": f"{cfg.servers} servers of the {cfg.preset} preset, page {cfg.page_size} tokens, device "
                   f"{cfg.device_pages} + host {cfg.host_pages} pages each; {cfg.workload.num_clients} clients x "
                   f"{cfg.workload.num_rounds} rounds, round-robin; shared tier on {shared.description}",
        "runs": list(runs.values()),
        "shared_vs_one_server": shared_run / one if one else None,
        "private_vs_one_server": runs["private-tiers"]["hit_rate"] / one if one else None,
        "io": io,
    }
    targets = [
        Target("shared_vs_one_server", result["shared_vs_one_server"] or 0.0, ">=", HIT_RATE_TARGET),
        Target("publish_vs_raw", io["publish_vs_raw"], ">=", THROUGHPUT_TARGET),
        Target("read_vs_raw", io["read_vs_raw"], ">=", THROUGHPUT_TARGET),
    ]
    if cfg.seal_key is not None:
        result.update(sealed_publish_vs_unsealed=io["sealed_publish_vs_unsealed"],
                      sealed_read_vs_unsealed=io["sealed_read_vs_unsealed"])
        targets += [Target("sealed_publish_vs_unsealed", io["sealed_publish_vs_unsealed"], ">=", SEALED_TARGET),
                    Target("sealed_read_vs_unsealed", io["sealed_read_vs_unsealed"], ">=", SEALED_TARGET)]
    record_targets(result, targets)
    return result


def format_table(result: dict) -> str:
    rows: list[Row] = []
    for run in result["runs"]:
        rows.append((f"{run['name']} ({run['servers']} server(s)): hit rate", f"{run['hit_rate']:.3f}", "", ""))
        rows.append(("  of it from disk / mean TTFT", f"{run['disk_hit_rate']:.3f}", f"{run['mean_ttft_s'] * 1e3:.0f} ms",
                     ""))
    rows.append(("shared tier / one server (hit rate)", f"{result['shared_vs_one_server']:.2f}",
                 *verdict(result, "shared_vs_one_server")))
    rows.append(("private tiers / one server (hit rate)", f"{result['private_vs_one_server']:.2f}", "", ""))
    io = result["io"]
    rows.append(("publish MB/s (raw PUT MB/s)", f"{io['publish_mb_s']:.1f}", f"({io['raw_put_mb_s']:.1f})", ""))
    rows.append(("publish / raw PUT", f"{io['publish_vs_raw']:.2f}", *verdict(result, "publish_vs_raw")))
    rows.append(("  publish / raw PUT, the rounds' lowest and highest", f"{min(io['publish_vs_raw_rounds']):.2f}",
                 f"{max(io['publish_vs_raw_rounds']):.2f}", ""))
    rows.append(("  publish / raw write-once PUT (If-None-Match)", f"{io['publish_vs_raw_write_once']:.2f}", "", ""))
    rows.append(("  publish / raw PUT in one stream (no batches)", f"{io['publish_vs_raw_stream']:.2f}",
                 f"({io['raw_stream_put_mb_s']:.1f} MB/s)", ""))
    rows.append(("read MB/s (raw GET MB/s)", f"{io['read_mb_s']:.1f}", f"({io['raw_get_mb_s']:.1f})", ""))
    rows.append(("read / raw GET", f"{io['read_vs_raw']:.2f}", *verdict(result, "read_vs_raw")))
    rows.append(("  read / raw GET, the rounds' lowest and highest", f"{min(io['read_vs_raw_rounds']):.2f}",
                 f"{max(io['read_vs_raw_rounds']):.2f}", ""))
    rows.append(("  read / raw GET in one stream (no batches)", f"{io['read_vs_raw_stream']:.2f}",
                 f"({io['raw_stream_get_mb_s']:.1f} MB/s)", ""))
    rows.append(("ms per page: publish, read", f"{io['publish_ms_per_page']:.2f}", f"{io['read_ms_per_page']:.2f}", ""))
    rows.append(("ms per object: raw PUT, GET", f"{io['raw_put_ms_per_object']:.2f}",
                 f"{io['raw_get_ms_per_object']:.2f}", ""))
    rows.append(("threads: upload, read (raw the same)", f"{io['upload_threads']}", f"{io['read_threads']}", ""))
    rows.append(("pages per put and get (raw batches the same)", f"{io['io_batch_pages']}", "", ""))
    rows.append(("index lookup per request (ms)", f"{io['index_lookup_ms_per_request']:.2f}", "", ""))
    if "sealed_publish_mb_s" in io:
        rows.append(("sealed tier: publish MB/s, read MB/s", f"{io['sealed_publish_mb_s']:.1f}",
                     f"{io['sealed_read_mb_s']:.1f}", ""))
        rows.append(("sealed publish / unsealed publish", f"{io['sealed_publish_vs_unsealed']:.2f}",
                     *verdict(result, "sealed_publish_vs_unsealed")))
        rows.append(("sealed read / unsealed read", f"{io['sealed_read_vs_unsealed']:.2f}",
                     *verdict(result, "sealed_read_vs_unsealed")))
    return "\n".join([result["setting"], "", *table_lines(rows, target_width=9), "", verdict_line(result)])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = FleetConfig()
    w = d.workload
    parser.add_argument("--servers", type=int, default=d.servers, help=f"servers in the fleet (default {d.servers})")
    parser.add_argument("--num-clients", type=int, default=w.num_clients, help=f"conversations (default {w.num_clients})")
    parser.add_argument("--num-rounds", type=int, default=w.num_rounds, help=f"requests per client (default {w.num_rounds})")
    parser.add_argument("--request-length", type=int, default=w.request_length,
                        help=f"tokens of each new question (default {w.request_length})")
    parser.add_argument("--output-length", type=int, default=w.output_length,
                        help=f"tokens of each reply (default {w.output_length})")
    parser.add_argument("--request-rate", type=float, default=w.request_rate,
                        help=f"requests per second across all clients, Poisson (default {w.request_rate:g}: a "
                             f"client's next turn comes some seconds after its reply, as a person's does; inf "
                             f"sends at once, before the reply's pages can be published)")
    parser.add_argument("--preset", default=d.preset, help=f"built-in model: tiny, small, llama-1b (default {d.preset})")
    parser.add_argument("--page-size", type=int, default=d.page_size, help=f"tokens per page (default {d.page_size})")
    parser.add_argument("--device-pages", type=int, default=d.device_pages,
                        help=f"each server's device pool, in pages (default {d.device_pages})")
    parser.add_argument("--host-pages", type=int, default=d.host_pages,
                        help=f"each server's host pool, in pages (default {d.host_pages})")
    parser.add_argument("--io-pages", type=int, default=d.io_pages,
                        help=f"pages of the publish and read measurement (default {d.io_pages})")
    parser.add_argument("--index-url", default=None, metavar="URL",
                        help="the shared tier's PostgreSQL database (default: a throwaway local server; needs "
                             "Debian's postgresql)")
    parser.add_argument("--object-store", default=None, metavar="URL",
                        help="the shared tier's bucket, s3://BUCKET/PREFIX, reached through the AWS_* variables "
                             "(default: a throwaway radosgw where Ceph is installed, else moto)")
    parser.add_argument("--seal-key", metavar="PATH", type=Path, default=None,
                        help="a key file (chunkstore keys new): also publish and read the same pages through a "
                             "sealed tier (its own index and bucket prefix), round by round with the unsealed one")
    scale = parser.add_argument_group("the fleet's growth (instead of the runs above)")
    scale.add_argument("--simulate-servers", metavar="N,N,...", type=_server_counts, default=None,
                       help="simulated servers (a process each, with its own store and no model) replaying a "
                            "multi-turn trace on one throwaway PostgreSQL and S3 server, per N: e.g. 1,2,4,8,16,32")
    s = ScaleConfig()
    scale.add_argument("--sim-rate", type=float, default=s.rate_per_server, metavar="REQ_PER_S",
                       help=f"requests per second per simulated server (default {s.rate_per_server:g}: 32 servers "
                            "fit on 2 cores)")
    scale.add_argument("--sim-warmup", type=float, default=s.warmup_s, metavar="SECONDS",
                       help=f"seconds that fill the tier before each N is measured (default {s.warmup_s:g})")
    scale.add_argument("--sim-duration", type=float, default=s.duration_s, metavar="SECONDS",
                       help=f"seconds measured per N (default {s.duration_s:g}), longer where that holds fewer than "
                            f"--sim-min-requests")
    scale.add_argument("--sim-min-requests", type=int, default=s.min_requests, metavar="N",
                       help=f"requests measured per N at least (default {s.min_requests})")
    scale.add_argument("--sim-capacity-s", type=_capacity_s, default=s.capacity_s, metavar="SECONDS",
                       help=f"the tier's capacity, in seconds of the fleet's publishes (default {s.capacity_s:g}: "
                            "every N measures a full tier that evicts; 'none': unbounded)")
    scale.add_argument("--index-rows", metavar="ROWS", type=_row_count, default=None,
                       help="instead: lookups and eviction planning on an index bulk-loaded with 100k, 1M, ... up "
                            "to ROWS rows (e.g. 10M), and its size on disk")
    scale.add_argument("--pg-setting", metavar="NAME=VALUE", action="append", type=_pg_setting, default=[],
                       help="a setting of the throwaway PostgreSQL of --simulate-servers and --index-rows, e.g. "
                            "shared_buffers=4GB (repeatable; default: PostgreSQL's own, but --index-rows gives "
                            "shared_buffers room for the largest index)")
    add_output_arguments(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")


def config_from_args(args: argparse.Namespace) -> FleetConfig:
    workload = Workload(num_clients=args.num_clients, num_rounds=args.num_rounds, request_length=args.request_length,
                        output_length=args.output_length, max_parallel=4, request_rate=args.request_rate)
    return FleetConfig(workload=workload, servers=args.servers, preset=args.preset, page_size=args.page_size,
                       device_pages=args.device_pages, host_pages=args.host_pages, index_url=args.index_url,
                       object_store=args.object_store, io_pages=args.io_pages, show_progress=not args.no_progress,
                       seal_key=args.seal_key)


def _server_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of server counts: {text!r} (e.g. 1,2,4,8,16,32)") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"server counts must be at least 1: {text!r}")
    return counts


def _capacity_s(text: str) -> float | None:
    return None if text.strip().lower() == "none" else float(text)


_ROW_UNITS = {"": 1, "k": 1_000, "m": 1_000_000, "g": 1_000_000_000}


def _row_count(text: str) -> int:
    """A row count: digits with an optional k, M or G (decimal: 10M is 10,000,000), at least 1,000."""
    number, unit = text.strip()[:-1], text.strip()[-1:].lower()
    if unit.isdigit():
        number, unit = text.strip(), ""
    try:
        rows = int(float(number) * _ROW_UNITS[unit])
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"not a row count: {text!r} (e.g. 10M, 250k)") from None
    if rows < 1000:
        raise argparse.ArgumentTypeError(f"--index-rows takes at least 1k rows, not {text!r}")
    return rows


def _pg_setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[a-z_][a-z0-9_.]*", name.strip()) or not value.strip():
        raise argparse.ArgumentTypeError(f"not a PostgreSQL setting NAME=VALUE: {text!r}")
    return name.strip(), value.strip()


def scale_config_from_args(args: argparse.Namespace) -> ScaleConfig:
    return ScaleConfig(servers=args.simulate_servers, rate_per_server=args.sim_rate, warmup_s=args.sim_warmup,
                       duration_s=args.sim_duration, min_requests=args.sim_min_requests,
                       capacity_s=args.sim_capacity_s, show_progress=not args.no_progress,
                       pg_settings=dict(args.pg_setting))


def run(args: argparse.Namespace) -> int:
    from chunkstore.bench.common import run_bench

    failures = (RuntimeError, OSError, ImportError)
    if args.index_rows is not None:
        from chunkstore.bench.fleet_rows import RowsConfig, format_rows_table, run_rows_bench

        return run_bench(args, PROG, lambda: RowsConfig(max_rows=args.index_rows, show_progress=not args.no_progress,
                                                        pg_settings=dict(args.pg_setting)),
                         run_rows_bench, format_rows_table, failures=failures, failed="the benchmark failed")
    if args.simulate_servers is not None:
        from chunkstore.bench.fleet_scale import format_scale_table, run_scale_bench

        return run_bench(args, PROG, lambda: scale_config_from_args(args), run_scale_bench, format_scale_table,
                         failures=failures, failed="the benchmark failed")
    return run_bench(args, PROG, lambda: config_from_args(args), run_fleet_bench, format_table,
                     failures=failures, failed="the benchmark failed")
