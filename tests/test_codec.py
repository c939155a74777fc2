"""Payload codecs: bitwise round trips for every KV dtype and codec, and a decoder that checks every
declared size before it decompresses or allocates (no decompression bombs)."""

from __future__ import annotations

import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from chunkstore.disk.codec import (
    Codec, CorruptChunkError, EncodedPayload, Plane, PlaneCodec, check_planes, decode_into, encode, encode_into,
)

DTYPES = ("bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2")
KINDS = ("random", "kv", "zeros", "constant")
SHAPE = (2, 2, 16, 4, 32)  # (layers, K/V, page, kv heads, head dim): 8192 items
LARGE_SHAPE = (4, 2, 32, 8, 64)  # 131072 items: every byte plane is over the 128 KiB probe limit
INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
PROBE_BYTES = 64 * 1024


def make_page(dtype: str, kind: str, shape=SHAPE, seed: int = 0) -> torch.Tensor:
    """A page of KV: random bit patterns (NaNs and infinities included), KV-like values
    (randn times a per-channel scale), all zeros, or a constant."""
    torch_dtype = getattr(torch, dtype)
    g = torch.Generator().manual_seed(seed)
    numel = int(np.prod(shape))
    if kind == "random":
        itemsize = torch.empty((), dtype=torch_dtype).element_size()
        raw = torch.randint(0, 256, (numel * itemsize,), dtype=torch.uint8, generator=g)
        return raw.view(torch_dtype).reshape(shape)
    if kind == "kv":
        scale = torch.exp(torch.randn(shape[-1], generator=g))  # outlier channels, as in real KV
        return (torch.randn(shape, generator=g) * scale).to(torch_dtype)
    if kind == "zeros":
        return torch.zeros(shape, dtype=torch_dtype)
    return torch.full(shape, 1.5).to(torch_dtype)


def page_bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).reshape(-1).numpy()


def round_trip(raw: np.ndarray, itemsize: int, codec: Codec, level: int | None = None
               ) -> tuple[EncodedPayload, np.ndarray]:
    encoded = encode(raw, itemsize, codec, level)
    payload = b"".join(bytes(s) for s in encoded.segments)
    assert len(payload) == encoded.stored_size_bytes
    check_planes(encoded.planes, codec, itemsize, raw.nbytes, len(payload))
    out = np.full(raw.nbytes, 0xA5, dtype=np.uint8)  # not zeros: unwritten bytes must show
    decode_into(memoryview(payload), encoded.planes, codec, itemsize, out)
    return encoded, out


def assert_bitwise_equal(t: torch.Tensor, out: np.ndarray) -> None:
    assert out.tobytes() == page_bytes(t).tobytes()
    int_dtype = INT_VIEW[t.element_size()]
    decoded = torch.from_numpy(out.copy()).view(t.dtype).reshape(t.shape)
    assert torch.equal(decoded.view(int_dtype), t.view(int_dtype))


# -- round trips -----------------------------------------------------------------------------

@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_is_bitwise(dtype, kind, codec):
    t = make_page(dtype, kind)
    encoded, out = round_trip(page_bytes(t), t.element_size(), codec)
    assert_bitwise_equal(t, out)
    expected_planes = t.element_size() if codec is Codec.ZSTD_SPLIT else 1
    assert len(encoded.planes) == expected_planes
    if codec is Codec.NONE:
        assert encoded.planes == (Plane(PlaneCodec.RAW, out.nbytes),)
    elif kind in ("zeros", "constant"):
        assert all(p.codec is PlaneCodec.ZSTD for p in encoded.planes)
        assert encoded.stored_size_bytes < out.nbytes // 20
    elif kind == "random":  # nothing to gain: every plane falls back to raw
        assert all(p == Plane(PlaneCodec.RAW, out.nbytes // expected_planes) for p in encoded.planes)


@pytest.mark.parametrize("codec", [Codec.ZSTD, Codec.ZSTD_SPLIT])
@pytest.mark.parametrize("kind", ["random", "kv"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_of_planes_large_enough_to_probe(dtype, kind, codec):
    t = make_page(dtype, kind, LARGE_SHAPE, seed=1)
    _, out = round_trip(page_bytes(t), t.element_size(), codec)
    assert_bitwise_equal(t, out)


def test_split_stores_the_bf16_exponent_plane_compressed_and_the_mantissa_plane_raw():
    t = make_page("bfloat16", "kv", LARGE_SHAPE)
    encoded = encode(page_bytes(t), 2, Codec.ZSTD_SPLIT)
    low, high = encoded.planes
    assert low == Plane(PlaneCodec.RAW, t.numel())  # low mantissa byte: noise
    assert high.codec is PlaneCodec.ZSTD and high.stored_size_bytes < 0.8 * t.numel()
    # plane 0 is byte 0 of every item, stored as it is
    assert bytes(encoded.segments[0]) == page_bytes(t)[0::2].tobytes()


@pytest.mark.parametrize("level", [-5, 1, 3, 9])
@pytest.mark.parametrize("codec", [Codec.ZSTD, Codec.ZSTD_SPLIT])
@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e5m2", "float32"])
def test_round_trip_with_an_explicit_zstd_level(dtype, codec, level):
    for kind in ("kv", "zeros"):
        t = make_page(dtype, kind)
        _, out = round_trip(page_bytes(t), t.element_size(), codec, level)
        assert_bitwise_equal(t, out)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.sampled_from(list(Codec)), st.sampled_from([None, 1, -3]),
       st.binary(max_size=4096) | st.lists(st.sampled_from([0, 1, 255]), max_size=4096).map(bytes))
def test_round_trip_of_arbitrary_bytes(itemsize, codec, level, data):
    raw = np.frombuffer(data[: len(data) // itemsize * itemsize], dtype=np.uint8).copy()
    _, out = round_trip(raw, itemsize, codec, level)
    assert out.tobytes() == raw.tobytes()


def test_encode_and_decode_are_thread_safe():
    pages = [make_page(d, k, seed=i) for i, (d, k) in enumerate(
        [(d, k) for d in ("bfloat16", "float16", "float8_e4m3fn") for k in ("kv", "random")] * 3)]

    def work(t):
        encoded, out = round_trip(page_bytes(t), t.element_size(), Codec.ZSTD_SPLIT)
        return b"".join(bytes(s) for s in encoded.segments), out.tobytes()

    serial = [work(t) for t in pages]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(work, pages)) == serial
    assert all(out == page_bytes(t).tobytes() for t, (_, out) in zip(pages, serial))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float8_e4m3fn"])
@pytest.mark.parametrize("codec", list(Codec))
def test_encode_into_lays_the_planes_end_to_end_in_a_reused_buffer(dtype, codec):
    """The store's writer: one buffer for every page, each page's planes contiguous from its
    start (the chunk file is one segment), the same planes as ``encode``, whatever the buffer
    held before (a page stored after a larger or less compressible one)."""
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    out = np.full(4 * int(np.prod(LARGE_SHAPE)) + 64, 0xA5, dtype=np.uint8)
    for kind in ("random", "kv", "zeros", "kv"):
        raw = page_bytes(make_page(dtype, kind, LARGE_SHAPE))
        encoded = encode_into(raw, itemsize, codec, out)
        payload = b"".join(bytes(s) for s in encoded.segments)
        assert payload == bytes(memoryview(out)[:encoded.stored_size_bytes])  # end to end, from the start
        assert encoded.stored_size_bytes <= raw.nbytes
        assert encoded.planes == encode(raw, itemsize, codec).planes
        back = np.empty(raw.nbytes, dtype=np.uint8)
        decode_into(memoryview(payload), encoded.planes, codec, itemsize, back)
        assert back.tobytes() == raw.tobytes()
    with pytest.raises(ValueError, match="at least"):
        encode_into(raw, itemsize, codec, np.empty(raw.nbytes - 1, dtype=np.uint8))


# -- the probe: a plane over 128 KiB whose first 64 KiB save < 2% is stored raw ----------------

def _half_noise(size: int, noise_first: bool) -> np.ndarray:
    noise = np.random.default_rng(3).integers(0, 256, PROBE_BYTES, dtype=np.uint8)
    zeros = np.zeros(size - PROBE_BYTES, dtype=np.uint8)
    return np.concatenate([noise, zeros] if noise_first else [zeros, noise])


def test_a_plane_whose_probe_does_not_compress_is_stored_raw():
    raw = _half_noise(3 * PROBE_BYTES, noise_first=True)  # compressible overall, not its first 64 KiB
    encoded, out = round_trip(raw, 1, Codec.ZSTD_SPLIT)
    assert encoded.planes == (Plane(PlaneCodec.RAW, raw.nbytes),)
    assert out.tobytes() == raw.tobytes()
    # plain zstd does not probe, and neither does split for a plane of at most 128 KiB
    assert encode(raw, 1, Codec.ZSTD).planes[0].codec is PlaneCodec.ZSTD
    small = _half_noise(2 * PROBE_BYTES, noise_first=True)
    assert encode(small, 1, Codec.ZSTD_SPLIT).planes[0].codec is PlaneCodec.ZSTD


def test_a_plane_whose_probe_compresses_is_compressed_whole():
    raw = _half_noise(3 * PROBE_BYTES, noise_first=False)
    encoded, out = round_trip(raw, 1, Codec.ZSTD_SPLIT)
    (plane,) = encoded.planes
    assert plane.codec is PlaneCodec.ZSTD and plane.stored_size_bytes < raw.nbytes // 2
    assert out.tobytes() == raw.tobytes()


# -- encode's own checks and codec names -------------------------------------------------------

def test_encode_rejects_what_is_not_a_flat_byte_array():
    with pytest.raises(ValueError):
        encode(np.zeros(8, dtype=np.int16), 2, Codec.ZSTD)
    with pytest.raises(ValueError):
        encode(np.zeros((2, 4), dtype=np.uint8), 2, Codec.ZSTD)
    with pytest.raises(ValueError):
        encode(np.zeros(7, dtype=np.uint8), 2, Codec.ZSTD_SPLIT)


def test_parse_names_the_valid_codecs():
    assert [Codec.parse(c.value) for c in Codec] == list(Codec)
    with pytest.raises(ValueError) as info:
        Codec.parse("lz4")
    assert "lz4" in str(info.value)
    for c in Codec:
        assert c.value in str(info.value)


def test_codec_codes_round_trip_and_unknown_codes_are_corruption():
    assert [Codec.from_code(c.code) for c in Codec] == list(Codec)
    with pytest.raises(CorruptChunkError):
        Codec.from_code(3)
    assert Codec.default_for(2) is Codec.ZSTD_SPLIT and Codec.default_for(4) is Codec.ZSTD_SPLIT
    assert Codec.default_for(1) is Codec.ZSTD


# -- check_planes ----------------------------------------------------------------------------

PLANE = 8192  # bf16 page of 8192 items: two planes of 8192 bytes
GOOD = (Plane(PlaneCodec.RAW, PLANE), Plane(PlaneCodec.ZSTD, 3000))


def test_check_planes_accepts_a_table_that_fits():
    check_planes(GOOD, Codec.ZSTD_SPLIT, 2, 2 * PLANE, PLANE + 3000)
    check_planes((Plane(PlaneCodec.ZSTD, PLANE + 1023),), Codec.ZSTD, 2, PLANE, PLANE + 1023)
    check_planes((Plane(PlaneCodec.RAW, PLANE),), Codec.NONE, 2, PLANE, PLANE)


@pytest.mark.parametrize("planes, codec, raw_size, payload_size, match", [
    (GOOD[:1], Codec.ZSTD_SPLIT, 2 * PLANE, PLANE, "wants 2 planes"),
    (GOOD + (Plane(PlaneCodec.RAW, PLANE),), Codec.ZSTD_SPLIT, 2 * PLANE, 2 * PLANE + 3000, "wants 2 planes"),
    (GOOD, Codec.NONE, 2 * PLANE, PLANE + 3000, "wants 1 planes"),
    ((), Codec.ZSTD, 2 * PLANE, 0, "wants 1 planes"),
    (GOOD, Codec.ZSTD_SPLIT, 2 * PLANE, PLANE + 3001, "add up"),
    (GOOD, Codec.ZSTD_SPLIT, 2 * PLANE, PLANE + 2999, "add up"),
    ((Plane(PlaneCodec.RAW, PLANE - 1), GOOD[1]), Codec.ZSTD_SPLIT, 2 * PLANE, PLANE + 2999, "raw plane"),
    ((Plane(PlaneCodec.RAW, PLANE + 1), GOOD[1]), Codec.ZSTD_SPLIT, 2 * PLANE, PLANE + 3001, "raw plane"),
    ((Plane(PlaneCodec.RAW, PLANE),), Codec.NONE, PLANE + 1, PLANE, "raw plane"),
    ((GOOD[0], Plane(PlaneCodec.ZSTD, PLANE + 1024)), Codec.ZSTD_SPLIT, 2 * PLANE, 2 * PLANE + 1024,
     "zstd plane"),
    ((GOOD[0], Plane(PlaneCodec.ZSTD, 2**40)), Codec.ZSTD_SPLIT, 2 * PLANE, PLANE + 2**40, "zstd plane"),
    ((GOOD[0], Plane(PlaneCodec.ZSTD, 0)), Codec.ZSTD_SPLIT, 2 * PLANE, PLANE, "zstd plane"),
    ((Plane(PlaneCodec.ZSTD, 100),), Codec.NONE, PLANE, 100, "codec none"),
    (GOOD, Codec.ZSTD_SPLIT, 2 * PLANE - 1, PLANE + 3000, "whole number"),
])
def test_check_planes_rejects_a_table_that_does_not_fit(planes, codec, raw_size, payload_size, match):
    with pytest.raises(CorruptChunkError, match=match):
        check_planes(planes, codec, 2, raw_size, payload_size)


# -- decode_into: frames are checked before they are decompressed ------------------------------

BOMB_SIZE_BYTES = 100_000_000


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """A ~3 KB zstd frame that decompresses to 100 MB of zeros (built without holding 100 MB)."""
    c = zstandard.ZstdCompressor(level=1).compressobj(size=BOMB_SIZE_BYTES)
    block = bytes(1 << 20)
    parts = [c.compress(block) for _ in range(BOMB_SIZE_BYTES >> 20)]
    parts.append(c.compress(bytes(BOMB_SIZE_BYTES % (1 << 20))))
    parts.append(c.flush())
    frame = b"".join(parts)
    assert zstandard.frame_content_size(frame) == BOMB_SIZE_BYTES and len(frame) < 10_000
    return frame


def with_declared_size(frame: bytes, size: int) -> bytes:
    """``frame`` with the content size in its header rewritten (the blocks are left alone)."""
    descriptor = frame[4]
    single_segment = (descriptor >> 5) & 1
    start = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
    assert descriptor >> 6 == 2, "expected a 4-byte content size field"
    patched = frame[:start] + size.to_bytes(4, "little") + frame[start + 4 :]
    assert zstandard.frame_content_size(patched) == size
    return patched


def decode_bounded(payload: bytes, planes, codec: Codec, itemsize: int, out: np.ndarray) -> int:
    """decode_into under tracemalloc; returns the peak bytes allocated (it must raise)."""
    tracemalloc.start()
    try:
        with pytest.raises(CorruptChunkError):
            decode_into(memoryview(payload), planes, codec, itemsize, out)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_frame_declaring_100_mb_is_rejected_without_allocating_it(bomb):
    out = np.empty(PLANE, dtype=np.uint8)
    planes = (Plane(PlaneCodec.ZSTD, len(bomb)),)
    check_planes(planes, Codec.ZSTD, 1, PLANE, len(bomb))  # the plane table alone looks fine
    assert decode_bounded(bomb, planes, Codec.ZSTD, 1, out) < 4 << 20


def test_a_bomb_in_the_second_byte_plane_is_rejected(bomb):
    t = make_page("bfloat16", "kv")
    encoded = encode(page_bytes(t), 2, Codec.ZSTD_SPLIT)
    planes = (encoded.planes[0], Plane(PlaneCodec.ZSTD, len(bomb)))
    payload = bytes(encoded.segments[0]) + bomb
    check_planes(planes, Codec.ZSTD_SPLIT, 2, t.numel() * 2, len(payload))
    assert decode_bounded(payload, planes, Codec.ZSTD_SPLIT, 2, np.empty(t.numel() * 2, np.uint8)) < 4 << 20


def test_a_frame_that_lies_about_its_size_is_rejected(bomb):
    liar = with_declared_size(bomb, PLANE)  # declares one plane, holds 100 MB
    out = np.empty(PLANE, dtype=np.uint8)
    assert decode_bounded(liar, (Plane(PlaneCodec.ZSTD, len(liar)),), Codec.ZSTD, 1, out) < 4 << 20


def _zstd_plane_cases() -> dict[str, bytes]:
    data = page_bytes(make_page("float8_e4m3fn", "kv"))  # 8192 bytes, compressible
    frame = zstandard.ZstdCompressor().compress(data)
    return {
        "smaller declared size": zstandard.ZstdCompressor().compress(data[:100]),
        "no declared size": zstandard.ZstdCompressor(write_content_size=False).compress(data),
        "truncated frame": frame[:-3],
        "corrupt block": frame[:12] + bytes(b ^ 0xFF for b in frame[12:40]) + frame[40:],
        "not a frame": b"\x00" * 64,
    }


@pytest.mark.parametrize("case", sorted(_zstd_plane_cases()))
def test_a_bad_zstd_plane_is_corruption(case):
    seg = _zstd_plane_cases()[case]
    out = np.empty(PLANE, dtype=np.uint8)
    with pytest.raises(CorruptChunkError):
        decode_into(memoryview(seg), (Plane(PlaneCodec.ZSTD, len(seg)),), Codec.ZSTD, 1, out)


def test_a_frame_of_the_wrong_size_is_refused_by_its_header_before_it_is_decompressed(bomb):
    # Decompressing it would stop at the plane's size with "does not decode": "declares" comes
    # from the frame header's check, which runs first.
    out = np.empty(PLANE, dtype=np.uint8)
    with pytest.raises(CorruptChunkError, match="declares"):
        decode_into(memoryview(bomb), (Plane(PlaneCodec.ZSTD, len(bomb)),), Codec.ZSTD, 1, out)
