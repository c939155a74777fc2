"""A store's folder: ``store.json`` (format, model identity, privacy marker), the writer's ``LOCK``
file, where a model's store lives in a data folder (``store_root``), and a database index's
claim on the store it serves (``claim_index``).

Invariants: a folder holds the store of exactly one identity, written to ``store.json`` by the
first writer and checked by every opener; one process writes a store at a time (an exclusive,
non-blocking flock on ``LOCK``, released when the store closes or the process dies); top-level
files are made private on every writable open, and the chunk tree once, which ``store.json``
records (``PRIVATE_MARKER``), so a large store still opens in milliseconds; a database index
(not a SQLite file in the folder) serves one store's folder, or one shared tier's payloads, and one
model, recorded in its ``store_meta`` by the first writer.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from chunkstore.disk.files import PRIVATE_FILE_MODE, make_private, write_private_file
from chunkstore.disk.identity import ModelIdentity, ModelMismatchError
from chunkstore.disk.payloads import PayloadStore

if TYPE_CHECKING:
    from chunkstore.disk.index import ChunkIndex

log = logging.getLogger(__name__)

STORE_FILENAME = "store.json"
MODELS_DIRNAME = "models"  # in a data folder: the stores of models other than the first (store_root)
LOCK_FILENAME = "LOCK"
STORE_FORMAT = 1
# In store.json once every file and folder of the chunk tree has been made private (a store
# written before files were private gets one full walk, on its first writable open).
PRIVATE_MARKER = "private_files"


class StoreBusyError(RuntimeError):
    """Another process holds the store's writer lock."""


def read_store_doc(root: Path) -> dict | None:
    path = Path(root) / STORE_FILENAME
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def write_store_doc(root: Path, doc: dict) -> None:
    write_private_file(Path(root) / STORE_FILENAME, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())


def read_identity(root: Path) -> ModelIdentity | None:
    """The identity of the store in ``root``, None when there is none."""
    doc = read_store_doc(root)
    if doc is None:
        return None
    return ModelIdentity.from_json(json.dumps(doc["identity"]))


def store_root(data_dir: Path, identity: ModelIdentity) -> Path:
    """Where the store of ``identity`` lives in the data folder ``data_dir``, so that one data folder
    serves any model: the folder itself when it is new or holds this model's store (the first
    model takes it, as a store opened there directly does), else ``models/<model>-<digest>/`` below
    it, one store per further identity (each with its own lock, index and capacity: servers of two
    models may share a data folder at once). The digest covers the whole identity, so two
    identities never share a folder."""
    data_dir = Path(data_dir)
    stored = read_identity(data_dir)
    if stored is None or stored == identity:
        return data_dir
    name = re.sub(r"(?:[^A-Za-z0-9._-]|\.\.)+", "-", identity.model_id).strip("-.")[:48] or "model"
    digest = hashlib.blake2b(identity.to_json().encode(), digest_size=6).hexdigest()
    return data_dir / MODELS_DIRNAME / f"{name}-{digest}"


def check_identity(root: Path, identity: ModelIdentity, *, read_only: bool, allow_other_models: bool) -> None:
    """Write ``identity`` to a new store's ``store.json``, or check it against the stored one.
    Raises FileNotFoundError (read-only and no store), ModelMismatchError."""
    stored = read_identity(root)
    if stored is None:
        if read_only:
            raise FileNotFoundError(f"no chunk store at {root}")
        write_store_doc(root, {"format": STORE_FORMAT, "identity": json.loads(identity.to_json())})
    elif stored != identity and not allow_other_models:
        raise ModelMismatchError(
            f"the store at {root} holds KV of {stored}, not {identity}; "
            "open ChunkStore(store_root(DIR, identity), ...) (chunkstore.disk.store_folder.store_root: the "
            "folder of this model's own store in the data folder DIR, as `chunkstore serve` does), "
            "or pass another folder; allow_other_models=True shares this store (keys keep the "
            "models apart)"
        )


class WriterLock:
    """The exclusive lock on ``root/LOCK`` that makes its holder the store's one writer."""

    def __init__(self, root: Path):
        fd = os.open(Path(root) / LOCK_FILENAME, os.O_RDWR | os.O_CREAT, PRIVATE_FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreBusyError(f"another process is writing the store at {root}") from None
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def make_private_once(root: Path, payloads: PayloadStore) -> None:
    """Make the top-level files private (a few chmods, every writable open) and, while
    ``store.json`` lacks the marker, every payload (one walk per store: payloads created since are
    private from the start)."""
    for name in (STORE_FILENAME, LOCK_FILENAME):
        make_private(Path(root) / name, PRIVATE_FILE_MODE)
    doc = read_store_doc(root)
    if doc is None or doc.get(PRIVATE_MARKER):
        return
    t0 = time.monotonic()
    changed = payloads.make_private()
    if changed:
        log.info("made %d files and folders of %s private (once) in %.1f s", changed, root,
                 time.monotonic() - t0)
    write_store_doc(root, {**doc, PRIVATE_MARKER: True})


def warn_if_not_private(root: Path) -> None:
    """A read-only opener may not chmod (the files may not be its own): it only says so."""
    mode = Path(root).stat().st_mode & 0o777
    if mode & 0o077:
        log.warning("the data folder %s is open to other users (mode %o); opening the store for writing "
                    "makes it and its files private", root, mode)


def claim_index(index: ChunkIndex, root: Path, identity: ModelIdentity, *, read_only: bool,
                allow_other_models: bool, shared_name: str | None = None) -> None:
    """Bind an index to the model whose pages its rows name and, for a database on a server, to the
    store at ``root`` (or, for a shared tier, to the payloads every server names ``shared_name``):
    a database could be named by two stores, whose rows would then claim each other's files; a
    SQLite index lives in (or beside) its folder, which may move, so it records the model only (an
    index file copied from another model's store is refused, not read as this one's). Raises
    ModelMismatchError (closing the index), naming both, for an index another store or model has
    claimed."""
    claim = {"identity": identity.to_json()}
    if index.dialect.serves_many_stores:
        where = ("store_folder", str(Path(root).resolve())) if shared_name is None else ("payload_store", shared_name)
        claim[where[0]] = where[1]
        other = "payload_store" if shared_name is None else "store_folder"
        if (held := index.get_meta(other)) is not None:
            index.close()
            kind = "a shared tier" if shared_name is None else "one store's folder"
            raise ModelMismatchError(f"the index {index.name} belongs to {kind} ({other}: {held}); give each "
                                     "store its own database")
    for name, value in claim.items():
        held = index.get_meta(name)
        if held is None and not read_only:
            index.set_meta(name, value)
        elif held is not None and held != value and not (name == "identity" and allow_other_models):
            index.close()
            raise ModelMismatchError(f"the index {index.name} belongs to another store ({name}: {held}; this "
                                     f"store's: {value}); give each store its own index")
