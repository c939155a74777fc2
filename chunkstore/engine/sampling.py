"""Sampling parameters and the per-request sampler: greedy, temperature, top-p, seeded.

Invariants: ``SamplingParams`` is valid from construction on (a ValueError names the field);
a temperature below ``GREEDY_BELOW_TEMPERATURE`` (0 included) is greedy (argmax, no randomness);
the sampler's probabilities are finite and sum to 1 for every valid parameter (logits are shifted
so their maximum is 0 before the temperature divides them, and top-p keeps at least the most
likely token), so no temperature or top-p in range gives NaN; stop lists are bounded
(``MAX_STOP_STRINGS`` strings of at most ``MAX_STOP_CHARS`` characters), so matching them costs
a bounded amount per token; every random draw of a request comes from its
own ``torch.Generator`` seeded from ``seed``, so the same seed, prompt and model give the same
tokens whatever other requests run meanwhile.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

# Below this a temperature is greedy: 1 / T overflows float32 near 1e-38 (NaN probabilities), and
# long before that the softmax is one-hot in float32 anyway.
GREEDY_BELOW_TEMPERATURE = 1e-5
MAX_TEMPERATURE = 100.0
# As many stop strings as a request may give, and their longest length: each generated token is
# checked against them on the engine's thread, which every running request shares.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    ``max_tokens`` 0 only prefills (the prompt is cached, nothing is generated); the engine caps
    it to the positions the prompt leaves; ``temperature`` below ``GREEDY_BELOW_TEMPERATURE`` is
    greedy; ``stop`` strings (at most ``MAX_STOP_STRINGS``, each 1-``MAX_STOP_CHARS`` characters)
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
        if not isinstance(self.temperature, (int, float)) or not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        check_stop_strings(stop)
        object.__setattr__(self, "stop", stop)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE


def check_stop_strings(stop: Sequence[object]) -> None:
    """Raises ValueError (saying "stop strings") unless ``stop`` holds at most ``MAX_STOP_STRINGS``
    strings of 1-``MAX_STOP_CHARS`` characters each."""
    if len(stop) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(stop)}")
    for s in stop:
        if not isinstance(s, str) or not s:
            raise ValueError("stop strings must be non-empty strings")
        if len(s) > MAX_STOP_CHARS:
            raise ValueError(f"a stop string has at most {MAX_STOP_CHARS} characters, got {len(s)}")


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
        logits = logits.float()  # fp16/bf16 logits would overflow when divided by a small temperature
        if self.params.is_greedy:
            return int(torch.argmax(logits))
        # Shifted so the maximum is 0: every scaled logit is <= 0, so nothing overflows to +inf and
        # the maximum's exp(0) = 1 keeps the sum away from 0 (no NaN after the softmax).
        probs = torch.softmax((logits - logits.max()) / self.params.temperature, dim=-1)
        if self.params.top_p < 1.0:
            probs = _top_p(probs, self.params.top_p)
        return int(torch.multinomial(probs, 1, generator=self._generator))


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p`` (at least one)."""
    sorted_probs, order = torch.sort(probs, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    dropped = mass_before >= top_p
    dropped[0] = False  # the most likely token always stays (a top_p that rounds to 0 in float32 drops all)
    sorted_probs = sorted_probs.masked_fill(dropped, 0.0)
    kept = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return kept / kept.sum()
