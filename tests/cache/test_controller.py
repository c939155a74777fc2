"""The tier controller's in-flight registry, and the evictions that copy through the controller.

Real pools, a real store in tmp_path and real worker threads; faults come through seams (the
store's ``files.os_write``), never by reaching into private state.
"""

from __future__ import annotations

import errno
import threading

import torch

from chunkstore.cache.controller import InFlight, TierController
from chunkstore.cache.ops import Ack, BackupOp, PersistOp, TransferPath
from chunkstore.cache.pools import DevicePool, HostPool
from tests.cache.test_tiered import (
    LAYOUT, SETTLE_S, compute, keys_of, make_config, open_cache, serve, settle, toks, tree_pages, wait_until,
)

KEYS = (b"a" * 32, b"b" * 32)


def _pools():
    return DevicePool(LAYOUT, 4, "cpu"), HostPool(LAYOUT, 4)


def test_an_op_is_in_flight_from_submit_until_its_last_ack_is_applied():
    device, host = _pools()
    seen: list[tuple[object, bool, int]] = []
    controller = None

    def on_ack(ack: Ack) -> None:  # what the cache sees while it applies the ack
        seen.append((controller.in_flight.op_for(ack.op.path, ack.op.keys[0]), ack.op.done.is_set(),
                     controller.num_pending))

    controller = TierController(device, host, None, on_ack)
    try:
        op = BackupOp(keys=KEYS, device_slots=device.allocate(2), host_slots=host.allocate(2))
        controller.submit(op)
        assert op.done.wait(SETTLE_S)
        assert seen == [(op, False, 1)]  # applied while still registered, before done
        assert controller.in_flight.op_for(TransferPath.DEVICE_TO_HOST, KEYS[0]) is None
        assert controller.wait_idle(SETTLE_S) and controller.num_pending == 0
        assert controller.queue_depths() == dict.fromkeys((p.value for p in TransferPath), 0)
        assert op.num_failed_pages == 0
    finally:
        controller.close()


def test_run_now_registers_and_finishes_the_op_on_the_calling_thread():
    device, host = _pools()
    threads: list[str] = []
    controller = TierController(device, host, None, lambda ack: threads.append(threading.current_thread().name))
    try:
        op = BackupOp(keys=KEYS, is_applied_by_caller=True, device_slots=device.allocate(2),
                      host_slots=host.allocate(2))
        controller.run_now(op)
        assert op.done.is_set() and op.num_failed_pages == 0
        assert threads == [threading.current_thread().name]
        assert controller.num_pending == 0 and not controller.in_flight.covers(TransferPath.DEVICE_TO_HOST, KEYS[0])
    finally:
        controller.close()


def test_a_submission_after_close_fails_at_once_and_leaves_nothing_in_flight():
    device, host = _pools()
    acks: list[Ack] = []
    controller = TierController(device, host, None, acks.append)
    controller.close()
    op = BackupOp(keys=KEYS, device_slots=device.allocate(2), host_slots=host.allocate(2))
    controller.submit(op)
    assert op.done.is_set() and op.num_failed_pages == 2
    assert [a.ok for a in acks] == [(False, False)] and acks[0].error == "the tier controller is closed"
    assert controller.num_pending == 0 and controller.wait_idle(0)


def test_a_key_stays_with_the_newer_op_when_an_older_one_finishes():
    registry = InFlight()
    older = PersistOp(keys=KEYS)
    newer = PersistOp(keys=KEYS[1:])
    registry.add(older)
    registry.add(newer)
    registry.finish(older)
    assert older.done.is_set() and not newer.done.is_set()
    assert registry.op_for(TransferPath.HOST_TO_DISK, KEYS[0]) is None
    assert registry.op_for(TransferPath.HOST_TO_DISK, KEYS[1]) is newer
    assert registry.depths()[TransferPath.HOST_TO_DISK] == 1 and not registry.wait_idle(0)
    registry.finish(newer)
    registry.finish(newer)  # idempotent
    assert registry.num_ops == 0 and registry.wait_idle(0)


def test_a_key_goes_back_to_the_older_op_when_the_newer_one_finishes_first():
    registry = InFlight()
    older, newer = PersistOp(keys=KEYS), PersistOp(keys=KEYS)
    registry.add(older)
    registry.add(newer)
    assert registry.op_for(TransferPath.HOST_TO_DISK, KEYS[0]) is newer
    registry.finish(newer)
    assert registry.op_for(TransferPath.HOST_TO_DISK, KEYS[0]) is older
    assert registry.op_for(TransferPath.DEVICE_TO_HOST, KEYS[0]) is None  # paths are apart
    registry.finish(older)
    assert registry.op_for(TransferPath.HOST_TO_DISK, KEYS[0]) is None and registry.num_ops == 0


def test_a_write_back_device_eviction_copies_through_the_controller(tmp_path):
    with open_cache(make_config(tmp_path, write_policy="write_back")) as cache:
        tokens = toks(1, 2, 3)
        serve(cache, tokens)
        settle(cache)
        assert tree_pages(cache, "host") == 0  # write-back: nothing copied down yet
        before = cache.stats().paths["device_to_host"]
        assert cache.admin.evict("device", 3) == 3
        after = cache.stats().paths["device_to_host"]
        assert (after.num_ops - before.num_ops, after.num_pages - before.num_pages) == (1, 3)
        assert tree_pages(cache, "host") == 3 and tree_pages(cache, "device") == 0
        assert cache.controller.num_pending == 0  # run on this thread, and finished
        assert cache.peek(tokens) == (0, len(tokens), 0)


def _no_space(fd, data):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failed_write_before_a_host_eviction_keeps_the_host_copy(tmp_path):
    with open_cache(make_config(tmp_path, write_policy="write_back")) as cache:
        tokens = toks(1, 2)
        serve(cache, tokens)
        settle(cache)
        cache.admin.evict("device", 2)  # now on the host only, not on disk (write-back)
        assert tree_pages(cache, "host") == 2 and cache.store.exists(keys_of(tokens)) == [False, False]
        real, cache.store.payloads.os_write = cache.store.payloads.os_write, _no_space  # the store's write seam
        try:
            assert cache.admin.evict("host", 2) == 0  # the write failed: the only copy stays
            paths = cache.stats().paths["host_to_disk"]
            assert paths.failed_pages == 2 and paths.num_ops == 1
            assert tree_pages(cache, "host") == 2 and cache.controller.num_pending == 0
        finally:
            cache.store.payloads.os_write = real
        assert cache.admin.evict("host", 2) == 2  # the disk is back: written down, then evicted
        assert cache.store.exists(keys_of(tokens)) == [True, True]
        assert cache.peek(tokens) == (0, 0, len(tokens))


def test_a_persist_in_flight_keeps_its_host_copy_from_eviction(tmp_path):
    """The registry is what host eviction asks: a page a write is reading never goes meanwhile."""
    with open_cache(make_config(tmp_path)) as cache:
        tokens = toks(1, 2)
        gate = threading.Event()
        real = cache.store.payloads.os_write

        def slow_write(fd, data):
            gate.wait(SETTLE_S)
            return real(fd, data)

        cache.store.payloads.os_write = slow_write
        try:
            slots = compute(cache, keys_of(tokens))
            cache.insert(tokens, slots)  # write-through: backed up, then persisted (stalled)
            first_key = keys_of(tokens)[0]
            wait_until(lambda: cache.controller.in_flight.covers(TransferPath.HOST_TO_DISK, first_key),
                       "the persist is in flight")
            assert cache.admin.evict("host", 2) == 0  # being written: kept
            assert tree_pages(cache, "host") == 2
        finally:
            gate.set()
            cache.store.payloads.os_write = real
        settle(cache)
        assert cache.store.exists(keys_of(tokens)) == [True, True]
        assert cache.admin.evict("host", 2) == 2
        assert torch.equal(cache.host_pool.is_allocated(torch.arange(cache.host_pool.capacity_pages)),
                           torch.zeros(cache.host_pool.capacity_pages, dtype=torch.bool))
