"""What every engine integration shares about its store: the settings it takes from its engine's
extra config (one parser, so the keys mean the same in SGLang's
``--hicache-storage-backend-extra-config`` and vLLM's ``kv_connector_extra_config``; ValueError
naming the key for anything it cannot use), and opening the store when the engine's ranks start
at once."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from chunkstore.disk import (ChunkStore, Codec, Durability, FileKeyProvider, KeyProvider, ModelIdentity,
                             ModelMismatchError, StoreBusyError, StoreSpec, check_folder, check_index_url,
                             check_object_store, open_store, seal_key_provider, store_root)
from chunkstore.priority import ThreadPriority
from chunkstore.sizes import parse_bytes

# key in the extra config -> the settings field it sets
STORE_KEYS = {"disk_path": "disk_path", "disk_size": "disk_size_bytes", "compression": "compression",
              "durability": "durability", "background_priority": "background_priority",
              "max_pending": "max_pending_bytes", "index_url": "index_url", "object_store": "object_store",
              "local_cache_size": "local_cache_bytes", "seal_key": "seal_key"}


def check_keys(extra: dict[str, Any], known: Iterable[str], passthrough: Iterable[str], where: str) -> None:
    """Refuse a key that is neither ``known`` nor the engine's own (``passthrough``)."""
    unknown = set(extra) - set(known) - set(passthrough)
    if unknown:
        raise ValueError(f"unknown chunkstore settings in {where}: {sorted(unknown)}; known: {sorted(known)}")


def extra_dict(extra: Any, where: str) -> dict[str, Any]:
    """The engine's extra config as a dict (None: no settings). Raises ValueError, naming
    ``where``, for anything that is not a JSON object of settings (a list, a string)."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise ValueError(f"{where} must be a JSON object of chunkstore settings, got a {type(extra).__name__}: "
                         f"{extra!r:.80}")
    return dict(extra)


def parsed(where: str, key: str, parse: Callable[[Any], Any], value: Any) -> Any:
    """``parse(value)``; its ValueError (or a TypeError for a value of the wrong kind) names the
    setting and what was given."""
    try:
        return parse(value)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{where} {key!r}: {exc} (got {value!r:.80})") from None


def data_folder(value: Any) -> Path:
    """A data folder's path (``check_folder``: text without a NUL, within the path limits, not a
    file) that is a folder already or can be made: its nearest existing parent is a folder this
    process may create folders in. Raises ValueError saying which it is not."""
    folder = check_folder(value)
    for place in (folder, *folder.absolute().parents):
        try:
            found = place.stat()  # follows a symlink, as making the folder would
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise ValueError(f"{place} cannot be looked at: {exc.strerror or exc}") from None
        if place == folder:
            return folder  # a folder (check_folder refused anything else)
        if not stat.S_ISDIR(found.st_mode):
            raise ValueError(f"{folder} cannot be made: {place} is a file, not a folder")
        if not os.access(place, os.W_OK | os.X_OK):
            raise ValueError(f"{folder} cannot be made: no permission to create a folder in {place}")
        return folder
    return folder  # (the root folder always exists)


def _local_copy_bytes(value: Any) -> int:
    return 0 if str(value).strip() == "0" else parse_bytes(value)  # 0: no local copy


def _seal_key(value: Any) -> KeyProvider:
    """A key file's provider, its key read once now so that a bad file is refused at start-up."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError("a seal key is the path of a key file (chunkstore keys new PATH)")
    from pathlib import Path

    provider = FileKeyProvider(Path(value).expanduser())
    provider.master_key()  # SealKeyError (a ValueError) says what is wrong with the file
    return provider


def store_fields(extra: dict[str, Any], where: str = "the extra config") -> dict[str, Any]:
    """The STORE_KEYS present in ``extra``, parsed, by settings field name. Raises ValueError naming
    the key and the value for anything it cannot use."""
    kw: dict[str, Any] = {}
    if "disk_path" in extra:
        kw["disk_path"] = parsed(where, "disk_path", data_folder, extra["disk_path"])
    for name in ("disk_size", "max_pending"):
        if extra.get(name) is not None:
            kw[STORE_KEYS[name]] = parsed(where, name, parse_bytes, extra[name])
    if extra.get("local_cache_size") is not None:
        kw["local_cache_bytes"] = parsed(where, "local_cache_size", _local_copy_bytes, extra["local_cache_size"])
    if extra.get("index_url") is not None:  # (its ValueError names the backends)
        kw["index_url"] = parsed(where, "index_url", lambda v: check_index_url(str(v)), extra["index_url"])
    if extra.get("object_store") is not None:
        kw["object_store"] = parsed(where, "object_store", lambda v: check_object_store(str(v)), extra["object_store"])
    if extra.get("seal_key") is not None:
        kw["seal_key"] = parsed(where, "seal_key", _seal_key, extra["seal_key"])
    if extra.get("compression") not in (None, "auto"):
        kw["compression"] = parsed(where, "compression", Codec.parse, extra["compression"])
    if "durability" in extra:
        kw["durability"] = parsed(where, "durability", Durability.parse, extra["durability"])
    if "background_priority" in extra:
        kw["background_priority"] = parsed(where, "background_priority", ThreadPriority.parse,
                                           extra["background_priority"])
    return kw


def store_spec(settings: Any, identity: ModelIdentity, *, read_only: bool = False) -> StoreSpec:
    """The store of ``identity`` in the data folder ``settings.disk_path`` (``store_root``: the
    folder serves any model), as the settings describe it. A reader's spec names only where the
    store is: it writes nothing, so it keeps no capacity, codec, priority or local copy of its own."""
    folder = store_root(settings.disk_path, identity)
    # A sealed store's key: the ``seal_key`` setting, else the environment's (seal_key_provider).
    seal_key = settings.seal_key if settings.seal_key is not None else seal_key_provider()
    if read_only:
        return StoreSpec(folder, index_url=settings.index_url, object_store=settings.object_store, read_only=True,
                         seal_key=seal_key)
    return StoreSpec(folder, index_url=settings.index_url, object_store=settings.object_store,
                     local_copy_bytes=settings.local_cache_bytes, capacity_bytes=settings.disk_size_bytes,
                     codec=settings.compression, durability=settings.durability,
                     background_priority=settings.background_priority, seal_key=seal_key)


def open_writer(settings: Any, identity: ModelIdentity, *, wait_s: float = 30.0) -> ChunkStore:
    """Open the store of ``identity`` in the data folder ``settings.disk_path`` for writing
    (``store_root``), with the settings' capacity, codec, durability and priority, on the index
    and bucket they name (a shared tier, with a local copy of what this process reads).

    The ranks of one engine start together: on a new data folder each sees no store yet and picks
    the folder itself, one wins, and the others find it busy or another rank's. So a busy or
    foreign store is retried, its folder looked up again (by then the winner's ``store.json`` says
    whose it is), for up to ``wait_s``; then the error is raised (StoreBusyError: another process
    writes this identity's store)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return open_store(store_spec(settings, identity), identity)
        except (StoreBusyError, ModelMismatchError):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def open_reader(settings: Any, identity: ModelIdentity) -> ChunkStore | None:
    """The store of ``identity`` in ``settings.disk_path``, opened read-only on the index and bucket
    the settings name; None while no writer has made it."""
    try:
        return open_store(store_spec(settings, identity, read_only=True), identity)
    except (FileNotFoundError, ModelMismatchError):
        return None
