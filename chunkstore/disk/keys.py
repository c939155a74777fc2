"""Chunk keys: blake2b-256 hashes chained over a token prefix, one per full page.

Invariants: the encoding is unambiguous (every field is tagged and length-prefixed, the two hash
kinds use different personalisation strings), so distinct (identity, namespace, parent, tokens)
tuples never hash the same bytes; keys are identical across processes and machines (no Python
``hash()``, fixed byte order). The encoding is published with test vectors in docs/KEYS.md.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from chunkstore.disk.identity import ENGINE_KEY_BYTES, ModelIdentity

KEY_SIZE_BYTES = 32
DEFAULT_NAMESPACE = "default"

_ROOT_PERSON = b"chunkstore:root1"  # 16 bytes, blake2b personalisation
_PAGE_PERSON = b"chunkstore:page1"

# Field tags (part of the key format: never renumber).
TAG_MODEL_ID = 0x01
TAG_KV_DTYPE = 0x02
TAG_NUM_LAYERS = 0x03
TAG_NUM_KV_HEADS = 0x04
TAG_HEAD_DIM = 0x05
TAG_PAGE_SIZE = 0x06
TAG_LAYOUT_VERSION = 0x07
TAG_TP_RANK = 0x08
TAG_TP_SIZE = 0x09
TAG_NAMESPACE = 0x0A
TAG_KEY_SCHEME = 0x0B  # only in an "engine" identity's root: every "tokens" root stays as it was
TAG_PARENT = 0x10
TAG_TOKENS = 0x11


def _field(tag: int, value: bytes) -> bytes:
    return struct.pack(">BI", tag, len(value)) + value


def _uint_field(tag: int, value: int) -> bytes:
    return _field(tag, struct.pack(">Q", value))


def encode_tokens(token_ids: Iterable[int]) -> bytes:
    """Token ids as little-endian uint32; raises ValueError for ids outside [0, 2**32)."""
    arr = _token_array(token_ids)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def _token_array(token_ids: Iterable[int]) -> array:
    """Token ids as array("I"); raises ValueError outside [0, 2**32), TypeError for a non-integer."""
    if isinstance(token_ids, (bytes, bytearray, memoryview)):
        token_ids = list(token_ids)  # array() would take these as raw machine words, not as ids
    try:
        return array("I", token_ids)
    except OverflowError as exc:
        raise ValueError(f"token ids must be in [0, 2**32): {exc}") from None


def decode_tokens(data: bytes) -> tuple[int, ...]:
    if len(data) % 4:
        raise ValueError("token bytes are not a whole number of uint32")
    arr = array("I")
    arr.frombytes(data)
    if sys.byteorder != "little":
        arr.byteswap()
    return tuple(arr)


def root_key(identity: ModelIdentity, namespace: str = DEFAULT_NAMESPACE) -> bytes:
    """The parent of every first page: binds the model identity and the namespace."""
    h = hashlib.blake2b(digest_size=KEY_SIZE_BYTES, person=_ROOT_PERSON)
    h.update(_field(TAG_MODEL_ID, identity.model_id.encode()))
    h.update(_field(TAG_KV_DTYPE, identity.kv_dtype.encode()))
    h.update(_uint_field(TAG_NUM_LAYERS, identity.num_layers))
    h.update(_uint_field(TAG_NUM_KV_HEADS, identity.num_kv_heads))
    h.update(_uint_field(TAG_HEAD_DIM, identity.head_dim))
    h.update(_uint_field(TAG_PAGE_SIZE, identity.page_size))
    h.update(_uint_field(TAG_LAYOUT_VERSION, identity.layout_version))
    h.update(_uint_field(TAG_TP_RANK, identity.tp_rank))
    h.update(_uint_field(TAG_TP_SIZE, identity.tp_size))
    h.update(_field(TAG_NAMESPACE, namespace.encode()))
    if identity.key_scheme != "tokens":
        h.update(_field(TAG_KEY_SCHEME, identity.key_scheme.encode()))
    return h.digest()


def page_key(parent_key: bytes, token_bytes: bytes) -> bytes:
    """key(page) = H(parent key, tokens of the page); ``token_bytes`` from encode_tokens."""
    if len(parent_key) != KEY_SIZE_BYTES:
        raise ValueError(f"parent key must be {KEY_SIZE_BYTES} bytes, got {len(parent_key)}")
    h = hashlib.blake2b(digest_size=KEY_SIZE_BYTES, person=_PAGE_PERSON)
    h.update(_field(TAG_PARENT, parent_key))
    h.update(_field(TAG_TOKENS, token_bytes))
    return h.digest()


_PARENT_FIELD_HEAD = struct.pack(">BI", TAG_PARENT, KEY_SIZE_BYTES)


def chain_keys(parent_key: bytes, token_bytes: bytes, page_size: int) -> list[bytes]:
    """The chained keys of the whole pages in ``token_bytes`` (from encode_tokens), from
    ``parent_key`` on: ``page_key`` per page, hashed in one call each (the hot path of an insert).
    A trailing partial page is ignored."""
    if len(parent_key) != KEY_SIZE_BYTES:
        raise ValueError(f"parent key must be {KEY_SIZE_BYTES} bytes, got {len(parent_key)}")
    page_bytes = page_size * 4
    tokens_head = struct.pack(">BI", TAG_TOKENS, page_bytes)
    blake2b, keys, prev = hashlib.blake2b, [], parent_key
    for start in range(0, len(token_bytes) - page_bytes + 1, page_bytes):
        prev = blake2b(b"".join((_PARENT_FIELD_HEAD, prev, tokens_head, token_bytes[start:start + page_bytes])),
                       digest_size=KEY_SIZE_BYTES, person=_PAGE_PERSON).digest()
        keys.append(prev)
    return keys


@dataclass(frozen=True, slots=True)
class PageRef:
    """One full page of a prefix: its key, its parent's key and its token ids."""

    key: bytes
    parent_key: bytes
    token_ids: tuple[int, ...]
    namespace: str

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def chain_pages(
    identity: ModelIdentity,
    token_ids: Sequence[int],
    namespace: str = DEFAULT_NAMESPACE,
    parent_key: bytes | None = None,
) -> list[PageRef]:
    """Keys for every full page of ``token_ids`` (a trailing partial page is ignored).

    Raises ValueError for a token id of a full page outside [0, 2**32) and TypeError for one that
    is not an integer (Python, numpy or torch integers are accepted).

    ``parent_key`` continues a chain (the key of the page before ``token_ids[0]``); by default the
    chain starts at the root of (identity, namespace).
    """
    if identity.key_scheme != "tokens":
        raise ValueError(f"pages of a {identity.key_scheme!r}-keyed identity are named by engine_pages, not tokens")
    parent = root_key(identity, namespace) if parent_key is None else parent_key
    size = identity.page_size
    tokens = list(token_ids)
    usable = len(tokens) - len(tokens) % size
    # array("I") converts in C and, like operator.index, refuses floats (int(1.7) == 1 would give
    # a float token the key of another id) and ids outside [0, 2**32).
    arr = _token_array(tokens[:usable])
    whole = tuple(arr)
    if sys.byteorder != "little":
        arr.byteswap()
    keys = chain_keys(parent, arr.tobytes(), size)
    parents = [parent, *keys[:-1]]
    return [PageRef(key=k, parent_key=p, token_ids=whole[i * size : (i + 1) * size], namespace=namespace)
            for i, (k, p) in enumerate(zip(keys, parents))]


def engine_pages(identity: ModelIdentity, engine_keys: Sequence[bytes],
                 namespace: str = DEFAULT_NAMESPACE) -> list[PageRef]:
    """Pages named by an engine's own page keys (``identity.key_scheme == "engine"``), each
    standing alone: key(page) = H(root, engine key), the root binding the identity and the
    namespace, and the chunk header carries the engine key (as 8 uint32 ids), which every read
    compares. The engine's keys must cover their whole prefix themselves (SGLang's do: each hashes
    the previous one), so equal keys mean equal KV; a page needs no knowledge of the pages before
    it, which SGLang's copying interface never passes.

    Raises ValueError for a token-keyed identity or a key that is not 32 bytes.
    """
    if identity.key_scheme != "engine":
        raise ValueError("engine_pages needs an identity with key_scheme='engine'")
    root = root_key(identity, namespace)
    pages = []
    for engine_key in engine_keys:
        if len(engine_key) != ENGINE_KEY_BYTES:
            raise ValueError(f"an engine page key is {ENGINE_KEY_BYTES} bytes, got {len(engine_key)}")
        engine_key = bytes(engine_key)
        pages.append(PageRef(key=page_key(root, engine_key), parent_key=root, token_ids=decode_tokens(engine_key),
                             namespace=namespace))
    return pages
