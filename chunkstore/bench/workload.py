"""The multi-turn chat workload of ``chunkstore bench multiturn`` (SGLang's bench_multiturn.py) and its driver.

Invariants: the questions are a pure function of the seed, so every configuration sends the same
ones; a client has at most one request in flight and sends round r+1 only after round r's reply
(which joins its history); at most ``max_parallel`` requests are in flight; two sends are at least
an exponential draw (mean 1 / request_rate) apart, as SGLang's sender sleeps after each send; the
ideal hit rate is that of an infinite cache of whole pages matched as the engine matches.
"""

from __future__ import annotations

import math
import queue
import random
import string
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

_ALPHABET = np.frombuffer((string.ascii_lowercase + " " * 5).encode(), dtype=np.uint8)  # ~1 space a word


@dataclass(frozen=True, slots=True)
class Workload:
    """N clients, R rounds each; a round sends the client's whole history plus a new question of
    ``request_length`` tokens and gets ``output_length`` tokens back. Raises ValueError naming a
    bad field."""

    num_clients: int = 16
    num_rounds: int = 5
    request_length: int = 96
    output_length: int = 4
    max_parallel: int = 4
    request_rate: float = 16.0  # requests per second (Poisson); inf sends as soon as allowed
    seed: int = 1

    def __post_init__(self) -> None:
        for name in ("num_clients", "num_rounds", "request_length", "output_length", "max_parallel"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not self.request_rate > 0:  # also refuses NaN
            raise ValueError(f"request_rate must be > 0 (inf: no gaps), got {self.request_rate!r}")

    @property
    def num_requests(self) -> int:
        return self.num_clients * self.num_rounds

    @property
    def final_history_tokens(self) -> int:
        """One client's history after its last reply (questions and replies, no template)."""
        return self.num_rounds * (self.request_length + self.output_length)

    def prompt_tokens(self, round_index: int) -> int:
        """Tokens of round ``round_index``'s prompt (0-based) when sent as token ids."""
        return (round_index + 1) * self.request_length + round_index * self.output_length

    def questions(self) -> list[list[str]]:
        """``[client][round]``: lowercase ASCII words, exactly ``request_length`` bytes each, so
        ``request_length`` tokens with the byte tokenizer."""
        rng = np.random.default_rng(self.seed)
        return [[_ALPHABET[rng.integers(0, len(_ALPHABET), self.request_length)].tobytes().decode()
                 for _ in range(self.num_rounds)] for _ in range(self.num_clients)]

    def ideal_hit_rate(self, page_size: int) -> float:
        """What an infinite cache reaches on this workload sent as token ids (see ``ideal_cached_tokens``)."""
        cached = prompt = 0
        for r in range(self.num_rounds):
            previous = (self.prompt_tokens(r - 1), self.output_length) if r else None
            cached += ideal_cached_tokens(self.prompt_tokens(r), previous, page_size)
            prompt += self.prompt_tokens(r)
        return cached / prompt


def ideal_cached_tokens(prompt_tokens: int, previous: tuple[int, int] | None, page_size: int) -> int:
    """Cached tokens of a prompt under an infinite cache, given the client's previous request
    (``(prompt_tokens, completion_tokens)``, None for its first): the engine caches the whole pages
    of the previous prompt and the reply tokens fed back (all but the last), and matches whole
    pages of the new prompt without its last token. Clients share no prefix (random questions)."""
    if previous is None:
        return 0
    fed = previous[0] + max(previous[1] - 1, 0)
    return min((prompt_tokens - 1) // page_size, fed // page_size) * page_size


# ---- the conversation and its replies ------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Reply:
    """What one request got back. ``output_ids`` in-process (exact ids), None over HTTP (``text``);
    ``tier_tokens`` (device, host, disk: where the cached tokens were found) when the backend
    says; ``prefill_s``, ``forward_s`` (the forward of the uncached tokens alone) and ``queue_s``
    (submit to prefill start) in-process only."""

    text: str
    output_ids: tuple[int, ...] | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    tier_tokens: dict[str, int] | None
    ttft_s: float
    latency_s: float
    prefill_s: float | None = None
    forward_s: float | None = None
    queue_s: float | None = None


@dataclass(slots=True)
class Conversation:
    """One client's questions so far (the last one awaiting its reply) and the replies."""

    questions: list[str] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    client: int
    round_index: int
    sent_at_s: float  # from the run's start
    reply: Reply


@dataclass(frozen=True, slots=True)
class DriveResult:
    records: list[RequestRecord]
    duration_s: float  # first send -> last reply


Send = Callable[[int, int, Conversation], Reply]  # (client, round, conversation) -> reply; blocks


def drive(workload: Workload, send: Send, *, on_reply: Callable[[RequestRecord], None] | None = None) -> DriveResult:
    """Run the workload through ``send`` (called on up to ``max_parallel`` threads at once).

    Raises RuntimeError naming the client and round when a request fails (the requests in flight
    are waited for first).
    """
    questions = workload.questions()
    conversations = [Conversation() for _ in range(workload.num_clients)]
    ready = deque(range(workload.num_clients))  # clients whose next round may be sent, first come first
    done: queue.SimpleQueue[tuple[int, int, float, Future]] = queue.SimpleQueue()
    gaps = random.Random(workload.seed)
    records: list[RequestRecord] = []
    in_flight, next_send_s = 0, 0.0
    start = time.perf_counter()
    with ThreadPoolExecutor(workload.max_parallel, thread_name_prefix="bench-client") as pool:
        while len(records) < workload.num_requests:
            now = time.perf_counter() - start
            can_send = bool(ready) and in_flight < workload.max_parallel
            if can_send and now >= next_send_s:
                client = ready.popleft()
                conversation = conversations[client]
                round_index = len(conversation.replies)
                conversation.questions.append(questions[client][round_index])
                future = pool.submit(send, client, round_index, conversation)
                future.add_done_callback(lambda f, c=client, r=round_index, t=now: done.put((c, r, t, f)))
                in_flight += 1
                if not math.isinf(workload.request_rate):
                    next_send_s = now + gaps.expovariate(workload.request_rate)
                continue
            try:
                client, round_index, sent_at_s, future = done.get(timeout=next_send_s - now if can_send else None)
            except queue.Empty:
                continue
            in_flight -= 1
            error = future.exception()
            if error is not None:
                raise RuntimeError(f"client {client} round {round_index}: {type(error).__name__}: {error}") from error
            reply = future.result()
            record = RequestRecord(client, round_index, sent_at_s, reply)
            records.append(record)
            conversations[client].replies.append(reply)
            if len(conversations[client].replies) < workload.num_rounds:
                ready.append(client)
            if on_reply is not None:
                on_reply(record)
    return DriveResult(records, time.perf_counter() - start)
