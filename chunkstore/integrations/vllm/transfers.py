"""The worker side of the vLLM connector: blocks loaded into vLLM's paged KV and saved out of it,
through the tiered cache (a staging pool on vLLM's device, the host tier, the disk tier).

Invariants: a load takes only what the cache's ``match`` returns, pages verified on their way up
from disk, and reports every block it could not fill (and the ones after it) as a load error,
so vLLM recomputes them; an asynchronous load runs after the work vLLM's stream queued before it
and is reported finished once its copies are done, whatever fails (its errors no later than
that); a request whose synchronous load failed saves nothing until vLLM has recomputed the failed
blocks; a save copies whole computed blocks out of
the paged KV on vLLM's thread, before their blocks can be reused, and inserts them into the
cache, whose write-through puts them on disk in the background; a rank that does not write
(an MLA replica) loads from the store its writer rank writes and saves nothing; store and cache
errors are logged, never raised into vLLM's threads. Uses the cache's and the store's public
methods only.
"""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from chunkstore.cache.tiered import TieredCache
from chunkstore.disk import ChunkStore, ModelIdentity, chain_pages
from chunkstore.integrations.vllm.paged_kv import PagedKV
from chunkstore.integrations.writer import close_at_exit

log = logging.getLogger(__name__)

TRANSFER_PAGES = 64  # blocks per copy batch: bounds the memory a long prompt's transfer stages

# The writing ranks' caches in this process, by store folder: vLLM's scheduler looks up in the
# host tier of a worker that runs in its own process (tensor parallel size 1).
_LOCAL_CACHES: "weakref.WeakValueDictionary[str, TieredCache]" = weakref.WeakValueDictionary()


def local_cache(store_folder: str) -> TieredCache | None:
    """The cache of the worker in this process whose store is ``store_folder``, if any."""
    return _LOCAL_CACHES.get(store_folder)


def local_caches() -> list[TieredCache]:
    """The caches of the workers in this process (their stats show where loads came from)."""
    return list(_LOCAL_CACHES.values())


@dataclass(slots=True)
class BlockTransfer:
    """Pages ``first_page`` up to ``len(block_ids)`` of a request's tokens, to load or save:
    ``block_ids[i]`` is the vLLM block of page i and ``token_ids`` the tokens of pages 0 to the last."""

    req_id: str
    namespace: str
    token_ids: tuple[int, ...]
    block_ids: list[int]
    first_page: int

    @property
    def num_pages(self) -> int:
        return len(self.block_ids)


class WorkerTransfers:
    """Loads and saves of one rank. ``cache`` is None on a rank that does not write; it then
    reads the store ``open_reader`` returns (None until the writer rank has made it)."""

    def __init__(self, paged: PagedKV, identity: ModelIdentity, *, cache: TieredCache | None,
                 open_reader: Callable[[], ChunkStore | None] | None = None, async_load: bool = True):
        self.paged, self.identity, self.cache = paged, identity, cache
        self._open_reader = open_reader
        self._reader: ChunkStore | None = None
        self._done = threading.Lock()
        self._finished: set[str] = set()
        self._errors: set[int] = set()
        self._queue: queue.SimpleQueue[tuple[list[BlockTransfer], Any] | None] | None = None
        # req_id -> the first page of its that failed a synchronous load: its saves are skipped
        # until the scheduler plans them from that page again (once vLLM recomputed it).
        self._failed_from: dict[str, int] = {}
        self.is_cuda = paged.device.type == "cuda"
        self._loader: threading.Thread | None = None
        self._is_closed = False
        if cache is not None and cache.store is not None:
            _LOCAL_CACHES[str(cache.store.root)] = cache
        if async_load:
            self._queue = queue.SimpleQueue()
            self._loader = threading.Thread(target=self._load_loop, name="chunkstore-vllm-loader", daemon=True)
            self._loader.start()
        close_at_exit(self)

    # ---- loads -----------------------------------------------------------------------------------

    @property
    def page_size(self) -> int:
        return self.identity.page_size

    def load_now(self, loads: list[BlockTransfer]) -> bool:
        """Load on the calling thread (before the forward); False when a block did not load. A
        request whose load failed saves nothing until vLLM has recomputed its failed blocks."""
        ok = True
        for load in loads:
            good = self._copy(load)
            if good < load.num_pages:
                self._failed_from[load.req_id] = good
            ok &= self._record(load, good, finished=False)
        return ok

    def start_loads(self, loads: list[BlockTransfer]) -> None:
        """Load in the background, after what vLLM's stream has queued so far (its saves into the
        staging pool, earlier users of the blocks); each request is then in ``take_finished``."""
        if not loads:
            return
        ready = None
        if self.is_cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.paged.device))
        self._queue.put((loads, ready))

    def forget(self, finished_req_ids: set[str]) -> None:
        """Requests vLLM has finished: nothing is kept for them."""
        for req_id in finished_req_ids:
            self._failed_from.pop(req_id, None)

    def take_finished(self) -> set[str]:
        """The requests whose background loads are done since the last call."""
        with self._done:
            done, self._finished = self._finished, set()
        return done

    def take_errors(self) -> set[int]:
        """The blocks that did not load since the last call (take_finished first: a request's
        errors are then never reported after it)."""
        with self._done:
            errors, self._errors = self._errors, set()
        return errors

    def _load_loop(self) -> None:
        """Every load queued is reported finished, whatever fails (vLLM holds the request until
        then): a load that raises reports all its blocks as errors."""
        stream = None
        while (item := self._queue.get()) is not None:
            loads, ready = item
            for load in loads:
                good = load.first_page
                try:
                    if not self.is_cuda:
                        good = self._copy(load)
                        continue
                    if stream is None:
                        stream = torch.cuda.Stream(self.paged.device)
                    stream.wait_event(ready)
                    with torch.cuda.stream(stream):
                        good = self._copy(load)
                    stream.synchronize()  # vLLM's forward reads the blocks once the request is finished
                except Exception:
                    log.exception("chunkstore: loading blocks of request %s failed", load.req_id)
                    good = load.first_page
                finally:
                    self._record(load, good, finished=True)

    def _record(self, load: BlockTransfer, good: int, *, finished: bool) -> bool:
        if good < load.num_pages:
            log.warning("chunkstore: %d of %d blocks of request %s did not load; vLLM recomputes them",
                        load.num_pages - good, load.num_pages - load.first_page, load.req_id)
        with self._done:
            self._errors.update(load.block_ids[good:])
            if finished:
                self._finished.add(load.req_id)
        return good == load.num_pages

    def _copy(self, load: BlockTransfer) -> int:
        """Fill the load's blocks; the pages loaded from page 0 (``first_page`` when none)."""
        try:
            if self.cache is not None:
                return self._copy_from_cache(load)
            return self._copy_from_store(load)
        except Exception:  # a store or cache error: the blocks are recomputed
            log.exception("chunkstore: loading blocks of request %s failed", load.req_id)
            return load.first_page

    def _copy_from_cache(self, load: BlockTransfer) -> int:
        cache = self.cache
        hit = cache.match(load.token_ids[:load.num_pages * self.page_size], load.namespace, wait_for_prefetch=True)
        try:
            end = min(hit.num_pages, load.num_pages)
            for start in range(load.first_page, end, TRANSFER_PAGES):
                stop = min(start + TRANSFER_PAGES, end)
                self.paged.scatter(load.block_ids[start:stop], cache.device_pool.read(hit.device_slots[start:stop]))
            if self.is_cuda:  # the slots may be reused once released: the copies must be done
                torch.cuda.current_stream(self.paged.device).synchronize()
            return max(end, load.first_page)
        finally:
            cache.release(hit)

    def _copy_from_store(self, load: BlockTransfer) -> int:
        if self._reader is None and self._open_reader is not None:
            self._reader = self._open_reader()
        if self._reader is None:
            return load.first_page  # the writer rank has not made the store yet
        pages = chain_pages(self.identity, load.token_ids[:load.num_pages * self.page_size], load.namespace)
        for start in range(load.first_page, load.num_pages, TRANSFER_PAGES):
            batch = pages[start:start + TRANSFER_PAGES]
            staged = torch.empty((len(batch), *self.identity.page_shape), dtype=self.paged.dtype)
            hits = self._reader.get_into(batch, list(staged))
            n = hits.index(False) if False in hits else len(hits)
            if n:
                self.paged.scatter(load.block_ids[start:start + n], staged[:n])
            if n < len(hits):
                return start + n
        return load.num_pages

    # ---- saves -----------------------------------------------------------------------------------

    def save(self, saves: list[BlockTransfer]) -> None:
        """Copy the saves' new pages into the cache (on vLLM's thread, after the forward)."""
        if self.cache is None:
            return
        for save in saves:
            failed_from = self._failed_from.get(save.req_id)
            if failed_from is not None:
                if save.first_page > failed_from:
                    continue  # planned before vLLM learned of the failure: its forward read bad blocks
                del self._failed_from[save.req_id]  # planned again from the failed page: recomputed
            try:
                self._save_one(save)
            except Exception:
                log.exception("chunkstore: saving blocks of request %s failed; they are computed again later",
                              save.req_id)

    def _save_one(self, save: BlockTransfer) -> None:
        for start in range(save.first_page, save.num_pages, TRANSFER_PAGES):
            stop = min(start + TRANSFER_PAGES, save.num_pages)
            if not self._insert(save, start, stop):
                self._insert(save, 0, stop)  # the pages before ``start`` left the cache meanwhile

    def _insert(self, save: BlockTransfer, start: int, stop: int) -> bool:
        """Pages ``start:stop`` into the cache, after the ones before them; False when those are no
        longer in it (only for ``start`` > 0; nothing changed)."""
        cache = self.cache
        slots = cache.allocate_device(stop - start)
        try:
            cache.device_pool.write(slots, self.paged.gather(save.block_ids[start:stop],
                                                             device=cache.device_pool.device))
            cache.insert(save.token_ids[:stop * self.page_size], slots, save.namespace, from_page=start)
        except ValueError:
            cache.free_device(slots)
            if start == 0:
                raise
            return False
        except BaseException:
            cache.free_device(slots)
            raise
        return True

    # ---- the end ---------------------------------------------------------------------------------

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every saved page is on disk; False on timeout or a page that could not be written."""
        if self.cache is None:
            return True
        return self.cache.flush(timeout_s).failed_pages == 0

    def close(self, *, flush_timeout_s: float = 60.0) -> None:
        """Finish the loads in flight, write the saved pages down (for up to ``flush_timeout_s``),
        close the cache and the store. Idempotent."""
        if self._is_closed:
            return
        self._is_closed = True
        if self._loader is not None:
            self._queue.put(None)
            self._loader.join(flush_timeout_s)
        if self.cache is not None:
            store = self.cache.store
            self.cache.flush(flush_timeout_s)
            self.cache.close()
            if store is not None:
                store.close()
        if self._reader is not None:
            self._reader.close()
