"""What the disk tier's background work costs the request path: the forward's contention factor,
the CPU the store's threads spend per page, and the TTFT floor the hit rate allows.

- The forward's cost model, fitted by least squares on the ``no-cache`` run of the same
  invocation (where nothing but the forward and the cache's inserts run): a prefill of ``n``
  tokens after ``start`` cached ones costs ``c + a * n + b * n * (start + (n + 1) / 2)`` seconds
  (a fixed cost per forward, the per-token layers, then attention over every earlier position). A run's contention factor is its
  measured forward seconds over what the model predicts for the same prefills: 1.0 when nothing
  slows the forward, 1.5 when it runs half as fast again.
- The TTFT floor of a request: the predicted (uncontended) forward of its uncached tokens, plus
  its cached tokens times the measured load cost per token of the tier they came from (host, or
  disk: the whole way up). Queueing and decode are not in it, so a measured TTFT near the floor
  means the cache delivers what its hits allow.
- Thread CPU: seconds on a CPU of the live threads whose names start with a group's prefixes,
  read from /proc (the scheduler's nanoseconds where it keeps them, else user + system clock
  ticks; Linux only, None elsewhere). Pool threads live as long as their store, so
  a run is sampled before its engine closes.

Invariants: every figure is measured in the same invocation it is compared with; a figure that
cannot be measured here (no no-cache run, no /proc, no page moved) is None, never 0.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chunkstore.bench.workload import Reply

# Thread name prefixes: the store's own pools and the controller's disk paths.
WRITE_THREADS = ("chunkstore-write", "chunkstore-host_to_disk")
LOAD_THREADS = ("chunkstore-read", "chunkstore-decode", "chunkstore-background-read", "chunkstore-background-decode",
                "chunkstore-disk_to_host")
_TASKS = Path("/proc/self/task")


@dataclass(frozen=True, slots=True)
class ForwardCost:
    """Seconds of a prefill forward of ``n`` tokens after ``start`` cached ones:
    ``fixed_s + per_token_s * n + per_pair_s * n * (start + (n + 1) / 2)``."""

    fixed_s: float
    per_token_s: float
    per_pair_s: float

    @classmethod
    def fit(cls, replies: list[Reply]) -> ForwardCost | None:
        """Least squares over the replies that computed tokens, every term kept >= 0 (a term the
        data push below zero is dropped and the rest fitted again); None with fewer than three
        such replies."""
        rows, seconds = [], []
        for r in replies:
            n = r.prompt_tokens - r.cached_tokens
            if r.forward_s is None or n <= 0:
                continue
            rows.append((1.0, n, n * (r.cached_tokens + (n + 1) / 2)))
            seconds.append(r.forward_s)
        if len(rows) < 3:
            return None
        a = np.asarray(rows, dtype=np.float64)
        y = np.asarray(seconds, dtype=np.float64)
        kept = [0, 1, 2]
        while True:
            coef, *_ = np.linalg.lstsq(a[:, kept], y, rcond=None)
            if (coef >= 0).all() or len(kept) == 1:
                break
            kept.pop(int(np.argmin(coef)))
        terms = [0.0, 0.0, 0.0]
        for i, c in zip(kept, coef):
            terms[i] = max(float(c), 0.0)
        return cls(*terms)

    def predict(self, start: int, n: int) -> float:
        return self.fixed_s + self.per_token_s * n + self.per_pair_s * n * (start + (n + 1) / 2)


def contention_factor(replies: list[Reply], cost: ForwardCost | None) -> float | None:
    """Measured forward seconds over the uncontended prediction for the same prefills."""
    if cost is None:
        return None
    measured = predicted = 0.0
    for r in replies:
        n = r.prompt_tokens - r.cached_tokens
        if r.forward_s is None or n <= 0:
            continue
        measured += r.forward_s
        predicted += cost.predict(r.cached_tokens, n)
    return measured / predicted if predicted > 0 else None


def ttft_floor_avg_s(replies: list[Reply], cost: ForwardCost | None,
                     load_s_per_token: dict[str, float | None] | None) -> float | None:
    """The average TTFT floor of ``replies`` (see the module doc); None without a cost model or
    without the tiers the cached tokens came from."""
    if cost is None or not replies or any(r.tier_tokens is None for r in replies):
        return None
    load = load_s_per_token or {}
    floors = []
    for r in replies:
        floor = cost.predict(r.cached_tokens, max(r.prompt_tokens - r.cached_tokens, 1))
        for tier in ("host", "disk"):
            tokens = r.tier_tokens.get(tier, 0)
            if tokens:
                per_token = load.get(tier)
                if per_token is None:
                    return None
                floor += tokens * per_token
        floors.append(floor)
    return float(np.mean(floors))


def _task_cpu_s(native_id: int, ticks_per_s: float) -> float | None:
    task = _TASKS / str(native_id)
    try:  # nanoseconds on a CPU, where the kernel keeps them (schedstat); else clock ticks (stat)
        return int((task / "schedstat").read_text().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        pass
    try:
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the command: state is field 3, utime and stime are fields 14 and 15 (man 5 proc).
    return (int(fields[11]) + int(fields[12])) / ticks_per_s


def thread_cpu_s(prefixes: tuple[str, ...]) -> float | None:
    """CPU seconds of the live threads whose names start with one of ``prefixes``; None where
    /proc has no per-thread figures."""
    if not _TASKS.is_dir():
        return None
    ticks_per_s = float(os.sysconf("SC_CLK_TCK"))
    total = 0.0
    for t in threading.enumerate():
        if t.native_id is not None and t.name.startswith(prefixes):
            total += _task_cpu_s(t.native_id, ticks_per_s) or 0.0
    return total


def store_cpu_s() -> dict[str, float | None]:
    """CPU seconds of the store's write and load threads so far (see the module doc)."""
    return {"write": thread_cpu_s(WRITE_THREADS), "load": thread_cpu_s(LOAD_THREADS)}
