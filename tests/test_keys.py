"""Chunk keys: an unambiguous, deterministic encoding that matches docs/KEYS.md.

The tests hold the code against a reference encoder written from the doc (so code and doc agree),
show that the doc's encoding parses back to its fields (so it is injective), and check collisions
directly on inputs built to be ambiguous under a naive concatenation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from chunkstore.disk import keys
from chunkstore.disk.identity import DTYPE_CODES, KEY_SCHEMES, ModelIdentity
from chunkstore.disk.keys import (
    KEY_SIZE_BYTES, PageRef, chain_keys, chain_pages, decode_tokens, encode_tokens, engine_pages, page_key,
    root_key,
)

DOC = Path(__file__).resolve().parents[1] / "docs" / "KEYS.md"
PROPERTY = settings(max_examples=100, deadline=None)
U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
POSITIVE_FIELDS = ("num_layers", "num_kv_heads", "head_dim", "page_size", "layout_version")


# -- a reference encoder, written from docs/KEYS.md rather than from keys.py --------------------

ROOT_FIELDS = (  # (tag, name, kind) in the documented order
    (0x01, "model_id", "string"), (0x02, "kv_dtype", "string"), (0x03, "num_layers", "integer"),
    (0x04, "num_kv_heads", "integer"), (0x05, "head_dim", "integer"), (0x06, "page_size", "integer"),
    (0x07, "layout_version", "integer"), (0x08, "tp_rank", "integer"), (0x09, "tp_size", "integer"),
)


def ref_field(tag: int, value: bytes) -> bytes:
    return bytes([tag]) + len(value).to_bytes(4, "big") + value


def ref_root_preimage(identity: ModelIdentity, namespace: str) -> bytes:
    out = b""
    for tag, name, kind in ROOT_FIELDS:
        value = getattr(identity, name)
        out += ref_field(tag, value.encode("utf-8") if kind == "string" else value.to_bytes(8, "big"))
    out += ref_field(0x0A, namespace.encode("utf-8"))
    if identity.key_scheme != "tokens":  # only engine-keyed roots carry the scheme
        out += ref_field(0x0B, identity.key_scheme.encode("utf-8"))
    return out


def ref_tokens(token_ids) -> bytes:
    return b"".join(t.to_bytes(4, "little") for t in token_ids)


def ref_page_preimage(parent: bytes, token_ids) -> bytes:
    return ref_field(0x10, parent) + ref_field(0x11, ref_tokens(token_ids))


def ref_root_key(identity: ModelIdentity, namespace: str) -> bytes:
    return hashlib.blake2b(ref_root_preimage(identity, namespace), digest_size=32,
                           person=b"chunkstore:root1").digest()


def ref_page_key(parent: bytes, token_ids) -> bytes:
    return hashlib.blake2b(ref_page_preimage(parent, token_ids), digest_size=32,
                           person=b"chunkstore:page1").digest()


def parse_fields(preimage: bytes) -> list[tuple[int, bytes]]:
    """The left inverse of the field encoding: fails on any byte string that is not fields."""
    fields, pos = [], 0
    while pos < len(preimage):
        tag = preimage[pos]
        (length,) = struct.unpack(">I", preimage[pos + 1 : pos + 5])
        value = preimage[pos + 5 : pos + 5 + length]
        assert len(value) == length, "field runs past the end"
        fields.append((tag, value))
        pos += 5 + length
    return fields


def identity_from_fields(fields: list[tuple[int, bytes]]) -> tuple[ModelIdentity, str]:
    assert [t for t, _ in fields] == [t for t, _, _ in ROOT_FIELDS] + [0x0A]
    kw = {}
    for (tag, name, kind), (_, value) in zip(ROOT_FIELDS, fields):
        kw[name] = value.decode("utf-8") if kind == "string" else int.from_bytes(value, "big")
    return ModelIdentity(**kw), fields[-1][1].decode("utf-8")


# -- strategies ------------------------------------------------------------------------------

ints = st.one_of(st.integers(1, 4), st.integers(1, U64_MAX))


@st.composite
def identities(draw, model_ids=st.text(min_size=1, max_size=12), values=ints,
               page_sizes=None, tp_sizes=None):
    tp_size = draw(tp_sizes or values)
    tp_rank = draw(st.integers(0, min(tp_size - 1, 3)) | st.integers(0, tp_size - 1))
    kw = {name: draw(values) for name in POSITIVE_FIELDS}
    if page_sizes is not None:
        kw["page_size"] = draw(page_sizes)
    return ModelIdentity(model_id=draw(model_ids), kv_dtype=draw(st.sampled_from(sorted(DTYPE_CODES))),
                         tp_rank=tp_rank, tp_size=tp_size, **kw)


namespaces = st.text(max_size=10)
token_ids = st.integers(0, U32_MAX) | st.integers(0, 3)
parents = st.binary(min_size=KEY_SIZE_BYTES, max_size=KEY_SIZE_BYTES)
small_identities = identities(page_sizes=st.integers(1, 4))


def make_identity(**overrides) -> ModelIdentity:
    kw = dict(model_id="m", kv_dtype="bfloat16", num_layers=2, num_kv_heads=1, head_dim=8, page_size=2)
    kw.update(overrides)
    return ModelIdentity(**kw)


def chain_key(identity: ModelIdentity, namespace: str, pages: list[list[int]]) -> bytes:
    """The last key of a chain of arbitrary-length pages (the root key when there are none)."""
    key = root_key(identity, namespace)
    for page in pages:
        key = page_key(key, encode_tokens(page))
    return key


# -- the published encoding ------------------------------------------------------------------

def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def doc_vectors() -> list[dict]:
    blocks = re.findall(r"```json\n(.*?)```", doc_text(), re.S)
    assert len(blocks) == 1, "docs/KEYS.md must hold exactly one ```json block of test vectors"
    return json.loads(blocks[0])


def test_doc_has_at_least_three_vectors_with_pages():
    vectors = doc_vectors()
    assert len(vectors) >= 3
    assert sum(1 for v in vectors if v["page_keys"]) >= 3


@pytest.mark.parametrize("index", range(len(doc_vectors())))
def test_doc_vector_matches_code(index):
    v = doc_vectors()[index]
    identity = ModelIdentity(**v["identity"])
    assert set(v["identity"]) == {f.name for f in dataclasses.fields(ModelIdentity)}
    assert root_key(identity, v["namespace"]).hex() == v["root_key"]
    if identity.key_scheme == "engine":
        pages = engine_pages(identity, [bytes.fromhex(k) for k in v["engine_keys"]], v["namespace"])
        assert len(pages) == len(v["engine_keys"])
        assert [encode_tokens(p.token_ids).hex() for p in pages] == v["engine_keys"]  # the header's ids
    else:
        pages = chain_pages(identity, v["token_ids"], v["namespace"])
        assert len(pages) == len(v["token_ids"]) // identity.page_size
    assert [p.key.hex() for p in pages] == v["page_keys"]
    # and the reference encoder, which follows the doc's prose, agrees with the doc's numbers
    assert ref_root_key(identity, v["namespace"]).hex() == v["root_key"]


def test_doc_worked_example_hashes_to_vector_two():
    blocks = re.findall(r"```hex\n(.*?)```", doc_text(), re.S)
    assert len(blocks) == 2
    root_pre, page_pre = (bytes.fromhex(b.replace("\n", " ")) for b in blocks)
    v = doc_vectors()[1]
    identity = ModelIdentity(**v["identity"])
    assert root_pre == ref_root_preimage(identity, v["namespace"])
    assert hashlib.blake2b(root_pre, digest_size=32, person=b"chunkstore:root1").hexdigest() == v["root_key"]
    assert page_pre == ref_page_preimage(bytes.fromhex(v["root_key"]), v["token_ids"][:4])
    assert hashlib.blake2b(page_pre, digest_size=32, person=b"chunkstore:page1").hexdigest() == v["page_keys"][0]


def test_doc_tag_table_and_personalisation_match_code():
    rows = re.findall(r"^\| 0x([0-9a-f]{2}) \| `(\w+)`", doc_text(), re.M)
    documented = {f"TAG_{name.upper()}": int(tag, 16) for tag, name in rows}
    in_code = {name: getattr(keys, name) for name in dir(keys) if name.startswith("TAG_")}
    assert documented == in_code
    assert f"`{keys._ROOT_PERSON.decode()}`" in doc_text()
    assert f"`{keys._PAGE_PERSON.decode()}`" in doc_text()
    assert keys._ROOT_PERSON != keys._PAGE_PERSON


@PROPERTY
@given(identities(), namespaces)
def test_root_key_is_the_documented_encoding(identity, namespace):
    assert root_key(identity, namespace) == ref_root_key(identity, namespace)


@PROPERTY
@given(parents, st.lists(token_ids, max_size=40))
def test_page_key_is_the_documented_encoding(parent, tokens):
    assert encode_tokens(tokens) == ref_tokens(tokens)
    assert page_key(parent, encode_tokens(tokens)) == ref_page_key(parent, tokens)


@PROPERTY
@given(identities(), namespaces)
def test_documented_root_encoding_parses_back(identity, namespace):
    # A left inverse exists, so the encoding is injective: distinct inputs, distinct preimages.
    assert identity_from_fields(parse_fields(ref_root_preimage(identity, namespace))) == (identity, namespace)


@PROPERTY
@given(parents, st.lists(token_ids, max_size=20))
def test_documented_page_encoding_parses_back(parent, tokens):
    fields = parse_fields(ref_page_preimage(parent, tokens))
    assert [t for t, _ in fields] == [0x10, 0x11]
    assert fields[0][1] == parent
    assert decode_tokens(fields[1][1]) == tuple(tokens)


# -- no collisions ---------------------------------------------------------------------------

# Small alphabets so that equal tuples come up often and "equal iff same input" is tested both ways.
tiny_identities = identities(model_ids=st.sampled_from(["a", "b", "ab", "ba"]), values=st.integers(1, 2))
tiny_namespaces = st.sampled_from(["", "a", "b", "ab", "default"])
tiny_pages = st.lists(st.lists(st.integers(0, 2), max_size=3), max_size=3)


@PROPERTY
@given(tiny_identities, tiny_namespaces, tiny_pages, tiny_identities, tiny_namespaces, tiny_pages)
def test_keys_equal_only_for_equal_inputs(id_a, ns_a, pages_a, id_b, ns_b, pages_b):
    same_input = (id_a, ns_a, pages_a) == (id_b, ns_b, pages_b)
    assert (chain_key(id_a, ns_a, pages_a) == chain_key(id_b, ns_b, pages_b)) == same_input


@PROPERTY
@given(parents, st.lists(token_ids, max_size=6), parents, st.lists(token_ids, max_size=6))
def test_page_keys_equal_only_for_equal_inputs(parent_a, tokens_a, parent_b, tokens_b):
    key_a = page_key(parent_a, encode_tokens(tokens_a))
    key_b = page_key(parent_b, encode_tokens(tokens_b))
    assert (key_a == key_b) == ((parent_a, tokens_a) == (parent_b, tokens_b))


@PROPERTY
@given(st.text(min_size=2, max_size=12), st.data())
def test_moving_bytes_between_model_id_and_namespace_changes_the_key(text, data):
    i = data.draw(st.integers(1, len(text)))
    j = data.draw(st.integers(1, len(text)).filter(lambda j: j != i))
    a = root_key(make_identity(model_id=text[:i]), text[i:])
    b = root_key(make_identity(model_id=text[:j]), text[j:])
    assert a != b


@PROPERTY
@given(st.text(min_size=1, max_size=12), identities(), namespaces)
def test_moving_bytes_between_model_id_and_kv_dtype_changes_the_key(prefix, identity, namespace):
    # model_id and kv_dtype are adjacent: "<prefix>b" + "float16" == "<prefix>" + "bfloat16"
    a = dataclasses.replace(identity, model_id=prefix + "b", kv_dtype="float16")
    b = dataclasses.replace(identity, model_id=prefix, kv_dtype="bfloat16")
    assert root_key(a, namespace) != root_key(b, namespace)


@PROPERTY
@given(st.lists(token_ids, min_size=1, max_size=12), st.data())
def test_splitting_tokens_differently_across_pages_changes_the_key(tokens, data):
    def partition():
        cuts = data.draw(st.sets(st.integers(0, len(tokens)), max_size=4))
        bounds = [0, *sorted(cuts), len(tokens)]
        return [tokens[a:b] for a, b in zip(bounds, bounds[1:])]

    first, second = partition(), partition()
    assume(first != second)
    identity = make_identity()
    assert chain_key(identity, "default", first) != chain_key(identity, "default", second)


@pytest.mark.parametrize("a, b", [
    # (model_id, kv_dtype, namespace, pages) pairs that a naive concatenation would confuse
    (("xb", "float16", "n", []), ("x", "bfloat16", "n", [])),
    (("c", "bfloat16", "ab", []), ("bc", "bfloat16", "a", [])),
    (("m", "bfloat16", "", []), ("m", "bfloat16", "\x00", [])),
    (("m", "bfloat16", "default", []), ("m", "bfloat16", "default", [[]])),
    (("m", "bfloat16", "n", [[]]), ("m", "bfloat16", "n", [[0]])),
    (("m", "bfloat16", "n", [[1, 2], [3]]), ("m", "bfloat16", "n", [[1], [2, 3]])),
    (("m", "bfloat16", "n", [[1, 2, 3]]), ("m", "bfloat16", "n", [[1, 2], [3]])),
    (("m", "bfloat16", "n", [[1, 2, 3]]), ("m", "bfloat16", "n", [[1, 2, 3], []])),
    (("m", "bfloat16", "n", [[0x00000011, 0x00000400]]), ("m", "bfloat16", "n", [[0x11]])),
])
def test_ambiguous_concatenations_get_different_keys(a, b):
    def key(model_id, kv_dtype, namespace, pages):
        return chain_key(make_identity(model_id=model_id, kv_dtype=kv_dtype), namespace, pages)
    assert key(*a) != key(*b)


def test_root_and_page_keys_are_domain_separated():
    # the same bytes hashed as a root preimage and as a page preimage must not give the same key
    parent = bytes(range(32))
    pre = ref_page_preimage(parent, [1, 2])
    as_root = hashlib.blake2b(pre, digest_size=32, person=keys._ROOT_PERSON).digest()
    assert page_key(parent, encode_tokens([1, 2])) != as_root


def other_value(identity: ModelIdentity, name: str):
    old = getattr(identity, name)
    if name == "model_id":
        return st.text(min_size=1, max_size=12).filter(lambda v: v != old)
    if name == "kv_dtype":
        return st.sampled_from(sorted(set(DTYPE_CODES) - {old}))
    if name == "tp_rank":
        return st.integers(0, identity.tp_size - 1).filter(lambda v: v != old)
    if name == "tp_size":
        return st.integers(identity.tp_rank + 1, U64_MAX).filter(lambda v: v != old)
    if name == "key_scheme":
        return st.sampled_from(sorted(set(KEY_SCHEMES) - {old}))
    return ints.filter(lambda v: v != old)


@PROPERTY
@given(identities(), namespaces, st.data())
def test_any_single_identity_field_change_changes_the_root_key(identity, namespace, data):
    name = data.draw(st.sampled_from([f.name for f in dataclasses.fields(ModelIdentity)]))
    assume(not (name == "tp_rank" and identity.tp_size == 1))
    changed = dataclasses.replace(identity, **{name: data.draw(other_value(identity, name))})
    assert changed != identity
    assert root_key(changed, namespace) != root_key(identity, namespace)


@PROPERTY
@given(small_identities, st.lists(token_ids, min_size=4, max_size=24), namespaces, namespaces)
def test_namespaces_never_share_page_keys(identity, tokens, ns_a, ns_b):
    assume(ns_a != ns_b)
    keys_a = {p.key for p in chain_pages(identity, tokens, ns_a)} | {root_key(identity, ns_a)}
    keys_b = {p.key for p in chain_pages(identity, tokens, ns_b)} | {root_key(identity, ns_b)}
    assert not keys_a & keys_b


# -- chaining --------------------------------------------------------------------------------

@PROPERTY
@given(small_identities, st.lists(token_ids, max_size=24), namespaces, st.data())
def test_chain_pages_keys_full_pages_and_ignores_a_trailing_partial_page(identity, tokens, ns, data):
    size = identity.page_size
    full = tokens[: len(tokens) // size * size]
    extra = data.draw(st.lists(token_ids, max_size=size - 1))
    pages = chain_pages(identity, full + extra, ns)
    assert pages == chain_pages(identity, full, ns)
    assert len(pages) == len(full) // size
    parent = root_key(identity, ns)
    for i, page in enumerate(pages):
        expected_tokens = tuple(full[i * size : (i + 1) * size])
        assert page == PageRef(key=page_key(parent, encode_tokens(expected_tokens)), parent_key=parent,
                               token_ids=expected_tokens, namespace=ns)
        assert page.num_tokens == size
        parent = page.key


@PROPERTY
@given(small_identities, st.lists(token_ids, max_size=16), st.lists(token_ids, max_size=16))
def test_chain_pages_continues_from_a_parent_key(identity, head, tail):
    head = head[: len(head) // identity.page_size * identity.page_size]
    first = chain_pages(identity, head)
    parent = first[-1].key if first else root_key(identity)
    assert first + chain_pages(identity, tail, parent_key=parent) == chain_pages(identity, head + tail)


def test_chain_pages_does_not_validate_the_ignored_partial_page():
    identity = make_identity(page_size=2)
    assert len(chain_pages(identity, [1, 2, -1])) == 1  # documented in docs/KEYS.md


def test_chain_pages_accepts_numpy_and_torch_integers():
    identity = make_identity(page_size=2)
    expected = chain_pages(identity, [5, 6, 7, 8])
    assert chain_pages(identity, np.array([5, 6, 7, 8], dtype=np.int64)) == expected
    assert chain_pages(identity, torch.tensor([5, 6, 7, 8])) == expected


@pytest.mark.parametrize("bad", [1.0, 1.5, "1", None])
def test_chain_pages_rejects_non_integer_token_ids(bad):
    # int(1.5) == 1 would silently give the page the key of token 1
    with pytest.raises(TypeError):
        chain_pages(make_identity(page_size=2), [bad, 2])


# -- token ids -------------------------------------------------------------------------------

out_of_range = st.integers(max_value=-1) | st.integers(min_value=2**32)


@PROPERTY
@given(st.lists(token_ids, max_size=8), out_of_range, st.data())
def test_token_ids_outside_u32_raise_value_error(tokens, bad, data):
    where = data.draw(st.integers(0, len(tokens)))
    bad_tokens = tokens[:where] + [bad] + tokens[where:]
    with pytest.raises(ValueError):
        encode_tokens(bad_tokens)
    identity = make_identity(page_size=len(bad_tokens))
    with pytest.raises(ValueError):
        chain_pages(identity, bad_tokens)


@PROPERTY
@given(st.lists(token_ids, max_size=64))
def test_token_encoding_round_trips(tokens):
    data = encode_tokens(tokens)
    assert len(data) == 4 * len(tokens)
    assert decode_tokens(data) == tuple(tokens)


def test_token_encoding_is_little_endian_u32():
    assert encode_tokens([0, 1, 0x01020304, U32_MAX]) == (
        b"\x00\x00\x00\x00" b"\x01\x00\x00\x00" b"\x04\x03\x02\x01" b"\xff\xff\xff\xff")
    assert encode_tokens(b"\x01\x02") == encode_tokens([1, 2])  # bytes are ids, not machine words
    with pytest.raises(ValueError):
        decode_tokens(b"\x00" * 5)


@pytest.mark.parametrize("size", [0, 31, 33, 64])
def test_page_key_rejects_a_parent_of_the_wrong_size(size):
    with pytest.raises(ValueError):
        page_key(b"\x01" * size, encode_tokens([1]))


# -- identity fields feed the key, so they must be integers ----------------------------------

@pytest.mark.parametrize("field, bad", [
    ("page_size", "16"), ("page_size", 16.0), ("num_layers", True), ("head_dim", 2**64),
    ("tp_rank", -1), ("num_kv_heads", 0), ("model_id", ""), ("model_id", b"m"), ("kv_dtype", "int4"),
])
def test_identity_rejects_values_the_key_cannot_encode(field, bad):
    with pytest.raises(ValueError):
        make_identity(**{field: bad})


def test_identity_normalises_numpy_integers_and_round_trips_through_json():
    identity = make_identity(num_layers=np.int64(2), head_dim=np.uint32(8), page_size=U64_MAX)
    assert type(identity.num_layers) is int and type(identity.head_dim) is int
    assert identity == make_identity(page_size=U64_MAX)
    again = ModelIdentity.from_json(identity.to_json())
    assert again == identity and root_key(again) == root_key(identity)


# -- determinism across processes ------------------------------------------------------------

# The child imports keys.py and identity.py without the package __init__, which pulls in torch
# through the store (seconds per process); the hashing code under test is the same file.
_CHILD = """
import json, sys, types
package = types.ModuleType("chunkstore")
package.__path__ = [sys.argv[1]]
sys.modules["chunkstore"] = package
from chunkstore.disk.identity import ModelIdentity
from chunkstore.disk.keys import chain_pages, root_key
out = {"hash": hash("chunkstore"), "keys": []}
for case in json.load(sys.stdin):
    identity = ModelIdentity(**case["identity"])
    pages = chain_pages(identity, case["token_ids"], case["namespace"])
    out["keys"].append([root_key(identity, case["namespace"]).hex()] + [p.key.hex() for p in pages])
print(json.dumps(out))
"""


def test_keys_are_identical_in_other_processes(tmp_path):
    cases = [{k: v[k] for k in ("identity", "namespace", "token_ids")} for v in doc_vectors() if "token_ids" in v]
    rng = np.random.default_rng(7)
    for i in range(20):
        identity = make_identity(model_id=f"model-{i}-ü", page_size=int(rng.integers(1, 5)),
                                 num_layers=int(rng.integers(1, 2**63)))
        cases.append({"identity": json.loads(identity.to_json()), "namespace": f"ns{i % 3}",
                      "token_ids": rng.integers(0, 2**32, size=int(rng.integers(0, 20))).tolist()})
    expected = []
    for case in cases:
        identity = ModelIdentity(**case["identity"])
        pages = chain_pages(identity, case["token_ids"], case["namespace"])
        expected.append([root_key(identity, case["namespace"]).hex()] + [p.key.hex() for p in pages])

    children = [
        subprocess.Popen([sys.executable, "-c", _CHILD, str(Path(keys.__file__).parent)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONHASHSEED": seed})
        for seed in ("0", "12345")
    ]
    results = []
    for child in children:
        out, err = child.communicate(json.dumps(cases), timeout=120)
        assert child.returncode == 0, err
        results.append(json.loads(out))
    assert results[0]["hash"] != results[1]["hash"], "PYTHONHASHSEED did not change str hashing"
    for result in results:
        assert result["keys"] == expected


def test_chain_keys_equals_page_key_chained():
    parent = b"\x07" * 32
    tokens = list(range(4 * 5 + 3))  # five whole pages and a partial one
    data = encode_tokens(tokens)
    expected, prev = [], parent
    for page in range(5):
        prev = page_key(prev, data[page * 16 : (page + 1) * 16])
        expected.append(prev)
    assert chain_keys(parent, data, 4) == expected
    assert chain_keys(parent, data[:12], 4) == []
    with pytest.raises(ValueError):
        chain_keys(b"short", data, 4)


def test_engine_keyed_pages_chain_the_engine_keys_from_their_own_root():
    tokens_id = make_identity()
    engine_id = make_identity(key_scheme="engine")
    assert root_key(engine_id) != root_key(tokens_id)  # the scheme is in the root
    k1, k2 = hashlib.sha256(b"page 1").digest(), hashlib.sha256(b"page 2").digest()
    pages = engine_pages(engine_id, [k1, k2], "tenant")
    root = root_key(engine_id, "tenant")
    assert [p.parent_key for p in pages] == [root, root]  # the engine key already covers the prefix
    assert pages[1].key == page_key(root, k2) and encode_tokens(pages[1].token_ids) == k2
    assert engine_id.ids_per_page == 8 and tokens_id.ids_per_page == tokens_id.page_size
    assert engine_pages(engine_id, [k2], "tenant") == pages[1:]  # alone, the same key
    assert engine_pages(engine_id, [k2], "other")[0].key != pages[1].key
    with pytest.raises(ValueError, match="32 bytes"):
        engine_pages(engine_id, [k1[:16]])
    with pytest.raises(ValueError, match="key_scheme"):
        engine_pages(tokens_id, [k1])
    with pytest.raises(ValueError, match="engine_pages"):
        chain_pages(engine_id, [1, 2])
    with pytest.raises(ValueError, match="key_scheme"):
        make_identity(key_scheme="hashes")


def test_keyed_names_match_the_documented_vectors():
    """docs/KEYS.md's keyed names, recomputed from its text with hashlib alone (not sealing.py),
    and by the sealing code: both agree with the table."""
    from chunkstore.disk.sealing import NamespaceKeys

    text = DOC.read_text().split("## Keyed names")[1]
    rows = re.findall(r"^\| `([0-9a-f]{64})` \| `([0-9a-f]{64})` \|$", text, re.MULTILINE)
    assert len(rows) == 3
    naming_key = bytes(range(32))
    keys = NamespaceKeys("default", bytes(8), bytes(32), naming_key)
    for chain, name in rows:
        reference = hashlib.blake2b(bytes.fromhex(chain), digest_size=32, key=naming_key,
                                    person=b"chunkstore:name1").hexdigest()
        assert reference == name == keys.name(bytes.fromhex(chain)).hex()
