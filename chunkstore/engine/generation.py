"""Generation: one request on the engine thread, from prefill to its finish reason.

Invariants: a sampled token is fed to the model only when the generation goes on (an EOS, a
token that completes a stop string, the last of ``max_tokens`` and a token with no position
left are returned, not fed); the handle is completed exactly once (``finish`` or ``fail``) and
the runner's sequence is closed exactly once before that (its pages go to the cache on a finish,
nothing is cached on a failure).
"""

from __future__ import annotations

import logging
import time

from chunkstore.engine.request import FinishReason, GenerationResult, RequestHandle
from chunkstore.engine.runner import ModelRunner, Sequence
from chunkstore.engine.sampling import Sampler
from chunkstore.engine.stops import OutputText
from chunkstore.engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class Generation:
    """Drives one request: ``start`` (prefill and the first token), then ``step`` until finished."""

    def __init__(self, handle: RequestHandle, runner: ModelRunner, tokenizer: Tokenizer, *,
                 max_positions: int, submitted_at_s: float, wait_for_prefetch: bool | None = None) -> None:
        self.handle = handle
        self.wait_for_prefetch = wait_for_prefetch  # None: the cache's prefetch policy decides
        self.params = handle.request.params
        self.runner, self.tokenizer = runner, tokenizer
        self.max_positions = max_positions
        self.submitted_at_s = submitted_at_s
        # The tokenizer's never-sampled ids (a byte model's non-text bytes), and EOS under ignore_eos.
        banned = tokenizer.never_sampled_ids | (tokenizer.eos_token_ids if self.params.ignore_eos else frozenset())
        self.sampler = Sampler(self.params, runner.device, banned_ids=sorted(banned))
        self.seq: Sequence | None = None
        self.output_ids: list[int] = []
        self.text = OutputText(self.params.stop)
        self._stream = tokenizer.stream_decoder()
        self._pending: int | None = None  # sampled, to be fed by the next step
        self._started_at_s: float | None = None
        self._first_token_at_s: float | None = None
        self.is_finished = False

    def start(self) -> None:
        """Prefill (through the cache) and sample the first token; may finish at once."""
        self._started_at_s = time.perf_counter()
        if self.handle.is_cancelled:
            return self.finish(FinishReason.ABORT)
        self.seq = self.runner.prefill(self.handle.prompt_ids, self.handle.request.namespace,
                                       wait_for_prefetch=self.wait_for_prefetch)
        if self.handle.max_tokens == 0:
            return self.finish(FinishReason.LENGTH)
        self._accept(self.sampler.sample(self.seq.logits))

    def step(self) -> None:
        """Feed the pending token and sample the next."""
        if self.handle.is_cancelled:
            return self.finish(FinishReason.ABORT)
        self.take_logits(self.runner.decode(self.seq, self._pending))

    @property
    def pending_token(self) -> int | None:
        """The sampled token the next step feeds (None when the generation does not go on, or is
        cancelled: its ``step`` finishes it). The engine feeds several in one ``decode_batch``."""
        return None if self.handle.is_cancelled else self._pending

    def take_logits(self, logits) -> None:
        """The pending token was fed (alone or in a batch): sample the next from its ``logits``."""
        self._pending = None
        self._accept(self.sampler.sample(logits))

    def _accept(self, token_id: int) -> None:
        if self._first_token_at_s is None:
            self._first_token_at_s = time.perf_counter()
        self.output_ids.append(token_id)
        if token_id in self.tokenizer.eos_token_ids and not self.params.ignore_eos:
            return self.finish(FinishReason.STOP)
        self.handle.put_delta(self.text.append(self._stream.push(token_id)), num_tokens=1)
        if self.text.is_stopped:
            return self.finish(FinishReason.STOP)
        if len(self.output_ids) >= self.handle.max_tokens or self.seq.num_tokens >= self.max_positions:
            return self.finish(FinishReason.LENGTH)
        self._pending = token_id

    def finish(self, reason: FinishReason) -> None:
        """Flush the text, cache the sequence's whole pages, complete the handle."""
        if not self.text.is_stopped:
            self.handle.put_delta(self.text.append(self._stream.finish()))
        self.handle.put_delta(self.text.finish())
        if self.seq is not None:
            self.runner.finish(self.seq)
        self.is_finished = True
        self.handle.complete(self._result(reason))

    def fail(self, error: BaseException) -> None:
        """Give back what the request holds, without caching, and complete it with ``error``.
        Never raises."""
        self.is_finished = True
        try:
            if self.seq is not None:
                self.runner.abort(self.seq)
        except Exception:  # the handle must be completed whatever the cleanup does
            log.exception("request %d: cleanup after a failure failed", self.handle.request_id)
        if not self.handle.is_done:
            self.handle.complete(None, error)

    def _result(self, reason: FinishReason) -> GenerationResult:
        now = time.perf_counter()
        seq = self.seq
        started = self._started_at_s if self._started_at_s is not None else now
        first = self._first_token_at_s if self._first_token_at_s is not None else now
        return GenerationResult(
            request_id=self.handle.request_id, text=self.text.text, token_ids=tuple(self.output_ids),
            finish_reason=reason, prompt_tokens=len(self.handle.prompt_ids),
            completion_tokens=len(self.output_ids), cached_tokens=seq.cached_tokens if seq else 0,
            device_tokens=seq.device_tokens if seq else 0, host_tokens=seq.host_tokens if seq else 0,
            disk_tokens=seq.disk_tokens if seq else 0, queue_s=started - self.submitted_at_s,
            prefill_s=seq.prefill_s if seq else 0.0, forward_s=seq.forward_s if seq else 0.0, ttft_s=first - self.submitted_at_s,
            latency_s=now - self.submitted_at_s, seed=self.sampler.seed)
