"""``chunkstore bench store``: ChunkStore save/load throughput against plain file I/O of the same
bytes, compression against the order-0 entropy bound, and exists() latency on a 1M-row index; with
``--seal-key``, a sealed store beside the unsealed one in the same run, and the cipher's own rate
on the same bytes.

Invariants: every throughput counts logical (uncompressed) bytes in decimal GB/s; loads read cold
files (``cold_method`` says how, or that they could not be made cold); the store and the raw
baselines see the same pages, batches and thread count, interleaved batch by batch (in rotating
order) so that drift in a shared machine's disk speed hits all of them alike; every load is
checked byte for byte after its timer stops. Timing targets are reported, never asserted.
"""

from __future__ import annotations

import argparse
import math
import mmap
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from chunkstore.bench.common import (
    GB,
    MIB,
    Target,
    files_under,
    frozen_heap,
    make_cold,
    record_targets,
    table_lines,
    verdict_line,
)
from chunkstore.bench.common import run_bench
from chunkstore.bench.common import verdict as target_verdict
from chunkstore.bench.kvdata import (
    KVSource,
    entropy_bound_ratio,
    make_pages,
    plane_entropies_bits,
)
from chunkstore.cache.config import CacheConfig
from chunkstore.disk.codec import Codec
from chunkstore.disk.identity import DTYPE_ITEMSIZE, ModelIdentity
from chunkstore.disk.index import ChunkRow
from chunkstore.disk.keys import DEFAULT_NAMESPACE, KEY_SIZE_BYTES, PageRef, chain_pages
from chunkstore.disk.page_io import TORCH_DTYPES, page_tensor_bytes
from chunkstore.disk.results import SealingWork, StoreStats
from chunkstore.disk.seal_keys import FileKeyProvider
from chunkstore.disk.store import ChunkStore, default_num_workers
from chunkstore.output import add_output_arguments
from chunkstore.testing.tensors import same_bytes

SERVE_PAGE_SIZE = CacheConfig.model_fields["page_size"].default  # `chunkstore serve`'s page size

CHAIN_PAGES = 128  # pages per synthetic prompt, and the chain length exists() is timed on
VOCAB_SIZE = 128_256  # Llama-3's, for plausible token ids
_FILL_BATCH_ROWS = 20_000
_EXISTS_REPEATS = 101


@dataclass(slots=True)
class StoreBenchConfig:
    """What to run; validated at construction (ValueError names the bad field and why)."""

    size_mb: int = 1024
    num_layers: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    dtype: str = "bfloat16"
    kv_source: KVSource = KVSource.SYNTHETIC
    num_workers: int | None = None  # None: the store's default (store.default_num_workers)
    # One load-back of a matched prefix: 128 pages of 16 tokens is a 2k-token prefix (an 8k one
    # is 512 pages). Both the store and the plain-file baseline run in batches of this size.
    batch_pages: int = 128
    index_rows: int = 1_000_000
    seed: int = 0
    codec: Codec | None = None  # None: the store's default for the dtype
    keep_dir: Path | None = None
    show_progress: bool = True
    seal_key: Path | None = None  # a key file: also time a sealed store, side by side with the unsealed one
    device: str = "cpu"  # where the store's pages are put from and loaded into (cuda: device memory)

    def __post_init__(self) -> None:
        if isinstance(self.kv_source, str):
            self.kv_source = KVSource.parse(self.kv_source)
        if isinstance(self.codec, str):
            self.codec = Codec.parse(self.codec)
        for name in ("size_mb", "num_layers", "num_kv_heads", "head_dim", "page_size", "batch_pages"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.num_workers is not None and self.num_workers <= 0:
            raise ValueError(f"num_workers must be > 0, got {self.num_workers}")
        if self.index_rows < CHAIN_PAGES:
            raise ValueError(f"index_rows must be >= {CHAIN_PAGES} (the timed chain), got {self.index_rows}")
        valid_dtypes = sorted(n for n, t in TORCH_DTYPES.items() if t.is_floating_point and n in DTYPE_ITEMSIZE)
        if self.dtype not in valid_dtypes:
            valid = ", ".join(valid_dtypes)
            raise ValueError(f"unknown dtype {self.dtype!r}; valid dtypes: {valid}")
        try:
            device = torch.device(self.device)
        except RuntimeError:  # torch's error for a name it does not know
            device = None
        if device is None or device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda (cuda:N), got {self.device!r}")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device}: this torch sees no CUDA device")
        self.device = str(device)
        if self.keep_dir is not None:
            self.keep_dir = Path(self.keep_dir)
            if self.keep_dir.exists() and (not self.keep_dir.is_dir() or any(self.keep_dir.iterdir())):
                raise ValueError(f"--keep {self.keep_dir} must be a new or empty folder "
                                 "(an old store would deduplicate every page and time nothing)")

    @property
    def identity(self) -> ModelIdentity:
        return ModelIdentity(model_id="chunkstore-bench", kv_dtype=self.dtype, num_layers=self.num_layers,
                             num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, page_size=self.page_size)

    @property
    def workers(self) -> int:
        return self.num_workers or default_num_workers()

    @property
    def num_pages(self) -> int:
        return max(1, math.ceil(self.size_mb * MIB / self.identity.page_size_bytes))


@dataclass(slots=True)
class _Timers:
    """Wall seconds and process CPU seconds (all threads, user + system) per named step."""

    seconds: dict[str, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)

    def timed(self, name: str, fn: Callable[[], object]) -> object:
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
        self.cpu_seconds[name] = self.cpu_seconds.get(name, 0.0) + time.process_time() - c0
        return out

    def gbps(self, name: str, num_bytes: int) -> float:
        return num_bytes / self.seconds[name] / GB

    def cpu_s_per_gb(self, name: str, num_bytes: int) -> float:
        return self.cpu_seconds[name] / (num_bytes / GB)


def vm_rss_bytes() -> int:
    """This process's resident set size from /proc/self/status (0 where there is none)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# -- plain file I/O baseline -----------------------------------------------------------------

def raw_write(path: Path, data: np.ndarray) -> None:
    """One page as one plain file: write all, fsync, close."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data).cast("B")
        while len(view):
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_read_into(path: Path, out: np.ndarray) -> None:
    """Read a whole plain file into ``out`` (1-D uint8 of the file's size)."""
    view = memoryview(out).cast("B")
    with open(path, "rb", buffering=0) as f:
        got = 0
        while got < len(view):
            n = f.readinto(view[got:])
            if not n:
                raise OSError(f"{path} is shorter than a page")
            got += n


_direct_buffers = threading.local()


def raw_read_direct_into(path: Path, out: np.ndarray) -> None:
    """Read a whole plain file around the page cache (O_DIRECT, as the store reads) into ``out``."""
    size = out.nbytes
    aligned = (size + 4095) // 4096 * 4096
    buf = getattr(_direct_buffers, "buf", None)
    if buf is None or len(buf) < aligned:
        buf = _direct_buffers.buf = mmap.mmap(-1, aligned)  # page-aligned, as O_DIRECT needs
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        got = os.preadv(fd, [memoryview(buf)[:aligned]], 0)
    finally:
        os.close(fd)
    if got < size:
        raise OSError(f"{path} is shorter than a page")
    out[:] = np.frombuffer(buf, dtype=np.uint8, count=size)


# -- the benchmark ---------------------------------------------------------------------------

def _progress(cfg: StoreBenchConfig, total: int, desc: str, unit: str) -> tqdm:
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True,
                disable=not cfg.show_progress or not sys.stderr.isatty())  # bars on a terminal only


def _page_refs(identity: ModelIdentity, num_pages: int, seed: int) -> list[PageRef]:
    """Keys of ``num_pages`` pages in chains of CHAIN_PAGES (one chain per synthetic prompt)."""
    rng = np.random.default_rng(seed)
    refs: list[PageRef] = []
    while len(refs) < num_pages:
        n = min(CHAIN_PAGES, num_pages - len(refs))
        tokens = rng.integers(0, VOCAB_SIZE, n * identity.page_size).tolist()
        refs.extend(chain_pages(identity, tokens))
    return refs


def _rotated(items: list, by: int) -> list:
    by %= len(items)
    return items[by:] + items[:by]


def _synchronized(device: torch.device, step: Callable[[range], None]) -> Callable[[range], None]:
    """``step``, then a wait for the device's queued copies (so a timer stops when the bytes are there)."""
    if device.type != "cuda":
        return step

    def run(b: range) -> None:
        step(b)
        torch.cuda.synchronize(device)
    return run


def _measure_io(cfg: StoreBenchConfig, work: Path, pages: torch.Tensor, refs: list[PageRef]) -> dict:
    """Save and load through the store, and write and read the same pages as plain files. The
    store's pages come from and go to ``cfg.device``; the plain files' from and to host memory."""
    identity, workers, n = cfg.identity, cfg.workers, len(refs)
    store_dir, raw_dirs = work / "store", {"raw": work / "raw-pool", "raw_1stream": work / "raw-1stream"}
    for d in raw_dirs.values():
        d.mkdir(parents=True)
    raw_path = {name: [d / f"{i:07d}.page" for i in range(n)] for name, d in raw_dirs.items()}
    page_bytes = [page_tensor_bytes(p) for p in pages]
    batches = [range(i, min(i + cfg.batch_pages, n)) for i in range(0, n, cfg.batch_pages)]
    logical = n * identity.page_size_bytes
    device = torch.device(cfg.device)
    store_pages = pages.to(device) if device.type != "cpu" else pages  # what the store puts and loads
    writes, reads = _Timers(), _Timers()
    load_average = os.getloadavg()[0]  # other work on a shared machine skews every figure

    store = ChunkStore(store_dir, identity, codec=cfg.codec, num_workers=workers)
    sealed = None if cfg.seal_key is None else ChunkStore(work / "sealed-store", identity, codec=cfg.codec,
                                                          num_workers=workers, seal_key=FileKeyProvider(cfg.seal_key))
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bench-raw")
    # Plain reads get as many threads as the store reads with (its I/O threads), for fairness.
    read_threads = store.io_threads
    reader_pool = ThreadPoolExecutor(max_workers=read_threads, thread_name_prefix="bench-raw-read")
    try:
        def put_into(target: ChunkStore, b: range) -> None:
            result = target.put([refs[i] for i in b], [store_pages[i] for i in b])
            if not result.ok or len(result.stored) != len(b):
                raise RuntimeError(f"the store did not write every page: {result.failed or result.deduplicated}")

        put = _synchronized(device, lambda b: put_into(store, b))

        def write_pool(b: range) -> None:
            list(pool.map(lambda i: raw_write(raw_path["raw"][i], page_bytes[i]), b))

        def write_1stream(b: range) -> None:
            for i in b:
                raw_write(raw_path["raw_1stream"][i], page_bytes[i])

        write_steps = [("store", put), ("raw", write_pool), ("raw_1stream", write_1stream)]
        if sealed is not None:
            write_steps.append(("sealed", _synchronized(device, lambda b: put_into(sealed, b))))
        with _progress(cfg, n, "write", "page") as bar:
            for k, b in enumerate(batches):
                for name, step in _rotated(write_steps, k):
                    writes.timed(name, lambda: step(b))
                bar.update(len(b))
        stats = store.stats()
        sealed_stats = sealed.stats() if sealed is not None else None
        aead = _aead_rates(store_dir) if sealed is not None else {}

        # Loads go into one preallocated batch of destinations, touched first so page faults
        # are not timed; each phase is verified (untimed) before the next overwrites it. The
        # store loads into ``cfg.device``, the plain reads into host memory (the same tensor on a CPU).
        host_dest = torch.zeros((cfg.batch_pages, *identity.page_shape), dtype=pages.dtype)
        dest_bytes = [page_tensor_bytes(d) for d in host_dest]
        dest = host_dest if device.type == "cpu" else torch.zeros_like(host_dest, device=device)

        def get_from(source: ChunkStore, b: range) -> None:
            hits = source.get_into([refs[i] for i in b], list(dest[: len(b)]))
            if not all(hits):
                raise RuntimeError(f"the store missed {hits.count(False)} of {len(b)} pages it holds")

        get = _synchronized(device, lambda b: get_from(store, b))

        def read_pool(b: range) -> None:
            list(reader_pool.map(lambda j: raw_read_into(raw_path["raw"][b[j]], dest_bytes[j]), range(len(b))))

        def read_1stream(b: range) -> None:
            for j, i in enumerate(b):
                raw_read_into(raw_path["raw_1stream"][i], dest_bytes[j])

        def read_direct(b: range) -> None:
            list(reader_pool.map(lambda j: raw_read_direct_into(raw_path["raw"][b[j]], dest_bytes[j]),
                                 range(len(b))))

        sealed_files = files_under(work / "sealed-store") if sealed is not None else []
        cold_method = make_cold([*files_under(store_dir), *sealed_files, *raw_path["raw"], *raw_path["raw_1stream"]])
        read_steps = [("store", get), ("raw", read_pool), ("raw_1stream", read_1stream)]
        if sealed is not None:
            read_steps.append(("sealed", _synchronized(device, lambda b: get_from(sealed, b))))
        if hasattr(os, "O_DIRECT"):  # O_DIRECT reads the disk whatever the page cache holds
            read_steps.append(("raw_direct", read_direct))
        with _progress(cfg, n, "read", "page") as bar:
            for k, b in enumerate(batches):
                for name, step in _rotated(read_steps, k):
                    into = dest if name in ("store", "sealed") else host_dest
                    into.view(torch.uint8).fill_(0xA5)  # a step that loads nothing cannot pass
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    reads.timed(name, lambda: step(b))
                    if not same_bytes(into[: len(b)], pages[b.start : b.stop]):
                        raise RuntimeError(f"{name} loaded bytes that differ from the pages written")
                bar.update(len(b))
        loaded_work = sealed.stats().sealing_work if sealed is not None else None
    finally:
        pool.shutdown(wait=True)
        reader_pool.shutdown(wait=True)
        store.close()
        if sealed is not None:
            sealed.close()
        for d in raw_dirs.values():
            shutil.rmtree(d, ignore_errors=True)

    return {
        "save_gbps": writes.gbps("store", logical),
        "load_gbps": reads.gbps("store", logical),
        "raw_write_gbps": writes.gbps("raw", logical),
        "raw_read_gbps": reads.gbps("raw", logical),
        "raw_write_1stream_gbps": writes.gbps("raw_1stream", logical),
        "raw_read_1stream_gbps": reads.gbps("raw_1stream", logical),
        # The best plain reader: the same threads, around the page cache like the store.
        "raw_read_direct_gbps": reads.gbps("raw_direct", logical) if hasattr(os, "O_DIRECT") else None,
        # Process CPU (all threads) per logical GB: cores / cpu_s_per_gb bounds the GB/s, and a
        # busy shared machine slows a CPU-heavy path more than plain I/O.
        "save_cpu_s_per_gb": writes.cpu_s_per_gb("store", logical),
        "load_cpu_s_per_gb": reads.cpu_s_per_gb("store", logical),
        "raw_write_cpu_s_per_gb": writes.cpu_s_per_gb("raw", logical),
        "raw_read_cpu_s_per_gb": reads.cpu_s_per_gb("raw", logical),
        "load_average_1m": load_average,
        "device": str(store_pages.device),  # where the store's pages were put from and loaded into
        "read_threads": read_threads,
        "cold_method": cold_method,
        "raw_bytes": stats.raw_bytes,
        "stored_bytes": stats.stored_bytes,
        "compression_ratio": stats.compression_ratio,
        **(_sealed_figures(writes, reads, logical, sealed_stats, loaded_work, aead) if sealed is not None else {}),
    }


def _aead_rates(store_dir: Path, max_bytes: int = 256 * MIB) -> dict:
    """AES-256-GCM alone on the unsealed store's chunk files (the compressed bytes a sealed store
    seals), one thread, in process CPU: ``seal_aead_gbps_per_core`` (encrypt) and
    ``open_aead_gbps_per_core`` (decrypt), each into one warm buffer (the cipher and nothing else:
    no allocation, no page fault)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    chunks, total = [], 0
    for path in sorted(files_under(store_dir)):
        if path.suffix == ".kv" and total < max_bytes:
            chunks.append(path.read_bytes())
            total += len(chunks[-1])
    cipher, nonce, aad = AESGCM(os.urandom(32)), os.urandom(12), os.urandom(110)
    sealed = [cipher.encrypt(nonce, c, aad) for c in chunks]  # (untimed: what decrypt reads)
    out = memoryview(bytearray(max(len(c) for c in chunks) + 16))
    c0 = time.process_time()
    for c in chunks:
        cipher.encrypt_into(nonce, c, aad, out[:len(c) + 16])
    c1 = time.process_time()
    for c in sealed:
        cipher.decrypt_into(nonce, c, aad, out[:len(c) - 16])
    c2 = time.process_time()
    return {"seal_aead_gbps_per_core": total / max(c1 - c0, 1e-9) / GB,
            "open_aead_gbps_per_core": total / max(c2 - c1, 1e-9) / GB, "aead_sample_bytes": total}


def _sealed_figures(writes: _Timers, reads: _Timers, logical: int, saved: StoreStats, loaded: SealingWork,
                    aead: dict) -> dict:
    """The sealed store's figures, and what sealing costs beyond the unsealed store in CPU per
    logical GB, against what the cipher alone costs on the bytes sealed: as the difference of the
    two stores' process CPU (everything sealing changes, and every other thread's noise), and as
    the sealing code's own CPU in the store (``StoreStats.sealing_work``: the threads' CPU clocks
    around the keys, the naming, the cipher and its buffers; exact, but blind to what sealing
    might cost elsewhere). ``saved`` is the sealed store's figures after the writes, ``loaded``
    its sealing work after the reads."""
    sealed_bytes, wrote = saved.stored_bytes, saved.sealing_work
    cipher_save = sealed_bytes / logical / aead["seal_aead_gbps_per_core"]  # CPU s per logical GB
    cipher_load = sealed_bytes / logical / aead["open_aead_gbps_per_core"]
    extra_save = writes.cpu_s_per_gb("sealed", logical) - writes.cpu_s_per_gb("store", logical)
    extra_load = reads.cpu_s_per_gb("sealed", logical) - reads.cpu_s_per_gb("store", logical)
    return {
        "sealed_save_gbps": writes.gbps("sealed", logical),
        "sealed_load_gbps": reads.gbps("sealed", logical),
        "sealed_save_cpu_s_per_gb": writes.cpu_s_per_gb("sealed", logical),
        "sealed_load_cpu_s_per_gb": reads.cpu_s_per_gb("sealed", logical),
        "sealed_bytes": sealed_bytes,
        **aead,
        "seal_cipher_cpu_s_per_gb": cipher_save,
        "open_cipher_cpu_s_per_gb": cipher_load,
        "seal_extra_cpu_s_per_gb": extra_save,
        "open_extra_cpu_s_per_gb": extra_load,
        "seal_code_cpu_s_per_gb": (wrote.seal_cpu_s + wrote.name_cpu_s) / (logical / GB),
        "open_code_cpu_s_per_gb": (loaded.open_cpu_s - wrote.open_cpu_s + loaded.name_cpu_s - wrote.name_cpu_s)
        / (logical / GB),
    }


def _sorted_random_keys(num_keys: int, rng: np.random.Generator) -> np.ndarray:
    keys = rng.integers(0, 256, (num_keys, KEY_SIZE_BYTES), dtype=np.uint8)
    words = keys.view(">u8")  # big-endian words sort like the bytes they hold
    return keys[np.lexsort(tuple(words[:, w] for w in reversed(range(words.shape[1]))))]


def _fill_index(cfg: StoreBenchConfig, store: ChunkStore, chain: list[PageRef]) -> None:
    """Insert ``cfg.index_rows`` rows, ``chain`` among them, straight into the index.

    exists() reads the index only, so these rows have no files. The filler rows are inserted in
    key order, so SQLite appends instead of splitting pages at random (which slows down as the
    table outgrows SQLite's cache); each points to the row before it as its parent, which
    nothing here reads.
    """
    identity, now = cfg.identity, time.time()
    keys = _sorted_random_keys(cfg.index_rows - len(chain), np.random.default_rng(cfg.seed + 1))
    raw, stored = identity.page_size_bytes, int(identity.page_size_bytes / 1.45)
    parent = chain[0].parent_key
    with _progress(cfg, cfg.index_rows, "fill index", "row") as bar:
        for start in range(0, len(keys), _FILL_BATCH_ROWS):
            block = keys[start : start + _FILL_BATCH_ROWS].tobytes()
            rows = []
            for off in range(0, len(block), KEY_SIZE_BYTES):
                key = block[off : off + KEY_SIZE_BYTES]
                rows.append(ChunkRow(key=key, parent_key=parent, namespace=DEFAULT_NAMESPACE,
                                     num_tokens=identity.page_size, raw_bytes=raw, stored_bytes=stored,
                                     created_at=now, last_access_at=now))
                parent = key
            store.adopt(rows)
            bar.update(len(rows))
        store.adopt([ChunkRow(key=p.key, parent_key=p.parent_key, namespace=p.namespace,
                                     num_tokens=p.num_tokens, raw_bytes=raw, stored_bytes=stored,
                                     created_at=now, last_access_at=now) for p in chain])
        bar.update(len(chain))


def _open_and_look_up(index_dir: str, identity_json: str, keys: list[bytes], absent_keys: list[bytes],
                      repeats: int) -> dict:
    """Open the store at ``index_dir`` and time exists(); runs in a fresh process, so that the
    first lookup pays what it pays after a restart and resident memory is not hidden by a heap
    that earlier phases grew and freed."""
    identity = ModelIdentity.from_json(identity_json)
    rss_before = vm_rss_bytes()
    t0 = time.perf_counter()
    with ChunkStore(index_dir, identity, num_workers=1) as store:
        found = store.exists(keys)
        open_s = time.perf_counter() - t0
        if not all(found):
            raise RuntimeError(f"exists() missed {found.count(False)} of the {len(keys)} keys just indexed")
        hit_s, miss_s = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            store.exists(keys)
            hit_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            if any(store.exists(absent_keys)):
                raise RuntimeError("exists() found keys that were never indexed")
            miss_s.append(time.perf_counter() - t)
        rss_after = vm_rss_bytes()
    return {
        "exists_128_ms": statistics.median(hit_s) * 1e3,
        "exists_128_miss_ms": statistics.median(miss_s) * 1e3,
        "open_first_lookup_s": open_s,
        "rss_growth_mb": (rss_after - rss_before) / MIB,
    }


def _measure_exists(cfg: StoreBenchConfig, work: Path) -> dict:
    """exists() on a CHAIN_PAGES-key chain in an index of ``cfg.index_rows`` rows, and the cost of
    opening that store (time to the first answer, resident memory) in a fresh process."""
    identity, index_dir = cfg.identity, work / "index"
    chain = _page_refs(identity, CHAIN_PAGES, cfg.seed + 2)
    absent = chain_pages(identity, [t + 1 for p in chain for t in p.token_ids])
    t0 = time.perf_counter()
    with ChunkStore(index_dir, identity, num_workers=1) as store:
        _fill_index(cfg, store, chain)
        num_rows = store.num_chunks()
    fill_s = time.perf_counter() - t0

    spawn = multiprocessing.get_context("spawn")  # fork would inherit this process's heap and imports
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as child:
        child.submit(vm_rss_bytes).result()  # start it and import everything before the cache is dropped
        cold_method = make_cold(files_under(index_dir))
        looked_up = child.submit(_open_and_look_up, str(index_dir), identity.to_json(),
                                 [p.key for p in chain], [p.key for p in absent], _EXISTS_REPEATS).result()
    return {"index_rows": num_rows, "index_fill_s": fill_s, "index_cold_method": cold_method, **looked_up}


def run_store_bench(cfg: StoreBenchConfig) -> dict:
    """Run the whole benchmark; returns the flat result dict that the table and the JSON show.

    Writes under ``cfg.keep_dir`` (left in place: store/ and index/) or a temporary folder
    (deleted). Raises RuntimeError when the store loses, misses or corrupts a page.
    """
    identity = cfg.identity
    if cfg.keep_dir is not None:
        cfg.keep_dir.mkdir(parents=True, exist_ok=True)
        work = cfg.keep_dir
    else:
        work = Path(tempfile.mkdtemp(prefix="chunkstore-bench-"))
    phases = _Timers()
    try:
        with _progress(cfg, cfg.num_pages, "generate KV", "page") as bar:
            pages = phases.timed("generate", lambda: make_pages(cfg.kv_source, identity, cfg.num_pages, cfg.seed,
                                                                on_page=lambda: bar.update()))
        refs = _page_refs(identity, cfg.num_pages, cfg.seed)
        with frozen_heap():
            io = phases.timed("io", lambda: _measure_io(cfg, work, pages, refs))
        with _progress(cfg, len(pages), "entropy", "page") as bar:
            entropies = phases.timed("entropy", lambda: plane_entropies_bits(pages, identity.itemsize,
                                                                              on_page=lambda: bar.update()))
        del pages  # before the index phase, whose resident memory is measured
        index = phases.timed("index", lambda: _measure_exists(cfg, work))
    finally:
        if cfg.keep_dir is None:
            shutil.rmtree(work, ignore_errors=True)

    bound = entropy_bound_ratio(entropies)
    result = {
        "size_mb": cfg.size_mb,
        "num_pages": cfg.num_pages,
        "page_shape": list(identity.page_shape),
        "page_size_bytes": identity.page_size_bytes,
        "num_layers": cfg.num_layers,
        "num_kv_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "page_size": cfg.page_size,
        "dtype": cfg.dtype,
        "kv_source": cfg.kv_source.value,
        "seed": cfg.seed,
        "codec": (cfg.codec or Codec.default_for(identity.itemsize)).value,
        "batch_pages": cfg.batch_pages,
        "workers": cfg.workers,  # store compress/write threads = raw write threads
        **io,
        "plane_entropy_bits": entropies,
        "entropy_bound_ratio": bound,
        "save_vs_raw": io["save_gbps"] / io["raw_write_gbps"],
        "load_vs_raw": io["load_gbps"] / io["raw_read_gbps"],
        "load_vs_raw_direct": (io["load_gbps"] / io["raw_read_direct_gbps"]
                               if io["raw_read_direct_gbps"] else None),
        "ratio_vs_bound": io["compression_ratio"] / bound,
        **index,
        "phase_s": {name: round(sec, 3) for name, sec in phases.seconds.items()},
        "store_dir": str(work / "store") if cfg.keep_dir is not None else None,
        "index_store_dir": str(work / "index") if cfg.keep_dir is not None else None,
    }
    targets = [
        Target("save_vs_raw", result["save_vs_raw"], ">=", 1.0),
        Target("load_vs_raw", result["load_vs_raw"], ">=", 1.0),
        Target("ratio_vs_bound", result["ratio_vs_bound"], ">=", 0.97),
        Target("exists_128_ms", result["exists_128_ms"], "<=", 2.0),
    ]
    if cfg.seal_key is not None:
        result.update(
            sealed_save_vs_unsealed=io["sealed_save_gbps"] / io["save_gbps"],
            sealed_load_vs_unsealed=io["sealed_load_gbps"] / io["load_gbps"],
            seal_extra_vs_cipher=io["seal_extra_cpu_s_per_gb"] / io["seal_cipher_cpu_s_per_gb"],
            open_extra_vs_cipher=io["open_extra_cpu_s_per_gb"] / io["open_cipher_cpu_s_per_gb"],
            seal_code_vs_cipher=io["seal_code_cpu_s_per_gb"] / io["seal_cipher_cpu_s_per_gb"],
            open_code_vs_cipher=io["open_code_cpu_s_per_gb"] / io["open_cipher_cpu_s_per_gb"],
        )
        targets += [
            Target("sealed_save_vs_unsealed", result["sealed_save_vs_unsealed"], ">=", 0.75),
            Target("sealed_load_vs_unsealed", result["sealed_load_vs_unsealed"], ">=", 0.75),
            Target("seal_extra_vs_cipher", result["seal_extra_vs_cipher"], "<=", 1.2),
            Target("open_extra_vs_cipher", result["open_extra_vs_cipher"], "<=", 1.2),
        ]
    record_targets(result, targets)
    return result


# -- presentation ----------------------------------------------------------------------------

def format_table(r: dict) -> str:
    """The result as a readable table (built from the same dict the JSON holds)."""
    w = r["workers"]

    def verdict(name: str) -> tuple[str, str]:
        return target_verdict(r, name)

    rows: list[tuple[str, str, str, str]] = [
        ("save GB/s (ChunkStore.put)", f"{r['save_gbps']:.2f}", "", ""),
        (f"raw write GB/s, {w} threads", f"{r['raw_write_gbps']:.2f}", "", ""),
        ("raw write GB/s, 1 stream", f"{r['raw_write_1stream_gbps']:.2f}", "", ""),
        ("save / raw write", f"{r['save_vs_raw']:.2f}", *verdict("save_vs_raw")),
        ("load GB/s (ChunkStore.get_into)", f"{r['load_gbps']:.2f}", "", ""),
        (f"raw read GB/s, {r['read_threads']} threads", f"{r['raw_read_gbps']:.2f}", "", ""),
        ("raw read GB/s, 1 stream", f"{r['raw_read_1stream_gbps']:.2f}", "", ""),
        ("load / raw read", f"{r['load_vs_raw']:.2f}", *verdict("load_vs_raw")),
        *([(f"raw read GB/s, {r['read_threads']} threads, O_DIRECT", f"{r['raw_read_direct_gbps']:.2f}", "", ""),
           ("load / raw O_DIRECT read", f"{r['load_vs_raw_direct']:.2f}", "", "")]
          if r.get("raw_read_direct_gbps") else []),
        ("CPU s/GB: save / raw write", f"{r['save_cpu_s_per_gb']:.2f} / {r['raw_write_cpu_s_per_gb']:.2f}", "", ""),
        ("CPU s/GB: load / raw read", f"{r['load_cpu_s_per_gb']:.2f} / {r['raw_read_cpu_s_per_gb']:.2f}", "", ""),
        ("compression ratio", f"{r['compression_ratio']:.3f}", "", ""),
        ("entropy bound ratio", f"{r['entropy_bound_ratio']:.3f}", "", ""),
        ("ratio / bound", f"{r['ratio_vs_bound']:.3f}", *verdict("ratio_vs_bound")),
        (f"exists(128) ms, {r['index_rows']:,} rows", f"{r['exists_128_ms']:.3f}", *verdict("exists_128_ms")),
        ("exists(128 absent) ms", f"{r['exists_128_miss_ms']:.3f}", "", ""),
        ("open + first lookup s", f"{r['open_first_lookup_s']:.3f}", "", ""),
        ("RSS growth MiB", f"{r['rss_growth_mb']:.1f}", "", ""),
    ]
    if "sealed_save_gbps" in r:
        rows += [
            ("sealed save GB/s", f"{r['sealed_save_gbps']:.2f}", "", ""),
            ("sealed save / unsealed save", f"{r['sealed_save_vs_unsealed']:.2f}", *verdict("sealed_save_vs_unsealed")),
            ("sealed load GB/s", f"{r['sealed_load_gbps']:.2f}", "", ""),
            ("sealed load / unsealed load", f"{r['sealed_load_vs_unsealed']:.2f}", *verdict("sealed_load_vs_unsealed")),
            ("CPU s/GB: sealed save / sealed load",
             f"{r['sealed_save_cpu_s_per_gb']:.2f} / {r['sealed_load_cpu_s_per_gb']:.2f}", "", ""),
            ("AES-256-GCM GB/s per core: seal / open",
             f"{r['seal_aead_gbps_per_core']:.2f} / {r['open_aead_gbps_per_core']:.2f}", "", ""),
            ("sealed bytes / raw bytes", f"{r['sealed_bytes'] / r['raw_bytes']:.3f}", "", ""),
            ("extra CPU s/GB of sealing: save / load",
             f"{r['seal_extra_cpu_s_per_gb']:.3f} / {r['open_extra_cpu_s_per_gb']:.3f}", "", ""),
            ("the cipher's CPU s/GB on those bytes: seal / open",
             f"{r['seal_cipher_cpu_s_per_gb']:.3f} / {r['open_cipher_cpu_s_per_gb']:.3f}", "", ""),
            ("extra / cipher, save", f"{r['seal_extra_vs_cipher']:.2f}", *verdict("seal_extra_vs_cipher")),
            ("extra / cipher, load", f"{r['open_extra_vs_cipher']:.2f}", *verdict("open_extra_vs_cipher")),
            ("the sealing code's own CPU s/GB in the store: save / load",
             f"{r['seal_code_cpu_s_per_gb']:.3f} / {r['open_code_cpu_s_per_gb']:.3f}", "", ""),
            ("its CPU / the cipher's: save / load",
             f"{r['seal_code_vs_cipher']:.2f} / {r['open_code_vs_cipher']:.2f}", "", ""),
        ]
    shape = "x".join(str(d) for d in r["page_shape"])
    head = (f"chunkstore bench store: {r['num_pages']} pages of {shape} {r['dtype']} "
            f"({r['page_size_bytes'] / MIB:.2f} MiB each, {r['num_pages'] * r['page_size_bytes'] / MIB:.0f} MiB), "
            f"{r['kv_source']} KV on {r['device']}, codec {r['codec']}, {w} write threads, {r['read_threads']} read threads, batches of {r['batch_pages']}, "
            f"cold reads: {r['cold_method']}, load average {r['load_average_1m']:.1f}")
    lines = [head, "", *table_lines(rows, value_width=9, target_width=8)]
    if r["cold_method"] == "none":
        lines.append("warning: could not drop the page cache; load figures may be warm reads")
    lines += ["", verdict_line(r, "figures swing +-25% on a shared disk")]
    if r["store_dir"]:
        lines.append(f"kept: {r['store_dir']} and {r['index_store_dir']}")
    return "\n".join(lines)


# -- CLI -------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``chunkstore bench store``."""
    d = StoreBenchConfig()
    parser.add_argument("--size-mb", type=int, default=d.size_mb,
                        help=f"MiB of KV pages to write and read (default {d.size_mb})")
    parser.add_argument("--keep", metavar="DIR", type=Path, default=None,
                        help="write under DIR (new or empty) and leave the stores there (store/, index/); "
                             "the raw-file baseline is always deleted. Default: a temporary folder")
    add_output_arguments(parser)
    parser.add_argument("--layers", type=int, default=d.num_layers, help=f"model layers (default {d.num_layers})")
    parser.add_argument("--kv-heads", type=int, default=d.num_kv_heads,
                        help=f"KV heads (default {d.num_kv_heads})")
    parser.add_argument("--head-dim", type=int, default=d.head_dim, help=f"head dimension (default {d.head_dim})")
    parser.add_argument("--page-size", type=int, default=d.page_size,
                        help=f"tokens per page (default {d.page_size}, not serve's {SERVE_PAGE_SIZE}: 2 MiB chunks "
                             f"of the Llama-3-8B-like shape, the size the targets were set for)")
    parser.add_argument("--dtype", default=d.dtype, help=f"KV dtype (default {d.dtype})")
    parser.add_argument("--kv-source", default=d.kv_source.value,
                        help=f"where the KV comes from: {', '.join(s.value for s in KVSource)} "
                             f"(default {d.kv_source.value})")
    parser.add_argument("--codec", default=None,
                        help=f"store codec: {', '.join(c.value for c in Codec)} (default: the store's for the dtype)")
    parser.add_argument("--workers", type=int, default=None,
                        help="store compress/write threads, also the raw write threads (default: the store's, 2 per CPU and at least 4); reads use the store's I/O threads on both sides")
    parser.add_argument("--batch-pages", type=int, default=d.batch_pages,
                        help=f"pages per put / get_into call (default {d.batch_pages})")
    parser.add_argument("--index-rows", type=int, default=d.index_rows,
                        help=f"rows in the index that exists() is timed on (default {d.index_rows:,})")
    parser.add_argument("--seed", type=int, default=d.seed, help=f"seed of the synthetic KV (default {d.seed})")
    parser.add_argument("--seal-key", metavar="PATH", type=Path, default=None,
                        help="a key file (chunkstore keys new): also time a sealed store beside the unsealed one, "
                             "and AES-256-GCM alone on the same bytes")
    parser.add_argument("--device", default=d.device,
                        help="where the store's pages are put from and loaded into: cpu, or cuda for device "
                             "memory (the plain-file baselines stay in host memory) (default cpu)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")


def config_from_args(args: argparse.Namespace) -> StoreBenchConfig:
    """Raises ValueError for an invalid option."""
    return StoreBenchConfig(
        size_mb=args.size_mb, num_layers=args.layers, num_kv_heads=args.kv_heads, head_dim=args.head_dim,
        page_size=args.page_size, dtype=args.dtype, kv_source=args.kv_source, num_workers=args.workers,
        batch_pages=args.batch_pages, index_rows=args.index_rows, seed=args.seed, codec=args.codec,
        keep_dir=args.keep, show_progress=not args.no_progress, seal_key=args.seal_key, device=args.device,
    )


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print the table (or the JSON), write --output. Exit code: 0 done, 1 the store failed (or
    a target was missed under --strict), 2 invalid options."""
    return run_bench(args, "chunkstore bench store", lambda: config_from_args(args), run_store_bench, format_table,
                     failures=(RuntimeError,), failed="the store failed")
