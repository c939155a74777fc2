"""Payload codecs for chunk files: `none`, `zstd`, and `zstd_split` (zstd over byte planes).

Invariants: decoding checks every declared size against the expected layout before it
decompresses or allocates anything (a corrupt or hostile header cannot cause a decompression bomb
or an oversized allocation); encode/decode are pure functions of their inputs (thread-safe); the
heavy work runs in zstd and numpy, which release the GIL, so a thread pool scales across cores.
"""

from __future__ import annotations

import enum
import sys
import threading
from dataclasses import dataclass

import numpy as np
import zstandard

from chunkstore.choices import Choice

# Byte planes of KV are order-0 sources: long matches are rare, so a small hash table and the
# longest minimum match keep zstd's fast strategy at level-1 ratio (~99% of the entropy bound,
# measured on bf16 KV) while compressing about twice as fast as plain level 1.
_KV_FAST_PARAMS = dict(
    window_log=17, hash_log=8, chain_log=6, search_log=1, min_match=7, target_length=0,
    strategy=zstandard.STRATEGY_FAST,
)
_PROBE_BYTES = 64 * 1024
_MIN_SAVING = 0.02  # a plane that compresses by less than this is stored raw


class CorruptChunkError(ValueError):
    """A chunk file (or payload) disagrees with its header, its checksum or what was asked for."""


class Codec(Choice):
    NONE = "none"
    ZSTD = "zstd"
    ZSTD_SPLIT = "zstd_split"

    @property
    def code(self) -> int:
        return _CODEC_CODES[self]

    @classmethod
    def from_code(cls, code: int) -> "Codec":
        for codec, c in _CODEC_CODES.items():
            if c == code:
                return codec
        raise CorruptChunkError(f"unknown codec code {code}")

    @classmethod
    def default_for(cls, itemsize: int) -> "Codec":
        """Byte planes for multi-byte values: measured on the small preset's KV, fp32 compresses to
        1.25x at 1.3 CPU s/GB this way against 1.15x at 2.0 with one zstd frame (bf16: 1.66x at 1.8
        against 1.38x at 3.8); one-byte values have one plane, so plain zstd."""
        return cls.ZSTD_SPLIT if itemsize >= 2 else cls.ZSTD


_CODEC_CODES = {Codec.NONE: 0, Codec.ZSTD: 1, Codec.ZSTD_SPLIT: 2}


class PlaneCodec(enum.IntEnum):
    RAW = 0
    ZSTD = 1


@dataclass(frozen=True, slots=True)
class Plane:
    codec: PlaneCodec
    stored_size_bytes: int


@dataclass(frozen=True, slots=True)
class EncodedPayload:
    planes: tuple[Plane, ...]
    segments: tuple[memoryview | bytes, ...]  # written in order after the header

    @property
    def stored_size_bytes(self) -> int:
        return sum(p.stored_size_bytes for p in self.planes)


_local = threading.local()


def _compressor(level: int | None) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    c = cache.get(level)
    if c is None:
        if level is None:
            params = zstandard.ZstdCompressionParameters(**_KV_FAST_PARAMS)
            c = zstandard.ZstdCompressor(compression_params=params)
        else:
            c = zstandard.ZstdCompressor(level=level)
        cache[level] = c
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "decompressor", None)
    if d is None:
        d = _local.decompressor = zstandard.ZstdDecompressor()
    return d


def _num_planes(codec: Codec, itemsize: int) -> int:
    return itemsize if codec is Codec.ZSTD_SPLIT else 1


def _compress_into(src: memoryview, level: int | None, dest: memoryview) -> int | None:
    """One zstd frame of ``src`` written at the start of ``dest``: its size, or None when it does
    not fit in ``dest`` (a frame no smaller than the plane: the plane is stored raw)."""
    reader = _compressor(level).stream_reader(src, size=len(src), read_size=len(src))
    got = 0
    while got < len(dest):
        n = reader.readinto(dest[got:])
        if n == 0:
            return got
        got += n
    return None


def _split_plane_into(raw: np.ndarray, itemsize: int, i: int, dest: np.ndarray) -> None:
    """Byte ``i`` of every item of ``raw`` (plane i) into ``dest``."""
    if itemsize == 2 and _LITTLE_ENDIAN:  # shifts and masks beat a strided copy by ~2x
        words = raw.view(np.uint16)
        if i == 0:
            np.bitwise_and(words, 0xFF, out=dest, casting="unsafe")
        else:
            np.right_shift(words, 8, out=dest, casting="unsafe")
    else:
        np.copyto(dest, raw.reshape(-1, itemsize)[:, i])


def thread_buffer(name: str, size: int) -> np.ndarray:
    """This thread's buffer ``name`` (1-D uint8), its first ``size`` bytes, kept for the thread's
    next use: a fresh buffer per page paid its page faults (and a bytearray its zeroing) on every
    page, about as much as the cipher itself. It grows with a quarter to spare: pages of one model
    differ in size by a few bytes, and a buffer grown to each new largest was made again on about
    one page in twenty. What it holds is valid until this thread asks for ``name`` again."""
    buf = getattr(_local, name, None)
    if buf is None or buf.nbytes < size:
        buf = np.empty(size + size // 4, dtype=np.uint8)
        setattr(_local, name, buf)
    return buf[:size]


def encode(raw: np.ndarray, itemsize: int, codec: Codec, level: int | None = None) -> EncodedPayload:
    """Encode ``raw`` (1-D uint8, the page's bytes in memory order) into a new buffer.

    ``level`` None uses the KV-tuned fast parameters; an int uses that zstd level. Codec none
    returns ``raw`` itself as its segment: write it before ``raw`` changes.
    """
    _check_raw(raw, itemsize, codec)
    if codec is Codec.NONE:
        return EncodedPayload((Plane(PlaneCodec.RAW, raw.nbytes),), (memoryview(raw),))
    return encode_into(raw, itemsize, codec, np.empty(raw.nbytes, dtype=np.uint8), level)


def encode_into(raw: np.ndarray, itemsize: int, codec: Codec, out: np.ndarray,
                level: int | None = None) -> EncodedPayload:
    """Encode ``raw`` as ``encode`` does, its planes one after the other from the start of ``out``
    (1-D uint8 of at least ``raw.nbytes``: a plane that would not shrink is stored raw, so a
    payload is never larger than its page); the segments are views of ``out``, end to end, so a
    writer can keep the whole chunk file in one buffer (page_io.encode_page) and seal it in one
    call. A plane stored raw is split straight into ``out``; one to compress is split into this
    thread's scratch and compressed from there into ``out``: no plane is copied twice."""
    _check_raw(raw, itemsize, codec)
    if out.dtype != np.uint8 or out.ndim != 1 or out.nbytes < raw.nbytes:
        raise ValueError(f"out must be 1-D uint8 of at least {raw.nbytes} bytes")
    view = memoryview(out)
    if codec is Codec.NONE:
        out[:raw.nbytes] = raw
        return EncodedPayload((Plane(PlaneCodec.RAW, raw.nbytes),), (view[:raw.nbytes],))
    num_planes = _num_planes(codec, itemsize)
    plane_bytes = raw.nbytes // num_planes
    probe = codec is Codec.ZSTD_SPLIT and plane_bytes > 2 * _PROBE_BYTES
    planes, segments, pos = [], [], 0
    for i in range(num_planes):
        dest = out[pos:pos + plane_bytes]
        if probe and _poor_sample(raw, itemsize, i, level):
            _split_plane_into(raw, itemsize, i, dest)
            src = None  # stored raw, in place
        elif num_planes == 1:
            src = raw
        else:
            src = thread_buffer("plane", plane_bytes)
            _split_plane_into(raw, itemsize, i, src)
        size = None if src is None else _compress_into(memoryview(src), level, view[pos:pos + plane_bytes])
        if size is None:
            if src is not None:
                dest[:] = src
            planes.append(Plane(PlaneCodec.RAW, plane_bytes))
            size = plane_bytes
        else:
            planes.append(Plane(PlaneCodec.ZSTD, size))
        segments.append(view[pos:pos + size])
        pos += size
    return EncodedPayload(tuple(planes), tuple(segments))


def _poor_sample(raw: np.ndarray, itemsize: int, i: int, level: int | None) -> bool:
    """Whether plane i's first _PROBE_BYTES compress by less than _MIN_SAVING (noise, such as a
    mantissa's low byte: the whole plane is stored raw, never compressed)."""
    sample = thread_buffer("sample", _PROBE_BYTES)
    _split_plane_into(raw[:_PROBE_BYTES * itemsize], itemsize, i, sample)
    return len(_compressor(level).compress(memoryview(sample))) > (1 - _MIN_SAVING) * _PROBE_BYTES


def _check_raw(raw: np.ndarray, itemsize: int, codec: Codec) -> None:
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise ValueError("encode takes a 1-D uint8 array")
    if codec is Codec.ZSTD_SPLIT and raw.nbytes % itemsize:
        raise ValueError(f"{raw.nbytes} bytes is not a whole number of {itemsize}-byte items")


_LITTLE_ENDIAN = sys.byteorder == "little"


def check_planes(planes: tuple[Plane, ...], codec: Codec, itemsize: int, raw_size_bytes: int,
                 payload_size_bytes: int) -> None:
    """Raise CorruptChunkError unless the plane table fits the layout and the payload length."""
    n = _num_planes(codec, itemsize)
    if len(planes) != n:
        raise CorruptChunkError(f"codec {codec.value} wants {n} planes, header has {len(planes)}")
    if raw_size_bytes % n:
        raise CorruptChunkError("raw size is not a whole number of items")
    plane_size = raw_size_bytes // n
    total = 0
    for p in planes:
        if p.codec is PlaneCodec.RAW and p.stored_size_bytes != plane_size:
            raise CorruptChunkError(f"raw plane of {p.stored_size_bytes} bytes, expected {plane_size}")
        if p.codec is PlaneCodec.ZSTD and not 0 < p.stored_size_bytes < plane_size + 1024:
            raise CorruptChunkError(f"zstd plane of {p.stored_size_bytes} bytes for {plane_size} raw")
        if codec is Codec.NONE and p.codec is not PlaneCodec.RAW:
            raise CorruptChunkError("codec none with a compressed plane")
        total += p.stored_size_bytes
    if total != payload_size_bytes:
        raise CorruptChunkError(f"planes add up to {total} bytes, payload has {payload_size_bytes}")


def decode_into(payload: memoryview, planes: tuple[Plane, ...], codec: Codec, itemsize: int,
                out: np.ndarray) -> None:
    """Decode ``payload`` into ``out`` (1-D uint8 of the raw size). Raises CorruptChunkError.

    Call check_planes first; this re-checks every zstd frame's declared content size before
    decompressing it.
    """
    n = len(planes)
    plane_size = out.nbytes // n
    sources = [_plane_source(seg, p, plane_size) for seg, p in zip(_segments(payload, planes), planes)]
    if n == 1:
        out[:] = sources[0]
    elif n == 2 and _LITTLE_ENDIAN:  # out = hi << 8 | lo, in two vector passes
        words = out.view(np.uint16)
        np.left_shift(sources[1], 8, out=words, dtype=np.uint16)
        np.bitwise_or(words, sources[0], out=words)
    else:
        grid = out.reshape(-1, n)
        for i, src in enumerate(sources):
            grid[:, i] = src


def _segments(payload: memoryview, planes: tuple[Plane, ...]) -> list[memoryview]:
    out, offset = [], 0
    for p in planes:
        out.append(payload[offset : offset + p.stored_size_bytes])
        offset += p.stored_size_bytes
    return out


def _plane_source(seg: memoryview, p: Plane, plane_size: int) -> np.ndarray:
    if p.codec is PlaneCodec.RAW:
        return np.frombuffer(seg, dtype=np.uint8)
    try:
        declared = zstandard.frame_content_size(seg)
    except zstandard.ZstdError as exc:
        raise CorruptChunkError(f"bad zstd frame: {exc}") from None
    if declared != plane_size:
        raise CorruptChunkError(f"zstd frame declares {declared} bytes, expected {plane_size}")
    try:
        data = _decompressor().decompress(seg, max_output_size=plane_size, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise CorruptChunkError(f"zstd frame does not decode: {exc}") from None
    if len(data) != plane_size:
        raise CorruptChunkError("zstd frame decoded to the wrong size")
    return np.frombuffer(data, dtype=np.uint8)
