"""StoreSpec and open_store: the one door to a chunk store.

Invariants: every caller opens a store here (the store commands, the cache's composition root,
the management API, the engine integrations), so a setting has one name, one unit and one
default: sizes are whole bytes, parsed from what a person typed only at the edges
(chunkstore/sizes.py); a spec is valid from construction (its URLs parse, its sizes are in
range) and immutable. A bucket's local copy lives in the store's own folder, and only a store
that writes keeps one. Importing this module imports neither torch nor a database driver.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from chunkstore.disk.files import Durability
from chunkstore.priority import ThreadPriority

if TYPE_CHECKING:
    from chunkstore.disk.codec import Codec
    from chunkstore.disk.identity import ModelIdentity
    from chunkstore.disk.objects import ObjectStoreConfig
    from chunkstore.disk.payloads import PayloadStore
    from chunkstore.disk.seal_keys import KeyProvider
    from chunkstore.disk.store import ChunkStore

__all__ = ["DEFAULT_LOCAL_COPY_BYTES", "StoreSpec", "check_folder", "check_index_url", "check_object_store", "open_store"]

# A shared tier's local copy of what a server read: `chunkstore serve`'s default and the engine
# integrations' (10 GB).
DEFAULT_LOCAL_COPY_BYTES = 10 * 10**9


# The longest path and path component a folder may have (Linux's PATH_MAX and NAME_MAX).
MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255


def check_folder(path: str | os.PathLike) -> Path:
    """``path`` (``~`` expanded) when it can name a store's folder: text without a NUL, within the
    path limits, and not an existing file. Raises ValueError saying which it is not (a TypeError
    for a value that is no path at all)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"a folder's path is text, not a {type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str):
        text = os.fsdecode(text)
    if "\0" in text:
        raise ValueError("a folder's path holds no NUL byte")
    if not text.strip():
        raise ValueError("a folder's path is not empty")
    folder = Path(text).expanduser()
    encoded = os.fsencode(str(folder))
    if len(encoded) >= MAX_PATH_BYTES:
        raise ValueError(f"a path is at most {MAX_PATH_BYTES - 1} bytes, this one has {len(encoded)}")
    if any(len(os.fsencode(part)) > MAX_NAME_BYTES for part in folder.parts):
        raise ValueError(f"a path's folder names are at most {MAX_NAME_BYTES} bytes each")
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file, not a folder")
    return folder


def check_index_url(url: str) -> str:
    """``url`` when it names an index backend; else ValueError naming the backends taken."""
    from chunkstore.disk.index import index_backend

    index_backend(url)
    return url


def check_object_store(url: str) -> str:
    """``url`` when it names a bucket (s3://bucket[/prefix]); else ValueError saying what is wrong."""
    from chunkstore.disk.objects import parse_object_url

    parse_object_url(url)
    return url


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """Where a store is and how it is opened.

    ``folder`` is the store's own folder (``store_root(data, identity)`` of a data folder);
    ``index_url`` a SQLAlchemy URL of its index (None: ``index.db`` in the folder);
    ``object_store`` a bucket, ``s3://bucket[/prefix]`` or an ObjectStoreConfig (None: chunk
    files in the folder); ``local_copy_bytes`` the most bytes of a bucket's chunks kept on local
    disk (0: none; a read-only store keeps none); ``capacity_bytes`` the most stored bytes
    (None: unbounded); ``codec`` None for the store's default for the dtype; ``seal_key`` the
    master key of a sealed store (None: unsealed; seal_keys.py). Raises ValueError
    for a size out of range, a URL that names no backend, or a folder that cannot be one
    (``check_folder``)."""

    folder: Path
    index_url: str | None = None
    object_store: str | ObjectStoreConfig | None = None
    local_copy_bytes: int = 0
    capacity_bytes: int | None = None
    codec: Codec | None = None
    durability: Durability = Durability.FSYNC
    background_priority: ThreadPriority = ThreadPriority.NORMAL
    read_only: bool = False
    seal_key: KeyProvider | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "folder", check_folder(self.folder))
        if self.capacity_bytes is not None and self.capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive (or None: unbounded), got {self.capacity_bytes}")
        if self.local_copy_bytes < 0:
            raise ValueError(f"local_copy_bytes must be 0 (no local copy) or more, got {self.local_copy_bytes}")
        object.__setattr__(self, "durability", Durability.parse(self.durability))
        object.__setattr__(self, "background_priority", ThreadPriority.parse(self.background_priority))
        if self.index_url is not None:
            check_index_url(self.index_url)
        if isinstance(self.object_store, str):
            check_object_store(self.object_store)

    @property
    def keeps_local_copy(self) -> bool:
        return self.object_store is not None and not self.read_only and self.local_copy_bytes > 0

    def payloads(self) -> PayloadStore | None:
        """A new client of the bucket (with the local copy when the spec keeps one), or None: the
        folder's own chunk files."""
        if self.object_store is None:
            return None
        from chunkstore.disk.objects import ObjectPayloads, ObjectStoreConfig
        from chunkstore.disk.payload_cache import LOCAL_COPY_FOLDER, CachedPayloads

        config = self.object_store
        bucket = ObjectPayloads(ObjectStoreConfig(config) if isinstance(config, str) else config)
        if not self.keeps_local_copy:
            return bucket
        return CachedPayloads(bucket, self.folder / LOCAL_COPY_FOLDER, self.local_copy_bytes)


def open_store(spec: StoreSpec, identity: ModelIdentity | None = None, *, reset_index: bool = False) -> ChunkStore:
    """Open the store ``spec`` names, for ``identity`` (None: the one its ``store.json`` names).
    ``reset_index`` starts its index empty (rebuild). Raises what ChunkStore raises
    (StoreBusyError, ModelMismatchError, IndexMissingError, ValueError: SealKeyError among them, OSError, sqlalchemy's
    DatabaseError), and FileNotFoundError when ``identity`` is None and the folder holds no store."""
    from chunkstore.disk.store import ChunkStore
    from chunkstore.disk.store_folder import read_identity

    if identity is None:
        identity = read_identity(spec.folder)
        if identity is None:
            raise FileNotFoundError(f"no chunk store at {spec.folder} (no store.json)")
    return ChunkStore(spec.folder, identity, capacity_bytes=spec.capacity_bytes, codec=spec.codec,
                      durability=spec.durability, background_priority=spec.background_priority,
                      read_only=spec.read_only, reset_index=reset_index, index_url=spec.index_url,
                      payloads=spec.payloads(), seal_key=spec.seal_key)
