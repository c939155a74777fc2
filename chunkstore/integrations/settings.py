"""What every engine integration shares about its store: the settings it takes from its engine's
extra config (one parser, so the keys mean the same in SGLang's
``--hicache-storage-backend-extra-config`` and vLLM's ``kv_connector_extra_config``; ValueError
naming the key for anything it cannot use), and opening the store when the engine's ranks start
at once."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from chunkstore.disk import (ChunkStore, Codec, Durability, ModelIdentity, ModelMismatchError, StoreBusyError,
                             StoreSpec, check_index_url, check_object_store, open_store, store_root)
from chunkstore.priority import ThreadPriority
from chunkstore.sizes import parse_bytes

# key in the extra config -> the settings field it sets
STORE_KEYS = {"disk_path": "disk_path", "disk_size": "disk_size_bytes", "compression": "compression",
              "durability": "durability", "background_priority": "background_priority",
              "max_pending": "max_pending_bytes", "index_url": "index_url", "object_store": "object_store",
              "local_cache_size": "local_cache_bytes"}


def check_keys(extra: dict[str, Any], known: Iterable[str], passthrough: Iterable[str], where: str) -> None:
    """Refuse a key that is neither ``known`` nor the engine's own (``passthrough``)."""
    unknown = set(extra) - set(known) - set(passthrough)
    if unknown:
        raise ValueError(f"unknown chunkstore settings in {where}: {sorted(unknown)}; known: {sorted(known)}")


def store_fields(extra: dict[str, Any]) -> dict[str, Any]:
    """The STORE_KEYS present in ``extra``, parsed, by settings field name."""
    kw: dict[str, Any] = {}
    if "disk_path" in extra:
        kw["disk_path"] = Path(str(extra["disk_path"])).expanduser()
    for name in ("disk_size", "max_pending"):
        if extra.get(name) is not None:
            kw[STORE_KEYS[name]] = parse_bytes(extra[name])
    if extra.get("local_cache_size") is not None:  # 0: no local copy
        size = extra["local_cache_size"]
        kw["local_cache_bytes"] = 0 if str(size).strip() == "0" else parse_bytes(size)
    if extra.get("index_url") is not None:
        kw["index_url"] = check_index_url(str(extra["index_url"]))  # its ValueError names the backends
    if extra.get("object_store") is not None:
        kw["object_store"] = check_object_store(str(extra["object_store"]))
    if extra.get("compression") not in (None, "auto"):
        kw["compression"] = Codec.parse(extra["compression"])
    if "durability" in extra:
        kw["durability"] = Durability.parse(extra["durability"])
    if "background_priority" in extra:
        kw["background_priority"] = ThreadPriority.parse(extra["background_priority"])
    return kw


def store_spec(settings: Any, identity: ModelIdentity, *, read_only: bool = False) -> StoreSpec:
    """The store of ``identity`` in the data folder ``settings.disk_path`` (``store_root``: the
    folder serves any model), as the settings describe it. A reader's spec names only where the
    store is: it writes nothing, so it keeps no capacity, codec, priority or local copy of its own."""
    folder = store_root(settings.disk_path, identity)
    if read_only:
        return StoreSpec(folder, index_url=settings.index_url, object_store=settings.object_store, read_only=True)
    return StoreSpec(folder, index_url=settings.index_url, object_store=settings.object_store,
                     local_copy_bytes=settings.local_cache_bytes, capacity_bytes=settings.disk_size_bytes,
                     codec=settings.compression, durability=settings.durability,
                     background_priority=settings.background_priority)


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
