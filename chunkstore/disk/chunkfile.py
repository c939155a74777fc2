"""The chunk file format: a self-describing, checksummed header followed by the encoded payload.

Invariants: a file is verifiable alone (header checksum, raw-bytes checksum, key = H(parent,
tokens)); parsing bounds every size before allocating; a chunk that fails any check raises
CorruptChunkError and is never returned. The byte layout is documented in docs/CHUNK_FORMAT.md.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import xxhash

from chunkstore.disk.codec import Codec, CorruptChunkError, EncodedPayload, Plane, PlaneCodec, check_planes, decode_into
from chunkstore.disk.identity import DTYPE_CODES, DTYPE_ITEMSIZE, DTYPE_NAMES
from chunkstore.disk.keys import KEY_SIZE_BYTES, decode_tokens, encode_tokens, page_key

MAGIC = b"CSKVCHNK"
FORMAT_VERSION = 1
CHECKSUM_SIZE_BYTES = 16
MAX_HEADER_BYTES = 1 << 20
MAX_NDIM = 8
MAX_RAW_BYTES = 1 << 32  # a page larger than this is corrupt whatever its header says
MAX_NAMESPACE_BYTES = 1024
_PREAMBLE = struct.Struct("<8sHI")  # magic, format version, header body length
_SIZES = struct.Struct("<BQ")


def raw_checksum(raw: np.ndarray | memoryview | bytes) -> bytes:
    return xxhash.xxh3_128_digest(raw)


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    key: bytes
    parent_key: bytes
    namespace: str
    token_ids: tuple[int, ...]
    dtype: str
    shape: tuple[int, ...]
    codec: Codec
    raw_size_bytes: int
    checksum: bytes
    planes: tuple[Plane, ...]

    @property
    def itemsize(self) -> int:
        return DTYPE_ITEMSIZE[self.dtype]

    @property
    def stored_size_bytes(self) -> int:
        return sum(p.stored_size_bytes for p in self.planes)


def max_header_bytes(num_tokens: int, num_planes: int) -> int:
    """The most bytes ``encode_header`` makes for a page of ``num_tokens`` tokens and ``num_planes``
    planes, whatever its namespace and shape (the writer leaves this much room before the payload)."""
    return (_PREAMBLE.size + 2 * KEY_SIZE_BYTES + 2 + MAX_NAMESPACE_BYTES + 4 + 4 * num_tokens + 2 + 4 * MAX_NDIM
            + _SIZES.size + CHECKSUM_SIZE_BYTES + 1 + _SIZES.size * num_planes + CHECKSUM_SIZE_BYTES)


def encode_header(h: ChunkHeader) -> bytes:
    """Raises ValueError for a header the reader would reject (the writer never makes one)."""
    ns = h.namespace.encode()
    if len(ns) > MAX_NAMESPACE_BYTES:
        raise ValueError(f"namespace of {len(ns)} bytes exceeds {MAX_NAMESPACE_BYTES}")
    if not 0 < len(h.shape) <= MAX_NDIM or not all(0 < d < 2**32 for d in h.shape):
        raise ValueError(f"shape {h.shape} is not 1-{MAX_NDIM} dimensions of 1 to 2**32-1")
    tokens = encode_tokens(h.token_ids)
    parts = [
        h.key, h.parent_key,
        struct.pack("<H", len(ns)), ns,
        struct.pack("<I", len(h.token_ids)), tokens,
        struct.pack("<BB", DTYPE_CODES[h.dtype], len(h.shape)),
        struct.pack(f"<{len(h.shape)}I", *h.shape),
        struct.pack("<BQ", h.codec.code, h.raw_size_bytes),
        h.checksum,
        struct.pack("<B", len(h.planes)),
        *(_SIZES.pack(int(p.codec), p.stored_size_bytes) for p in h.planes),
    ]
    body = b"".join(parts)
    preamble = _PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(body))
    return preamble + body + xxhash.xxh3_128_digest(preamble + body)


class _Reader:
    def __init__(self, data: memoryview):
        self.data = data
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise CorruptChunkError("header ends early")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str) -> tuple:
        s = struct.Struct(fmt)
        return s.unpack(self.take(s.size))


def decode_header(data: memoryview) -> tuple[ChunkHeader, int]:
    """Parse and check a header; returns it and the payload offset. Raises CorruptChunkError."""
    if len(data) < _PREAMBLE.size:
        raise CorruptChunkError("file shorter than the preamble")
    magic, version, body_len = _PREAMBLE.unpack(data[: _PREAMBLE.size])
    if magic != MAGIC:
        raise CorruptChunkError("bad magic")
    if version != FORMAT_VERSION:
        raise CorruptChunkError(f"unsupported format version {version}")
    if body_len > MAX_HEADER_BYTES:
        raise CorruptChunkError(f"header of {body_len} bytes exceeds {MAX_HEADER_BYTES}")
    end = _PREAMBLE.size + body_len
    if end + CHECKSUM_SIZE_BYTES > len(data):
        raise CorruptChunkError("file shorter than its header")
    if xxhash.xxh3_128_digest(data[:end]) != bytes(data[end : end + CHECKSUM_SIZE_BYTES]):
        raise CorruptChunkError("header checksum mismatch")
    r = _Reader(data[_PREAMBLE.size : end])
    key = bytes(r.take(KEY_SIZE_BYTES))
    parent = bytes(r.take(KEY_SIZE_BYTES))
    (ns_len,) = r.unpack("<H")
    try:
        namespace = bytes(r.take(ns_len)).decode()
    except UnicodeDecodeError:
        raise CorruptChunkError("namespace is not UTF-8") from None
    (num_tokens,) = r.unpack("<I")
    token_bytes = bytes(r.take(4 * num_tokens))
    dtype_code, ndim = r.unpack("<BB")
    if dtype_code not in DTYPE_NAMES:
        raise CorruptChunkError(f"unknown dtype code {dtype_code}")
    if not 0 < ndim <= MAX_NDIM:
        raise CorruptChunkError(f"bad ndim {ndim}")
    shape = r.unpack(f"<{ndim}I")
    codec_code, raw_size = r.unpack("<BQ")
    checksum = bytes(r.take(CHECKSUM_SIZE_BYTES))
    (num_planes,) = r.unpack("<B")
    planes = []
    for _ in range(num_planes):
        pc, stored = r.unpack("<BQ")
        if pc not in (0, 1):
            raise CorruptChunkError(f"unknown plane codec {pc}")
        planes.append(Plane(PlaneCodec(pc), stored))
    if r.pos != len(r.data):
        raise CorruptChunkError("trailing bytes in header")
    dtype = DTYPE_NAMES[dtype_code]
    expected = DTYPE_ITEMSIZE[dtype]
    for d in shape:
        expected *= d
    if expected != raw_size:
        raise CorruptChunkError(f"raw size {raw_size} disagrees with shape {shape} of {dtype}")
    if raw_size > MAX_RAW_BYTES:
        raise CorruptChunkError(f"raw size {raw_size} exceeds {MAX_RAW_BYTES}")
    if page_key(parent, token_bytes) != key:
        raise CorruptChunkError("key is not the hash of parent key and tokens")
    header = ChunkHeader(
        key=key, parent_key=parent, namespace=namespace, token_ids=decode_tokens(token_bytes),
        dtype=dtype, shape=tuple(shape), codec=Codec.from_code(codec_code), raw_size_bytes=raw_size,
        checksum=checksum, planes=tuple(planes),
    )
    return header, end + CHECKSUM_SIZE_BYTES


def make_header(key: bytes, parent_key: bytes, namespace: str, token_ids: tuple[int, ...], dtype: str,
                shape: tuple[int, ...], codec: Codec, raw: np.ndarray, payload: EncodedPayload) -> ChunkHeader:
    return ChunkHeader(
        key=key, parent_key=parent_key, namespace=namespace, token_ids=token_ids, dtype=dtype,
        shape=shape, codec=codec, raw_size_bytes=raw.nbytes, checksum=raw_checksum(raw),
        planes=payload.planes,
    )


def decode_chunk(data: memoryview, out: np.ndarray | None = None,
                 expect_dtype: str | None = None, expect_shape: tuple[int, ...] | None = None,
                 ) -> tuple[ChunkHeader, np.ndarray]:
    """Verify a whole chunk file and decode its payload into ``out`` (allocated when None).

    Checks the layout against ``expect_dtype``/``expect_shape`` before decompressing anything, and
    the raw checksum after. Raises CorruptChunkError; ``out`` holds garbage after a failure.
    """
    header, offset = decode_header(data)
    if expect_dtype is not None and header.dtype != expect_dtype:
        raise CorruptChunkError(f"dtype {header.dtype}, expected {expect_dtype}")
    if expect_shape is not None and header.shape != tuple(expect_shape):
        raise CorruptChunkError(f"shape {header.shape}, expected {tuple(expect_shape)}")
    check_planes(header.planes, header.codec, header.itemsize, header.raw_size_bytes, len(data) - offset)
    if out is None:
        out = np.empty(header.raw_size_bytes, dtype=np.uint8)
    elif out.nbytes != header.raw_size_bytes:
        raise CorruptChunkError(f"chunk holds {header.raw_size_bytes} bytes, destination {out.nbytes}")
    decode_into(data[offset:], header.planes, header.codec, header.itemsize, out)
    if raw_checksum(out) != header.checksum:
        raise CorruptChunkError("payload checksum mismatch")
    return header, out
