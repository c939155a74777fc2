"""Corrupt chunk files on a real store: every kind is a miss on read, moved to quarantine/ once,
counted, logged once, and never disturbs the other chunks; verify finds each one without
changing anything, and verify(repair=True) quarantines it."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from chunkstore import ChunkStore
from chunkstore.disk.keys import PageRef
from chunkstore.disk.maintenance import verify
from chunkstore.disk.page_io import max_payload_bytes
from chunkstore.testing.tensors import same_bytes
from tests.helpers.corruption import (assert_quarantined_once, fill, forged_chunk, payload_offset, read_past_the_damage,
                                      warnings_about)

VICTIM = 3  # a page in the middle of the chain: corrupting it must not hide its neighbours


@pytest.fixture
def filled(store, identity):
    return fill(store, identity)


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


# Each corruption gets (store, pages, tensors) and damages the file of pages[VICTIM].
Corruption = Callable[[ChunkStore, list[PageRef], list[torch.Tensor]], None]


def _header_flip(at: Callable[[int], int]) -> Corruption:
    def corrupt(store, pages, tensors):
        path = store.payloads.path_for(pages[VICTIM].key)
        _flip(path, at(payload_offset(path.read_bytes())))
    return corrupt


def _payload_flip(fraction: float) -> Corruption:
    def corrupt(store, pages, tensors):
        path = store.payloads.path_for(pages[VICTIM].key)
        data = path.read_bytes()
        start = payload_offset(data)
        _flip(path, min(len(data) - 1, start + int((len(data) - start) * fraction)))
    return corrupt


def _truncate(keep: Callable[[int, int], int]) -> Corruption:
    def corrupt(store, pages, tensors):
        path = store.payloads.path_for(pages[VICTIM].key)
        data = path.read_bytes()
        path.write_bytes(data[: keep(len(data), payload_offset(data))])
    return corrupt


def _swapped(store, pages, tensors):
    shutil.copyfile(store.payloads.path_for(pages[VICTIM + 1].key), store.payloads.path_for(pages[VICTIM].key))


def _forged(field: str) -> Corruption:
    """A header that passes its own checksum but lies about the page."""
    def corrupt(store, pages, tensors):
        store.payloads.path_for(pages[VICTIM].key).write_bytes(forged_chunk(store, pages, tensors, VICTIM, field))
    return corrupt


def _oversized(store, pages, tensors):
    path = store.payloads.path_for(pages[VICTIM].key)
    with open(path, "ab") as f:
        f.truncate(max_payload_bytes(store.identity) + 1)  # sparse: large without costing disk


def _trailing(store, pages, tensors):
    with open(store.payloads.path_for(pages[VICTIM].key), "ab") as f:
        f.write(b"\0" * 100)


def _garbage(store, pages, tensors):
    path = store.payloads.path_for(pages[VICTIM].key)
    path.write_bytes(os.urandom(path.stat().st_size))


CORRUPTIONS: dict[str, Corruption] = {
    "header-magic": _header_flip(lambda end: 0),
    "header-version": _header_flip(lambda end: 8),
    "header-length": _header_flip(lambda end: 10),
    "header-key": _header_flip(lambda end: 20),
    "header-tokens": _header_flip(lambda end: end - 60),
    "header-checksum": _header_flip(lambda end: end - 1),
    "payload-first": _payload_flip(0.0),
    "payload-middle": _payload_flip(0.5),
    "payload-last": _payload_flip(1.0),
    "truncated-by-one": _truncate(lambda n, end: n - 1),
    "truncated-at-header": _truncate(lambda n, end: end),
    "truncated-in-header": _truncate(lambda n, end: 10),
    "empty": _truncate(lambda n, end: 0),
    "swapped": _swapped,
    "forged-tokens": _forged("tokens"),
    "forged-parent": _forged("parent"),
    "forged-namespace": _forged("namespace"),
    "forged-other-key": _forged("consistent"),
    "oversized": _oversized,
    "trailing-bytes": _trailing,
    "garbage": _garbage,
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupt_file_is_a_miss_and_quarantined(filled, kind, caplog):
    store, pages, tensors = filled
    victim = pages[VICTIM]
    CORRUPTIONS[kind](store, pages, tensors)
    before = read_past_the_damage(store, pages, tensors, VICTIM, caplog, "corrupt")
    assert not store.payloads.path_for(victim.key).exists()
    moved = list(store.payloads.quarantine_dir.iterdir())
    assert [p.name.startswith(victim.key.hex()) for p in moved] == [True]
    assert_quarantined_once(store, pages, VICTIM, before, caplog)


@pytest.mark.parametrize("kind", ["payload-middle", "swapped", "forged-other-key", "garbage"])
def test_corrupt_file_is_a_miss_for_get_into(filled, kind):
    store, pages, tensors = filled
    CORRUPTIONS[kind](store, pages, tensors)
    outs = [torch.zeros(store.identity.page_shape, dtype=store.torch_dtype) for _ in pages]
    hits = store.get_into(pages, outs)
    assert hits == [i != VICTIM for i in range(len(pages))]
    assert all(same_bytes(o, t) for o, t, h in zip(outs, tensors, hits) if h)


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_verify_reports_without_changing_anything(filled, kind):
    store, pages, tensors = filled
    CORRUPTIONS[kind](store, pages, tensors)
    path = store.payloads.path_for(pages[VICTIM].key)
    damaged = path.read_bytes()
    before = store.stats()
    report = verify(store)
    assert (report.checked, report.ok, report.corrupt, report.missing) == (8, 7, 1, 0)
    assert report.quarantined == report.rows_dropped == report.adopted == 0
    assert path.read_bytes() == damaged
    assert store.exists([pages[VICTIM].key]) == [True]
    assert list(store.payloads.quarantine_dir.iterdir()) == []
    after = store.stats()
    assert (after.num_chunks, after.quarantined) == (before.num_chunks, before.quarantined)


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_verify_repair_quarantines(filled, kind, caplog):
    store, pages, tensors = filled
    CORRUPTIONS[kind](store, pages, tensors)
    victim = pages[VICTIM]
    with caplog.at_level(logging.WARNING):
        report = verify(store, repair=True)
    assert (report.corrupt, report.quarantined) == (1, 1)
    assert store.exists([victim.key]) == [False]
    assert not store.payloads.path_for(victim.key).exists()
    assert [p.name.startswith(victim.key.hex()) for p in store.payloads.quarantine_dir.iterdir()] == [True]
    assert store.stats().quarantined == 1
    assert len(warnings_about(caplog, victim.key)) == 1
    got = store.get(pages)
    assert [t is None for t in got] == [i == VICTIM for i in range(len(pages))]
    clean = verify(store)
    assert (clean.corrupt, clean.missing, clean.ok) == (0, 0, 7)


def test_read_only_store_leaves_the_corrupt_file_in_place(filled, tmp_path, caplog):
    store, pages, tensors = filled
    CORRUPTIONS["payload-middle"](store, pages, tensors)
    with ChunkStore(store.root, store.identity, read_only=True) as ro, caplog.at_level(logging.WARNING):
        got = ro.get(pages)
    assert got[VICTIM] is None
    assert store.payloads.path_for(pages[VICTIM].key).exists()
    assert list(store.payloads.quarantine_dir.iterdir()) == []
    assert len(warnings_about(caplog, pages[VICTIM].key)) == 1
