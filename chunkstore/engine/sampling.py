"""Sampling parameters and the per-request sampler: greedy, temperature, top-p, seeded.

Invariants: ``SamplingParams`` is valid from construction on (a ValueError names the field);
temperature 0 is greedy (argmax, no randomness); every random draw of a request comes from its
own ``torch.Generator`` seeded from ``seed``, so the same seed, prompt and model give the same
tokens whatever other requests run meanwhile.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    ``max_tokens`` 0 only prefills (the prompt is cached, nothing is generated); ``stop`` strings
    end the generation and are not part of its text; ``seed`` None draws a fresh seed.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = field(default=())
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {self.max_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop must be non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


class Sampler:
    """Picks tokens for one request from float32 logits ``(vocab,)``."""

    def __init__(self, params: SamplingParams, device: torch.device, *, banned_ids: Sequence[int] = ()) -> None:
        self.params = params
        self.seed = params.seed if params.seed is not None else secrets.randbits(63)
        self._generator = torch.Generator(device=device).manual_seed(self.seed)
        self._banned = torch.tensor(sorted(banned_ids), dtype=torch.long, device=device)

    def sample(self, logits: torch.Tensor) -> int:
        """The next token id. Banned ids (e.g. EOS under ``ignore_eos``) are never picked."""
        if self._banned.numel():
            logits = logits.index_fill(0, self._banned, float("-inf"))
        if self.params.is_greedy:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / self.params.temperature, dim=-1)
        if self.params.top_p < 1.0:
            probs = _top_p(probs, self.params.top_p)
        return int(torch.multinomial(probs, 1, generator=self._generator))


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p`` (at least one)."""
    sorted_probs, order = torch.sort(probs, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return kept / kept.sum()
