"""PrefetchHolds: a speculative prefetch keeps its host pages for the request that asked for it.

``TieredCache.prefetch`` loads, while a request waits in the queue, the on-disk part of its prefix
into host memory. Left evictable, those pages are the least recently used of the host pool, so the
next prefetch or write-through backup pushes them out before their request starts (measured on
the default multi-turn workload: nine in ten were read twice). So the pages of a speculative
prefetch are *held*: host eviction skips them (the cache asks ``is_held``) until a ``match`` that
covers the request's tokens consumes them, or until ``hold_s`` passes (a request that never
starts). So are the host pages its prefix already had in memory (``hold_resident``), which would
otherwise go down to disk while it waits, to be read back on its match. A hold is not a tree lock:
it keeps the host copies only, never device pages above them. Speculative pages, in flight and
held, stay within ``capacity_pages`` (a share of the host pool, the rest being for the running
request and for backups), and the running request's own load, or a backup of new pages, may take
holds back, newest first. The requests prefetched for stay *pending* until they start: after each
match the cache prefetches again for the next of them, which catches what a bounded prefetch left
out and the prefix pages that went down to disk while the request waited.

Invariants (the owner calls everything under the tree lock): an op is in at most one of
``_in_flight`` and ``_held``; a key is held by at most one hold, and only while that hold lasts;
the pending list is bounded (oldest dropped) and every hold and pending entry ends by ``hold_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from chunkstore.cache.ops import PrefetchOp

log = logging.getLogger(__name__)

MAX_PENDING = 256  # requests prefetched for and not started; several engine queues' worth
NEXT_IN_LINE = 4  # pending requests prefetched for again after each match


@dataclass(frozen=True, slots=True)
class PendingPrefetch:
    tokens: tuple[int, ...]
    namespace: str
    expires_at: float  # time.monotonic()


@dataclass(eq=False)
class ResidentHold:
    """Host pages a queued request's prefix already had in memory, held like a prefetch's."""

    keys: tuple[bytes, ...]
    namespace: str
    token_ids: tuple[int, ...]  # the request's tokens up to the last held page


def _starts(prefix: tuple[int, ...], tokens: tuple[int, ...]) -> bool:
    n = len(prefix)  # the last-token check first: most pairs differ there, and it copies nothing
    return n <= len(tokens) and (n == 0 or tokens[n - 1] == prefix[-1]) and tokens[:n] == prefix


class PrefetchHolds:
    """The speculative prefetches of one cache: in flight and held, and the requests they are for."""

    def __init__(self, capacity_pages: int, hold_s: float) -> None:
        self.capacity_pages, self.hold_s = capacity_pages, hold_s
        self._in_flight: set[PrefetchOp] = set()
        self._held: dict[PrefetchOp | ResidentHold, float] = {}  # -> when the hold ends (time.monotonic())
        self._held_keys: dict[bytes, PrefetchOp | ResidentHold] = {}
        self._pending: deque[PendingPrefetch] = deque(maxlen=MAX_PENDING)

    @property
    def num_held_pages(self) -> int:
        return len(self._held_keys)

    def room(self) -> int:
        """Pages a new speculative prefetch may still take."""
        in_flight = sum(op.num_pages for op in self._in_flight)
        return max(0, self.capacity_pages - in_flight - self.num_held_pages)

    def is_held(self, keys: Iterable[bytes]) -> bool:
        """Whether any of these pages (a node's) is kept for a queued request."""
        held = self._held_keys
        return bool(held) and any(k in held for k in keys)

    def started(self, op: PrefetchOp) -> None:
        self._in_flight.add(op)

    def finished(self, op: PrefetchOp) -> None:
        """The op's last batch landed: a speculative op not consumed meanwhile holds the pages it
        loaded."""
        if op not in self._in_flight:
            return
        self._in_flight.discard(op)
        keys = [k for k in op.keys[:op.num_loaded_pages] if k not in self._held_keys]
        if keys:
            self._held[op] = time.monotonic() + self.hold_s
            self._held_keys.update(dict.fromkeys(keys, op))

    def hold_resident(self, keys: Iterable[bytes], tokens: tuple[int, ...], namespace: str) -> int:
        """Hold host pages of a queued request's prefix (``tokens`` up to the last of them) that are
        in memory already, so they do not go down to disk while it waits; at most the room left.
        Returns the pages newly held."""
        new = [k for k in keys if k not in self._held_keys][:self.room()]
        if new:
            hold = ResidentHold(tuple(new), namespace, tokens)
            self._held[hold] = time.monotonic() + self.hold_s
            self._held_keys.update(dict.fromkeys(new, hold))
        return len(new)

    def add_pending(self, tokens: tuple[int, ...], namespace: str) -> None:
        self._pending.append(PendingPrefetch(tokens, namespace, time.monotonic() + self.hold_s))

    def consume(self, tokens: tuple[int, ...], namespace: str) -> int:
        """A request with these tokens started: its held pages go back to the eviction order, its
        in-flight prefetches will not be held, it is no longer pending. Returns the pages given
        back."""
        for op in [op for op in self._in_flight if op.namespace == namespace and _starts(op.token_ids, tokens)]:
            self._in_flight.discard(op)
        given_back = sum(self._unhold(op) for op in list(self._held)
                         if op.namespace == namespace and _starts(op.token_ids, tokens))
        started = [p for p in self._pending if p.namespace == namespace and _starts(p.tokens, tokens)]
        for p in started:
            self._pending.remove(p)
        return given_back

    def expire(self, now: float | None = None) -> int:
        """End the holds and forget the pending requests older than ``hold_s``; returns the pages
        given back."""
        now = time.monotonic() if now is None else now
        given_back = sum(self._unhold(op) for op, until in list(self._held.items()) if until <= now)
        while self._pending and self._pending[0].expires_at <= now:
            self._pending.popleft()
        return given_back

    def release_newest(self, num_pages: int) -> int:
        """Give back holds, newest first (the request furthest from starting), until ``num_pages``
        pages are back or none is held: for the request running now, which needs the room."""
        given_back = 0
        for op in reversed(list(self._held)):
            if given_back >= num_pages:
                break
            given_back += self._unhold(op)
        return given_back

    def release_all(self) -> int:
        """End every hold (the requests stay in line: they are prefetched for again)."""
        return sum(self._unhold(op) for op in list(self._held))

    def next_in_line(self) -> list[PendingPrefetch]:
        """The oldest pending requests (at most ``NEXT_IN_LINE``) to prefetch for again; none when
        there is no room."""
        if not self._pending or self.room() == 0:
            return []
        return [self._pending[i] for i in range(min(NEXT_IN_LINE, len(self._pending)))]

    def _unhold(self, op: PrefetchOp | ResidentHold) -> int:
        del self._held[op]
        keys = [k for k in op.keys if self._held_keys.get(k) is op]
        for key in keys:
            del self._held_keys[key]
        return len(keys)


class PrefetchRefresher:
    """A thread that runs ``refresh`` (prefetch again for the requests next in line) after each
    ``wake``, off the caller's thread: the engine's match only signals it. Wakes that arrive while
    a refresh runs fold into one more run. ``close`` stops it (idempotent)."""

    def __init__(self, refresh: Callable[[], None]) -> None:
        self._refresh = refresh
        self._cond = threading.Condition()
        self._is_wanted = self._is_running = self._is_closed = False
        self._thread = threading.Thread(target=self._loop, name="chunkstore-prefetch-refresh", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        with self._cond:
            self._is_wanted = True
            self._cond.notify_all()

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until no refresh is running or asked for; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._is_closed or not (self._is_wanted or self._is_running),
                                       timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        with self._cond:
            self._is_closed = True
            self._cond.notify_all()
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._is_wanted or self._is_closed)
                if self._is_closed:
                    return
                self._is_wanted, self._is_running = False, True
            try:
                self._refresh()
            except Exception:  # an optimisation only: the requests load on match instead
                log.exception("prefetching for queued requests failed")
            finally:
                with self._cond:
                    self._is_running = False
                    self._cond.notify_all()
