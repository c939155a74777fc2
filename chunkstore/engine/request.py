"""Requests, results and the handle a caller waits on or streams from.

Invariants: a handle is completed exactly once, with a result or an error, and only by the
engine's thread; every text delta is put on the handle's stream before the completion, so a
stream that ends has delivered the whole text; ``result()`` returns (or raises) the same thing
however often it is called.
"""

from __future__ import annotations

import dataclasses
import enum
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from chunkstore.engine.sampling import SamplingParams
from chunkstore.engine.tokenizer import Message
from chunkstore.disk.keys import DEFAULT_NAMESPACE


class TextDelta(str):
    """A piece of a stream's text, and ``num_tokens``: the output tokens it covers (tokens whose
    bytes end no character yet are counted with the next piece). A ``str``, so a consumer that
    wants only the text takes it as one."""

    num_tokens: int

    def __new__(cls, text: str, num_tokens: int) -> "TextDelta":
        piece = super().__new__(cls, text)
        piece.num_tokens = num_tokens
        return piece


class EngineError(RuntimeError):
    """Base of the engine's own errors."""


class QueueFullError(EngineError):
    """The request queue is at its bound; the request was not taken (retry later)."""


class EngineClosedError(EngineError):
    """The engine is closed (or closing) and takes no more requests."""


class InvalidPromptError(ValueError):
    """The request's prompt cannot be served (empty, a token id outside the vocabulary, text that
    is not valid Unicode); its message is meant for the client."""


class PromptTooLongError(InvalidPromptError):
    """The prompt does not fit in the model's positions."""


class FinishReason(str, enum.Enum):
    STOP = "stop"  # an EOS token or a stop string
    LENGTH = "length"  # max_tokens, or the model's last position
    ABORT = "abort"  # cancelled by the caller or the engine's shutdown


@dataclass(frozen=True, slots=True)
class Request:
    """One generation. Give exactly one of ``prompt`` (text), ``token_ids`` or ``messages`` (a chat,
    rendered with the tokenizer's chat template). Raises ValueError otherwise."""

    prompt: str | None = None
    token_ids: Sequence[int] | None = None
    messages: Sequence[Message] | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    namespace: str = DEFAULT_NAMESPACE

    def __post_init__(self) -> None:
        given = [name for name in ("prompt", "token_ids", "messages") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of prompt, token_ids, messages (got {given or 'none'})")
        if not isinstance(self.namespace, str) or not self.namespace:
            raise ValueError(f"namespace must be a non-empty string, got {self.namespace!r}")
        if not isinstance(self.params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(self.params).__name__}")


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """What a finished request produced, and what the cache saved it."""

    request_id: int
    text: str
    token_ids: tuple[int, ...]  # generated ids (an EOS that ended the generation included)
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens whose KV came from the cache
    device_tokens: int  # where the cached tokens were found: device, host, disk (sum = cached_tokens)
    host_tokens: int
    disk_tokens: int
    queue_s: float  # submit -> prefill start
    prefill_s: float  # cache match + load + forward of the uncached tokens
    forward_s: float  # the forward of the uncached tokens alone (part of prefill_s)
    ttft_s: float  # submit -> first token sampled
    latency_s: float  # submit -> finished
    seed: int  # the sampler's seed (drawn when the request gave none)

    def as_dict(self) -> dict:
        """JSON-ready fields."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["token_ids"] = list(self.token_ids)
        d["finish_reason"] = self.finish_reason.value
        return d


_DONE = object()  # end of a handle's stream


class RequestHandle:
    """The caller's side of a submitted request: ``result()`` blocks until it is finished;
    iterating yields text deltas as they are generated (then stops; ``result()`` has the rest)."""

    def __init__(self, request_id: int, request: Request, prompt_ids: list[int], max_tokens: int | None = None) -> None:
        self.request_id = request_id
        self.request = request
        self.prompt_ids = prompt_ids
        # The tokens it may generate: its params' max_tokens, capped by the engine to what fits.
        self.max_tokens = request.params.max_tokens if max_tokens is None else max_tokens
        self._deltas: queue.SimpleQueue = queue.SimpleQueue()
        self._pending_tokens = 0  # engine thread only: tokens not yet streamed with a text
        self._done = threading.Event()
        self._result: GenerationResult | None = None
        self._error: BaseException | None = None
        self._is_cancelled = False
        # Called once, on the engine's thread, as it completes (the engine's ServingStats); never raises.
        self.on_complete: Callable[[GenerationResult | None, BaseException | None], None] | None = None

    # -- caller side -------------------------------------------------------------------------------

    def result(self, timeout_s: float | None = None) -> GenerationResult:
        """The finished result. Raises the request's error, or TimeoutError after ``timeout_s``."""
        if not self._done.wait(timeout_s):
            raise TimeoutError(f"request {self.request_id} not finished after {timeout_s} s")
        if self._error is not None:
            raise self._error
        return self._result

    def __iter__(self) -> Iterator[TextDelta]:
        """Text deltas until the end; raises the request's error at the end if it failed. One
        consumer: deltas are handed out once."""
        while True:
            item = self._deltas.get()
            if item is _DONE:
                break
            yield item
        if self._error is not None:
            raise self._error

    def cancel(self) -> None:
        """Ask the engine to stop this request at its next step (finish reason ``abort``)."""
        self._is_cancelled = True

    @property
    def is_cancelled(self) -> bool:
        return self._is_cancelled

    @property
    def is_done(self) -> bool:
        return self._done.is_set()

    # -- engine side -------------------------------------------------------------------------------

    def put_delta(self, text: str, num_tokens: int = 0) -> None:
        """Stream ``text`` (nothing while it is empty), which ``num_tokens`` new tokens produced."""
        self._pending_tokens += num_tokens
        if text:
            self._deltas.put(TextDelta(text, self._pending_tokens))
            self._pending_tokens = 0

    def complete(self, result: GenerationResult | None, error: BaseException | None = None) -> None:
        """Called once by the engine thread. Raises ValueError when already completed."""
        if self._done.is_set():
            raise ValueError(f"request {self.request_id} completed twice")
        self._result, self._error = result, error
        if self.on_complete is not None:  # first, so a caller woken below sees the figures
            self.on_complete(result, error)
        self._deltas.put(_DONE)
        self._done.set()
