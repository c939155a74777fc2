"""Engine: a bounded request queue and one scheduler thread that owns the model and the cache's cycle.

Invariants: only the scheduler thread runs the model and calls match / allocate_device / insert /
release (the runner is not thread-safe); ``submit`` may run on any thread and calls the cache only
for ``prefetch`` (thread-safe, never waits); the queue never holds more than ``max_queue_size``
requests (a full queue refuses with QueueFullError at once, before any tokenizing, nothing else
changes); a request's ``max_tokens`` is capped up front to the positions its prompt leaves; a request that raises
is completed with its error and the thread goes on with the others; every submitted handle is
completed, also at shutdown (running requests finish as ``abort``, queued ones fail with
EngineClosedError).
"""

from __future__ import annotations

import functools
import itertools
import logging
import operator
import queue
import threading
import time
from dataclasses import dataclass

from chunkstore.cache.config import CacheConfig
from chunkstore.cache.stats import CacheStats
from chunkstore.cache.tiered import FlushResult, TieredCache
from chunkstore.engine.generation import Generation
from chunkstore.engine.loader import LoadedModel
from chunkstore.engine.request import (EngineClosedError, FinishReason, GenerationResult, InvalidPromptError,
                                       PromptTooLongError, QueueFullError, Request, RequestHandle)
from chunkstore.engine.runner import ModelRunner
from chunkstore.engine.serving_stats import ServingStats

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.1  # how long an idle scheduler blocks on the queue before it re-checks for close


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """``max_queue_size``: requests waiting for the scheduler. ``max_running_requests``: requests
    decoded together, one token each per turn (1 = strictly one after another). ``batch_decode``:
    a turn feeds the running requests' tokens in one forward (False: one forward each)."""

    max_queue_size: int = 64
    max_running_requests: int = 4
    batch_decode: bool = True

    def __post_init__(self) -> None:
        for name in ("max_queue_size", "max_running_requests"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _token_ids(values, vocab_size: int) -> list[int]:
    """Plain ints from any integer-like values (numpy ints too). Raises ValueError for anything
    else, for bools, and for ids outside ``[0, vocab_size)``."""
    try:
        ids = [operator.index(t) for t in values if not isinstance(t, bool)]
    except TypeError:
        ids = None
    if ids is None or len(ids) != len(values) or any(not 0 <= t < vocab_size for t in ids):
        raise InvalidPromptError(f"token ids must be integers in [0, {vocab_size})")
    return ids


class Engine:
    """Generates text with ``loaded`` over a ``TieredCache`` built from ``cache_config``.

    Starts the scheduler thread. Raises what TieredCache raises for a bad config.
    """

    def __init__(self, loaded: LoadedModel, cache_config: CacheConfig, config: EngineConfig = EngineConfig()) -> None:
        self.loaded, self.config = loaded, config
        self.tokenizer = loaded.tokenizer
        self.cache = TieredCache.open(cache_config, loaded.identity(cache_config.page_size), device=loaded.device)
        try:
            self.runner = ModelRunner(loaded, self.cache)
        except BaseException:
            self.cache.close()
            raise
        self._queue: queue.Queue[tuple[RequestHandle, float]] = queue.Queue(maxsize=config.max_queue_size)
        self._ids = itertools.count(1)
        self._submit_lock = threading.Lock()  # orders submits against close
        self._is_closing = False
        self._is_closed = False
        self._running: list[Generation] = []
        self.serving = ServingStats()  # requests, tokens and latencies served (the management API's)
        self._thread = threading.Thread(target=self._run, name="chunkstore-engine", daemon=True)
        self._thread.start()

    # ---- caller side -----------------------------------------------------------------------------

    def submit(self, request: Request) -> RequestHandle:
        """Tokenize, check and queue ``request``; when requests are ahead of it, start prefetching
        its on-disk prefix into host memory (an idle engine loads it in ``match``).

        ``max_tokens`` beyond what the prompt leaves (the model's positions minus the prompt, plus
        the one token the last position predicts) is capped to it: the generation would end there
        with ``length`` anyway, and nothing is sized by the number asked.

        Raises QueueFullError when the queue is full (checked first, so a refusal costs no
        tokenizing), PromptTooLongError when the prompt exceeds the model's positions,
        InvalidPromptError (a ValueError) for an empty prompt, a token id outside the vocabulary or
        text that is not valid Unicode, EngineClosedError after ``close``. Nothing is queued when
        it raises.
        """
        if self.is_queue_full:
            raise self.queue_full_error()
        prompt_ids = self._prompt_ids(request)
        # The last position's logits give one token more (it is returned, never fed).
        max_tokens = min(request.params.max_tokens, self.loaded.max_positions - len(prompt_ids) + 1)
        submitted_at_s = time.perf_counter()
        with self._submit_lock:
            if self._is_closing:
                raise EngineClosedError("the engine is closed")
            handle = RequestHandle(next(self._ids), request, prompt_ids, max_tokens)
            handle.on_complete = self.serving.record_completed
            self.serving.record_accepted()  # before the put: the engine may complete it at once
            try:
                self._queue.put_nowait((handle, submitted_at_s))
            except queue.Full:
                self.serving.record_not_queued()
                raise self.queue_full_error() from None
        # Disk reads start now and overlap the requests ahead of this one; an engine with nothing
        # else to run waits for them at admission (see _admit), whatever the prefetch policy.
        try:
            self.cache.prefetch(prompt_ids[:-1], request.namespace)
        except Exception:
            log.exception("prefetch failed for request %d (it will load on match)", handle.request_id)
        return handle

    def generate(self, request: Request, timeout_s: float | None = None) -> GenerationResult:
        """``submit(request).result(timeout_s)``."""
        return self.submit(request).result(timeout_s)

    def queue_full_error(self) -> QueueFullError:
        """The error ``submit`` raises when the queue is full (for callers that check first)."""
        return QueueFullError(f"the request queue is full ({self.config.max_queue_size} requests waiting); "
                              f"retry later")

    def _prompt_ids(self, request: Request) -> list[int]:
        try:
            if request.prompt is not None:
                ids = self.tokenizer.encode(request.prompt)
            elif request.messages is not None:
                ids = self.tokenizer.encode_chat(request.messages)
            else:
                ids = _token_ids(request.token_ids, self.tokenizer.vocab_size)
        except UnicodeError:  # a lone surrogate: no tokenizer can encode it
            raise InvalidPromptError("the prompt is not valid Unicode text") from None
        if not ids:
            raise InvalidPromptError("the prompt is empty")
        limit = self.loaded.max_positions
        if len(ids) > limit:
            raise PromptTooLongError(f"the prompt has {len(ids)} tokens; the model allows at most {limit}")
        return ids

    @property
    def num_queued(self) -> int:
        return self._queue.qsize()

    @property
    def is_queue_full(self) -> bool:
        """Whether a submit now would be refused with QueueFullError (a hint: the queue moves)."""
        return self._queue.full()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stats(self) -> CacheStats:
        """The cache's snapshot (thread-safe)."""
        return self.cache.stats()

    def flush(self, timeout_s: float | None = None) -> FlushResult:
        """Write every page the cache holds in memory down to disk and wait (thread-safe)."""
        return self.cache.flush(timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        """Stop taking requests, end the running ones (``abort``, their whole pages cached), fail the
        queued ones with EngineClosedError, stop the thread, then close the cache with
        ``flush=True`` so what the write policy keeps is on disk. Idempotent."""
        with self._submit_lock:
            self._is_closing = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"the engine thread did not stop within {timeout_s} s")
        if not self._is_closed:
            self._is_closed = True
            self.cache.close(flush=True)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- scheduler thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._is_closing:
                if len(self._running) < self.config.max_running_requests:
                    self._admit(block=not self._running)
                self._decode_turn()
        finally:  # also when something escaped the per-request guard: no handle is left hanging
            self._is_closing = True
            self._shut_down()

    def _decode_turn(self) -> None:
        """One token for every running request: cancelled ones finish; the rest are fed in one
        batched forward (one each when batching is off, or when the batch fails: a batch that
        raises has changed no sequence, so each is then retried alone and fails on its own)."""
        batch, tokens, singles = [], [], []
        for gen in list(self._running):  # one read of each token: a cancel may land at any time
            token = gen.pending_token
            if token is None:
                singles.append(gen)
            else:
                batch.append(gen)
                tokens.append(token)
        if len(batch) < 2 or not self.config.batch_decode:
            singles, batch = singles + batch, []
        for gen in singles:
            self._guarded(gen, gen.step)
        if not batch:
            return
        try:
            rows = self.runner.decode_batch([gen.seq for gen in batch], tokens)
        except Exception:
            log.exception("a batched decode of %d requests failed; decoding them one by one", len(batch))
            for gen in batch:
                self._guarded(gen, gen.step)
            return
        for gen, logits in zip(batch, rows, strict=True):
            self._guarded(gen, functools.partial(gen.take_logits, logits))

    def _admit(self, *, block: bool) -> None:
        """Start at most one queued request per turn, so running ones keep streaming."""
        try:
            handle, submitted_at_s = self._queue.get(timeout=_IDLE_WAIT_S) if block else self._queue.get_nowait()
        except queue.Empty:
            return
        # Idle otherwise: nothing to overlap a prefetch in flight with, so the match waits for it.
        is_idle = not self._running and self._queue.empty()
        gen = Generation(handle, self.runner, self.tokenizer, max_positions=self.loaded.max_positions,
                         submitted_at_s=submitted_at_s, wait_for_prefetch=True if is_idle else None)
        self._running.append(gen)
        self._guarded(gen, gen.start)

    def _guarded(self, gen: Generation, action) -> None:
        try:
            action()
        except Exception as exc:
            log.exception("request %d failed", gen.handle.request_id)
            gen.fail(exc)
        if gen.is_finished:
            self._running.remove(gen)

    def _shut_down(self) -> None:
        for gen in self._running:
            self._guarded_finish(gen)
        self._running.clear()
        while True:
            try:
                handle, _ = self._queue.get_nowait()
            except queue.Empty:
                break
            handle.complete(None, EngineClosedError("the engine closed before this request started"))

    def _guarded_finish(self, gen: Generation) -> None:
        try:
            gen.finish(FinishReason.ABORT)
        except Exception as exc:
            log.exception("request %d failed while aborting", gen.handle.request_id)
            gen.fail(exc)
