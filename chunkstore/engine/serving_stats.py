"""ServingStats: what the engine served since the process started (requests, tokens, latencies).

Invariants: counters only grow, except ``requests_active`` (accepted and not yet completed); every
update and every snapshot happens under one lock, so a snapshot is never half of an update; a
request is counted once, when its handle completes (finished, aborted or failed), and a finished
one whose finish reason is ``abort`` (its client went away, or the server shut down) is also
counted in ``requests_cancelled``; time to first token is recorded only for requests that sampled
a token. Recording never raises.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from chunkstore.cache.stats import Histogram
from chunkstore.engine.request import FinishReason, GenerationResult


@dataclass(frozen=True, slots=True)
class ServingSnapshot:
    """Counters since the process started; a later snapshot minus an earlier one is the activity between."""

    requests_total: int = 0  # completed: finished (any finish reason) or failed
    requests_failed: int = 0  # completed with an error
    requests_cancelled: int = 0  # finished as abort: their client went away, or the server shut down
    requests_active: int = 0  # accepted (queued or running), not completed
    prompt_tokens_total: int = 0  # of finished requests, as the three below
    cached_tokens_total: int = 0
    completion_tokens_total: int = 0
    ttft_sum_s: float = 0.0
    ttft_count: int = 0
    latency_sum_s: float = 0.0  # submit -> finished, of finished requests
    ttft: Histogram = field(default_factory=Histogram)
    latency: Histogram = field(default_factory=Histogram)

    @property
    def ttft_avg_s(self) -> float | None:
        return self.ttft_sum_s / self.ttft_count if self.ttft_count else None


class ServingStats:
    """Thread-safe: ``record_accepted`` from the submitting thread, ``record_completed`` from the
    engine's thread (a handle's completion), ``snapshot`` from any."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snap = ServingSnapshot()

    def record_accepted(self) -> None:
        with self._lock:
            self._snap = replace(self._snap, requests_active=self._snap.requests_active + 1)

    def record_not_queued(self) -> None:
        """Undo ``record_accepted`` for a request the queue refused (it never runs)."""
        with self._lock:
            self._snap = replace(self._snap, requests_active=max(0, self._snap.requests_active - 1))

    def record_completed(self, result: GenerationResult | None, error: BaseException | None = None) -> None:
        """One accepted request completed, with ``result`` or (``error``) without."""
        with self._lock:
            s = self._snap
            done = dict(requests_total=s.requests_total + 1, requests_active=max(0, s.requests_active - 1))
            if error is not None or result is None:
                self._snap = replace(s, requests_failed=s.requests_failed + 1, **done)
                return
            has_token = result.completion_tokens > 0
            is_cancelled = result.finish_reason is FinishReason.ABORT
            self._snap = replace(
                s, requests_cancelled=s.requests_cancelled + (1 if is_cancelled else 0),
                prompt_tokens_total=s.prompt_tokens_total + result.prompt_tokens,
                cached_tokens_total=s.cached_tokens_total + result.cached_tokens,
                completion_tokens_total=s.completion_tokens_total + result.completion_tokens,
                ttft_sum_s=s.ttft_sum_s + (result.ttft_s if has_token else 0.0),
                ttft_count=s.ttft_count + (1 if has_token else 0),
                ttft=s.ttft.observed(result.ttft_s) if has_token else s.ttft,
                latency_sum_s=s.latency_sum_s + result.latency_s, latency=s.latency.observed(result.latency_s),
                **done)

    def snapshot(self) -> ServingSnapshot:
        with self._lock:
            return self._snap

