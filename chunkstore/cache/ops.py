"""The tier controller's work items: one typed operation per transfer path, and their acknowledgements.

Invariants: an operation owns the destination slots it names from submission until its last
acknowledgement is applied (then the cache hands each slot to the tree or frees it); an operation
that reads tree-held pages holds a lock on them (``anchor``) so they are neither evicted nor freed
while it runs; an acknowledgement covers a contiguous run of the operation's pages and says per
page whether it succeeded; an operation ``is_applied_by_caller`` (a load-back, an eviction's copy)
is applied by the thread that waits for it, every other by the cache's ack handler. Nothing here
moves bytes: controller.py does, and its ``InFlight`` registry records what is in flight.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from chunkstore.cache.policies import PolicyEnum
from chunkstore.cache.radix_types import LockHandle, RadixNode
from chunkstore.cache.tiers import Tier
from chunkstore.disk.keys import PageRef


class TransferPath(PolicyEnum):
    """The four copy paths between tiers, one worker thread (and queue) each."""

    DEVICE_TO_HOST = "device_to_host"  # backup (write-through or before a device eviction)
    HOST_TO_DISK = "host_to_disk"  # persist
    DISK_TO_HOST = "disk_to_host"  # prefetch
    HOST_TO_DEVICE = "host_to_device"  # load-back

    @property
    def source(self) -> Tier:
        return Tier(self.value.split("_to_")[0])

    @property
    def destination(self) -> Tier:
        return Tier(self.value.split("_to_")[1])


@dataclass(eq=False)
class TransferOp:
    """Common part of every operation: its pages' keys and the completion flag the cache waits on.
    ``is_applied_by_caller``: the acks only count in the stats; the thread that runs or waits for
    the op applies its outcome (``num_failed_pages == 0``: every page landed)."""

    keys: tuple[bytes, ...]
    is_applied_by_caller: bool = False
    submitted_at: float = field(default_factory=time.perf_counter, init=False)
    done: threading.Event = field(default_factory=threading.Event, init=False)  # after the last ack
    error: str | None = field(default=None, init=False)  # set when any page failed for a reason
    num_acked_pages: int = field(default=0, init=False)  # progress: pages acknowledged so far
    num_failed_pages: int = field(default=0, init=False)  # of those, the pages that failed

    path: TransferPath = field(init=False)

    @property
    def num_pages(self) -> int:
        return len(self.keys)


@dataclass(eq=False)
class BackupOp(TransferOp):
    """Device -> host: copy ``device_slots`` into ``host_slots`` (owned by the op until acked)."""

    device_slots: torch.Tensor = None
    host_slots: torch.Tensor = None
    anchor: LockHandle | None = None  # lock on the node whose pages these are (None: an eviction's
    # copy, run with run_now under the tree's lock, which keeps the pages in place instead)
    ready: "torch.cuda.Event | None" = None  # recorded after the compute that wrote the pages

    def __post_init__(self) -> None:
        self.path = TransferPath.DEVICE_TO_HOST


@dataclass(eq=False)
class PersistOp(TransferOp):
    """Host -> disk: ``store.put`` of ``pages`` from the host pages ``host_slots`` (tree-held; not
    locked: host evictions skip pages being persisted, so the device copy stays evictable)."""

    pages: tuple[PageRef, ...] = ()
    host_slots: torch.Tensor = None
    node: RadixNode | None = None  # the node holding the last page when the op began

    def __post_init__(self) -> None:
        self.path = TransferPath.HOST_TO_DISK


@dataclass(eq=False)
class PrefetchOp(TransferOp):
    """Disk -> host: load ``pages`` (the chain after ``from_page`` pages of ``token_ids``) into
    ``host_slots``, in batches; each batch's hits are inserted into the tree as they land."""

    namespace: str = ""
    token_ids: tuple[int, ...] = ()  # the request's tokens up to the last page to load
    from_page: int = 0  # pages of token_ids before the first loaded page (in the tree, anchored)
    pages: tuple[PageRef, ...] = ()
    host_slots: torch.Tensor = None
    anchor: LockHandle | None = None  # lock on the tree node the chain continues; moves per batch
    num_loaded_pages: int = 0  # pages inserted into the tree so far
    speculative: bool = False  # for a queued request (held pages): its reads run at the background priority

    def __post_init__(self) -> None:
        self.path = TransferPath.DISK_TO_HOST


@dataclass(eq=False)
class LoadBackOp(TransferOp):
    """Host -> device: copy ``host_slots`` (tree-held, locked by the caller) into ``device_slots``."""

    host_slots: torch.Tensor = None
    device_slots: torch.Tensor = None
    ready: "torch.cuda.Event | None" = None  # recorded on the caller's stream: its queued work on
    # the destination slots (freed by an eviction just now) finishes before the copy overwrites them
    event: "torch.cuda.Event | None" = None  # on CUDA: recorded after the copy

    def __post_init__(self) -> None:
        self.path = TransferPath.HOST_TO_DEVICE
        self.is_applied_by_caller = True  # the caller of TieredCache._load_back waits for it


@dataclass(frozen=True, slots=True)
class Ack:
    """The outcome of pages ``[start_page, start_page + len(ok))`` of ``op``."""

    op: TransferOp
    start_page: int
    ok: tuple[bool, ...]  # per page
    num_bytes: int  # bytes moved (successful pages)
    elapsed_s: float  # wall time of this part of the work
    is_last: bool = True  # no more acks for this op
    error: str | None = None

    @property
    def num_ok(self) -> int:
        return sum(self.ok)

    @property
    def num_leading_ok(self) -> int:
        """Pages that succeeded before the first failure (a chain is usable only up to a hole)."""
        n = 0
        for is_ok in self.ok:
            if not is_ok:
                break
            n += 1
        return n
