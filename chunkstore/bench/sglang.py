"""``chunkstore bench sglang``: chunkstore as SGLang's HiCache L3 backend against SGLang's own
``HiCacheFile``, both driven by SGLang's real ``HiCacheController`` on CPU
(chunkstore/testing/sglang_harness.py): set and get throughput, and bytes on disk.

Invariants: both backends see the same KV pages (KV-like synthetic, chunkstore/bench/kvdata.py),
the same token chains, host layout, controller and requests; throughputs count logical
(uncompressed) bytes in decimal GB/s; a set is timed until its pages are on disk for both
(write_through of every request, then chunkstore's ``flush``, then ``os.sync``: HiCacheFile
writes without fsync, so its acked pages are only in the page cache); every get prefetches into
host slots filled with a poison pattern first, and is compared byte for byte after its timer stops
(a miss or a differing byte fails the run); cold gets start from a dropped page cache; the order
of the backends alternates phase by phase; each phase of a backend runs on a new controller (one
process group at a time), as after a restart. Targets are reported, never asserted. SGLang is
imported only when the benchmark runs, so ``--help`` works without it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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
from chunkstore.output import add_output_arguments

PROG = "chunkstore bench sglang"
LAYOUTS = ("layer_first", "page_first", "page_first_direct")  # sglang_harness.LAYOUTS
CONTROLLER_KINDS = ("base", "hybrid")  # sglang_harness.CONTROLLER_KINDS
CODECS = ("none", "zstd", "zstd_split")  # chunkstore.disk.codec.Codec
PRIORITIES = ("normal", "low", "idle")  # chunkstore.priority.ThreadPriority
BACKENDS = ("chunkstore", "hicache_file")
# SGLang's other built-in HiCache storage backends that a host may run (its storage_backend names):
# each is tried with SGLang's own factory; one that starts runs the same phases, one that does not
# is a row with its reason. The rest (eic, simm, mori, npu_memcache, seaweedfs, tensorcast) need
# services or hardware that nothing here starts; shm and sim store no KV.
OTHER_SYSTEMS = ("mooncake", "nixl", "aibrix", "hf3fs")
SYSTEMS = ("chunkstore", "file", *OTHER_SYSTEMS)  # --systems names ("file": HiCacheFile)
LABELS = {"chunkstore": "chunkstore", "hicache_file": "HiCacheFile", "mooncake": "Mooncake store",
          "nixl": "NIXL", "aibrix": "AIBrix KVCache", "hf3fs": "3FS"}
FILE_DIR_ENV = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"  # where HiCacheFile keeps its pages
POISON = 0xA5  # host slots hold this before a get, so a get that loads nothing cannot pass
ENV_HINT = ("run it with the interpreter of the environment that scripts/sglang_env.sh builds, "
            "e.g. .venv-sglang/bin/chunkstore bench sglang")


class BenchFailure(RuntimeError):
    """A backend lost, missed or corrupted a page (the run's figures would mean nothing)."""


@dataclass(slots=True)
class SGLangBenchConfig:
    """What to run; validated at construction (ValueError names the bad field and why)."""

    num_layers: int = 32
    num_heads: int = 8  # KV heads on this rank
    head_dim: int = 128
    page_size: int = 64  # tokens per page: SGLang's usual HiCache page with an L3 backend
    num_pages: int = 128  # 1 GiB of bf16 KV at the default shape (8 MiB pages)
    request_pages: int = 32  # pages per write_through / prefetch: one request's 2k-token prefix
    layout: str = "layer_first"
    controller_kind: str = "hybrid"  # what a 0.5.23 server builds for an MHA model
    codec: str | None = None  # chunkstore's; None: the store's default for the dtype
    background_priority: str | None = None  # chunkstore's writer; None: the backend's default (low)
    seed: int = 0
    work_dir: Path | None = None  # parent of the temporary folder
    timeout_s: float = 600.0  # longest wait for one request's write or prefetch, or the flush
    show_progress: bool = True
    systems: tuple[str, ...] = SYSTEMS  # chunkstore and file always; the others are tried

    @property
    def other_systems(self) -> list[str]:
        return [name for name in self.systems if name in OTHER_SYSTEMS]

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_heads", "head_dim", "page_size", "num_pages", "request_pages"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}; valid layouts: {', '.join(LAYOUTS)}")
        if self.controller_kind not in CONTROLLER_KINDS:
            raise ValueError(f"unknown controller {self.controller_kind!r}; valid: {', '.join(CONTROLLER_KINDS)}")
        if self.codec is not None and self.codec not in CODECS:
            raise ValueError(f"unknown codec {self.codec!r}; valid codecs: {', '.join(CODECS)}")
        if self.background_priority is not None and self.background_priority not in PRIORITIES:
            raise ValueError(f"unknown priority {self.background_priority!r}; valid: {', '.join(PRIORITIES)}")
        self.systems = tuple(self.systems)
        for name in self.systems:
            if name not in SYSTEMS:
                raise ValueError(f"unknown system {name!r}; valid: {', '.join(SYSTEMS)}")
        if len(set(self.systems)) != len(self.systems):
            raise ValueError(f"--systems names a system twice: {','.join(self.systems)}")
        if not {"chunkstore", "file"} <= set(self.systems):
            raise ValueError("--systems must include chunkstore and file: the figures are chunkstore's against "
                             "HiCacheFile's")
        if self.work_dir is not None:
            self.work_dir = Path(self.work_dir)
            if not self.work_dir.is_dir():
                raise ValueError(f"--work-dir {self.work_dir} is not an existing folder")

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.num_layers * self.page_size * self.num_heads * self.head_dim * 2  # K and V, bf16

    @property
    def logical_bytes(self) -> int:
        return self.num_pages * self.page_size_bytes

    @property
    def requests(self) -> list[range]:
        """The page ranges of the requests, in order (the last may be shorter)."""
        step = self.request_pages
        return [range(i, min(i + step, self.num_pages)) for i in range(0, self.num_pages, step)]


@dataclass(slots=True)
class _Timed:
    """Wall and process CPU seconds (all threads) of one timed step."""

    wall_s: float
    cpu_s: float


def _timed(fn: Callable[[], object]) -> _Timed:
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return _Timed(time.perf_counter() - t0, time.process_time() - c0)


def _progress(cfg: SGLangBenchConfig, total: int, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, unit="page", file=sys.stderr, leave=False, dynamic_ncols=True,
                disable=not cfg.show_progress or not sys.stderr.isatty())  # bars on a terminal only


def disk_usage(root: Path) -> tuple[int, int, int]:
    """(allocated bytes as du counts them, apparent bytes, files) of everything under ``root``."""
    allocated = apparent = count = 0
    for path in files_under(root):
        st = path.stat()
        allocated += st.st_blocks * 512
        apparent += st.st_size
        count += 1
    return allocated, apparent, count


def _read_all(paths: list[Path]) -> None:
    """Read every file once (buffered), so that the page cache holds it."""
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(8 * MIB):
                pass


class _Run:
    """One benchmark run: the pages, the requests' tokens, and one backend's controller at a time."""

    def __init__(self, cfg: SGLangBenchConfig, work: Path):
        import torch

        from chunkstore.bench.kvdata import KVSource, make_pages
        from chunkstore.disk.identity import ModelIdentity
        from chunkstore.testing import sglang_harness as H

        self.cfg, self.work, self.H, self.torch = cfg, work, H, torch
        self.dirs = {"chunkstore": work / "chunkstore", "hicache_file": work / "hicache-file",
                     **{name: work / name for name in OTHER_SYSTEMS}}
        identity = ModelIdentity(model_id="chunkstore-bench-sglang", kv_dtype="bfloat16", num_layers=cfg.num_layers,
                                 num_kv_heads=cfg.num_heads, head_dim=cfg.head_dim, page_size=cfg.page_size)
        with _progress(cfg, cfg.num_pages, "generate KV") as bar:
            # (pages, layer, K/V, token, head, dim): the store's layout; the harness's page is K/V-first.
            store_pages = make_pages(KVSource.SYNTHETIC, identity, cfg.num_pages, cfg.seed, on_page=bar.update)
        self.pages = store_pages.transpose(1, 2)  # (pages, K/V, layer, token, head, dim), a view
        self.background_priority = cfg.background_priority  # the backend's default once its set ran
        self.tokens = [H.make_tokens(len(r), cfg.page_size, seed=cfg.seed * 100_003 + 1 + k)
                       for k, r in enumerate(cfg.requests)]

    def harness(self, backend: str):
        cfg, H = self.cfg, self.H
        common = {"layout": cfg.layout, "num_layers": cfg.num_layers, "num_heads": cfg.num_heads,
                  "head_dim": cfg.head_dim, "page_size": cfg.page_size, "host_tokens": cfg.num_pages * cfg.page_size,
                  "dtype": self.torch.bfloat16, "device_tokens": cfg.page_size,  # the device pool is unused by L3
                  "controller_kind": cfg.controller_kind, "model_name": "chunkstore-bench-sglang"}
        if backend == "chunkstore":
            extra = {"backend_name": "chunkstore", "module_path": "chunkstore.integrations.sglang",
                     "class_name": "ChunkstoreHiCache", "interface_v1": 1, "disk_path": str(self.dirs[backend])}
            if cfg.codec is not None:
                extra["compression"] = cfg.codec
            if cfg.background_priority is not None:
                extra["background_priority"] = cfg.background_priority
            return H.make_controller(self.work, backend_extra_config=extra, storage_backend="dynamic", **common)
        if backend in OTHER_SYSTEMS:  # configured the way SGLang configures it (its environment variables)
            return H.make_controller(self.work, backend_extra_config={}, storage_backend=backend, **common)
        before = os.environ.get(FILE_DIR_ENV)
        os.environ[FILE_DIR_ENV] = str(self.dirs[backend])  # read when HiCacheFile is constructed
        try:
            return H.make_controller(self.work, backend_extra_config={}, storage_backend="file", **common)
        finally:
            if before is None:
                os.environ.pop(FILE_DIR_ENV, None)
            else:
                os.environ[FILE_DIR_ENV] = before

    def start_failure(self, backend: str) -> tuple[str, str] | None:
        """None when SGLang starts ``backend`` on this host (its controller is built and closed),
        else (status, reason): "missing" when its package is not installed, "failed" otherwise."""
        try:
            self.harness(backend).close()
        except ImportError as exc:
            return "missing", _first_line(exc)
        except Exception as exc:  # noqa: BLE001 (whatever a third party's start raises is the row's reason)
            return "failed", _first_line(exc)
        return None

    # -- set ----------------------------------------------------------------------------------

    def set_phase(self, backend: str) -> dict:
        """Fill the host pool (untimed), then time write_through of every request until the
        controller acks it, the backend has published it and the disk holds it."""
        cfg, H = self.cfg, self.H
        h = self.harness(backend)
        try:
            slots = []
            for r in cfg.requests:
                idx = h.host_pool.alloc(len(r) * cfg.page_size)
                if idx is None:
                    raise BenchFailure("the host pool is full")
                H.write_host_pages(h, idx, list(self.pages[r.start:r.stop]))
                slots.append(idx)
            marks: dict[str, float] = {}

            def write_all() -> None:
                t0 = time.perf_counter()
                with _progress(cfg, cfg.num_pages, f"set {LABELS[backend]}") as bar:
                    for r, tokens, idx in zip(cfg.requests, self.tokens, slots):
                        done = H.write_through(h, tokens, idx, timeout=cfg.timeout_s)
                        if done != len(tokens):
                            raise BenchFailure(f"{LABELS[backend]} wrote {done} of {len(tokens)} tokens of a request")
                        bar.update(len(r))
                marks["ack"] = time.perf_counter() - t0
                flush = getattr(h.storage_backend, "flush", None)
                if flush is not None and not flush(timeout_s=cfg.timeout_s):
                    raise BenchFailure(f"{LABELS[backend]} did not publish its writes within {cfg.timeout_s:g}s")
                marks["published"] = time.perf_counter() - t0
                os.sync()  # HiCacheFile never fsyncs; chunkstore's pages are fsynced already

            timed = _timed(write_all)
            settings = getattr(h.storage_backend, "settings", None)  # chunkstore's, as the backend read them
            if settings is not None:
                self.background_priority = settings.background_priority.value
        finally:
            h.close()
        return {"set_s": timed.wall_s, "set_cpu_s": timed.cpu_s, "set_ack_s": marks["ack"],
                "set_published_s": marks["published"]}

    # -- get ----------------------------------------------------------------------------------

    def get_phase(self, backend: str, cold: bool) -> dict:
        """Time a prefetch of every request into poisoned host slots, then (untimed) compare what
        landed there with the pages written."""
        cfg, H, torch = self.cfg, self.H, self.torch
        h = self.harness(backend)
        kind = "cold" if cold else "warm"
        try:
            h.host_pool.kv_buffer.view(torch.uint8).fill_(POISON)  # also faults the pool in, untimed
            files = files_under(self.dirs[backend])
            if cold:
                method = make_cold(files)
            else:
                _read_all(files)  # what chunkstore reads with O_DIRECT is read from the disk all the same
                method = "page cache"
            got: list = []

            def read_all() -> None:
                with _progress(cfg, cfg.num_pages, f"get {kind} {LABELS[backend]}") as bar:
                    for r, tokens in zip(cfg.requests, self.tokens):
                        fetched, idx = H.prefetch(h, tokens, timeout=cfg.timeout_s)
                        if fetched != len(tokens):
                            raise BenchFailure(f"{LABELS[backend]} fetched {fetched} of the {len(tokens)} tokens "
                                               f"of a request it stored ({kind} get)")
                        got.append(idx)
                        bar.update(len(r))

            timed = _timed(read_all)
            for r, idx in zip(cfg.requests, got):
                for i, page in zip(r, H.read_host_pages(h, idx)):
                    if not H.pages_equal(page, self.pages[i]):
                        raise BenchFailure(f"{LABELS[backend]} read back page {i} with bytes that differ from "
                                           f"the page written ({kind} get)")
        finally:
            h.close()
        return {f"get_{kind}_s": timed.wall_s, f"get_{kind}_cpu_s": timed.cpu_s, f"{kind}_method": method}


def _key(system: str) -> str:
    """A --systems name's key in the result ("file" is HiCacheFile's)."""
    return "hicache_file" if system == "file" else system


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _rates(cfg: SGLangBenchConfig, raw: dict, allocated: int, apparent: int, files: int) -> dict:
    n, logical = cfg.num_pages, cfg.logical_bytes
    out = {
        "set_pages_per_s": n / raw["set_s"],
        "set_gbps": logical / raw["set_s"] / GB,
        "set_published_gbps": logical / raw["set_published_s"] / GB,
        "set_ack_gbps": logical / raw["set_ack_s"] / GB,
    }
    for kind in ("cold", "warm"):
        out[f"get_{kind}_pages_per_s"] = n / raw[f"get_{kind}_s"]
        out[f"get_{kind}_gbps"] = logical / raw[f"get_{kind}_s"] / GB
    for step in ("set", "get_cold", "get_warm"):
        out[f"{step}_cpu_s_per_gb"] = raw[f"{step}_cpu_s"] / (logical / GB)
    out.update({
        "disk_bytes": allocated, "apparent_bytes": apparent, "files": files,
        "compression_ratio": logical / allocated if allocated else float("inf"),
        "seconds": {k: round(v, 4) for k, v in raw.items() if k.endswith("_s")},
    })
    return out


def run_sglang_bench(cfg: SGLangBenchConfig) -> dict:
    """Run the whole benchmark; returns the result dict that the table and the JSON show.

    Everything is written under a temporary folder (in ``cfg.work_dir`` when given), deleted after.
    Raises BenchFailure when a backend loses, misses or corrupts a page, and ImportError when
    SGLang cannot be imported."""
    import sglang  # noqa: F401  (ImportError before any work)

    from chunkstore.disk.codec import Codec

    work = Path(tempfile.mkdtemp(prefix="chunkstore-bench-sglang-", dir=cfg.work_dir))
    load_average = os.getloadavg()[0]  # other work on a shared machine skews every figure
    t_start = time.perf_counter()
    raw: dict[str, dict] = {b: {} for b in BACKENDS}
    usage: dict[str, tuple[int, int, int]] = {}
    methods: set[str] = set()
    status: dict[str, tuple[str, str | None]] = {b: ("ran", None) for b in BACKENDS}
    try:
        run = _Run(cfg, work)
        order = list(BACKENDS)
        for name in cfg.other_systems:  # tried first: one that SGLang starts here joins the phases
            failure = run.start_failure(name)
            status[name] = ("ran", None) if failure is None else failure
            if failure is None:
                order.append(name)
                raw[name] = {}

        def step(b: str, phase: Callable[[], dict]) -> dict | None:
            """``phase``'s figures; a third system that loses or garbles a page, or raises, is a
            failed row, chunkstore or HiCacheFile doing so fails the run."""
            if status[b][0] != "ran":
                return None
            try:
                return phase()
            except Exception as exc:  # noqa: BLE001 (a third party's error is its row's reason)
                if b in BACKENDS:
                    raise
                status[b] = ("failed", str(exc) if isinstance(exc, BenchFailure) else _first_line(exc))
                return None

        for b in order:  # phase 1: chunkstore first
            if (got := step(b, lambda: run.set_phase(b))) is not None:
                raw[b].update(got)
                usage[b] = disk_usage(run.dirs[b])
        for b in reversed(order):  # phase 2: the others first, then HiCacheFile, chunkstore last
            if (got := step(b, lambda: run.get_phase(b, cold=True))) is not None:
                methods.add(got.pop("cold_method"))
                raw[b].update(got)
        for b in order:  # phase 3: chunkstore first
            if (got := step(b, lambda: run.get_phase(b, cold=False))) is not None:
                got.pop("warm_method")
                raw[b].update(got)
        priority = run.background_priority
        del run
    finally:
        shutil.rmtree(work, ignore_errors=True)

    backends = {b: _rates(cfg, raw[b], *usage[b]) for b in order if status[b][0] == "ran"}
    systems = [{"name": name, "label": LABELS[_key(name)], "status": status[_key(name)][0],
                "reason": status[_key(name)][1]} for name in cfg.systems]
    cs, fb = backends["chunkstore"], backends["hicache_file"]
    result = {
        "num_pages": cfg.num_pages,
        "page_shape": [2, cfg.num_layers, cfg.page_size, cfg.num_heads, cfg.head_dim],
        "page_size_bytes": cfg.page_size_bytes,
        "logical_bytes": cfg.logical_bytes,
        "num_layers": cfg.num_layers,
        "num_heads": cfg.num_heads,
        "head_dim": cfg.head_dim,
        "page_size": cfg.page_size,
        "dtype": "bfloat16",
        "request_pages": cfg.request_pages,
        "num_requests": len(cfg.requests),
        "layout": cfg.layout,
        "controller_kind": cfg.controller_kind,
        "codec": cfg.codec or Codec.default_for(2).value,
        "background_priority": priority,
        "kv_source": "synthetic",
        "seed": cfg.seed,
        "cold_method": "none" if "none" in methods else "/".join(sorted(methods)),
        "load_average_1m": load_average,
        "order": {"set": list(order), "get_cold": list(reversed(order)), "get_warm": list(order)},
        "backends": backends,
        "systems": systems,
        "set_vs_file": cs["set_gbps"] / fb["set_gbps"],
        "set_published_vs_file": cs["set_published_gbps"] / fb["set_published_gbps"],
        "get_cold_vs_file": cs["get_cold_gbps"] / fb["get_cold_gbps"],
        "get_warm_vs_file": cs["get_warm_gbps"] / fb["get_warm_gbps"],
        "disk_bytes_vs_file": cs["disk_bytes"] / fb["disk_bytes"] if fb["disk_bytes"] else float("inf"),
        "total_s": round(time.perf_counter() - t_start, 3),
    }
    record_targets(result, [
        Target("get_cold_vs_file", result["get_cold_vs_file"], ">=", 1.0),
        Target("get_warm_vs_file", result["get_warm_vs_file"], ">=", 1.0),
        Target("disk_bytes_vs_file", result["disk_bytes_vs_file"], "<=", 0.75),
        Target("set_vs_file", result["set_vs_file"], ">=", 0.9),
    ])
    return result


# -- presentation ----------------------------------------------------------------------------

def format_table(r: dict) -> str:
    """The result as a readable table (built from the same dict the JSON holds)."""
    cs, fb = r["backends"]["chunkstore"], r["backends"]["hicache_file"]

    def pair(key: str, fmt: str = ".2f", scale: float = 1.0) -> str:
        return f"{cs[key] / scale:{fmt}} / {fb[key] / scale:{fmt}}"

    def ratio(name: str) -> tuple[str, str, str, str]:
        return ("  chunkstore / HiCacheFile", f"{r[name]:.2f}", *target_verdict(r, name))

    rows: list[tuple[str, str, str, str]] = [
        ("set GB/s, until on disk", pair("set_gbps"), "", ""),
        ("set pages/s, until on disk", pair("set_pages_per_s", ".1f"), "", ""),
        ratio("set_vs_file"),
        ("set GB/s, until published (no sync)", pair("set_published_gbps"), "", ""),
        ("set GB/s, until the controller's ack", pair("set_ack_gbps"), "", ""),
        ("get GB/s, cold", pair("get_cold_gbps"), "", ""),
        ("get pages/s, cold", pair("get_cold_pages_per_s", ".1f"), "", ""),
        ratio("get_cold_vs_file"),
        ("get GB/s, warm", pair("get_warm_gbps"), "", ""),
        ("get pages/s, warm", pair("get_warm_pages_per_s", ".1f"), "", ""),
        ratio("get_warm_vs_file"),
        ("MiB on disk", pair("disk_bytes", ".1f", MIB), "", ""),
        ratio("disk_bytes_vs_file"),
        ("logical / on-disk bytes", pair("compression_ratio", ".3f"), "", ""),
        ("files", f"{cs['files']} / {fb['files']}", "", ""),
        ("CPU s/GB: set", pair("set_cpu_s_per_gb"), "", ""),
        ("CPU s/GB: get cold", pair("get_cold_cpu_s_per_gb"), "", ""),
        ("CPU s/GB: get warm", pair("get_warm_cpu_s_per_gb"), "", ""),
    ]
    shape = "x".join(str(d) for d in r["page_shape"])
    head = (f"{PROG}: {r['num_pages']} pages of {shape} {r['dtype']} ({r['page_size_bytes'] / MIB:.2f} MiB each, "
            f"{r['logical_bytes'] / MIB:.0f} MiB) in {r['num_requests']} requests of {r['request_pages']} pages, "
            f"{r['layout']} host layout, {r['controller_kind']} controller, chunkstore codec {r['codec']} "
            f"(writer priority {r['background_priority']}), "
            f"{r['kv_source']} KV, cold reads: {r['cold_method']}, load average {r['load_average_1m']:.1f}")
    lines = [head, "", "figures: chunkstore / HiCacheFile", "",
             *table_lines(rows, value_width=15, target_width=7)]
    others = [s for s in r.get("systems", []) if s["name"] not in ("chunkstore", "file")]
    if others:
        lines += ["", "SGLang's other storage backends on this host:"]
        for s in others:
            if s["status"] == "ran":
                b = r["backends"][s["name"]]
                lines.append(f"  {s['name']} ({s['label']}): set {b['set_gbps']:.2f} GB/s, get cold "
                             f"{b['get_cold_gbps']:.2f} / warm {b['get_warm_gbps']:.2f} GB/s, "
                             f"{b['disk_bytes'] / MIB:.1f} MiB on disk")
            else:
                lines.append(f"  {s['name']} ({s['label']}): {s['status']}: {s['reason']}")
    if r["cold_method"] == "none":
        lines.append("warning: could not drop the page cache; cold figures may be warm reads")
    lines += ["", verdict_line(r, "figures swing +-25% on a shared disk"), f"total {r['total_s']:.0f} s"]
    return "\n".join(lines)


# -- CLI -------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``chunkstore bench sglang``."""
    d = SGLangBenchConfig()
    add_output_arguments(parser)
    parser.add_argument("--num-layers", type=int, default=d.num_layers, help=f"model layers (default {d.num_layers})")
    parser.add_argument("--num-heads", type=int, default=d.num_heads, help=f"KV heads (default {d.num_heads})")
    parser.add_argument("--head-dim", type=int, default=d.head_dim, help=f"head dimension (default {d.head_dim})")
    parser.add_argument("--page-size", type=int, default=d.page_size, help=f"tokens per page (default {d.page_size})")
    parser.add_argument("--num-pages", type=int, default=d.num_pages,
                        help=f"pages written and read by each backend (default {d.num_pages})")
    parser.add_argument("--request-pages", type=int, default=d.request_pages,
                        help=f"pages per request: one write_through or prefetch (default {d.request_pages})")
    parser.add_argument("--layout", choices=LAYOUTS, default=d.layout,
                        help=f"SGLang's host pool layout (default {d.layout})")
    parser.add_argument("--controller", choices=CONTROLLER_KINDS, default=d.controller_kind,
                        help="base: HiCacheController; hybrid: HybridCacheController, what a server builds "
                             f"for an MHA model (default {d.controller_kind})")
    parser.add_argument("--codec", choices=CODECS, default=None,
                        help="chunkstore's compression (default: the store's for the dtype)")
    parser.add_argument("--background-priority", choices=PRIORITIES, default=None,
                        help="chunkstore's writer thread priority (default: the backend's, low: nice 19; idle, "
                             "SCHED_IDLE, is starved by any other work on the machine)")
    parser.add_argument("--seed", type=int, default=d.seed,
                        help=f"seed of the synthetic KV and tokens (default {d.seed})")
    parser.add_argument("--work-dir", metavar="DIR", type=Path, default=None,
                        help="make the temporary folder in DIR, on the disk to measure (default: the system's)")
    parser.add_argument("--timeout-s", type=float, default=d.timeout_s,
                        help=f"longest wait for one request's write or prefetch (default {d.timeout_s:g})")
    parser.add_argument("--systems", default=",".join(d.systems), metavar="NAMES",
                        help="comma-separated: chunkstore and file (HiCacheFile), always, and any of "
                             f"SGLang's {', '.join(OTHER_SYSTEMS)}, each tried with SGLang's own factory and "
                             "configured as SGLang configures it (its environment variables): one that starts "
                             "runs the same phases, one that does not is a row with its reason "
                             f"(default {','.join(d.systems)})")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")


def config_from_args(args: argparse.Namespace) -> SGLangBenchConfig:
    """Raises ValueError for an invalid option."""
    return SGLangBenchConfig(
        num_layers=args.num_layers, num_heads=args.num_heads, head_dim=args.head_dim, page_size=args.page_size,
        num_pages=args.num_pages, request_pages=args.request_pages, layout=args.layout,
        controller_kind=args.controller, codec=args.codec, background_priority=args.background_priority,
        seed=args.seed, work_dir=args.work_dir, timeout_s=args.timeout_s, show_progress=not args.no_progress,
        systems=tuple(name.strip() for name in args.systems.split(",") if name.strip()),
    )


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print the table (or the JSON), write --output. Exit code: 0 done, 1 a backend
    failed (or a target was missed under --strict), 2 invalid options or no SGLang."""
    def configure() -> SGLangBenchConfig:
        cfg = config_from_args(args)
        try:
            import sglang.srt.mem_cache.hicache_storage  # noqa: F401
        except ImportError as exc:
            raise ValueError(f"SGLang is not importable in {sys.executable} ({exc}); {ENV_HINT}") from None
        return cfg

    return run_bench(args, PROG, configure, run_sglang_bench, format_table, failures=(BenchFailure,),
                     failed="a backend failed")
