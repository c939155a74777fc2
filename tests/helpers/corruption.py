"""Helpers of the corruption tests (tests/test_corruption.py on a folder, tests/test_shared_contract.py
on a bucket): the store they damage and the bytes of a chunk written as the store writes one, but
for whatever header fields a test likes (a header that lies about its page)."""

from __future__ import annotations

import logging

import torch

from chunkstore import ChunkStore, ModelIdentity, chain_pages
from chunkstore.disk.chunkfile import decode_header, encode_header, make_header
from chunkstore.disk.codec import encode
from chunkstore.disk.keys import PageRef, encode_tokens, page_key
from chunkstore.disk.page_io import page_tensor_bytes
from chunkstore.testing.tensors import same_bytes
from tests.helpers import kv_pages


def fill(store: ChunkStore, identity: ModelIdentity) -> tuple[ChunkStore, list[PageRef], list[torch.Tensor]]:
    """Six pages of one chain and two of another namespace, stored: (store, the six, their KV)."""
    pages = chain_pages(identity, list(range(identity.page_size * 6)))
    tensors = kv_pages(identity, len(pages), seed=1)
    assert store.put(pages, tensors).ok
    other = chain_pages(identity, [7] * identity.page_size * 2, namespace="other")
    assert store.put(other, kv_pages(identity, 2, seed=2)).ok
    return store, pages, tensors


def payload_offset(data: bytes) -> int:
    """Where the payload of the chunk ``data`` starts (the end of its header)."""
    return decode_header(memoryview(data))[1]


def chunk_bytes(store: ChunkStore, key: bytes, parent: bytes, tokens: tuple[int, ...], namespace: str,
                tensor: torch.Tensor) -> bytes:
    """A chunk written exactly as the store writes one, but for whatever header fields we like."""
    ident = store.identity
    raw = page_tensor_bytes(tensor)
    payload = encode(raw, ident.itemsize, store.codec)
    header = make_header(key, parent, namespace, tokens, ident.kv_dtype, ident.page_shape, store.codec, raw, payload)
    return encode_header(header) + b"".join(bytes(s) for s in payload.segments)


def forged_chunk(store: ChunkStore, pages: list[PageRef], tensors: list[torch.Tensor], victim: int,
                 field: str) -> bytes:
    """A chunk for ``pages[victim]`` whose header passes its own checksum but lies about the page:
    ``tokens`` (the victim's key, other tokens), ``parent`` (the victim's key, another parent),
    ``namespace`` (right key, parent and tokens; another namespace) or ``consistent`` (a fully
    consistent chunk of other tokens under another parent)."""
    v = pages[victim]
    other_parent = pages[0].key
    other_tokens = tuple(t + 1 for t in v.token_ids)
    key, parent, tokens, ns = v.key, v.parent_key, v.token_ids, v.namespace
    if field == "tokens":
        tokens = other_tokens
    elif field == "parent":
        parent = other_parent
    elif field == "namespace":
        ns = "other"
    elif field == "consistent":
        parent, tokens = other_parent, other_tokens
        key = page_key(parent, encode_tokens(tokens))
    return chunk_bytes(store, key, parent, tokens, ns, tensors[victim])


def warnings_about(caplog, key: bytes) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING and key.hex() in r.getMessage()]


def read_past_the_damage(store: ChunkStore, pages: list[PageRef], tensors: list[torch.Tensor], victim: int,
                         caplog, what: str = "damaged"):
    """Read ``pages`` whose ``pages[victim]`` is damaged, then the victim again: the victim is a
    miss (the second time a plain miss), every other page loads its own bytes, and the victim's row
    is gone. Returns the store's stats from before the reads."""
    key = pages[victim].key
    before = store.stats()
    with caplog.at_level(logging.WARNING):
        got = store.get(pages)
        again = store.get([pages[victim]])  # now a plain miss: no second quarantine, no second warning
    assert got[victim] is None and again == [None]
    for i, (t, want) in enumerate(zip(got, tensors)):
        if i != victim:
            assert t is not None and same_bytes(t, want), f"page {i} lost with the {what} one"
    assert store.exists([key]) == [False]
    return before


def assert_quarantined_once(store: ChunkStore, pages: list[PageRef], victim: int, before, caplog) -> None:
    """After read_past_the_damage: the victim was counted quarantined and dropped once, warned about
    once, and the prefix up to the hole is still served."""
    after = store.stats()
    assert after.quarantined == before.quarantined + 1
    assert after.num_chunks == before.num_chunks - 1
    assert len(warnings_about(caplog, pages[victim].key)) == 1
    assert store.longest_prefix([p.key for p in pages]) == victim  # the prefix up to the hole is served
