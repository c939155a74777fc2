"""Sealed chunks: the namespaces' keys, how they are wrapped, how a payload is sealed and opened,
and how a sealed store names its chunks. The byte layout is in docs/CHUNK_FORMAT.md, the naming
in docs/KEYS.md.

Invariants: a sealed payload is the chunk file (header and compressed planes, chunkfile.py)
encrypted and authenticated with AES-256-GCM under a key of its own, derived from the namespace's
data key and 16 random bytes (BLAKE2b keyed by the data key), with a random 12-byte nonce: a
(key, nonce) pair repeats only if 28 random bytes do, so nonces never repeat in practice however
many chunks a namespace seals (write-once keys would not suffice: two servers may compute
slightly different KV for one key). In clear: the magic, the format version, the namespace's key
id, the salt and the nonce; everything else is inside. The additional data binds the chunk's
stored name and the store's identity, so a body moved under another name, into another
namespace (another key) or another model's store fails to open. A stored name is a keyed hash
(BLAKE2b keyed by the namespace's naming key) of the page's public chain key, so names computed
from a guessed prompt without the key match nothing. A namespace's two keys are wrapped together
by the master key (AES-256-GCM, its namespace and key id in the additional data, so a row moved to
another namespace does not open). Pure computation: no I/O, no database.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from chunkstore.disk.codec import CorruptChunkError, thread_buffer
from chunkstore.disk.identity import ModelIdentity
from chunkstore.disk.keys import KEY_SIZE_BYTES
from chunkstore.disk.seal_keys import KEY_ID_BYTES, MasterKey, SealKeyError

SEAL_MAGIC = b"CSKVSEAL"
SEAL_VERSION = 1
SALT_BYTES = 16
NONCE_BYTES = 12
TAG_BYTES = 16
DATA_KEY_BYTES = 32
NAMING_KEY_BYTES = 32
_PREAMBLE = struct.Struct(f"<8sH{KEY_ID_BYTES}s{SALT_BYTES}s{NONCE_BYTES}s")  # 46 bytes, all in clear
PREAMBLE_BYTES = _PREAMBLE.size
SEAL_OVERHEAD_BYTES = PREAMBLE_BYTES + TAG_BYTES
_CHUNK_PERSON = b"chunkstore:seal1"  # BLAKE2b personalisations (16 bytes each)
_NAME_PERSON = b"chunkstore:name1"
_BINDING_PERSON = b"chunkstore:bind1"
_WRAP_AAD = b"chunkstore wrapped namespace keys v1"


class AuthenticationError(CorruptChunkError):
    """A sealed payload that does not open: forged, damaged, moved from another name, namespace or
    store, sealed under a key this store does not hold (a shredded namespace's), or not sealed at
    all in a sealed store. A security event: never served, quarantined, counted."""


def store_binding(identity: ModelIdentity) -> bytes:
    """What every sealed chunk of a store binds besides its name: a hash of the model identity
    (the fields of ``store.json``), so a chunk of one model never opens in another's store."""
    return hashlib.blake2b(identity.to_json().encode(), digest_size=32, person=_BINDING_PERSON).digest()


@dataclass(frozen=True, slots=True)
class NamespaceKeys:
    """One namespace's keys: ``key_id`` (public), ``data_key`` (seals its chunks) and
    ``naming_key`` (names them)."""

    namespace: str
    key_id: bytes
    data_key: bytes = field(repr=False)
    naming_key: bytes = field(repr=False)

    @classmethod
    def generate(cls, namespace: str) -> NamespaceKeys:
        return cls(namespace, os.urandom(KEY_ID_BYTES), os.urandom(DATA_KEY_BYTES), os.urandom(NAMING_KEY_BYTES))

    def name(self, key: bytes) -> bytes:
        """The stored name of a page whose public chain key is ``key`` (docs/KEYS.md)."""
        return hashlib.blake2b(key, digest_size=KEY_SIZE_BYTES, key=self.naming_key, person=_NAME_PERSON).digest()

    def chunk_key(self, salt: bytes) -> bytes:
        """The AES-256 key of the chunk whose salt is ``salt``."""
        return hashlib.blake2b(salt, digest_size=32, key=self.data_key, person=_CHUNK_PERSON).digest()


def _wrap_aad(master_key_id: str, key_id: bytes, namespace: str) -> bytes:
    ns = namespace.encode()
    return b"".join((_WRAP_AAD, master_key_id.encode(), key_id, struct.pack("<I", len(ns)), ns))


def wrap(master: MasterKey, keys: NamespaceKeys) -> bytes:
    """``keys``' secrets sealed by ``master`` (nonce, then ciphertext and tag)."""
    nonce = os.urandom(NONCE_BYTES)
    sealed = AESGCM(master.secret).encrypt(nonce, keys.data_key + keys.naming_key,
                                           _wrap_aad(master.key_id, keys.key_id, keys.namespace))
    return nonce + sealed


def unwrap(master: MasterKey, namespace: str, key_id: bytes, wrapped: bytes) -> NamespaceKeys:
    """The keys a ``wrap`` sealed. Raises SealKeyError when ``master`` does not open them (another
    master key, or a row altered or moved to another namespace)."""
    try:
        secrets_ = AESGCM(master.secret).decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:],
                                                 _wrap_aad(master.key_id, key_id, namespace))
    except (InvalidTag, ValueError):
        raise SealKeyError(f"the keys of namespace {namespace!r} (key id {key_id.hex()}) do not open with "
                           f"master key {master.key_id}: another key, or an altered index row") from None
    return NamespaceKeys(namespace, key_id, secrets_[:DATA_KEY_BYTES], secrets_[DATA_KEY_BYTES:])


def is_sealed(data: bytes | memoryview) -> bool:
    return bytes(data[:len(SEAL_MAGIC)]) == SEAL_MAGIC


def sealed_key_id(data: bytes | memoryview) -> bytes:
    """The key id a sealed payload names (in clear). Raises AuthenticationError for a payload
    that is not sealed, or in a format version this code does not read."""
    if len(data) < SEAL_OVERHEAD_BYTES or not is_sealed(data):
        raise AuthenticationError("not a sealed chunk (a sealed store reads sealed chunks only)")
    _, version, key_id, _, _ = _PREAMBLE.unpack(data[:PREAMBLE_BYTES])
    if version != SEAL_VERSION:
        raise AuthenticationError(f"sealed chunk of unknown format version {version}")
    return key_id


def seal(keys: NamespaceKeys, name: bytes, binding: bytes, segments: Sequence[bytes | memoryview]
         ) -> tuple[list[bytes | memoryview], int]:
    """The sealed payload of the chunk file ``segments`` stored under ``name``: its segments and
    size in bytes, in this thread's buffer, valid until this thread seals another (a payload
    store's ``stage`` takes its segments before it returns). A chunk file in one segment (the
    store's, page_io.encode_page) is sealed in one call; several are encrypted one after the other
    (GCM's streaming interface), never joined first (a join copied every byte once more). One
    call instead of a stream of four halved the set-up around the cipher in the store (70-90 µs a
    chunk to about 40), where every call runs with the caches compression left cold."""
    salt_nonce = os.urandom(SALT_BYTES + NONCE_BYTES)
    salt, nonce = salt_nonce[:SALT_BYTES], salt_nonce[SALT_BYTES:]
    head = _PREAMBLE.pack(SEAL_MAGIC, SEAL_VERSION, keys.key_id, salt, nonce)
    aad = head + name + binding
    if len(segments) == 1:
        size = len(memoryview(segments[0]).cast("B"))
        out = memoryview(thread_buffer("seal", size + TAG_BYTES))
        AESGCM(keys.chunk_key(salt)).encrypt_into(nonce, segments[0], aad, out)  # ciphertext, then tag
        return [head, out], len(head) + size + TAG_BYTES
    size = sum(len(memoryview(s).cast("B")) for s in segments)
    out = memoryview(thread_buffer("seal", size + TAG_BYTES + 15))  # update_into wants a block's slack after it
    encryptor = Cipher(algorithms.AES(keys.chunk_key(salt)), modes.GCM(nonce)).encryptor()
    encryptor.authenticate_additional_data(aad)
    pos = 0
    for segment in segments:
        pos += encryptor.update_into(segment, out[pos:])  # GCM is a stream mode: all of it, at once
    encryptor.finalize()
    out[pos:pos + TAG_BYTES] = encryptor.tag
    return [head, out[:pos + TAG_BYTES]], len(head) + pos + TAG_BYTES


def open_sealed(keys: NamespaceKeys, name: bytes, binding: bytes, data: bytes | memoryview) -> memoryview:
    """The chunk file inside the sealed payload ``data`` of ``name``, in a per-thread buffer valid
    until this thread opens another. Never decrypted where it lies: cryptography 51 refuses an
    output that overlaps its input. Raises AuthenticationError when it does not open."""
    key_id = sealed_key_id(data)
    if key_id != keys.key_id:
        raise AuthenticationError(f"sealed under key id {key_id.hex()}, not namespace {keys.namespace!r}'s")
    _, _, _, salt, nonce = _PREAMBLE.unpack(data[:PREAMBLE_BYTES])
    size = len(data) - SEAL_OVERHEAD_BYTES
    out = memoryview(thread_buffer("open", size))
    try:
        AESGCM(keys.chunk_key(salt)).decrypt_into(nonce, data[PREAMBLE_BYTES:],
                                                  bytes(data[:PREAMBLE_BYTES]) + name + binding, out)
    except InvalidTag:
        raise AuthenticationError("the sealed chunk does not authenticate (forged, damaged, or moved from "
                                  "another name, namespace or store)") from None
    return out
