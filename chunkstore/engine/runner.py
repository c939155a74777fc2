"""ModelRunner: prefill on top of the tiered cache's longest prefix, decode, and give the KV back as pages.

Invariants: a ``Sequence``'s ``kv`` holds exactly the KV of its ``token_ids`` at positions
0..len-1; the cached prefix never covers a prompt's last token (its logits are needed), so at
least one token is computed; a sequence holds its ``PrefixHit`` lock from ``prefill`` until
``finish`` or ``abort`` (exactly one of them, once), which is what keeps ``hit.device_slots``
valid for the final insert; only whole pages go into the cache (a trailing partial page stays in
the sequence's KV and is dropped with it, so no slot is ever allocated for it).
Not thread-safe: one thread (the engine's scheduler) drives a runner and its sequences.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from chunkstore.cache.pools import PoolExhaustedError
from chunkstore.cache.tiered import PrefixHit, TieredCache
from chunkstore.engine.kv_pages import forward, forward_batch_step, load_pages, new_kv_cache, store_pages
from chunkstore.engine.loader import LoadedModel

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Sequence:
    """One request's tokens and KV while it is generated."""

    namespace: str
    token_ids: list[int]  # tokens whose KV is in ``kv``: the prompt, then every generated token fed back
    num_prompt_tokens: int
    kv: Any  # a transformers DynamicCache; None once finished
    hit: PrefixHit | None  # locked until finish/abort
    cached_tokens: int  # prompt tokens taken from the cache (whole pages)
    device_tokens: int  # ... of which found on the device, host, disk (before load-back)
    host_tokens: int
    disk_tokens: int
    prefill_s: float  # wall time of match + gather + forward
    forward_s: float  # wall time of the forward of the uncached tokens alone
    logits: torch.Tensor  # float32: (vocab,) of the last position, or (computed tokens, vocab) with all_logits
    inserted_pages: int = field(default=0)  # whole pages handed to the cache by finish

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def is_open(self) -> bool:
        return self.kv is not None


class ModelRunner:
    """Runs one ``LoadedModel`` over one ``TieredCache`` (same page shape, dtype and device).

    Raises ValueError at construction when the cache's identity or device is not the model's.
    """

    def __init__(self, loaded: LoadedModel, cache: TieredCache) -> None:
        if cache.identity != loaded.identity(cache.page_size):
            raise ValueError(f"cache identity {cache.identity} is not the model's "
                             f"{loaded.identity(cache.page_size)}")
        pool_device, model_device = cache.device_pool.device, loaded.device
        if pool_device.type != model_device.type or model_device.index not in (None, pool_device.index):
            raise ValueError(f"device pool on {pool_device}, model on {model_device}")
        self.loaded, self.cache = loaded, cache
        self.model = loaded.model
        self.device = loaded.device

    @property
    def page_size(self) -> int:
        return self.cache.page_size

    def _ids(self, token_ids: list[int]) -> torch.Tensor:
        return torch.tensor([token_ids], dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def prefill(self, token_ids: list[int], namespace: str, *, all_logits: bool = False,
                wait_for_prefetch: bool | None = None) -> Sequence:
        """Take the longest cached prefix of whole pages (from any tier, locked), compute the rest.

        With ``all_logits`` the sequence's logits cover every computed position (tests compare
        them with ``full_logits``), else only the last. Raises ValueError for an empty prompt and
        whatever the model or the cache raise (the lock is given back first).
        """
        if not token_ids:
            raise ValueError("an empty prompt has no next-token logits")
        started = time.perf_counter()
        hit = self.cache.match(token_ids[:-1], namespace, wait_for_prefetch=wait_for_prefetch)
        try:
            kv = new_kv_cache()
            load_pages(self.cache.device_pool.buffer, hit.device_slots, kv)
            start = hit.num_tokens
            forward_started = time.perf_counter()
            logits = forward(self.model, self._ids(token_ids[start:]), kv, start_position=start,
                             logits_to_keep=0 if all_logits else 1)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # prefill_s is compute time, not launch time
            done = time.perf_counter()
        except BaseException:
            self.cache.release(hit)
            raise
        return Sequence(namespace, list(token_ids), len(token_ids), kv, hit, hit.num_tokens, hit.device_tokens,
                        hit.host_tokens, hit.disk_tokens, done - started, done - forward_started,
                        logits if all_logits else logits[-1])

    @torch.inference_mode()
    def decode(self, seq: Sequence, token_id: int) -> torch.Tensor:
        """Feed one generated token; returns the next position's float32 logits ``(vocab,)``.
        Raises ValueError for a finished sequence."""
        if not seq.is_open:
            raise ValueError("decode on a finished sequence")
        seq.logits = forward(self.model, self._ids([token_id]), seq.kv, start_position=seq.num_tokens)[-1]
        seq.token_ids.append(token_id)
        return seq.logits

    @torch.inference_mode()
    def decode_batch(self, seqs: list[Sequence], token_ids: list[int]) -> list[torch.Tensor]:
        """``decode`` of several sequences in one forward (their KV left-padded into one batch);
        equal to one ``decode`` each up to float rounding. Raises ValueError for a finished
        sequence or mismatched lengths; when the model raises, no sequence has changed."""
        if any(not seq.is_open for seq in seqs):
            raise ValueError("decode on a finished sequence")
        if len(seqs) == 1:
            return [self.decode(seqs[0], token_ids[0])]
        logits = forward_batch_step(self.model, token_ids, [seq.kv for seq in seqs])
        for seq, token_id, row in zip(seqs, token_ids, logits, strict=True):
            seq.logits = row
            seq.token_ids.append(token_id)
        return list(logits)

    @torch.inference_mode()
    def finish(self, seq: Sequence) -> int:
        """Hand the sequence's whole pages (prompt and fed output) to the cache, so the next turn
        of a chat finds them, and give back its lock. Returns the whole pages the cache holds for
        it (only the hit's when the device pool has no room for the rest: caching is skipped and
        logged, the request does not fail). Idempotent."""
        if not seq.is_open:
            return seq.inserted_pages
        try:
            hit_pages = seq.hit.num_pages
            num_full = seq.num_tokens // self.page_size
            seq.inserted_pages = hit_pages  # already in the tree
            slots = self._allocate(num_full - hit_pages)
            if slots is not None:
                try:
                    store_pages(self.cache.device_pool.buffer, slots, seq.kv, first_page=hit_pages)
                    all_slots = torch.cat([seq.hit.device_slots.to(slots.device), slots])
                    self.cache.insert(seq.token_ids[:num_full * self.page_size], all_slots, seq.namespace)
                except BaseException:  # insert raises before it takes any slot
                    self.cache.free_device(slots)
                    raise
                seq.inserted_pages = num_full
        finally:
            self._close(seq)
        return seq.inserted_pages

    def abort(self, seq: Sequence) -> None:
        """Give back the lock and drop the KV without caching anything. Idempotent."""
        if seq.is_open:
            self._close(seq)

    def _allocate(self, num_pages: int) -> torch.Tensor | None:
        if num_pages <= 0:
            return None  # nothing new: every whole page came from the cache
        try:
            return self.cache.allocate_device(num_pages)
        except PoolExhaustedError as exc:
            log.warning("not caching %d pages: %s", num_pages, exc)
            return None

    def _close(self, seq: Sequence) -> None:
        hit, seq.hit, seq.kv = seq.hit, None, None
        if hit is not None:
            self.cache.release(hit)

    @torch.inference_mode()
    def full_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Float32 logits of every position of ``token_ids`` computed from scratch, no cache
        involved: the reference that cached prefills are compared with."""
        return forward(self.model, self._ids(token_ids), new_kv_cache(), start_position=0, logits_to_keep=0)
