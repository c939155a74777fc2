"""Page pools: a fixed number of KV pages of one layout in one preallocated tensor, and their allocator.

Invariants: a slot is either free (in the free list) or allocated (its mask bit set), never both,
so ``num_free + num_used == capacity_pages`` and no slot is handed out twice; a rejected free
(out of range, duplicate, or not allocated) changes nothing; the allocator's bookkeeping is torch
tensors (slicing and concatenation, no per-page Python loops) guarded by one lock per pool; every
page is a view of the pool's single buffer, so writing a view writes the pool.
"""

from __future__ import annotations

import contextlib
import operator
import threading
from collections.abc import Sequence

import torch

from chunkstore.cache.layout import KVLayout
from chunkstore.cache.prefault import Prefaulter

SlotsLike = torch.Tensor | Sequence[int]


class PoolExhaustedError(RuntimeError):
    """An allocation asked for more pages than the pool has free (ask ``can_allocate`` first)."""


def default_device() -> torch.device:
    """The device that KV lives on during compute: the current CUDA device if any, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _is_run(idx: torch.Tensor) -> bool:
    """Whether sorted-ascending consecutive slots: such a batch is one slice, copied without a gather."""
    return idx.numel() == 1 or bool((idx[1:] - idx[:-1] == 1).all())


class PagePool:
    """``num_pages`` pages of ``layout`` in one tensor of shape ``(num_pages, *layout.page_shape)``.

    ``pin_memory`` pins a CPU pool (page-locked, for asynchronous copies to CUDA) when CUDA is
    available and is ignored otherwise. Slots are int64 CPU tensors (a sequence of ints is also
    accepted wherever slots are taken). Allocation and free are thread-safe (one lock per pool,
    ``lock``: held by allocate, free and the slot checks of every copy; public so that a caller can
    hold the pool still, as the tests do to keep transfers waiting); reads and writes of pages are
    not serialised: the caller that allocated a slot owns its bytes.
    """

    def __init__(self, layout: KVLayout, num_pages: int, *, device: torch.device | str | None = None,
                 pin_memory: bool = False):
        if isinstance(num_pages, bool) or not hasattr(num_pages, "__index__"):
            raise ValueError(f"num_pages must be an integer, got {num_pages!r}")
        num_pages = operator.index(num_pages)
        if num_pages <= 0:
            raise ValueError(f"num_pages must be positive, got {num_pages}")
        device = torch.device(device) if device is not None else torch.device("cpu")
        if pin_memory and device.type != "cpu":
            raise ValueError(f"pin_memory applies to CPU pools, not to {device}")
        self.layout = layout
        self.is_pinned = bool(pin_memory and torch.cuda.is_available())
        # Empty, not zeroed: a slot's bytes are read only after its owner wrote them (the
        # allocator hands out slots, the radix tree names only written ones), and zeroing a
        # default 1 GB + 2 GB on the CPU took a second of every start. A plain CPU buffer is
        # prefaulted in the background instead (prefault.py), so that first writes into it do not
        # pay the kernel's page faults; pinning already maps every page.
        self.buffer = torch.empty((num_pages, *layout.page_shape), dtype=layout.torch_dtype,
                                  device=device, pin_memory=self.is_pinned)
        self.device = self.buffer.device  # "cuda" resolved to "cuda:N"
        self._prefaulter = Prefaulter(self.buffer) if self.device.type == "cpu" and not self.is_pinned else None
        self.lock = threading.Lock()  # a leaf lock: nothing is called while it is held
        self._free = torch.arange(num_pages, dtype=torch.int64)
        self._allocated = torch.zeros(num_pages, dtype=torch.bool)

    def wait_prefaulted(self, timeout_s: float | None = None) -> bool:
        """Wait until every page of a CPU buffer is mapped (benchmarks measure steady state); True
        when done (at once for a pinned or CUDA buffer)."""
        return self._prefaulter is None or self._prefaulter.wait(timeout_s)

    def close(self) -> None:
        """Stop the background prefault (the pool stays usable). Idempotent."""
        if self._prefaulter is not None:
            self._prefaulter.close()

    # -- allocator -------------------------------------------------------------------------------

    @property
    def capacity_pages(self) -> int:
        return self.buffer.shape[0]

    @property
    def capacity_bytes(self) -> int:
        return self.capacity_pages * self.layout.page_size_bytes

    @property
    def num_free(self) -> int:
        return self._free.numel()

    @property
    def num_used(self) -> int:
        return self.capacity_pages - self.num_free

    def can_allocate(self, num_pages: int) -> bool:
        """Whether ``allocate(num_pages)`` would succeed now (another thread may allocate first)."""
        return 0 <= num_pages <= self.num_free

    def allocate(self, num_pages: int) -> torch.Tensor:
        """Take ``num_pages`` free slots (int64, CPU) under the pool lock; their bytes are unspecified.

        Raises PoolExhaustedError when fewer are free (nothing is taken) and ValueError for a
        negative count.
        """
        if isinstance(num_pages, bool) or not hasattr(num_pages, "__index__"):
            raise ValueError(f"num_pages must be an integer, got {num_pages!r}")
        num_pages = operator.index(num_pages)
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        with self.lock:
            if num_pages > self._free.numel():
                raise PoolExhaustedError(
                    f"{num_pages} pages asked, {self._free.numel()} of {self.capacity_pages} free")
            slots, self._free = self._free[:num_pages], self._free[num_pages:]
            self._allocated[slots] = True
        return slots

    def free(self, slots: SlotsLike) -> None:
        """Return allocated slots to the free list under the pool lock.

        Raises ValueError, freeing nothing, when a slot is out of range, repeated, or not allocated
        (a double free).
        """
        idx = self._slots(slots, unique=True)
        with self.lock:
            not_allocated = idx[~self._allocated[idx]]
            if not_allocated.numel():
                raise ValueError(f"double free: slots {not_allocated[:8].tolist()} are not allocated")
            self._allocated[idx] = False
            self._free = torch.cat([self._free, idx])  # copies: the caller may reuse its tensor

    def free_list(self) -> torch.Tensor:
        """A copy of the free slots, in the order ``allocate`` hands them out (for checks)."""
        with self.lock:
            return self._free.clone()

    def is_allocated(self, slots: SlotsLike) -> torch.Tensor:
        """Bool per slot: whether it is allocated now."""
        idx = self._slots(slots)
        with self.lock:
            return self._allocated[idx].clone()

    # -- pages -----------------------------------------------------------------------------------

    def page(self, slot: int) -> torch.Tensor:
        """A view of one allocated page (``layout.page_shape``)."""
        idx = self._slots([slot], check_allocated=True)
        return self.buffer[int(idx[0])]

    def views(self, slots: SlotsLike) -> list[torch.Tensor]:
        """Views of allocated pages, one per slot, e.g. as ``ChunkStore.get_into`` destinations."""
        idx = self._slots(slots, check_allocated=True)
        return [self.buffer[i] for i in idx.tolist()]

    def read(self, slots: SlotsLike) -> torch.Tensor:
        """A copy of allocated pages, ``(len(slots), *page_shape)`` on the pool's device."""
        idx = self._slots(slots, check_allocated=True)
        return self.buffer.index_select(0, idx.to(self.device))

    def write(self, slots: SlotsLike, pages: torch.Tensor) -> None:
        """Copy ``pages`` (``(len(slots), *page_shape)``, the layout's dtype, on the pool's device)
        into allocated, distinct slots. Raises ValueError for anything else."""
        idx = self._slots(slots, unique=True, check_allocated=True)
        expected = (idx.numel(), *self.layout.page_shape)
        if not isinstance(pages, torch.Tensor) or tuple(pages.shape) != expected:
            got = tuple(pages.shape) if isinstance(pages, torch.Tensor) else type(pages).__name__
            raise ValueError(f"pages must have shape {expected}, got {got}")
        if pages.dtype != self.layout.torch_dtype:
            raise ValueError(f"pages must be {self.layout.torch_dtype}, got {pages.dtype}")
        if pages.device != self.device:
            raise ValueError(f"pages must be on {self.device}, got {pages.device}")
        if idx.numel():
            self.buffer.index_copy_(0, idx.to(self.device), pages)

    def copy_to(self, other: "PagePool", src_slots: SlotsLike, dst_slots: SlotsLike, *,
                non_blocking: bool = False, stream: "torch.cuda.Stream | None" = None,
                ) -> "torch.cuda.Event | None":
        """Copy pages ``src_slots`` of this pool into ``dst_slots`` of ``other`` (any device).

        One batched gather (a slice when the slots are consecutive) and one scatter, no per-page
        loop. On CUDA the copy runs on ``stream`` (the current stream when None), after the work
        already queued on the caller's current stream; with ``non_blocking`` it returns an event
        recorded after the copy (wait on it before using or freeing the slots), otherwise it
        returns None once the bytes have landed. A device-to-host copy into scattered host slots waits for the
        stream before scattering. Raises ValueError for mismatched layouts or slot counts, and for
        slots that are out of range or not allocated (destination slots must also be distinct).
        """
        if other.layout.page_shape != self.layout.page_shape or other.layout.dtype != self.layout.dtype:
            raise ValueError(f"layouts differ: {self.layout} vs {other.layout}")
        src = self._slots(src_slots, check_allocated=True)
        dst = other._slots(dst_slots, unique=True, check_allocated=True)
        if src.numel() != dst.numel():
            raise ValueError(f"{src.numel()} source slots but {dst.numel()} destination slots")
        uses_cuda = self.device.type == "cuda" or other.device.type == "cuda"
        if src.numel() == 0:
            return None
        ctx = contextlib.nullcontext()
        if uses_cuda and stream is not None:
            # The pages were written by work already queued on the caller's stream (compute, or a
            # write): the copy must not start before it.
            stream.wait_stream(torch.cuda.current_stream(stream.device))
            ctx = torch.cuda.stream(stream)
        elif uses_cuda:  # the current stream of the pools' GPU, not of whichever GPU is current
            ctx = torch.cuda.device(self.device if self.device.type == "cuda" else other.device)
        with ctx:
            pages = self._gather(src, other)
            other._scatter(dst, pages, non_blocking)
            if not uses_cuda:
                return None
            if not non_blocking:
                torch.cuda.current_stream().synchronize()
                return None
            event = torch.cuda.Event()
            event.record()
            return event

    def _gather(self, idx: torch.Tensor, dst: "PagePool") -> torch.Tensor:
        """Pages ``idx`` as one tensor on this pool's device: a view of a consecutive run, else a copy
        (into pinned memory when it is bound for CUDA, so that the upload can be asynchronous)."""
        if dst is not self and _is_run(idx):
            start = int(idx[0])
            return self.buffer[start:start + idx.numel()]
        if self.is_pinned and dst.device.type == "cuda":
            staging = torch.empty((idx.numel(), *self.layout.page_shape), dtype=self.buffer.dtype,
                                  pin_memory=True)
            return torch.index_select(self.buffer, 0, idx, out=staging)
        return self.buffer.index_select(0, idx.to(self.device))

    def _scatter(self, idx: torch.Tensor, pages: torch.Tensor, non_blocking: bool) -> None:
        """Write ``pages`` (any device) into slots ``idx`` of this pool."""
        if _is_run(idx):
            start = int(idx[0])
            self.buffer[start:start + idx.numel()].copy_(pages, non_blocking=non_blocking)
            return
        if pages.device != self.device:
            pages = pages.to(self.device, non_blocking=non_blocking)
            if non_blocking and self.device.type == "cpu":
                # The CPU scatter below would read the host copy before the stream delivered it.
                torch.cuda.current_stream().synchronize()
        self.buffer.index_copy_(0, idx.to(self.device, non_blocking=non_blocking), pages)

    # -- checks ----------------------------------------------------------------------------------

    def _slots(self, slots: SlotsLike, *, unique: bool = False, check_allocated: bool = False,
               ) -> torch.Tensor:
        """``slots`` as a 1-D int64 CPU tensor, checked; raises ValueError."""
        if isinstance(slots, torch.Tensor):
            if slots.dtype.is_floating_point or slots.dtype.is_complex or slots.dtype == torch.bool:
                raise ValueError(f"slots must be integers, got {slots.dtype}")
            idx = slots.detach().to("cpu", torch.int64).reshape(-1)
        else:
            try:
                idx = torch.tensor([operator.index(s) for s in slots], dtype=torch.int64)
            except TypeError:
                raise ValueError(f"slots must be integers, got {slots!r}") from None
        if idx.numel() == 0:
            return idx
        bad = idx[(idx < 0) | (idx >= self.capacity_pages)]
        if bad.numel():
            raise ValueError(f"slots {bad[:8].tolist()} out of range [0, {self.capacity_pages})")
        if unique and torch.unique(idx).numel() != idx.numel():
            raise ValueError("slots repeat")
        if check_allocated:
            with self.lock:
                unallocated = idx[~self._allocated[idx]]
            if unallocated.numel():
                raise ValueError(f"slots {unallocated[:8].tolist()} are not allocated")
        return idx

    def __repr__(self) -> str:
        pinned = ", pinned" if self.is_pinned else ""
        return (f"{type(self).__name__}({self.num_used}/{self.capacity_pages} pages used, "
                f"{self.capacity_bytes} bytes on {self.device}{pinned}; {self.layout})")


class DevicePool(PagePool):
    """The compute-side pool: on ``device`` (default: CUDA when available, else the CPU)."""

    def __init__(self, layout: KVLayout, num_pages: int, device: torch.device | str | None = None):
        super().__init__(layout, num_pages, device=device if device is not None else default_device())


class HostPool(PagePool):
    """The host-memory pool: CPU pages, pinned when CUDA is available (``pin_memory`` allowing)."""

    def __init__(self, layout: KVLayout, num_pages: int, *, pin_memory: bool = True):
        super().__init__(layout, num_pages, device="cpu", pin_memory=pin_memory)
