"""The `chunkstore` command line: store inspection and care, schema upgrades, benchmarks, the server.

Every store command takes --disk-path (default ./chunkstore-data, or $CHUNKSTORE_DISK_PATH) and
--json for machine-readable output (chunkstore/output.py: one meaning on every command); long work
shows a progress bar on stderr when stderr is a terminal. Exit codes: 0 ok, 1 the command found
problems (verify), 2 bad input or a store that cannot be opened.

Invariant: a command imports only what it uses. The parser adds the options of the command being
run only (a command's module may import torch, fastapi or transformers), so `--help`, `--version`
and the store commands (stats, verify, rebuild, gc, evict, db upgrade) never import torch,
transformers or fastapi (tests/test_cli_fast.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chunkstore import __version__
from chunkstore.output import add_json_flag
from chunkstore.sizes import argparse_type, parse_bytes, positive_gb_as_bytes
from chunkstore.store_flags import add_store_flags, flag_problem


class CliError(Exception):
    """A user-facing error: printed without a traceback, exit code 2."""


parse_size_bytes = argparse_type(parse_bytes)  # '500MB', '2GiB', '1048576' (chunkstore/sizes.py)
_gb_as_bytes = argparse_type(positive_gb_as_bytes)  # --disk-size: GB, or a size such as 500GB


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

    # A bar only on a terminal: redirected stderr (a log, a pipe) gets no carriage-return noise.
    return tqdm(total=total, desc=desc, unit="chunk", file=sys.stderr, disable=not sys.stderr.isatty(),
                leave=False)


def _flag(args: argparse.Namespace, dest: str, check: Callable[[Any], Any]) -> Any:
    """``check`` of a store flag's value; its ValueError names the flag and the value."""
    value = getattr(args, dest)
    try:
        return check(value)
    except (ValueError, TypeError) as exc:
        raise CliError(flag_problem(dest, value, exc)) from None


def _store_spec(args: argparse.Namespace, *, write: bool):
    """The store the flags name, and its identity (its store.json's). Raises CliError naming the
    flag whose value cannot be used, or saying why the store.json cannot be read."""
    from chunkstore.disk.seal_keys import seal_key_provider
    from chunkstore.disk.store import read_identity
    from chunkstore.disk.store_spec import StoreSpec, check_folder, check_index_url, check_object_store

    root = _flag(args, "disk_path", check_folder)
    for dest, check in (("index_url", check_index_url), ("object_store", check_object_store)):
        if getattr(args, dest) is not None:
            _flag(args, dest, check)
    try:
        identity = read_identity(root)
    except (ValueError, KeyError) as exc:
        raise CliError(f"{root / 'store.json'} is unreadable: {exc}") from None
    except OSError as exc:
        raise CliError(f"{root / 'store.json'} cannot be read: {exc.strerror or exc}") from None
    if identity is None:
        raise CliError(f"no chunk store at {root} (no store.json); check --disk-path")
    try:
        spec = StoreSpec(root, index_url=args.index_url, object_store=args.object_store,
                         capacity_bytes=getattr(args, "disk_size_bytes", None), read_only=not write,
                         seal_key=seal_key_provider(args.seal_key))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return spec, identity


def _open_store(args: argparse.Namespace, *, write: bool, reset_index: bool = False):
    spec, identity = _store_spec(args, write=write)
    return _open(args, spec, identity, reset_index=reset_index)


def _open(args: argparse.Namespace, spec, identity, *, reset_index: bool = False):
    from sqlalchemy.exc import DatabaseError

    from chunkstore.disk.identity import ModelMismatchError
    from chunkstore.disk.index import IndexMissingError
    from chunkstore.disk.store import StoreBusyError
    from chunkstore.disk.store_spec import open_store

    root = spec.folder
    try:
        return open_store(spec, identity, reset_index=reset_index)
    except (StoreBusyError, ModelMismatchError, IndexMissingError, OSError, ValueError) as exc:
        raise CliError(str(exc)) from None
    except DatabaseError as exc:
        if args.index_url:
            from chunkstore.disk.index import display_url

            raise CliError(f"cannot use the index at {display_url(args.index_url)}: {exc.orig}") from None
        raise CliError(f"the index of {root} is unreadable ({exc.orig}); "
                       f"run `chunkstore rebuild --disk-path {root}`") from None
    except RuntimeError as exc:
        raise CliError(str(exc)) from None


# -- commands --------------------------------------------------------------------------------

def _model_stores(root: Path) -> list[Path]:
    """The stores of further models in the data folder ``root`` (``models/<model>-<digest>/``, as
    `chunkstore serve` makes them), in name order."""
    from chunkstore.disk.store_folder import MODELS_DIRNAME, STORE_FILENAME

    return sorted(p.parent for p in (root / MODELS_DIRNAME).glob(f"*/{STORE_FILENAME}"))


def cmd_stats(args: argparse.Namespace) -> int:
    with _open_store(args, write=False) as store:
        stats = store.stats()
        model_id = store.identity.model_id
    others = []
    if not args.index_url and not args.object_store:  # a data folder: every model's store in it
        for folder in _model_stores(Path(args.disk_path)):
            with _open_store(argparse.Namespace(**{**vars(args), "disk_path": str(folder)}), write=False) as store:
                others.append({"path": str(folder), "model_id": store.identity.model_id, "stats": store.stats()})

    def store_lines(s, indent: str = "") -> list[str]:
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
            f"sealed             {'yes' if s.sealed else 'no'}",
        ]
        if s.sealed:
            out.append(f"auth failures      {s.auth_failures}")
        for n in s.namespaces:
            quota = n.quota_bytes if n.quota_bytes is not None else "-"
            out.append(f"  namespace {n.namespace!r}: {n.num_chunks} chunks, {n.stored_bytes} stored bytes, "
                       f"quota {quota}, hits {n.hits}, misses {n.misses}")
        return [indent + line for line in out]

    def lines(_) -> list[str]:
        if not others:
            return store_lines(stats)
        out = [f"model {model_id} (the data folder's own store)"] + store_lines(stats, "  ")
        for other in others:
            out += [f"model {other['model_id']} in {other['path']}"] + store_lines(other["stats"], "  ")
        return out

    # The JSON keeps the folder's own store's figures at the top, as before; other models' under "models".
    _emit(args, {**_jsonable(stats), "models": others}, lines)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from chunkstore.disk.maintenance import verify

    with _open_store(args, write=args.repair) as store:
        with _progress(store.num_chunks(), "verify") as bar:
            report = verify(store, repair=args.repair, progress=bar.update)
    _emit(args, report, lambda r: [f"{f.name:14} {getattr(r, f.name)}" for f in dataclasses.fields(r)])
    # Orphan and temp files are damage too (what a crash leaves); --repair fixes what it finds.
    return 0 if args.repair or report.damage == 0 else 1


def cmd_rebuild(args: argparse.Namespace) -> int:
    from chunkstore.disk.chunk_owner import ForeignChunksError
    from chunkstore.disk.maintenance import check_before_rebuild, rebuild

    spec, identity = _store_spec(args, write=True)
    try:
        # Before the index is dropped, so that a refusal changes nothing (a sealed store's chunks
        # are judged by rebuild, once the store has opened their keys).
        checked = None if args.force else check_before_rebuild(spec, identity)
        with _open(args, spec, identity, reset_index=True) as store:
            with _progress(None, "rebuild") as bar:
                report = rebuild(store, progress=bar.update, force=args.force or checked.has_own_chunk,
                                 recorded=None if checked is None else checked.recorded)
    except ForeignChunksError as exc:
        raise CliError(f"{exc} (or rebuild with --force: what verifies is indexed under store.json's model, the "
                       "rest quarantined)") from None
    _emit(args, report, lambda r: [f"{f.name:12} {getattr(r, f.name)}" for f in dataclasses.fields(r)])
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from chunkstore.disk.maintenance import gc

    with _open_store(args, write=True) as store:
        report = gc(store, purge_quarantine=args.purge_quarantine)
    _emit(args, report, lambda r: [f"{f.name:18} {getattr(r, f.name)}" for f in dataclasses.fields(r)])
    return 0


def _namespace(value: str | None) -> str | None:
    """``--namespace``'s value when it is a namespace (chunkstore/disk/namespaces.py); else CliError."""
    from chunkstore.disk.namespaces import check_namespace

    try:
        return None if value is None else check_namespace(value)
    except ValueError as exc:
        raise CliError(f"--namespace: {exc}") from None


def cmd_evict(args: argparse.Namespace) -> int:
    from chunkstore.disk.maintenance import evict_bytes

    _namespace(args.namespace)
    with _open_store(args, write=True) as store:
        if args.namespace is not None and args.bytes is None:
            result = store.delete_namespace(args.namespace)
        else:
            result = evict_bytes(store, args.bytes, namespace=args.namespace)
    summary = {"evicted_chunks": result.num_chunks, "evicted_bytes": result.stored_bytes}
    _emit(args, summary, lambda s: [f"evicted {s['evicted_chunks']} chunks, {s['evicted_bytes']} bytes"])
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from chunkstore.disk.index import display_url, sqlite_url, upgrade_index
    from chunkstore.disk.migrations import SchemaTooNewError

    if args.index_url:
        url = args.index_url
    else:
        root = Path(args.disk_path)
        if not root.is_dir():
            raise CliError(f"no chunk store at {root}")
        url = sqlite_url(root)
    try:
        before, head = upgrade_index(url)
    except (ValueError, SchemaTooNewError) as exc:
        raise CliError(str(exc)) from None
    except SQLAlchemyError as exc:  # a server that is down, a refused login
        raise CliError(f"cannot upgrade the index at {display_url(url)}: {getattr(exc, 'orig', exc)}") from None
    summary = {"from_revision": before, "to_revision": head}
    _emit(args, summary, lambda s: [f"index at revision {s['to_revision']} (was {s['from_revision']})"])
    return 0


# -- keys: a sealed store's master key and namespace keys (docs/SECURITY.md) -------------------

def cmd_keys_new(args: argparse.Namespace) -> int:
    from chunkstore.disk.seal_keys import write_key_file

    try:
        key = write_key_file(args.path)
    except FileExistsError:
        raise CliError(f"{args.path} exists; a key file is never overwritten (a lost key makes every chunk it "
                       "sealed unreadable)") from None
    except OSError as exc:
        raise CliError(f"cannot write {args.path}: {exc.strerror or exc}") from None
    summary = {"path": str(args.path), "key_id": key.key_id}
    _emit(args, summary, lambda s: [f"wrote seal key {s['key_id']} to {s['path']} (mode 0600); keep a copy "
                                    "somewhere safe: without it no sealed chunk can be read"])
    return 0


def _need_seal_key(args: argparse.Namespace, what: str) -> None:
    from chunkstore.disk.seal_keys import seal_key_provider

    if seal_key_provider(args.seal_key) is None:
        raise CliError(f"keys {what} needs the store's key: --seal-key PATH (or $CHUNKSTORE_SEAL_KEY_FILE)")


def cmd_keys_list(args: argparse.Namespace) -> int:
    _need_seal_key(args, "list")
    with _open_store(args, write=False) as store:
        keys = store.namespace_keys()
        master = store.sealing.master_key_id
    summary = {"master_key_id": master, "namespaces": keys}
    _emit(args, summary, lambda s: [f"sealed with master key {s['master_key_id']}"] + [
        f"  namespace {k.namespace!r}: key id {k.key_id}" for k in s["namespaces"]])
    return 0


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    from chunkstore.disk.seal_keys import FileKeyProvider, SealKeyError

    _need_seal_key(args, "rotate")
    try:
        new = FileKeyProvider(Path(args.new_seal_key).expanduser()).master_key()
    except SealKeyError as exc:
        raise CliError(str(exc)) from None
    with _open_store(args, write=True) as store:
        done = store.rotate_seal_key(new)
    lines = [f"rewrapped {done.namespaces} namespace key(s) from master key {done.from_master_key_id} to "
             f"{done.to_master_key_id}; no chunk was rewritten. Restart every server with the new key."]
    if done.unopened:
        lines.append(f"left as they were: the key rows of {', '.join(map(repr, done.unopened))}, which do not open "
                     "with the old key (altered or forged; nothing of them can be read)")
    _emit(args, done, lambda d: lines)
    return 0


def cmd_keys_shred(args: argparse.Namespace) -> int:
    _need_seal_key(args, "shred")
    _namespace(args.namespace)
    with _open_store(args, write=True) as store:
        done = store.shred_namespace(args.namespace)
    _emit(args, done, lambda d: [
        (f"shredded namespace {d.namespace!r}: its key is destroyed" if d.key_destroyed else
         f"namespace {d.namespace!r} had no key (nothing of it is sealed)")
        + f"; {d.num_chunks} chunks ({d.stored_bytes} bytes) deleted"])
    return 0


def _delegate(module: str) -> Callable[[argparse.Namespace], int]:
    """A command whose options and code live in ``module`` (its ``add_arguments`` and ``run``),
    imported only when that command runs or shows its help."""
    def run(args: argparse.Namespace) -> int:
        return importlib.import_module(module).run(args)
    return run


# -- parser ----------------------------------------------------------------------------------

def _store_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    add_store_flags(p)
    add_json_flag(p)
    return p


def _add_rebuild(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true",
                   help="rebuild even when the chunks read were written by another model than store.json names "
                        "(what verifies is indexed under store.json's model, the rest quarantined)")


def _add_verify(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repair", action="store_true",
                   help="quarantine corrupt files, drop rows of missing files, adopt valid files without a row")


def _add_gc(p: argparse.ArgumentParser) -> None:
    p.add_argument("--disk-size", dest="disk_size_bytes", type=_gb_as_bytes, metavar="GB|SIZE",
                   help="capacity to evict down to: a number of GB (10^9 bytes), or a size such as 500GB")
    p.add_argument("--purge-quarantine", action="store_true", help="also delete quarantined files")


def _add_keys_new(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=Path, metavar="PATH", help="where to write the new key file (never overwritten)")
    add_json_flag(p)


def _add_keys_rotate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--new-seal-key", required=True, metavar="PATH",
                   help="the new master key's file (--seal-key names the current one)")


def _add_keys_shred(p: argparse.ArgumentParser) -> None:
    p.add_argument("--namespace", required=True, help="the namespace whose key is destroyed, then its chunks")


def _add_evict(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bytes", type=parse_size_bytes, metavar="SIZE",
                   help="stored bytes to free: a plain number of bytes, or a size such as 500MB, 2GiB")
    p.add_argument("--namespace", help="with --bytes: evict only from it; alone: delete all of it")


@dataclass(frozen=True, slots=True)
class Command:
    """One leaf command: its words, its help, what runs it and, for a command whose options live in
    a module of their own (which may import torch or fastapi), that module."""

    path: tuple[str, ...]
    help: str
    func: Callable[[argparse.Namespace], int] | None = None  # None: ``module``'s run
    store: bool = False  # takes --disk-path and --json
    add: Callable[[argparse.ArgumentParser], None] | None = None
    module: str | None = None

    @property
    def runner(self) -> Callable[[argparse.Namespace], int]:
        return self.func if self.func is not None else _delegate(self.module)


_GROUPS = {("db",): ("index schema commands", "DB_COMMAND"), ("bench",): ("benchmarks", "BENCH"),
           ("soak",): ("long robustness runs", "SOAK"), ("keys",): ("a sealed store's keys", "KEYS_COMMAND")}
COMMANDS = (
    Command(("stats",), "chunks, bytes, compression, hits per namespace", cmd_stats, store=True),
    Command(("verify",), "read and check every chunk", cmd_verify, store=True, add=_add_verify),
    Command(("rebuild",), "recreate the index from the chunk files alone", cmd_rebuild, store=True,
            add=_add_rebuild),
    Command(("gc",), "remove temp files, evict to --disk-size, checkpoint", cmd_gc, store=True, add=_add_gc),
    Command(("evict",), "evict by bytes (LRU, leaf-first) or a whole namespace", cmd_evict, store=True,
            add=_add_evict),
    Command(("db", "upgrade"), "apply the alembic migrations to the index", cmd_db_upgrade, store=True),
    Command(("keys", "new"), "write a new master seal key file (mode 0600)", cmd_keys_new, add=_add_keys_new),
    Command(("keys", "list"), "a sealed store's master key id and namespace key ids", cmd_keys_list, store=True),
    Command(("keys", "rotate"), "rewrap every namespace key by a new master key (no chunk is rewritten)",
            cmd_keys_rotate, store=True, add=_add_keys_rotate),
    Command(("keys", "shred"), "destroy a namespace's key, then its chunks (crypto-shredding)", cmd_keys_shred,
            store=True, add=_add_keys_shred),
    Command(("bench", "store"), "store throughput against raw disk I/O, compression, lookups",
            module="chunkstore.bench.store"),
    Command(("bench", "tiers"), "match+insert cost, host->device and disk->device against baselines",
            module="chunkstore.bench.tiers"),
    Command(("bench", "multiturn"), "multi-turn chat: hit rate, TTFT, throughput per cache configuration",
            module="chunkstore.bench.multiturn"),
    Command(("bench", "sglang"), "chunkstore against SGLang's HiCacheFile as HiCache L3: set, get, bytes on disk",
            module="chunkstore.bench.sglang"),
    Command(("bench", "vllm"), "the multi-turn workload on vLLM with each KV cache system side by side: a first run "
            "and a restart", module="chunkstore.bench.vllm"),
    Command(("bench", "fleet"), "N servers on one shared tier against private tiers and one server; publish and "
            "read against raw PUT and GET", module="chunkstore.bench.fleet"),
    Command(("bench", "startup"), "start-up of the CLI and of serve against importing torch and transformers",
            module="chunkstore.bench.startup"),
    Command(("serve",), "OpenAI- and SGLang-compatible HTTP server over the engine and the cache",
            module="chunkstore.serve"),
    Command(("admin",), "the management REST API alone, over a store on disk", module="chunkstore.api.cli"),
    Command(("soak", "crash"), "kill a writer with SIGKILL at random moments, check every key after",
            module="chunkstore.testing.crash_soak"),
)


def _wanted(command: Command, argv: Sequence[str] | None) -> bool:
    """Whether ``command``'s options are needed: all are when ``argv`` is None (the whole parser,
    for docs and tests); else only those of the command named by argv's leading words (the top
    level has no options before the command, so the command words come first)."""
    if argv is None:
        return True
    return tuple(argv[:len(command.path)]) == command.path


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given ``argv``, only the command it names gets its options (see ``_wanted``)."""
    parser = argparse.ArgumentParser(prog="chunkstore", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"chunkstore {__version__}")
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[tuple[str, ...], Any] = {}
    common = _store_parent()
    for command in COMMANDS:
        sub = top
        if len(command.path) > 1:
            group = command.path[:-1]
            if group not in groups:
                title, metavar = _GROUPS[group]
                group_parser = top.add_parser(group[-1], help=title)
                groups[group] = group_parser.add_subparsers(dest=f"{group[-1]}_command", required=True,
                                                            metavar=metavar)
            sub = groups[group]
        p = sub.add_parser(command.path[-1], parents=[common] if command.store else [], help=command.help)
        if _wanted(command, argv):
            if command.add is not None:
                command.add(p)
            if command.module is not None:
                importlib.import_module(command.module).add_arguments(p)
        p.set_defaults(func=command.runner)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
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
