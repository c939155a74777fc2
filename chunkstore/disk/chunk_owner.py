"""Whose chunks a store holds: a bounded sample of its chunk headers judged against the model
identity its ``store.json`` names, so that a rebuild neither quarantines another model's chunks
as corrupt (another page shape) nor indexes them under the wrong identity (the same shape).

Invariants: judging reads payloads and changes nothing; it reads at most ``max_reads`` of them.
A chunk is the identity's when its layout (KV dtype, page shape, ids per page) is the identity's
and its chain of parents, followed through the headers, starts at the identity's root key for
its namespace (keys.py: the root binds the identity); a sealed chunk is when it opens with the
identity's binding (sealing.py). It is another's when its layout differs, when its chain starts
at a key that is neither a stored page nor this identity's root (another identity's root key,
or a page that was lost), or when it is sealed under a key the store holds and does not open
with this identity's binding. Anything else (unreadable, corrupt, a sealed chunk without a key
at hand, a walk cut short) is evidence neither way.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import islice

from sqlalchemy.exc import DBAPIError

from chunkstore.disk.chunkfile import ChunkHeader, decode_header
from chunkstore.disk.codec import CorruptChunkError
from chunkstore.disk.identity import ModelIdentity, ModelMismatchError
from chunkstore.disk.keys import root_key
from chunkstore.disk.payloads import PayloadStore
from chunkstore.disk.seal_keys import SealKeyError
from chunkstore.disk.sealing import AuthenticationError, NamespaceKeys, is_sealed, open_sealed, sealed_key_id, \
    store_binding

SAMPLE_CHUNKS = 16  # chunks of the listing judged (from its start); one of the identity's ends the sample
# Payloads read in all: a chunk's chain is walked to its first page, so a sample costs about one
# prompt's pages (its ancestors are shared by the chunks after it).
MAX_READS = 4096
# The largest payload read to judge it: another model's pages may be larger than any of this one's.
MAX_PAYLOAD_BYTES = 256 << 20
KeysById = Callable[[bytes], NamespaceKeys | None]  # a sealed store's keys by key id (Keyring.keys_by_id)


class Owner(enum.Enum):
    THIS = "this identity's"
    OTHER = "another identity's"
    UNKNOWN = "not known"


class ForeignChunksError(ModelMismatchError):
    """The chunks of a store were written by another model identity than its ``store.json`` names."""


@dataclass(frozen=True, slots=True)
class Ownership:
    """What a sample of a store's chunks showed: how many were judged, how many were the
    identity's and how many another's, and who wrote those, in words (as far as known)."""

    identity: ModelIdentity
    judged: int
    matching: int
    foreign: int
    writers: tuple[str, ...] = ()

    @property
    def is_foreign(self) -> bool:
        """Whether the store's chunks are another identity's: some were, and none was this one's."""
        return self.foreign > 0 and self.matching == 0

    def refusal(self, where: str) -> str:
        """Why a rebuild of the store at ``where`` stops, naming both identities."""
        writers = " or ".join(self.writers) or "another model"
        return (f"refusing to rebuild the store at {where}: these chunks were written by {writers}, not by model "
                f"{describe(self.identity)}, which its store.json names ({self.foreign} of the {self.judged} chunks "
                f"judged are another model's, none is store.json's). Nothing was changed; put back the store.json "
                f"of the model that wrote them")


def describe(identity: ModelIdentity) -> str:
    """An identity in one line: its model id, then what shapes its pages."""
    scheme = "" if identity.key_scheme == "tokens" else f", {identity.key_scheme} keys"
    return (f"{identity.model_id!r} ({identity.kv_dtype}, {identity.num_layers} layers, {identity.num_kv_heads} KV "
            f"heads, head dim {identity.head_dim}, page {identity.page_size}, TP rank {identity.tp_rank} of "
            f"{identity.tp_size}{scheme})")


def _layout(header: ChunkHeader) -> tuple:
    return header.dtype, header.shape, len(header.token_ids)


def _identity_layout(identity: ModelIdentity) -> tuple:
    return identity.kv_dtype, identity.page_shape, identity.ids_per_page


def _describe_layout(header: ChunkHeader) -> str:
    return f"a model whose KV pages are {header.dtype} of shape {header.shape} ({len(header.token_ids)} ids a page)"


class _Judge:
    """One judging: the reads made, and the first page's parent (the chain's root) found for each
    key walked, so the chunks after the first mostly find their answer on the way."""

    def __init__(self, payloads: PayloadStore, identity: ModelIdentity, keys_by_id: KeysById | None,
                 candidates: Sequence[ModelIdentity], max_reads: int):
        self.payloads = payloads.origin
        self.identity = identity
        self.keys_by_id = keys_by_id
        self.binding = store_binding(identity)
        self.candidates = [c for c in candidates if c != identity]
        self.max_reads = max_reads
        self.reads = 0
        self._roots: dict[bytes, bytes | None] = {}  # chunk key -> its chain's root (None: not found)

    def _read(self, key: bytes) -> memoryview | None:
        if self.reads >= self.max_reads:
            return None
        self.reads += 1
        try:
            return self.payloads.read(key, MAX_PAYLOAD_BYTES)
        except OSError:  # gone, too large, unreadable, storage down: not evidence (a rebuild says more)
            return None

    def _exists(self, key: bytes) -> bool:
        """Whether ``key`` is stored; True when the storage does not say (the walk then reads it,
        and a failed read leaves the chunk unknown, never another's)."""
        try:
            return self.payloads.exists(key)
        except OSError:
            return True

    def owner(self, key: bytes) -> tuple[Owner, str | None]:
        """Whose the chunk stored under ``key`` is, and (another's) who wrote it, in words."""
        data = self._read(key)
        if data is None:
            return Owner.UNKNOWN, None
        if is_sealed(data):
            return self._sealed_owner(key, data)
        header = self._header(key, data)
        if header is None:
            return Owner.UNKNOWN, None
        root = self._root(key, header)
        if _layout(header) != _identity_layout(self.identity):
            return Owner.OTHER, self._writer(header, root) or _describe_layout(header)
        if root is None:
            return Owner.UNKNOWN, None
        if root == root_key(self.identity, header.namespace):
            return Owner.THIS, None
        return Owner.OTHER, self._writer(header, root) or \
            "another model (their chains start at no root key of store.json's model)"

    @staticmethod
    def _header(key: bytes, data: memoryview) -> ChunkHeader | None:
        """The header of an unsealed chunk stored under its own key; None when it is not one."""
        try:
            header, _ = decode_header(data)
        except CorruptChunkError:
            return None
        return header if header.key == key else None

    def _root(self, key: bytes, header: ChunkHeader) -> bytes | None:
        """The parent of the first page of ``key``'s chain (a root key, or a page that is not
        stored), walking the parents' headers; None when the walk cannot finish."""
        walked: list[bytes] = [key]
        own_root = root_key(self.identity, header.namespace)
        parent = header.parent_key
        while True:
            if parent in self._roots:
                root = self._roots[parent]
                break
            if parent == own_root or not self._exists(parent):
                root = parent
                break
            data = self._read(parent)
            above = None if data is None or is_sealed(data) else self._header(parent, data)
            if above is None:
                root = None
                break
            walked.append(parent)
            parent = above.parent_key
        for k in walked:
            self._roots[k] = root
        return root

    def _writer(self, header: ChunkHeader, root: bytes | None) -> str | None:
        """The candidate identity whose root key for the chunk's namespace is ``root``."""
        for candidate in self.candidates:
            if root is not None and root == root_key(candidate, header.namespace):
                return f"model {describe(candidate)}"
        return None

    def _sealed_owner(self, key: bytes, data: memoryview) -> tuple[Owner, str | None]:
        """A sealed chunk opens with its namespace's key and the binding of the identity that wrote
        it: this one's, a candidate's, or (forged, or another's) none."""
        if self.keys_by_id is None:
            return Owner.UNKNOWN, None
        try:
            keys = self.keys_by_id(sealed_key_id(data))
        except (AuthenticationError, SealKeyError, DBAPIError):  # not a seal we read, a key row that does
            return Owner.UNKNOWN, None  # not open, an index that does not answer: nothing is known of the chunk
        if keys is None:  # a shredded namespace's leftover, or forged: no question of the model
            return Owner.UNKNOWN, None
        for binding, writer in [(self.binding, None),
                                *((store_binding(c), f"model {describe(c)}") for c in self.candidates)]:
            try:
                open_sealed(keys, key, binding, data)
            except AuthenticationError:
                continue
            return (Owner.THIS, None) if writer is None else (Owner.OTHER, writer)
        return Owner.OTHER, "another model (the sealed chunks do not open with store.json's identity)"


def judge(payloads: PayloadStore, identity: ModelIdentity, *, keys_by_id: KeysById | None = None,
          candidates: Iterable[ModelIdentity] = (), sample: int = SAMPLE_CHUNKS,
          max_reads: int = MAX_READS) -> Ownership:
    """Whose the first ``sample`` chunks of ``payloads``' listing are (see the module doc): the
    judging stops at the first of ``identity``'s. ``keys_by_id`` opens a sealed store's chunks
    (None: sealed chunks are not judged); ``candidates``, identities that may have written the
    others (the one an old index records), name them when one did. Reads only."""
    judge_ = _Judge(payloads, identity, keys_by_id, list(candidates), max_reads)
    judged = foreign = 0
    writers: list[str] = []
    try:
        keys = list(islice(payloads.keys(), sample))
    except OSError:  # a listing that fails (storage down): nothing known here; the rebuild says why
        keys = []
    for key in keys:
        owner, writer = judge_.owner(key)
        if owner is Owner.THIS:
            return Ownership(identity, judged + 1, 1, foreign, tuple(writers))
        if owner is Owner.OTHER:
            foreign += 1
            if writer is not None and writer not in writers:
                writers.append(writer)
        judged += owner is not Owner.UNKNOWN
    return Ownership(identity, judged, 0, foreign, tuple(writers[:3]))
