"""PagePool on CPU tensors: allocator invariants (against a set model), page round trips, views into
pool memory (through a real ChunkStore), batched copies between pools, and a threaded stress."""

from __future__ import annotations

import random
import threading
import time

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from chunkstore import ChunkStore, chain_pages
from chunkstore.cache import DevicePool, HostPool, KVLayout, PagePool, PoolExhaustedError, default_device
from chunkstore.testing.tensors import bits, same_bytes
from tests.helpers import TINY, kv_pages

LAYOUT = KVLayout.from_identity(TINY)
DTYPES = ["bfloat16", "float16", "float32"]


def random_pages(layout: KVLayout, n: int, seed: int = 0) -> torch.Tensor:
    """Random bit patterns (NaNs and infinities included): copies must move bits, not values."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n, layout.page_size_bytes), dtype=torch.uint8, generator=g)
    return raw.view(layout.torch_dtype).reshape(n, *layout.page_shape)


def layout_of(dtype: str) -> KVLayout:
    return KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype=dtype, page_size=4)


# -- allocator -----------------------------------------------------------------------------------

def test_new_pool_shape_and_sizes():
    pool = PagePool(LAYOUT, 10)
    assert pool.buffer.shape == (10, *LAYOUT.page_shape)
    assert pool.buffer.dtype == torch.bfloat16 and pool.buffer.is_contiguous()
    assert pool.capacity_pages == 10 and pool.num_free == 10 and pool.num_used == 0
    assert pool.capacity_bytes == 10 * LAYOUT.page_size_bytes
    assert pool.device == torch.device("cpu") and "0/10 pages" in repr(pool)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_page_counts_are_rejected(bad):
    with pytest.raises(ValueError, match="num_pages"):
        PagePool(LAYOUT, bad)


def test_allocate_and_free():
    pool = PagePool(LAYOUT, 8)
    a = pool.allocate(3)
    b = pool.allocate(5)
    assert a.dtype == torch.int64 and a.device.type == "cpu"
    assert sorted(a.tolist() + b.tolist()) == list(range(8))
    assert pool.num_free == 0 and not pool.can_allocate(1) and pool.can_allocate(0)
    assert pool.allocate(0).numel() == 0
    pool.free(a)
    assert pool.num_free == 3 and pool.can_allocate(3) and not pool.can_allocate(4)
    assert sorted(pool.allocate(3).tolist()) == sorted(a.tolist())
    assert pool.is_allocated([0, 1]).tolist() == [True, True]


def test_exhaustion_takes_nothing():
    pool = PagePool(LAYOUT, 4)
    pool.allocate(3)
    with pytest.raises(PoolExhaustedError, match="2 pages asked, 1 of 4 free") as info:
        pool.allocate(2)
    assert isinstance(info.value, RuntimeError)
    assert pool.num_free == 1
    with pytest.raises(ValueError):
        pool.allocate(-1)


@pytest.mark.parametrize("make_batch, match", [
    (lambda held: [7], "double free"),  # never allocated
    (lambda held: [int(held[0])] * 2, "repeat"),
    (lambda held: [8], "out of range"),
    (lambda held: [int(held[0]), -1], "out of range"),
    (lambda held: torch.tensor([0.0]), "integers"),
    (lambda held: ["a"], "integers"),
])
def test_rejected_free_changes_nothing(make_batch, match):
    pool = PagePool(LAYOUT, 8)
    held = pool.allocate(4)
    free_before, mask_before = pool.free_list(), pool.is_allocated(range(8))
    with pytest.raises(ValueError, match=match):
        pool.free(make_batch(held))
    assert torch.equal(pool.free_list(), free_before) and torch.equal(pool.is_allocated(range(8)), mask_before)


def test_double_free_of_a_mixed_batch_frees_nothing():
    pool = PagePool(LAYOUT, 8)
    held = pool.allocate(4)
    pool.free(held[:2])
    with pytest.raises(ValueError, match="double free"):
        pool.free(held)  # two still allocated, two already free
    assert pool.num_free == 6 and pool.is_allocated(held[2:]).all()


def test_free_copies_the_callers_tensor():
    pool = PagePool(LAYOUT, 4)
    slots = pool.allocate(2)
    pool.free(slots)
    slots.fill_(3)  # the caller reuses its tensor: the free list must not change
    assert sorted(pool.allocate(4).tolist()) == [0, 1, 2, 3]


class AllocatorMachine(RuleBasedStateMachine):
    """The pool against a set of held slots: never hands out a held slot, counts add up, and a
    rejected free leaves both unchanged."""

    def __init__(self):
        super().__init__()
        self.pool = PagePool(LAYOUT, 16)
        self.held: set[int] = set()

    @rule(n=st.integers(0, 20))
    def allocate(self, n):
        if self.pool.can_allocate(n):
            slots = self.pool.allocate(n).tolist()
            assert len(slots) == n and not self.held & set(slots) and len(set(slots)) == n
            self.held |= set(slots)
        else:
            assert n > 16 - len(self.held)
            with pytest.raises(PoolExhaustedError):
                self.pool.allocate(n)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free_some(self, data):
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.held)), unique=True, min_size=1))
        self.pool.free(torch.tensor(chosen))
        self.held -= set(chosen)

    @rule(data=st.data())
    def bad_free(self, data):
        slot = data.draw(st.integers(-2, 18))
        if 0 <= slot < 16 and slot in self.held:
            batch = [slot, slot]  # repeated in one call
        else:
            batch = [slot] + sorted(self.held)[:2]  # a free or out-of-range slot spoils the batch
        with pytest.raises(ValueError):
            self.pool.free(batch)

    @invariant()
    def counts_match_the_model(self):
        assert self.pool.num_used == len(self.held)
        assert self.pool.num_free + self.pool.num_used == self.pool.capacity_pages
        assert set(torch.nonzero(self.pool.is_allocated(range(16))).flatten().tolist()) == self.held
        assert set(self.pool.free_list().tolist()) == set(range(16)) - self.held


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
@pytest.mark.timeout(60)
def test_threaded_allocate_free_never_shares_a_slot():
    pool = PagePool(LAYOUT, 64)
    owners = torch.full((64,), -1, dtype=torch.int64)  # which thread holds each slot
    owners_lock = threading.Lock()
    errors: list[BaseException] = []
    deadline = time.monotonic() + 2.0

    def worker(tid: int) -> None:
        rng = random.Random(tid)
        held: list[torch.Tensor] = []
        try:
            while time.monotonic() < deadline:
                n = rng.randint(1, 12)
                if rng.random() < 0.55:
                    try:
                        slots = pool.allocate(n)
                    except PoolExhaustedError:
                        continue
                    with owners_lock:
                        assert (owners[slots] == -1).all(), "slot handed out twice"
                        owners[slots] = tid
                    held.append(slots)
                elif held:
                    slots = held.pop(rng.randrange(len(held)))
                    with owners_lock:
                        assert (owners[slots] == tid).all()
                        owners[slots] = -1
                    pool.free(slots)
            for slots in held:
                with owners_lock:
                    owners[slots] = -1
                pool.free(slots)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors, errors
    assert pool.num_free == 64 and not pool.is_allocated(range(64)).any()
    assert sorted(pool.free_list().tolist()) == list(range(64))


# -- pages ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_write_read_round_trip_is_bit_identical(dtype):
    layout = layout_of(dtype)
    pool = PagePool(layout, 8)
    slots = pool.allocate(5)[torch.tensor([3, 0, 4, 1, 2])]  # scattered order
    pages = random_pages(layout, 5, seed=1)
    pool.write(slots, pages)
    assert torch.equal(bits(pool.read(slots)), bits(pages))
    assert torch.equal(bits(pool.read(slots.flip(0))), bits(pages.flip(0)))
    for slot, page in zip(slots.tolist(), pages):
        assert torch.equal(bits(pool.page(slot)), bits(page))


@pytest.mark.parametrize("dtype", DTYPES)
def test_views_are_pool_memory(dtype):
    layout = layout_of(dtype)
    pool = PagePool(layout, 6)
    slots = pool.allocate(3)
    pages = random_pages(layout, 3, seed=2)
    for view, page in zip(pool.views(slots), pages):
        assert view.shape == layout.page_shape and view.is_contiguous()
        assert view.untyped_storage().data_ptr() == pool.buffer.untyped_storage().data_ptr()
        view.copy_(page)
    assert torch.equal(bits(pool.read(slots)), bits(pages))
    pool.page(int(slots[0])).zero_()
    assert not pool.read(slots[:1]).any()


def test_get_into_host_views_lands_in_the_pool(tmp_path):
    layout = LAYOUT
    pages = chain_pages(TINY, list(range(TINY.page_size * 6)))
    tensors = kv_pages(TINY, len(pages), seed=3)
    with ChunkStore(tmp_path / "store", TINY) as store:
        assert store.put(pages, tensors).ok
        host = HostPool(layout, 16)
        host.allocate(5)  # the chunk slots are not the first ones
        slots = host.allocate(len(pages))
        assert store.get_into(pages, host.views(slots)) == [True] * len(pages)
    got = host.read(slots)
    assert all(same_bytes(got[i], tensors[i]) for i in range(len(pages)))


def test_put_from_host_views_round_trips(tmp_path):
    """Pool views are valid store inputs too, so host -> disk needs no staging copy."""
    pages = chain_pages(TINY, list(range(TINY.page_size * 4)))
    host = HostPool(LAYOUT, 8)
    slots = host.allocate(len(pages))
    host.write(slots, torch.stack(kv_pages(TINY, len(pages), seed=4)))
    with ChunkStore(tmp_path / "store", TINY) as store:
        assert store.put(pages, host.views(slots)).ok
        got = store.get(pages)
    assert all(same_bytes(g, host.page(s)) for g, s in zip(got, slots.tolist()))


def test_write_checks_shape_dtype_device():
    pool = PagePool(LAYOUT, 4)
    slots = pool.allocate(2)
    good = random_pages(LAYOUT, 2)
    with pytest.raises(ValueError, match="shape"):
        pool.write(slots, good[:1])
    with pytest.raises(ValueError, match="shape"):
        pool.write(slots, [good[0], good[1]])
    with pytest.raises(ValueError, match="float16"):
        pool.write(slots, good.to(torch.float16))
    with pytest.raises(ValueError, match="meta"):
        pool.write(slots, torch.empty_like(good, device="meta"))
    with pytest.raises(ValueError, match="repeat"):
        pool.write([int(slots[0])] * 2, good)


def test_unallocated_slots_are_refused():
    pool = PagePool(LAYOUT, 4)
    slots = pool.allocate(1)
    pool.free(slots)
    for call in (lambda: pool.read(slots), lambda: pool.views(slots), lambda: pool.page(int(slots[0])),
                 lambda: pool.write(slots, random_pages(LAYOUT, 1))):
        with pytest.raises(ValueError, match="not allocated"):
            call()
    with pytest.raises(ValueError, match="out of range"):
        pool.read([4])


# -- copies between pools ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("src_order, dst_order", [
    ("run", "run"), ("run", "scattered"), ("scattered", "run"), ("scattered", "scattered"),
])
def test_copy_to_round_trip(dtype, src_order, dst_order):
    layout = layout_of(dtype)
    device, host = DevicePool(layout, 10), HostPool(layout, 20)
    dev_slots = device.allocate(6)
    host.allocate(3)
    host_slots = host.allocate(6)
    if src_order == "scattered":
        dev_slots = dev_slots[torch.tensor([5, 2, 0, 4, 1, 3])]
    if dst_order == "scattered":
        host_slots = host_slots[torch.tensor([1, 3, 5, 0, 2, 4])]
    pages = random_pages(layout, 6, seed=5)
    device.write(dev_slots, pages.to(device.device))
    assert device.copy_to(host, dev_slots, host_slots) is None
    assert torch.equal(bits(host.read(host_slots)), bits(pages))
    # and back up into fresh device slots (device -> host -> device)
    back = device.allocate(4)
    host.copy_to(device, host_slots[:4], back, non_blocking=True)
    assert torch.equal(bits(device.read(back).cpu()), bits(pages[:4]))


def test_copy_within_one_pool_handles_overlap():
    pool = PagePool(LAYOUT, 8)
    slots = pool.allocate(8)
    pages = random_pages(LAYOUT, 8, seed=6)
    pool.write(slots, pages)
    pool.copy_to(pool, slots[0:4], slots[2:6])  # overlapping runs
    got = pool.read(slots)
    assert torch.equal(bits(got[2:6]), bits(pages[0:4]))
    assert torch.equal(bits(got[:2]), bits(pages[:2])) and torch.equal(bits(got[6:]), bits(pages[6:]))


def test_copy_to_checks():
    pool, other = PagePool(LAYOUT, 4), PagePool(LAYOUT, 4)
    a, b = pool.allocate(2), other.allocate(2)
    with pytest.raises(ValueError, match="layouts differ"):
        pool.copy_to(PagePool(layout_of("bfloat16"), 4), a, [0, 1])
    with pytest.raises(ValueError, match="1 destination"):
        pool.copy_to(other, a, b[:1])
    with pytest.raises(ValueError, match="not allocated"):
        pool.copy_to(other, a, [2, 3])
    with pytest.raises(ValueError, match="repeat"):
        pool.copy_to(other, a, [int(b[0])] * 2)
    assert pool.copy_to(other, [], []) is None


def test_pool_constructors_on_this_machine():
    host = HostPool(LAYOUT, 2)
    assert host.device.type == "cpu" and host.is_pinned == torch.cuda.is_available()
    assert DevicePool(LAYOUT, 2).device == default_device()
    assert not HostPool(LAYOUT, 2, pin_memory=False).is_pinned
    with pytest.raises(ValueError, match="pin_memory"):
        PagePool(LAYOUT, 2, device="meta", pin_memory=True)
