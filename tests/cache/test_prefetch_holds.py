"""Prefetch holds: pages prefetched for a queued request stay in host memory until it starts.

Real TieredCache, pools and a zstd/SQLite store in tmp_path (the helpers of test_tiered.py). Each
scenario puts prefixes on disk with a first run, opens a cold cache over that disk, prefetches as
the engine does for queued requests, then applies the pressure that used to push those pages out
(other requests' traffic) and checks where the pages are with ``peek`` (which changes nothing).
"""

from __future__ import annotations

import time

import pytest
import torch

from chunkstore.cache.ops import PrefetchOp
from chunkstore.cache.prefetch_holds import MAX_PENDING, NEXT_IN_LINE, PrefetchHolds
from tests.cache.test_tiered import (
    P, assert_consistent, bad_pages, keys_of, lookup, make_config, open_cache, open_faulty_cache, persist_run, serve,
    settle, stalled_disk_reads, toks,
)

A, B, C = toks(1, 2, 3, 4), toks(5, 6, 7, 8), toks(9, 10, 11, 12)
TRAFFIC = [toks(100 + 10 * i, 101 + 10 * i, 102 + 10 * i, 103 + 10 * i) for i in range(8)]  # 32 new pages


def host_tokens(cache, tokens) -> int:
    return cache.peek(tokens)[1]


def assert_starts_from_host(cache, tokens, num_pages: int) -> None:
    """The request's match finds its first ``num_pages`` pages in host memory."""
    hit = lookup(cache, tokens)
    assert (hit.num_tokens, hit.host_tokens) == (num_pages * P, num_pages * P)


def other_traffic(cache) -> None:
    """Requests for other prefixes: their write-through copies need far more than the host pool."""
    for tokens in TRAFFIC:
        serve(cache, tokens)
        settle(cache)


def test_held_pages_survive_other_traffic_until_their_request_starts(tmp_path):
    persist_run(tmp_path, [A])
    with open_cache(make_config(tmp_path)) as cache:  # 8 device, 16 host pages; half for holds
        assert cache.prefetch(A) == 4
        settle(cache)
        other_traffic(cache)
        assert host_tokens(cache, A) == 4 * P, "pages prefetched for a queued request were evicted"
        assert cache.stats().host.locked_pages == 0  # a hold is not a tree lock
        assert_starts_from_host(cache, A, 4)  # the request starts: its hold is consumed
        other_traffic(cache)
        assert cache.peek(A)[:2] == (0, 0), "a consumed hold still kept its pages"
        assert_consistent(cache)


def test_a_hold_ends_after_prefetch_hold_s(tmp_path):
    persist_run(tmp_path, [A])
    with open_cache(make_config(tmp_path, prefetch_hold_s=0.05)) as cache:
        assert cache.prefetch(A) == 4
        settle(cache)
        time.sleep(0.1)  # the request never starts (cancelled in the queue, say)
        other_traffic(cache)
        assert host_tokens(cache, A) == 0
        assert_consistent(cache)


def test_the_share_bounds_speculative_prefetch_and_the_rest_follows_later(tmp_path):
    persist_run(tmp_path, [A, B])
    with open_cache(make_config(tmp_path, prefetch_host_share=0.25)) as cache:  # 4 of 16 host pages
        assert cache.prefetch(A) == 4
        assert cache.prefetch(B) == 0  # no room: B waits in line
        settle(cache)
        assert host_tokens(cache, B) == 0
        lookup(cache, A)  # A starts; its room goes to the next in line
        settle(cache)
        assert host_tokens(cache, B) == 4 * P
        assert_starts_from_host(cache, B, 4)
        assert_consistent(cache)


def test_a_zero_share_turns_prefetch_for_queued_requests_off(tmp_path):
    persist_run(tmp_path, [A])
    with open_cache(make_config(tmp_path, prefetch_host_share=0.0)) as cache:
        assert cache.prefetch(A) == 0
        settle(cache)
        assert host_tokens(cache, A) == 0
        hit = lookup(cache, A)  # loaded when the request starts instead
        assert (hit.num_tokens, hit.disk_tokens) == (4 * P, 4 * P)
        assert_consistent(cache)


def test_the_running_request_takes_back_the_holds_of_the_last_in_line(tmp_path):
    d = toks(13, 14, 15, 16, 17, 18, 19, 20)
    persist_run(tmp_path, [A, B, C, d])
    with open_cache(make_config(tmp_path, prefetch_host_share=1.0)) as cache:
        for tokens in (A, B, C):
            assert cache.prefetch(tokens) == 4
        settle(cache)  # 12 of 16 host pages held
        hit = lookup(cache, d)  # needs 8 pages of host room: takes C's (the newest hold)
        assert hit.num_tokens == 8 * P
        assert (host_tokens(cache, A), host_tokens(cache, B)) == (4 * P, 4 * P)
        assert_consistent(cache)


def test_a_prefix_that_went_to_disk_while_queued_is_prefetched_again(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        serve(cache, A)
        settle(cache)
        next_round = A + toks(50, 51)
        assert cache.prefetch(next_round) == 0  # A is in memory: nothing to load yet
        cache.admin.clear("device")
        cache.admin.clear("host")  # A goes down to disk while the request waits
        assert cache.peek(next_round) == (0, 0, 4 * P)
        serve(cache, B)  # another request starts: the refresher looks at the queue again
        settle(cache)
        assert host_tokens(cache, next_round) == 4 * P
        assert_starts_from_host(cache, next_round, 4)
        assert_consistent(cache)


def test_clearing_the_host_tier_ends_the_holds(tmp_path):
    persist_run(tmp_path, [A])
    with open_cache(make_config(tmp_path)) as cache:
        assert cache.prefetch(A) == 4
        settle(cache)
        assert cache.admin.clear("host") == 4
        assert host_tokens(cache, A) == 0
        assert_consistent(cache)


@pytest.mark.timeout(60)
def test_a_prefetch_still_in_flight_when_its_request_starts_is_not_held(tmp_path):
    persist_run(tmp_path, [A])
    with open_faulty_cache(make_config(tmp_path, prefetch_policy="best_effort")) as cache:
        with stalled_disk_reads(cache):
            assert cache.prefetch(A) == 4
            hit = cache.match(A, wait_for_prefetch=False)  # starts before the pages land
            assert hit.num_tokens == 0
            cache.release(hit)
        settle(cache)
        other_traffic(cache)
        assert host_tokens(cache, A) == 0, "pages of a request that already started were held"
        assert_consistent(cache)


# ---- the bookkeeping alone ------------------------------------------------------------------------

def _op(tokens, num_pages: int, namespace: str = "ns") -> PrefetchOp:
    keys = tuple(i.to_bytes(4, "little") + namespace.encode() + bytes(tokens[:1]) for i in range(num_pages))
    return PrefetchOp(keys=keys, namespace=namespace, token_ids=tuple(tokens), host_slots=torch.arange(num_pages))


def test_room_counts_pages_in_flight_and_held():
    holds = PrefetchHolds(capacity_pages=10, hold_s=60)
    a, b = _op([1, 2], 4), _op([3, 4], 3)
    holds.started(a)
    holds.started(b)
    assert holds.room() == 3
    a.num_loaded_pages = 2  # two of its four pages landed
    holds.finished(a)
    assert (holds.num_held_pages, holds.room()) == (2, 5)
    assert holds.is_held([a.keys[1]]) and not holds.is_held([a.keys[3]])
    assert holds.consume((1, 2, 9), "other-namespace") == 0
    assert holds.consume((1, 2, 9), "ns") == 2
    assert holds.room() == 7


def test_expiry_ends_holds_and_pending_requests():
    holds = PrefetchHolds(capacity_pages=10, hold_s=5)
    op = _op([1], 2)
    holds.started(op)
    op.num_loaded_pages = 2
    holds.finished(op)
    holds.add_pending((1,), "ns")
    now = time.monotonic()
    assert holds.expire(now) == 0 and holds.next_in_line()
    assert holds.expire(now + 6) == 2
    assert holds.next_in_line() == [] and holds.num_held_pages == 0


def test_pending_requests_are_bounded_and_next_in_line_is_the_oldest():
    holds = PrefetchHolds(capacity_pages=10, hold_s=60)
    for i in range(MAX_PENDING + 5):
        holds.add_pending((i,), "ns")
    line = holds.next_in_line()
    assert [p.tokens for p in line] == [(i,) for i in range(5, 5 + NEXT_IN_LINE)]
    holds.consume((5, 7), "ns")
    assert holds.next_in_line()[0].tokens == (6,)


def test_new_pages_are_backed_up_before_pages_held_for_queued_requests(tmp_path):
    persist_run(tmp_path, [A, B, C])
    with open_cache(make_config(tmp_path, prefetch_host_share=1.0)) as cache:
        for tokens in (A, B, C):
            assert cache.prefetch(tokens) == 4
        settle(cache)  # 12 of 16 host pages held
        fresh = toks(30, 31, 32, 33, 34, 35, 36, 37)
        serve(cache, fresh)  # write-through needs 8 host pages for its copies
        settle(cache)
        assert cache.stats().backups_skipped == 0, "a new page lost its copy to a speculative hold"
        assert cache.store.longest_prefix(keys_of(fresh)) == 8  # and it reached the disk
        assert_consistent(cache)


def test_the_host_copies_of_a_queued_requests_prefix_are_held_too(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        serve(cache, A)
        settle(cache)  # A is on the device, and written through to host and disk
        next_round = A + toks(50, 51)
        assert cache.prefetch(next_round) == 0  # nothing to load: A is in memory
        cache.admin.clear("device")
        other_traffic(cache)
        assert host_tokens(cache, next_round) == 4 * P
        assert cache.stats().paths["disk_to_host"].num_pages == 0, "a queued request's prefix went down to disk"
        assert_starts_from_host(cache, next_round, 4)
        other_traffic(cache)
        assert host_tokens(cache, next_round) == 0  # the hold ended with the match
        assert_consistent(cache)


@pytest.mark.timeout(120)
def test_write_back_evictions_copy_new_pages_before_pages_held_for_queued_requests(tmp_path):
    d = toks(13, 14, 15, 16)
    persist_run(tmp_path, [A, B, C, d])
    config = make_config(tmp_path, prefetch_host_share=1.0, write_policy="write_back")
    with open_cache(config) as cache:
        for tokens in (A, B, C, d):
            assert cache.prefetch(tokens) == 4
        settle(cache)  # every host page held
        fresh = [toks(40 + 10 * i, 41 + 10 * i, 42 + 10 * i, 43 + 10 * i) for i in range(4)]
        for tokens in fresh:  # 16 new pages through an 8-page device: evictions must copy them down
            serve(cache, tokens)
        settle(cache)
        for tokens in fresh[:2]:  # the first ones left the device, each with a copy below it
            assert sum(cache.peek(tokens)) == 4 * P, "a new page was lost to a speculative hold"
        assert_consistent(cache)


def test_a_running_requests_host_copies_make_room_for_the_next_ones_prefetch(tmp_path):
    # The running request's hit fills the host pool with copies of pages it reads on the device.
    # Those copies are spares (its lock keeps the device copy), so the prefetch for the request
    # behind it takes their room; kept, they left none and that request read its pages from disk
    # at its match, on the engine's thread.
    running = toks(*range(20, 28))  # 8 pages: the whole device pool and the whole host pool
    persist_run(tmp_path, [running, A])
    with open_cache(make_config(tmp_path, host_size="8pages", prefetch_host_share=1.0)) as cache:
        hit = cache.match(running)
        try:
            assert (hit.num_tokens, hit.disk_tokens) == (8 * P, 8 * P)
            assert cache.host_pool.num_free == 0 and cache.stats().host.locked_pages == 0
            assert cache.prefetch(A) == 4
            settle(cache)
            assert host_tokens(cache, A) == 4 * P
            assert bad_pages(cache, hit, running) == []  # the hit's device pages are untouched
        finally:
            cache.release(hit)
        assert_starts_from_host(cache, A, 4)
        assert_consistent(cache)
