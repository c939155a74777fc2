"""SealOps: a sealed store's key operations (list, shred, rotate), over its keyring (keyring.py).

Invariants: shredding a namespace deletes its keys first (from that moment nothing it sealed
opens, on any server, local copy or old copy of the bucket), then its rows, then its payloads,
so a failure after the first step leaves only unreadable payloads for gc; rotating the master key
rewraps every namespace's keys in one transaction and rewrites no chunk. ChunkStore inherits these
methods; an unsealed store refuses shred and rotate with ValueError.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chunkstore.disk.keyring import Keyring, Sealing
from chunkstore.disk.read_only import mutation
from chunkstore.disk.results import EvictResult
from chunkstore.disk.seal_keys import MasterKey

if TYPE_CHECKING:
    from chunkstore.disk.index import ChunkIndex


@dataclass(frozen=True, slots=True)
class NamespaceKeyInfo:
    """What is public of a namespace's keys: its key id (every sealed chunk of it names it), the
    master key that wraps them and when they were made."""

    namespace: str
    key_id: str  # hex
    master_key_id: str
    created_at: float


@dataclass(frozen=True, slots=True)
class RotateResult:
    from_master_key_id: str
    to_master_key_id: str
    namespaces: int  # whose keys were rewrapped
    unopened: tuple[str, ...] = ()  # namespaces whose key row did not open (altered or forged): left as they are


@dataclass(frozen=True, slots=True)
class ShredResult:
    namespace: str
    key_destroyed: bool  # False: the namespace had no keys (nothing of it was ever sealed, or shredded before)
    num_chunks: int  # its chunks whose rows and payloads were deleted
    stored_bytes: int


class SealOps:
    """Key operations of a store (``sealing`` and ``_index`` are the store's)."""

    sealing: Sealing
    _index: ChunkIndex
    delete_namespace: Callable[[str], EvictResult]  # EvictionOps'

    @property
    def is_sealed(self) -> bool:
        return self.sealing.is_sealed

    def _keyring(self, what: str) -> Keyring:
        if not isinstance(self.sealing, Keyring):
            raise ValueError(f"{what}: the store at {self.root} is not sealed")  # type: ignore[attr-defined]
        return self.sealing

    def namespace_keys(self) -> list[NamespaceKeyInfo]:
        """Every namespace's public key facts (none for an unsealed store)."""
        if not isinstance(self.sealing, Keyring):
            return []
        return [NamespaceKeyInfo(r.namespace, bytes(r.key_id).hex(), r.master_key_id, r.created_at)
                for r in self.sealing.table.rows()]

    @mutation
    def shred_namespace(self, namespace: str) -> ShredResult:
        """Crypto-shred ``namespace``: its keys go, then its chunks (rows, then payloads, pinned
        ones too). A later put into it makes new keys. Raises ValueError for an unsealed store,
        ReadOnlyStoreError, and what the index raises (nothing changed when the keys' delete
        failed)."""
        keyring = self._keyring("shred")
        with self._index.write_lock:  # no put of this process commits between the key's delete and its rows'
            destroyed = keyring.table.delete(namespace)
            keyring.forget(namespace)
            done = self.delete_namespace(namespace)
        return ShredResult(namespace, destroyed, done.num_chunks, done.stored_bytes)

    @mutation
    def rotate_seal_key(self, new: MasterKey) -> RotateResult:
        """Rewrap every namespace's keys by ``new`` (and mark the store sealed with it) in one
        transaction. This store uses ``new`` from then on; other servers keep the keys they hold
        and need ``new`` when they restart. A key row that does not open with the current key
        (altered or forged) is left as it is and named. Raises ValueError for an unsealed store,
        ReadOnlyStoreError."""
        keyring = self._keyring("rotate")
        old = keyring.master
        n, unopened = keyring.table.rewrap(old, new)
        keyring.master = new
        return RotateResult(old.key_id, new.key_id, n, tuple(unopened))
