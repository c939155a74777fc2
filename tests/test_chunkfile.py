"""Chunk files: header round trips, the documented byte layout, and detection of every class of
single-byte corruption (bit flips, overwrites, truncation) and of forged headers."""

from __future__ import annotations

import dataclasses
import struct
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import xxhash
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from chunkstore.disk import chunkfile
from chunkstore.disk import codec as codec_module
from chunkstore.disk.chunkfile import (
    FORMAT_VERSION, MAGIC, MAX_HEADER_BYTES, MAX_NAMESPACE_BYTES, MAX_NDIM, ChunkHeader, decode_chunk, decode_header,
    encode_header, make_header, max_header_bytes,
)
from chunkstore.disk.codec import Codec, CorruptChunkError, Plane, PlaneCodec, encode
from chunkstore.disk.identity import DTYPE_CODES, DTYPE_ITEMSIZE
from chunkstore.disk.keys import encode_tokens, page_key

DOC = Path(__file__).resolve().parents[1] / "docs" / "CHUNK_FORMAT.md"
SHAPE = (2, 2, 16, 4, 32)  # 8192 items
PARENT = bytes(range(32))
TOKENS = tuple(range(1000, 1016))


def make_page(dtype: str, kind: str = "kv", shape=SHAPE, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "zeros":
        return torch.zeros(shape, dtype=getattr(torch, dtype))
    scale = torch.exp(torch.randn(shape[-1], generator=g))
    return (torch.randn(shape, generator=g) * scale).to(getattr(torch, dtype))


@dataclass(frozen=True)
class Chunk:
    data: bytes
    raw: bytes
    header: ChunkHeader
    payload_offset: int


def build_chunk(dtype: str = "bfloat16", codec: Codec = Codec.ZSTD_SPLIT, kind: str = "kv",
                shape=SHAPE, namespace: str = "tenant-a", tokens=TOKENS, parent: bytes = PARENT) -> Chunk:
    raw = make_page(dtype, kind, shape).view(torch.uint8).reshape(-1).numpy()
    payload = encode(raw, DTYPE_ITEMSIZE[dtype], codec)
    key = page_key(parent, encode_tokens(tokens))
    header = make_header(key, parent, namespace, tuple(tokens), dtype, tuple(shape), codec, raw, payload)
    head = encode_header(header)
    data = head + b"".join(bytes(s) for s in payload.segments)
    return Chunk(data=data, raw=raw.tobytes(), header=header, payload_offset=len(head))


def decode(data: bytes, **kwargs):
    return decode_chunk(memoryview(data), **kwargs)


def reheader(chunk: Chunk, **changes) -> bytes:
    """The chunk with header fields replaced and a valid header checksum (a forged file)."""
    return encode_header(dataclasses.replace(chunk.header, **changes)) + chunk.data[chunk.payload_offset :]


# -- a reader written from docs/CHUNK_FORMAT.md ------------------------------------------------

def parse_layout(data: bytes) -> dict[str, tuple[int, int, object]]:
    """Field name -> (offset, size, value), read by the documented layout."""
    fields: dict[str, tuple[int, int, object]] = {}
    pos = 0

    def take(name: str, size: int, fmt: str | None = None):
        nonlocal pos
        raw = data[pos : pos + size]
        assert len(raw) == size
        value = struct.unpack("<" + fmt, raw)[0] if fmt else raw
        fields[name] = (pos, size, value)
        pos += size
        return value

    take("magic", 8)
    take("version", 2, "H")
    body_length = take("body_length", 4, "I")
    take("key", 32)
    take("parent", 32)
    take("namespace", take("namespace_length", 2, "H"))
    take("token_ids", 4 * take("num_tokens", 4, "I"))
    take("dtype_code", 1, "B")
    take("shape", 4 * take("ndim", 1, "B"))
    take("codec_code", 1, "B")
    take("raw_size", 8, "Q")
    take("raw_checksum", 16)
    for i in range(take("num_planes", 1, "B")):
        take(f"plane{i}_codec", 1, "B")
        take(f"plane{i}_size", 8, "Q")
    assert pos == 14 + body_length
    take("header_checksum", 16)
    fields["payload"] = (pos, len(data) - pos, data[pos:])
    return fields


def forge(data: bytes, **changes: bytes) -> bytes:
    """Replace raw header fields (by the documented layout), fix the body length unless it is one
    of the changes, and recompute the header checksum."""
    layout = parse_layout(data)
    end = layout["header_checksum"][0]
    head = bytearray(data[:end])
    for name, new in sorted(changes.items(), key=lambda kv: -layout[kv[0]][0]):
        offset, size, _ = layout[name]
        head[offset : offset + size] = new
    if "body_length" not in changes:
        head[10:14] = struct.pack("<I", len(head) - 14)
    return bytes(head) + xxhash.xxh3_128_digest(bytes(head)) + data[end + 16 :]


def doc_table(first_header_cell: str) -> list[list[str]]:
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header_cell} "))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
    return rows


def test_layout_matches_the_doc():
    chunk = build_chunk()
    fields = parse_layout(chunk.data)
    h = chunk.header
    assert fields["magic"][2] == b"CSKVCHNK" == MAGIC
    assert fields["version"][2] == 1 == FORMAT_VERSION
    assert fields["key"][2] == h.key and fields["parent"][2] == h.parent_key
    assert fields["namespace"][2] == h.namespace.encode()
    assert fields["token_ids"][2] == encode_tokens(h.token_ids)
    assert fields["dtype_code"][2] == DTYPE_CODES[h.dtype]
    assert struct.unpack(f"<{len(h.shape)}I", fields["shape"][2]) == h.shape
    assert fields["codec_code"][2] == h.codec.code
    assert fields["raw_size"][2] == h.raw_size_bytes == len(chunk.raw)
    assert fields["raw_checksum"][2] == xxhash.xxh3_128_digest(chunk.raw)
    assert [(fields[f"plane{i}_codec"][2], fields[f"plane{i}_size"][2]) for i in range(len(h.planes))] == [
        (int(p.codec), p.stored_size_bytes) for p in h.planes]
    end = fields["header_checksum"][0]
    assert fields["header_checksum"][2] == xxhash.xxh3_128_digest(chunk.data[:end])
    assert fields["payload"][0] == chunk.payload_offset and fields["payload"][1] == h.stored_size_bytes


def test_code_tables_and_limits_match_the_doc():
    assert {name: (int(code), int(size)) for code, name, size in doc_table("dtype code")} == {
        name: (code, DTYPE_ITEMSIZE[name]) for name, code in DTYPE_CODES.items()}
    assert {name: int(code) for code, name, _ in doc_table("codec code")} == {c.value: c.code for c in Codec}
    assert {int(code) for code, _ in doc_table("plane codec")} == {int(p) for p in PlaneCodec}
    text = DOC.read_text(encoding="utf-8")
    assert f"at most 1 MiB ({MAX_HEADER_BYTES})" in text and f"1..{chunkfile.MAX_NDIM}" in text
    assert codec_module._PROBE_BYTES == 64 * 1024 and "first 64 KiB" in text
    assert codec_module._MIN_SAVING == 0.02 and "less than 2%" in text


# -- round trips -----------------------------------------------------------------------------

@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2", "uint8"])
def test_round_trip_through_a_file(tmp_path, dtype, codec):
    if dtype == "uint8":
        chunk = build_chunk("float8_e5m2", codec)
        chunk = dataclasses.replace(chunk, header=dataclasses.replace(chunk.header, dtype="uint8"))
        chunk = dataclasses.replace(chunk, data=reheader(chunk))
    else:
        chunk = build_chunk(dtype, codec)
    path = tmp_path / chunk.header.key.hex()
    path.write_bytes(chunk.data)
    data = path.read_bytes()
    header, offset = decode_header(memoryview(data))
    assert header == chunk.header and offset == chunk.payload_offset
    header, out = decode(data, expect_dtype=dtype, expect_shape=list(SHAPE))
    assert header == chunk.header and out.dtype == np.uint8 and out.tobytes() == chunk.raw
    dest = np.zeros(len(chunk.raw), dtype=np.uint8)
    _, out = decode(data, out=dest)
    assert out is dest and dest.tobytes() == chunk.raw


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(["bfloat16", "float16", "float32", "float8_e4m3fn"]), st.sampled_from(list(Codec)),
       st.sampled_from(["kv", "zeros"]), st.text(max_size=20),
       st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=16),
       st.binary(min_size=32, max_size=32))
def test_round_trip_of_any_header(dtype, codec, kind, namespace, tokens, parent):
    chunk = build_chunk(dtype, codec, kind, (1, 2, 4, 2, 8), namespace, tuple(tokens), parent)
    header, out = decode(chunk.data, expect_dtype=dtype, expect_shape=(1, 2, 4, 2, 8))
    assert header == chunk.header and out.tobytes() == chunk.raw


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=MAX_NAMESPACE_BYTES // 4),  # at most 4 bytes a character in UTF-8
       st.integers(1, 64), st.integers(1, 8), st.sampled_from([1, 2, 4]))
def test_max_header_bytes_bounds_every_header(namespace, num_tokens, ndim, num_planes):
    header = ChunkHeader(key=b"k" * 32, parent_key=b"p" * 32, namespace=namespace, token_ids=(2**32 - 1,) * num_tokens,
                         dtype="float32", shape=(3,) * ndim, codec=Codec.ZSTD_SPLIT, raw_size_bytes=4 * 3**ndim,
                         checksum=b"c" * 16, planes=(Plane(PlaneCodec.ZSTD, 2**40),) * num_planes)
    assert len(encode_header(header)) <= max_header_bytes(num_tokens, num_planes)
    longest = dataclasses.replace(header, namespace="n" * MAX_NAMESPACE_BYTES, shape=(3,) * MAX_NDIM)
    assert len(encode_header(longest)) == max_header_bytes(num_tokens, num_planes)  # the bound is tight


def test_a_destination_of_the_wrong_size_is_refused():
    chunk = build_chunk()
    with pytest.raises(CorruptChunkError, match="destination"):
        decode(chunk.data, out=np.empty(len(chunk.raw) - 2, dtype=np.uint8))


# -- single-byte corruption ------------------------------------------------------------------

@pytest.fixture(scope="module")
def chunks() -> dict[str, Chunk]:
    out = {
        "bf16 split": build_chunk("bfloat16", Codec.ZSTD_SPLIT),  # a raw plane and a zstd plane
        "fp32 none": build_chunk("float32", Codec.NONE, shape=(2, 2, 16, 2, 16)),
        "fp8 zstd": build_chunk("float8_e4m3fn", Codec.ZSTD),
    }
    assert [p.codec for p in out["bf16 split"].header.planes] == [PlaneCodec.RAW, PlaneCodec.ZSTD]
    assert [p.codec for p in out["fp8 zstd"].header.planes] == [PlaneCodec.ZSTD]
    return out


def plane_of(chunk: Chunk, offset: int) -> Plane | None:
    """The plane that byte ``offset`` of the file belongs to (None inside the header)."""
    start = chunk.payload_offset
    for plane in chunk.header.planes:
        if start <= offset < start + plane.stored_size_bytes:
            return plane
        start += plane.stored_size_bytes
    return None


def payload_sample(chunk: Chunk, n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    offsets = set(rng.integers(chunk.payload_offset, len(chunk.data), n).tolist())
    start = chunk.payload_offset
    for plane in chunk.header.planes:  # both ends of every plane
        offsets |= {start, start + plane.stored_size_bytes - 1}
        start += plane.stored_size_bytes
    return sorted(offsets)


def check_corruption(chunk: Chunk, offsets: list[int], corrupt) -> None:
    """Every corrupted copy must raise CorruptChunkError, except that a few bits of a zstd frame do
    not affect its output: those copies must decode to exactly the original bytes."""
    harmless, zstd_offsets = [], 0
    for offset in offsets:
        data = bytearray(chunk.data)
        data[offset] = corrupt(data[offset], offset)
        if data == chunk.data:
            continue
        plane = plane_of(chunk, offset)
        zstd_offsets += plane is not None and plane.codec is PlaneCodec.ZSTD
        try:
            _, out = decode(bytes(data), expect_dtype=chunk.header.dtype, expect_shape=chunk.header.shape)
        except CorruptChunkError:
            continue
        assert plane is not None and plane.codec is PlaneCodec.ZSTD, f"undetected change at byte {offset}"
        assert out.tobytes() == chunk.raw, f"byte {offset} changed the data and was not detected"
        harmless.append(offset)
    assert len(harmless) <= max(2, zstd_offsets // 20)


@pytest.mark.parametrize("name", ["bf16 split", "fp32 none", "fp8 zstd"])
def test_a_bit_flip_anywhere_in_the_header_is_detected(chunks, name):
    chunk = chunks[name]
    offsets = list(range(chunk.payload_offset))
    for bit in (0, 3, 7):
        check_corruption(chunk, offsets, lambda b, off: b ^ (1 << ((off + bit) % 8)))


@pytest.mark.parametrize("name", ["bf16 split", "fp32 none", "fp8 zstd"])
def test_a_bit_flip_in_the_payload_is_detected(chunks, name):
    chunk = chunks[name]
    check_corruption(chunk, payload_sample(chunk, 150, seed=1), lambda b, off: b ^ (1 << (off % 8)))


@pytest.mark.parametrize("value", [0x00, 0xFF, 0x5A])
@pytest.mark.parametrize("name", ["bf16 split", "fp32 none", "fp8 zstd"])
def test_an_overwritten_byte_is_detected(chunks, name, value):
    chunk = chunks[name]
    offsets = list(range(0, chunk.payload_offset, 3)) + payload_sample(chunk, 60, seed=value)
    check_corruption(chunk, offsets, lambda b, off: value)


@pytest.mark.parametrize("name", ["bf16 split", "fp32 none", "fp8 zstd"])
def test_truncation_at_any_length_is_detected(chunks, name):
    chunk = chunks[name]
    rng = np.random.default_rng(5)
    lengths = set(range(chunk.payload_offset + 40)) | set(rng.integers(0, len(chunk.data), 100).tolist())
    lengths.add(len(chunk.data) - 1)
    for length in sorted(lengths):
        with pytest.raises(CorruptChunkError):
            decode(chunk.data[:length])


@pytest.mark.parametrize("extra", [b"\x00", b"\x28\xb5\x2f\xfd", bytes(4096)])
def test_bytes_after_the_payload_are_detected(chunks, extra):
    with pytest.raises(CorruptChunkError, match="add up"):
        decode(chunks["bf16 split"].data + extra)


# -- forged headers: the header checksum is valid, the content is not ------------------------

def test_forging_helpers_reproduce_the_original(chunks):
    chunk = chunks["bf16 split"]
    assert reheader(chunk) == chunk.data and forge(chunk.data) == chunk.data


@pytest.mark.parametrize("changes", [
    {"key": bytes(32)},
    {"parent_key": bytes(32)},
    {"token_ids": TOKENS[:-1] + (TOKENS[-1] + 1,)},
    {"token_ids": TOKENS[:-1]},
    {"token_ids": TOKENS + (0,)},
], ids=["key", "parent", "token changed", "token dropped", "token added"])
def test_a_key_that_is_not_the_hash_of_parent_and_tokens_is_detected(chunks, changes):
    with pytest.raises(CorruptChunkError, match="key is not the hash"):
        decode(reheader(chunks["bf16 split"], **changes))


def test_a_wrong_raw_checksum_is_detected(chunks):
    for chunk in chunks.values():
        forged = reheader(chunk, checksum=xxhash.xxh3_128_digest(b"other"))
        with pytest.raises(CorruptChunkError, match="payload checksum"):
            decode(forged)


@pytest.mark.parametrize("raw_size", [0, 2 * 8192 - 2, 2 * 8192 + 2, 4 * 8192])
def test_a_raw_size_that_disagrees_with_the_shape_is_detected(chunks, raw_size):
    with pytest.raises(CorruptChunkError, match="disagrees with shape"):
        decode(reheader(chunks["bf16 split"], raw_size_bytes=raw_size))


def _refuse(*args, **kwargs):
    raise AssertionError("decoded a payload that should have been refused from its header")


@pytest.mark.parametrize("changes, expect, match", [
    ({"shape": (2, 2, 16, 32, 4)}, {}, "shape"),
    ({"dtype": "float16"}, {}, "dtype"),
    ({}, {"expect_shape": (2, 2, 8, 4, 32)}, "shape"),
    ({}, {"expect_dtype": "float16"}, "dtype"),
    # a forged page of 2**50 bytes: refused before anything is allocated for it
    ({"shape": (2**16, 2**16, 2**16, 2, 2), "raw_size_bytes": 2**51}, {}, "shape|exceeds"),
], ids=["shape", "dtype", "expected shape", "expected dtype", "huge shape"])
def test_a_layout_other_than_the_expected_one_is_refused_before_decoding(chunks, monkeypatch, changes,
                                                                         expect, match):
    data = reheader(chunks["bf16 split"], **changes)
    monkeypatch.setattr(chunkfile, "decode_into", _refuse)
    kwargs = {"expect_dtype": "bfloat16", "expect_shape": SHAPE, **expect}
    with pytest.raises(CorruptChunkError, match=match):
        decode(data, **kwargs)


@pytest.mark.parametrize("changes, match", [
    ({"codec": Codec.NONE}, "wants 1 planes"),
    ({"codec": Codec.ZSTD}, "wants 1 planes"),
    ({"planes": (Plane(PlaneCodec.ZSTD, 8192), Plane(PlaneCodec.ZSTD, 1))}, "add up"),
], ids=["codec none", "codec zstd", "plane table"])
def test_a_plane_table_that_does_not_fit_is_refused_before_decoding(chunks, monkeypatch, changes, match):
    data = reheader(chunks["bf16 split"], **changes)
    monkeypatch.setattr(chunkfile, "decode_into", _refuse)
    with pytest.raises(CorruptChunkError, match=match):
        decode(data)


def test_planes_shifted_within_the_payload_are_detected(chunks):
    chunk = chunks["bf16 split"]
    raw_plane, zstd_plane = chunk.header.planes
    for delta in (-1, 1):
        planes = (Plane(PlaneCodec.RAW, raw_plane.stored_size_bytes + delta),
                  Plane(PlaneCodec.ZSTD, zstd_plane.stored_size_bytes - delta))
        with pytest.raises(CorruptChunkError, match="raw plane"):
            decode(reheader(chunk, planes=planes))
    swapped = (Plane(PlaneCodec.ZSTD, raw_plane.stored_size_bytes), Plane(PlaneCodec.RAW, 8192))
    with pytest.raises(CorruptChunkError):
        decode(reheader(chunk, planes=swapped))


def test_a_decompression_bomb_in_a_forged_file_is_refused():
    chunk = build_chunk("float8_e4m3fn", Codec.ZSTD)
    c = zstandard.ZstdCompressor().compressobj(size=64 * 2**20)
    bomb = b"".join([c.compress(bytes(1 << 20)) for _ in range(64)] + [c.flush()])
    header = dataclasses.replace(chunk.header, planes=(Plane(PlaneCodec.ZSTD, len(bomb)),))
    data = encode_header(header) + bomb
    tracemalloc.start()
    try:
        with pytest.raises(CorruptChunkError, match="declares"):
            decode(data, expect_dtype="float8_e4m3fn", expect_shape=SHAPE)
        assert tracemalloc.get_traced_memory()[1] < 4 << 20
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("field, value, match", [
    ("magic", b"CSKVCHNX", "bad magic"),
    ("magic", b"\x00" * 8, "bad magic"),
    ("version", struct.pack("<H", 0), "unsupported format version"),
    ("version", struct.pack("<H", 2), "unsupported format version"),
    ("body_length", struct.pack("<I", MAX_HEADER_BYTES + 1), "exceeds"),
    ("body_length", struct.pack("<I", 2**32 - 1), "exceeds"),
    ("body_length", struct.pack("<I", MAX_HEADER_BYTES), "shorter than its header"),
    ("dtype_code", b"\x00", "unknown dtype"),
    ("dtype_code", b"\x63", "unknown dtype"),
    ("codec_code", b"\x07", "unknown codec"),
    ("plane1_codec", b"\x02", "unknown plane codec"),
    ("namespace", b"\xff\xfe" + b"x" * 6, "not UTF-8"),
    ("num_tokens", struct.pack("<I", 2**32 - 1), "header ends early"),
    ("num_planes", b"\x03", "header ends early"),
    ("num_planes", b"\x01", "trailing bytes"),
    ("plane1_size", b"\x00" * 8 + b"\x00", "trailing bytes"),
])
def test_a_malformed_header_with_a_valid_checksum_is_detected(chunks, field, value, match):
    tracemalloc.start()
    try:
        with pytest.raises(CorruptChunkError, match=match):
            decode(forge(chunks["bf16 split"].data, **{field: value}))
        assert tracemalloc.get_traced_memory()[1] < 4 << 20  # num_tokens = 2**32 - 1 reads nothing
    finally:
        tracemalloc.stop()


def test_a_header_with_a_bad_ndim_is_detected(chunks):
    data = chunks["bf16 split"].data
    shape = parse_layout(data)["shape"][2]
    for ndim in (0, 9):
        with pytest.raises(CorruptChunkError, match="bad ndim"):
            decode(forge(data, ndim=bytes([ndim]), shape=shape[: 4 * ndim].ljust(4 * ndim, b"\x01")))


def test_the_namespace_is_covered_by_the_header_checksum(chunks):
    data = chunks["bf16 split"].data
    offset = parse_layout(data)["namespace"][0]
    tampered = bytearray(data)
    tampered[offset] ^= 0x01  # "tenant-a" -> "uenant-a", still UTF-8
    with pytest.raises(CorruptChunkError, match="header checksum"):
        decode(bytes(tampered))


def test_encode_header_refuses_token_ids_it_cannot_store(chunks):
    with pytest.raises(ValueError):
        encode_header(dataclasses.replace(chunks["bf16 split"].header, token_ids=(2**32,)))
