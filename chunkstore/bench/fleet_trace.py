"""The multi-turn trace that ``bench fleet --simulate-servers`` replays: who asks what, when, and
on which server.

Invariants: a trace is a pure function of its TraceConfig, so every simulated server computes the
same schedule and replays its own part of it. The fleet's requests arrive as one Poisson stream of
``servers x rate_per_server`` per second; conversation slots take them in turn, so a
conversation's next round comes about ``think_s`` after its last one and lands on the next server
(a load balancer without affinity); after ``rounds`` rounds a slot starts a new conversation. A
slot's tenant (its namespace) never changes. Every round asks ``question_tokens`` new tokens and
gets ``answer_tokens`` back, whole pages each, so round k's prompt is exactly the pages of the
rounds before it plus its question.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TraceConfig:
    servers: int
    rate_per_server: float  # requests per second that each server receives
    duration_s: float  # the whole trace: warm-up and measured part
    think_s: float = 4.0  # a conversation's time between two rounds
    rounds: int = 4  # rounds of a conversation
    tenants: int = 4
    question_tokens: int = 64
    answer_tokens: int = 16
    page_size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if self.servers < 1 or self.rounds < 1 or self.tenants < 1:
            raise ValueError("servers, rounds and tenants must be at least 1")
        if not (self.rate_per_server > 0 and self.duration_s > 0 and self.think_s > 0):
            raise ValueError("rate_per_server, duration_s and think_s must be positive")
        if self.question_tokens % self.page_size or self.answer_tokens % self.page_size:
            raise ValueError("question_tokens and answer_tokens must be whole pages")

    @property
    def fleet_rate(self) -> float:
        return self.servers * self.rate_per_server

    @property
    def slots(self) -> int:
        """Conversations in flight at once: one round each per ``think_s``."""
        return max(1, math.ceil(self.fleet_rate * self.think_s))

    @property
    def pages_per_round(self) -> int:
        return (self.question_tokens + self.answer_tokens) // self.page_size


@dataclass(frozen=True, slots=True)
class Request:
    index: int  # in the fleet's stream
    at_s: float  # after the trace's start
    server: int
    slot: int
    conversation: int  # of its slot: the slot's how-manieth conversation
    round: int
    namespace: str


def schedule(cfg: TraceConfig) -> list[Request]:
    """Every request of the trace, in arrival order."""
    rng = random.Random(f"arrivals:{cfg.seed}")
    out: list[Request] = []
    at_s, j = rng.expovariate(cfg.fleet_rate), 0
    while at_s < cfg.duration_s:
        turn, slot = divmod(j, cfg.slots)  # the slot's how-manieth request
        conversation, round_ = divmod(turn, cfg.rounds)
        out.append(Request(index=j, at_s=at_s, server=(slot + turn) % cfg.servers, slot=slot,
                           conversation=conversation, round=round_, namespace=f"tenant-{slot % cfg.tenants}"))
        at_s += rng.expovariate(cfg.fleet_rate)
        j += 1
    return out


def tokens(cfg: TraceConfig, request: Request) -> tuple[list[int], list[int]]:
    """(prompt, answer) of ``request``: the prompt is every earlier round's question and answer,
    then this round's question."""
    prompt: list[int] = []
    for r in range(request.round + 1):
        question, answer = _round_tokens(cfg, request, r)
        prompt += question
        if r < request.round:
            prompt += answer
        else:
            return prompt, answer
    raise AssertionError("unreachable")


def _round_tokens(cfg: TraceConfig, request: Request, round_: int) -> tuple[list[int], list[int]]:
    rng = random.Random(f"tokens:{cfg.seed}:{request.slot}:{request.conversation}:{round_}")
    question = [rng.randrange(32000) for _ in range(cfg.question_tokens)]
    answer = [rng.randrange(32000) for _ in range(cfg.answer_tokens)]
    return question, answer
