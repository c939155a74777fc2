"""The `chunkstore` command line: store inspection and care, schema upgrades, benchmarks, the server.

Every store command takes --disk-path (default ./chunkstore-data, or $CHUNKSTORE_DISK_PATH) and
--json for machine-readable output; long work shows a progress bar on stderr. Exit codes: 0 ok,
1 the command found problems (verify), 2 bad input or a store that cannot be opened.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_DATA_DIR = "chunkstore-data"
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


class CliError(Exception):
    """A user-facing error: printed without a traceback, exit code 2."""


def parse_size_bytes(text: str) -> int:
    """'1048576', '500MB', '1.5G', '64KiB' -> bytes (K/M/G/T decimal, Ki/Mi/Gi/Ti binary)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 1048576, 500MB, 2GiB)")
    unit = (m.group(2) or "").lower().rstrip("b")
    value = float(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return int(value)


def _positive_gb(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of GB: {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"--disk-size must be positive, got {text}")
    return v


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, bytes):
        return obj.hex()
    return obj


def _emit(args: argparse.Namespace, obj: Any, lines: Callable[[Any], list[str]]) -> None:
    if args.json:
        print(json.dumps(_jsonable(obj), indent=2, sort_keys=True))
    else:
        print("\n".join(lines(obj)))


def _progress(total: int | None, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="chunk", file=sys.stderr, disable=None, leave=False)


def _open_store(args: argparse.Namespace, *, write: bool, reset_index: bool = False):
    from sqlalchemy.exc import DatabaseError

    from chunkstore.files import Durability
    from chunkstore.identity import ModelMismatchError
    from chunkstore.index import IndexMissingError
    from chunkstore.store import ChunkStore, StoreBusyError, read_identity

    root = Path(args.disk_path)
    try:
        identity = read_identity(root)
    except (ValueError, KeyError) as exc:
        raise CliError(f"{root / 'store.json'} is unreadable: {exc}") from None
    if identity is None:
        raise CliError(f"no chunk store at {root} (no store.json); check --disk-path")
    capacity = int(args.disk_size * 1e9) if getattr(args, "disk_size", None) else None
    try:
        return ChunkStore(root, identity, capacity_bytes=capacity, read_only=not write,
                          durability=Durability.FSYNC, reset_index=reset_index)
    except (StoreBusyError, ModelMismatchError, IndexMissingError, FileNotFoundError, PermissionError) as exc:
        raise CliError(str(exc)) from None
    except DatabaseError as exc:
        raise CliError(f"the index of {root} is unreadable ({exc.orig}); "
                       f"run `chunkstore rebuild --disk-path {root}`") from None
    except RuntimeError as exc:
        raise CliError(str(exc)) from None


# -- commands --------------------------------------------------------------------------------

def cmd_stats(args: argparse.Namespace) -> int:
    with _open_store(args, write=False) as store:
        stats = store.stats()

    def lines(s) -> list[str]:
        out = [
            f"chunks             {s.num_chunks}",
            f"raw bytes          {s.raw_bytes}",
            f"stored bytes       {s.stored_bytes}",
            f"compression ratio  {s.compression_ratio:.3f}",
            f"hits / misses      {s.hits} / {s.misses}",
            f"dedup hits         {s.dedup_hits}",
            f"evictions          {s.evictions}",
            f"quarantined        {s.quarantined}",
            f"write errors       {s.write_errors}",
        ]
        for n in s.namespaces:
            quota = n.quota_bytes if n.quota_bytes is not None else "-"
            out.append(f"  namespace {n.namespace!r}: {n.num_chunks} chunks, {n.stored_bytes} stored bytes, "
                       f"quota {quota}, hits {n.hits}, misses {n.misses}")
        return out

    _emit(args, stats, lines)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from chunkstore.maintenance import verify

    with _open_store(args, write=args.repair) as store:
        with _progress(store.index.count(), "verify") as bar:
            report = verify(store, repair=args.repair, progress=bar.update)
    _emit(args, report, lambda r: [f"{f.name:14} {getattr(r, f.name)}" for f in dataclasses.fields(r)])
    # Orphan and temp files are damage too (what a crash leaves); --repair fixes what it finds.
    return 0 if args.repair or report.damage == 0 else 1


def cmd_rebuild(args: argparse.Namespace) -> int:
    from chunkstore.maintenance import rebuild

    with _open_store(args, write=True, reset_index=True) as store:
        with _progress(None, "rebuild") as bar:
            report = rebuild(store, progress=bar.update)
    _emit(args, report, lambda r: [f"{f.name:12} {getattr(r, f.name)}" for f in dataclasses.fields(r)])
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from chunkstore.maintenance import gc

    with _open_store(args, write=True) as store:
        report = gc(store, purge_quarantine=args.purge_quarantine)
    _emit(args, report, lambda r: [f"{f.name:18} {getattr(r, f.name)}" for f in dataclasses.fields(r)])
    return 0


def cmd_evict(args: argparse.Namespace) -> int:
    with _open_store(args, write=True) as store:
        if args.namespace is not None and args.bytes is None:
            result = store.delete_namespace(args.namespace)
        else:
            result = store.evict(args.bytes, namespace=args.namespace)
    summary = {"evicted_chunks": result.num_chunks, "evicted_bytes": result.stored_bytes}
    _emit(args, summary, lambda s: [f"evicted {s['evicted_chunks']} chunks, {s['evicted_bytes']} bytes"])
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from sqlalchemy import create_engine

    from chunkstore import migrations
    from chunkstore.index import DB_FILENAME, prepare_db_files

    root = Path(args.disk_path)
    if not root.is_dir():
        raise CliError(f"no chunk store at {root}")
    prepare_db_files(root)  # SQLite would create the index (and its WAL) 0644
    engine = create_engine(f"sqlite:///{root / DB_FILENAME}")
    try:
        with engine.begin() as conn:
            before, head = migrations.upgrade(conn)
    finally:
        engine.dispose()
    summary = {"from_revision": before, "to_revision": head}
    _emit(args, summary, lambda s: [f"index at revision {s['to_revision']} (was {s['from_revision']})"])
    return 0


def cmd_bench_store(args: argparse.Namespace) -> int:
    from chunkstore.bench import store as bench_store

    return bench_store.run(args)


def cmd_bench_tiers(args: argparse.Namespace) -> int:
    from chunkstore.bench import tiers as bench_tiers

    return bench_tiers.run(args)


def cmd_bench_multiturn(args: argparse.Namespace) -> int:
    from chunkstore.bench import multiturn as bench_multiturn

    return bench_multiturn.run(args)


def cmd_serve(args: argparse.Namespace) -> int:
    from chunkstore.server import main as serve

    return serve.run(args)


def cmd_admin(args: argparse.Namespace) -> int:
    from api import cli as admin_cli

    return admin_cli.run(args)


def cmd_soak_crash(args: argparse.Namespace) -> int:
    from chunkstore import soak

    return soak.run(args)


# -- parser ----------------------------------------------------------------------------------

def _store_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--disk-path", default=os.environ.get("CHUNKSTORE_DISK_PATH", DEFAULT_DATA_DIR),
                   help="folder of the chunk store (default ./chunkstore-data, or $CHUNKSTORE_DISK_PATH)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chunkstore", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _store_parent()

    p = sub.add_parser("stats", parents=[common], help="chunks, bytes, compression, hits per namespace")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("verify", parents=[common], help="read and check every chunk")
    p.add_argument("--repair", action="store_true",
                   help="quarantine corrupt files, drop rows of missing files, adopt valid files without a row")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("rebuild", parents=[common], help="recreate the index from the chunk files alone")
    p.set_defaults(func=cmd_rebuild)

    p = sub.add_parser("gc", parents=[common], help="remove temp files, evict to --disk-size, checkpoint")
    p.add_argument("--disk-size", type=_positive_gb, help="capacity in GB to evict down to")
    p.add_argument("--purge-quarantine", action="store_true", help="also delete quarantined files")
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("evict", parents=[common], help="evict by bytes (LRU, leaf-first) or a whole namespace")
    p.add_argument("--bytes", type=parse_size_bytes, help="stored bytes to free, e.g. 500MB, 2GiB")
    p.add_argument("--namespace", help="with --bytes: evict only from it; alone: delete all of it")
    p.set_defaults(func=cmd_evict)

    db = sub.add_parser("db", help="index schema commands")
    dbsub = db.add_subparsers(dest="db_command", required=True, metavar="DB_COMMAND")
    p = dbsub.add_parser("upgrade", parents=[common], help="apply the alembic migrations to the index")
    p.set_defaults(func=cmd_db_upgrade)

    bench = sub.add_parser("bench", help="benchmarks")
    bsub = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
    p = bsub.add_parser("store", help="store throughput against raw disk I/O, compression, lookups")
    from chunkstore.bench import store as bench_store

    bench_store.add_arguments(p)
    p.set_defaults(func=cmd_bench_store)
    p = bsub.add_parser("tiers", help="match+insert cost, host->device and disk->device against baselines")
    from chunkstore.bench import tiers as bench_tiers

    bench_tiers.add_arguments(p)
    p.set_defaults(func=cmd_bench_tiers)
    p = bsub.add_parser("multiturn", help="multi-turn chat: hit rate, TTFT, throughput per cache configuration")
    from chunkstore.bench import multiturn as bench_multiturn

    bench_multiturn.add_arguments(p)
    p.set_defaults(func=cmd_bench_multiturn)

    p = sub.add_parser("serve", help="OpenAI- and SGLang-compatible HTTP server over the engine and the cache")
    from chunkstore.server import main as serve

    serve.add_arguments(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("admin", help="the management REST API alone, over a store on disk")
    from api import cli as admin_cli

    admin_cli.add_arguments(p)
    p.set_defaults(func=cmd_admin)

    soak_parser = sub.add_parser("soak", help="long robustness runs")
    ssub = soak_parser.add_subparsers(dest="soak_command", required=True, metavar="SOAK")
    p = ssub.add_parser("crash", help="kill a writer with SIGKILL at random moments, check every key after")
    from chunkstore import soak

    soak.add_arguments(p)
    p.set_defaults(func=cmd_soak_crash)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "evict" and args.bytes is None and args.namespace is None:
        parser.error("evict needs --bytes N and/or --namespace NS")
    try:
        return args.func(args)
    except CliError as exc:
        print(f"chunkstore: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
