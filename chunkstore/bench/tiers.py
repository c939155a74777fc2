"""``chunkstore bench tiers``: what the tiered cache costs per request and how fast it moves pages.

Invariants: every figure comes from the public TieredCache calls an engine makes (match, allocate,
insert, release), and every loaded page is checked byte for byte after its timer stops; each
baseline (a plain tensor copy, the store's own batch load) moves the same bytes in the same run;
throughputs are decimal GB/s of logical bytes; disk loads start from cold files. Targets are
reported, never asserted.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from chunkstore.bench.common import (
    GB,
    MIB,
    Target,
    files_under,
    make_cold,
    record_targets,
    table_lines,
    verdict_line,
)
from chunkstore.bench.common import run_bench
from chunkstore.bench.common import verdict as target_verdict
from chunkstore.bench.kvdata import KVSource, make_pages
from chunkstore.cache.config import CacheConfig
from chunkstore.cache.tiered import TieredCache
from chunkstore.disk.identity import ModelIdentity
from chunkstore.disk.keys import chain_pages
from chunkstore.output import add_output_arguments

SERVE_PAGE_SIZE = CacheConfig.model_fields["page_size"].default  # `chunkstore serve`'s page size

VOCAB_SIZE = 128_256


@dataclass(slots=True)
class TiersBenchConfig:
    """What to run; ValueError names a bad field."""

    # match + insert: a tree of many conversations, at the page size its target was set for
    num_conversations: int = 1000
    conversation_tokens: int = 4096  # each conversation's history in the tree (after a shared prompt)
    system_prompt_tokens: int = 1024  # shared by every conversation
    request_tokens: int = 8192
    match_page_size: int = 64
    num_requests: int = 50
    # transfers: a realistic model layout
    size_mb: int = 1024  # KV moved host->device and disk->device
    batch_pages: int = 128  # pages per request (one load-back)
    num_layers: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    dtype: str = "bfloat16"
    seed: int = 0
    show_progress: bool = True

    def __post_init__(self) -> None:
        for name in ("num_conversations", "conversation_tokens", "request_tokens", "match_page_size",
                     "num_requests", "size_mb", "batch_pages", "num_layers", "num_kv_heads", "head_dim",
                     "page_size"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.system_prompt_tokens < 0:
            raise ValueError(f"system_prompt_tokens must be >= 0, got {self.system_prompt_tokens}")
        if self.request_tokens < self.match_page_size:
            raise ValueError("request_tokens must hold at least one page")

    def identity(self, page_size: int, small: bool = False) -> ModelIdentity:
        if small:  # the tree's cost does not depend on page bytes: keep the pools small
            return ModelIdentity("chunkstore-bench-tiers", self.dtype, num_layers=1, num_kv_heads=1,
                                 head_dim=8, page_size=page_size)
        return ModelIdentity("chunkstore-bench-tiers", self.dtype, num_layers=self.num_layers,
                             num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, page_size=page_size)

    @property
    def num_batches(self) -> int:
        page_bytes = self.identity(self.page_size).page_size_bytes
        return max(2, round(self.size_mb * MIB / page_bytes / self.batch_pages))


def _progress(cfg: TiersBenchConfig, total: int, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, unit="step", file=sys.stderr, leave=False, dynamic_ncols=True,
                disable=not cfg.show_progress or not sys.stderr.isatty())  # bars on a terminal only


def _tokens(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(0, VOCAB_SIZE, n).tolist()


def _serve(cache: TieredCache, tokens: list[int]) -> tuple[float, int]:
    """One request's cache work as an engine does it (no compute): seconds, new pages."""
    t0 = time.perf_counter()
    hit = cache.match(tokens)
    num_pages = len(tokens) // cache.page_size
    new = cache.allocate_device(num_pages - hit.num_pages)
    cache.insert(tokens, torch.cat([hit.device_slots, new]))
    cache.release(hit)
    return time.perf_counter() - t0, num_pages - hit.num_pages


def measure_match_insert(cfg: TiersBenchConfig, work: Path, *, use_disk: bool) -> dict:
    """Median ms of match + allocate + insert + release for a ``request_tokens`` request that
    extends one of ``num_conversations`` conversations already in the tree."""
    rng = np.random.default_rng(cfg.seed)
    size = cfg.match_page_size
    identity = cfg.identity(size, small=True)
    system = _tokens(rng, cfg.system_prompt_tokens)
    histories = [system + _tokens(rng, cfg.conversation_tokens) for _ in range(cfg.num_conversations)]
    total_pages = sum(len(h) // size + 1 for h in histories) + cfg.num_requests * (cfg.request_tokens // size + 1)
    config = CacheConfig(page_size=size, device_size=f"{total_pages}pages", host_size=f"{total_pages}pages",
                         use_disk=use_disk, disk_path=work / "match-store", write_policy="write_back")
    times, new_pages = [], []
    with TieredCache.open(config, identity) as cache, _progress(cfg, len(histories) + cfg.num_requests,
                                                          "match+insert" + (" (disk)" if use_disk else "")) as bar:
        for h in histories:
            _serve(cache, h)
            bar.update()
        for i in range(cfg.num_requests):
            base = histories[int(rng.integers(len(histories)))]
            request = (base + _tokens(rng, cfg.request_tokens))[: cfg.request_tokens]
            seconds, n = _serve(cache, request)
            times.append(seconds)
            new_pages.append(n)
            bar.update()
        num_nodes = cache.tree.stats().num_nodes
    return {"ms": statistics.median(times) * 1e3, "new_pages": statistics.median(new_pages), "tree_nodes": num_nodes}


def _fill(cache: TieredCache, prompts: list[list[int]], pages: torch.Tensor, batch: int) -> None:
    """Compute-free prefill: write each prompt's pages into device slots and insert them."""
    for i, tokens in enumerate(prompts):
        hit = cache.match(tokens)
        slots = cache.allocate_device(batch)
        device = cache.device_pool.device
        cache.device_pool.buffer[slots.to(device)] = pages[i * batch:(i + 1) * batch].to(device)
        cache.insert(tokens, slots)
        cache.release(hit)
        cache.wait_idle()


def _timed_match(cache: TieredCache, tokens: list[int], expected: torch.Tensor, source: str) -> float:
    t0 = time.perf_counter()
    hit = cache.match(tokens)
    if hit.ready is not None:
        hit.ready.synchronize()
    seconds = time.perf_counter() - t0
    try:
        got = cache.device_pool.buffer[hit.device_slots.to(cache.device_pool.device)].cpu()
        if hit.num_pages != len(expected) or not torch.equal(got.view(torch.uint8), expected.view(torch.uint8)):
            raise RuntimeError(f"{source}->device loaded {hit.num_pages} of {len(expected)} pages or wrong bytes")
    finally:
        cache.release(hit)
    return seconds


def _timed_copy(dst: torch.Tensor, src: torch.Tensor) -> float:
    """Seconds of one plain ``dst.copy_(src)``, until the bytes have landed."""
    t0 = time.perf_counter()
    dst.copy_(src, non_blocking=False)
    for t in (dst, src):
        if t.device.type == "cuda":
            torch.cuda.synchronize(t.device)
    return time.perf_counter() - t0


def measure_transfers(cfg: TiersBenchConfig, work: Path) -> dict:
    """host->device and disk->device through ``match``, with a plain copy and the store's load of
    the same bytes as baselines."""
    identity = cfg.identity(cfg.page_size)
    batch, n = cfg.batch_pages, cfg.num_batches
    page_bytes = identity.page_size_bytes
    rng = np.random.default_rng(cfg.seed + 1)
    prompts = [_tokens(rng, batch * cfg.page_size) for _ in range(n)]
    with _progress(cfg, batch * n, "generate KV") as bar:
        pages = make_pages(KVSource.SYNTHETIC, identity, batch * n, cfg.seed, on_page=lambda: bar.update())
    config = CacheConfig(page_size=cfg.page_size, device_size=f"{batch}pages", host_size=f"{batch * n}pages",
                         disk_path=work / "store", write_policy="write_through")
    batch_bytes = batch * page_bytes
    h2d, memcpy, memcpy_d2h, d2d, load = [], [], [], [], []
    with TieredCache.open(config, identity) as cache:
        cache.wait_prefaulted()  # the steady state: pools mapped, as the copy baseline's dst is
        with _progress(cfg, n, "fill") as bar:
            for i in range(n):
                _fill(cache, prompts[i:i + 1], pages[i * batch:(i + 1) * batch], batch)
                bar.update()
        backups = cache.stats().paths["device_to_host"]  # write-through: each inserted page copied to the host
        # The device holds the last prompt; the host holds all. Loading prompt i evicts the device.
        dst = torch.empty_like(cache.device_pool.buffer[:batch])
        src = cache.host_pool.buffer
        dst.copy_(src[:batch])  # touch every page of dst: first-touch page faults are not a copy's cost
        # The plain copy the cache's backups compare with: device pages into pinned host memory (as the host pool's).
        d2h_dst = torch.empty_like(src[:batch], pin_memory=cache.host_pool.is_pinned)
        d2h_dst.copy_(dst)
        with _progress(cfg, n - 1, "host->device") as bar:
            for i in range(n - 1):
                h2d.append(_timed_match(cache, prompts[i], pages[i * batch:(i + 1) * batch], "host"))
                memcpy.append(_timed_copy(dst, src[i * batch:(i + 1) * batch]))
                memcpy_d2h.append(_timed_copy(d2h_dst, dst))
                bar.update()
        cache.flush()
    store_files = files_under(work / "store")
    cold_method = "none"
    with TieredCache.open(config, identity) as cache:  # a restart: memory tiers empty, the disk warm-starts
        cache.wait_prefaulted()
        refs = [chain_pages(identity, p) for p in prompts]
        out = torch.empty((batch, *identity.page_shape), dtype=pages.dtype)
        with _progress(cfg, n, "disk->device") as bar:
            for i in range(n):
                expected = pages[i * batch:(i + 1) * batch]
                cold_method = make_cold(store_files)
                t0 = time.perf_counter()
                hits = cache.store.get_into(refs[i], list(out))
                load.append(time.perf_counter() - t0)
                if not all(hits) or not torch.equal(out.view(torch.uint8), expected.view(torch.uint8)):
                    raise RuntimeError("the store's load missed or corrupted pages")
                make_cold(store_files)
                d2d.append(_timed_match(cache, prompts[i], expected, "disk"))
                bar.update()
        stats = cache.stats()
    return {
        "host_to_device_gbps": batch_bytes * len(h2d) / sum(h2d) / GB,
        "memcpy_gbps": batch_bytes * len(memcpy) / sum(memcpy) / GB,
        # Each backup's own time, from its start on the cache's copy thread to the pages landing.
        "device_to_host_gbps": backups.gbps,
        "memcpy_d2h_gbps": batch_bytes * len(memcpy_d2h) / sum(memcpy_d2h) / GB,
        "disk_to_device_gbps": batch_bytes * len(d2d) / sum(d2d) / GB,
        "load_gbps": batch_bytes * len(load) / sum(load) / GB,
        "cold_method": cold_method,
        "transfer_pages": batch * n,
        "page_size_bytes": page_bytes,
        "device": str(cache.device_pool.device),
        "paths": {name: {"gbps": p.gbps, "pages": p.num_pages} for name, p in stats.paths.items()},
    }


def run_tiers_bench(cfg: TiersBenchConfig) -> dict:
    """The whole benchmark; returns the flat result dict that the table and the JSON show.
    Raises RuntimeError when the cache loses or corrupts a page."""
    work = Path(tempfile.mkdtemp(prefix="chunkstore-bench-tiers-"))
    try:
        memory = measure_match_insert(cfg, work, use_disk=False)
        disk = measure_match_insert(cfg, work, use_disk=True)
        transfers = measure_transfers(cfg, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "match_insert_ms": memory["ms"],
        "match_insert_disk_ms": disk["ms"],
        "match_insert_new_pages": memory["new_pages"],
        "tree_nodes": memory["tree_nodes"],
        "num_conversations": cfg.num_conversations,
        "request_tokens": cfg.request_tokens,
        "match_page_size": cfg.match_page_size,
        **transfers,
        "host_to_device_vs_memcpy": transfers["host_to_device_gbps"] / transfers["memcpy_gbps"],
        "device_to_host_vs_memcpy": transfers["device_to_host_gbps"] / transfers["memcpy_d2h_gbps"],
        "disk_to_device_vs_load": transfers["disk_to_device_gbps"] / transfers["load_gbps"],
        "page_shape": list(cfg.identity(cfg.page_size).page_shape),
        "dtype": cfg.dtype,
        "batch_pages": cfg.batch_pages,
    }
    targets = [
        Target("match_insert_ms", result["match_insert_ms"], "<=", 0.5),
        Target("host_to_device_vs_memcpy", result["host_to_device_vs_memcpy"], ">=", 0.5),
        Target("disk_to_device_vs_load", result["disk_to_device_vs_load"], ">=", 0.8),
    ]
    record_targets(result, targets)
    return result


def format_table(r: dict) -> str:

    def verdict(name: str) -> tuple[str, str]:
        return target_verdict(r, name)

    rows = [
        (f"match+insert ms, {r['request_tokens']}-token request, {r['num_conversations']} conversations",
         f"{r['match_insert_ms']:.3f}", *verdict("match_insert_ms")),
        ("match+insert ms, with the disk lookup", f"{r['match_insert_disk_ms']:.3f}", "", ""),
        ("host->device GB/s (match, load-back)", f"{r['host_to_device_gbps']:.2f}", "", ""),
        ("memcpy GB/s (plain tensor copy)", f"{r['memcpy_gbps']:.2f}", "", ""),
        ("host->device / memcpy", f"{r['host_to_device_vs_memcpy']:.2f}", *verdict("host_to_device_vs_memcpy")),
        ("device->host GB/s (write-through backups)", f"{r['device_to_host_gbps']:.2f}", "", ""),
        ("memcpy GB/s (plain copy into pinned memory)", f"{r['memcpy_d2h_gbps']:.2f}", "", ""),
        ("device->host / memcpy", f"{r['device_to_host_vs_memcpy']:.2f}", "", ""),
        ("disk->device GB/s (match after restart)", f"{r['disk_to_device_gbps']:.2f}", "", ""),
        ("store load GB/s (get_into)", f"{r['load_gbps']:.2f}", "", ""),
        ("disk->device / load", f"{r['disk_to_device_vs_load']:.2f}", *verdict("disk_to_device_vs_load")),
    ]
    shape = "x".join(str(d) for d in r["page_shape"])
    head = (f"chunkstore bench tiers: pages {shape} {r['dtype']} ({r['page_size_bytes'] / MIB:.2f} MiB), "
            f"{r['transfer_pages']} pages moved per path in loads of {r['batch_pages']}, device {r['device']}, "
            f"cold reads: {r['cold_method']}")
    return "\n".join([head, "", *table_lines(rows), "", verdict_line(r)])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``chunkstore bench tiers``."""
    d = TiersBenchConfig()
    add_output_arguments(parser)
    parser.add_argument("--conversations", type=int, default=d.num_conversations,
                        help=f"conversations in the tree for match+insert (default {d.num_conversations})")
    parser.add_argument("--request-tokens", type=int, default=d.request_tokens,
                        help=f"tokens of the timed request (default {d.request_tokens})")
    parser.add_argument("--match-page-size", type=int, default=d.match_page_size,
                        help=f"tokens per page for match+insert (default {d.match_page_size})")
    parser.add_argument("--requests", type=int, default=d.num_requests,
                        help=f"timed requests; the median is reported (default {d.num_requests})")
    parser.add_argument("--size-mb", type=int, default=d.size_mb,
                        help=f"MiB of KV moved on each transfer path (default {d.size_mb})")
    parser.add_argument("--batch-pages", type=int, default=d.batch_pages,
                        help=f"pages per loaded prefix (default {d.batch_pages})")
    parser.add_argument("--layers", type=int, default=d.num_layers, help=f"model layers (default {d.num_layers})")
    parser.add_argument("--kv-heads", type=int, default=d.num_kv_heads, help=f"KV heads (default {d.num_kv_heads})")
    parser.add_argument("--head-dim", type=int, default=d.head_dim, help=f"head dimension (default {d.head_dim})")
    parser.add_argument("--page-size", type=int, default=d.page_size,
                        help=f"tokens per page for the transfers (default {d.page_size}, not serve's "
                             f"{SERVE_PAGE_SIZE}: 2 MiB chunks of the Llama-3-8B-like shape, as bench store)")
    parser.add_argument("--seed", type=int, default=d.seed, help=f"seed of tokens and KV (default {d.seed})")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")


def run(args: argparse.Namespace) -> int:
    """Exit code: 0 done, 1 the cache failed (or a target was missed under --strict), 2 bad options."""
    def configure() -> TiersBenchConfig:
        return TiersBenchConfig(
            num_conversations=args.conversations, request_tokens=args.request_tokens,
            match_page_size=args.match_page_size, num_requests=args.requests, size_mb=args.size_mb,
            batch_pages=args.batch_pages, num_layers=args.layers, num_kv_heads=args.kv_heads,
            head_dim=args.head_dim, page_size=args.page_size, seed=args.seed, show_progress=not args.no_progress)

    return run_bench(args, "chunkstore bench tiers", configure, run_tiers_bench, format_table,
                     failures=(RuntimeError,), failed="the cache failed")
