"""Helpers of the concurrency tests (tests/test_concurrency.py, tests/test_shared_contract.py): the
soak's key space (chunkstore/testing/crash_soak.py) picked at random, the reader threads' checked
reads, and the evict-and-restore races set up through FaultyPayloads' hooks."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import torch

from chunkstore.disk.keys import PageRef
from chunkstore.disk.maintenance import evict_bytes
from chunkstore.disk.store import ChunkStore
from chunkstore.testing import crash_soak as soak
from tests.helpers.faults import FaultyPayloads

# (namespace, first page) subtrees of the soak key space.
SUBTREES = [(ns, d) for ns in soak.NAMESPACES for d in range(soak.BRANCHING)]


def random_chain(rng: random.Random, subtrees=SUBTREES) -> list[PageRef]:
    ns, first = rng.choice(subtrees)
    rest = tuple(rng.randrange(soak.BRANCHING) for _ in range(rng.randint(0, soak.MAX_DEPTH - 1)))
    return soak.chain_for(ns, (first, *rest))


def guarded(errors: list[str]):
    """A decorator for a thread's body ``fn(arg, rng)``: the thread runs ``run(arg, seed)``, which
    calls ``fn(arg, random.Random(seed))`` and records any exception in ``errors`` (for the main
    thread to report)."""
    def wrap(fn):
        def run(arg, seed: int) -> None:
            try:
                fn(arg, random.Random(seed))
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(f"{fn.__name__}: {type(exc).__name__}: {exc}")
        return run
    return wrap


def read_buffers() -> list[torch.Tensor]:
    """A reader's get_into buffers, one per page of the longest chain."""
    return [soak.expected_page(b"\0" * 32) for _ in range(soak.MAX_DEPTH)]


def checked_read(store: ChunkStore, rng: random.Random, expected: dict[bytes, torch.Tensor],
                 outs: list[torch.Tensor]) -> list[torch.Tensor | None]:
    """One reader step: a random chain read with get or get_into (into ``outs``), then exists and
    longest_prefix on it; raises AssertionError if a page loads with other bytes than ``expected``.
    Returns what was read (None for a miss)."""
    pages = random_chain(rng)
    if rng.random() < 0.5:
        got = store.get(pages)
    else:
        hits = store.get_into(pages, outs[: len(pages)])
        got = [o if h else None for o, h in zip(outs, hits)]
    store.exists([p.key for p in pages])
    store.longest_prefix([p.key for p in pages])
    for p, t in zip(pages, got):
        if t is not None and not soak.same_bytes(t, expected[p.key]):
            raise AssertionError(f"torn or mixed read of {p.key.hex()}")
    return got


def run_threads(threads: list[threading.Thread], timeout_s: float) -> None:
    """Start ``threads``, join each (``timeout_s`` at most each) and fail if one hung."""
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout_s)
    assert not any(t.is_alive() for t in threads), "a thread hung"


def one_page(token: int) -> tuple[PageRef, torch.Tensor]:
    page = soak.chain_for("default", (token,))[0]
    return page, soak.expected_page(page.key)


def store_again_meanwhile(store: ChunkStore, page: PageRef, want: torch.Tensor) -> None:
    """What a writer may do while a read is in flight: evict the chunk, then store it again."""
    assert evict_bytes(store, 1).keys == (page.key,)
    assert store.put([page], [want]).stored == [page.key]


def lose_the_read_race(payloads: FaultyPayloads, page: PageRef, meanwhile: Callable[[], None]) -> None:
    """Hook ``payloads``' reads: the first read of ``page`` runs ``meanwhile`` (between the reader's
    index lookup and its read of the payload: a writer evicts the chunk and stores it again), and
    then fails in the gap, so the reader sees no payload."""
    raced = []

    def read_losing_the_race(key, *_):
        if key == page.key and not raced:
            raced.append(key)
            meanwhile()
            raise FileNotFoundError(key.hex())

    payloads.hook("read", read_losing_the_race)


def race_a_damaged_read(payloads: FaultyPayloads, page: PageRef, meanwhile: Callable[[], None]) -> None:
    """Read ``page``'s (damaged) payload through ``payloads``, and right after the first read of it
    run ``meanwhile`` (a writer replaces it) before the reader acts on what it read."""
    raced = []

    def read_then_race(read, key, max_size_bytes, buffer):
        data = bytes(read(key, max_size_bytes, buffer))  # the damaged payload
        if key == page.key and not raced:
            raced.append(key)
            meanwhile()  # a writer replaces it meanwhile
        return memoryview(data)

    payloads.read_through(read_then_race)
