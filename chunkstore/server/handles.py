"""AsyncHandle: an engine request seen from the event loop; InFlight: the requests the server has in the engine.

Invariants: the engine's handles block, the loop must not, so each submitted request gets one pump
thread that moves its text deltas onto the loop in order and then exactly one outcome (the result or
the error), also when nobody listens any more (a closed loop drops them); a request is in InFlight
from its submit until the engine has completed it, so a shutdown can cancel every one still running;
a handle whose caller went away is cancelled (the engine ends it as ``abort`` at its next step):
a stream's when its response is cut (sse), a whole answer's when its connection closes while it is
generated (``result_while_connected``).
Threads: at most one pump per request the engine holds (bounded by its queue and running limits);
a request that finds the engine's queue full is refused (429) on the loop, without waiting for a
worker thread, so a flood of refused requests never delays the refusal of the next one.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from anyio import to_thread
from starlette.types import Receive

from chunkstore.engine import Engine, GenerationResult, Request, RequestHandle, TextDelta
from chunkstore.server.errors import ApiError


class InFlight:
    """The handles submitted and not yet completed. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles: set[RequestHandle] = set()

    def add(self, handle: RequestHandle) -> None:
        with self._lock:
            self._handles.add(handle)

    def discard(self, handle: RequestHandle) -> None:
        with self._lock:
            self._handles.discard(handle)

    def handles(self) -> list[RequestHandle]:
        """A snapshot of the handles in flight."""
        with self._lock:
            return list(self._handles)

    def count(self, namespace: str | None = None) -> int:
        """How many are in flight (of ``namespace`` only, when given)."""
        with self._lock:
            return sum(1 for h in self._handles if namespace is None or h.request.namespace == namespace)

    def cancel_all(self) -> int:
        """Ask the engine to end every request in flight (``abort``); returns how many."""
        handles = self.handles()
        for handle in handles:
            handle.cancel()
        return len(handles)

    def __len__(self) -> int:
        with self._lock:
            return len(self._handles)


@dataclass(frozen=True, slots=True)
class _Outcome:
    result: GenerationResult | None
    error: BaseException | None


class AsyncHandle:
    """Deltas and the result of one submitted request, awaitable. One consumer."""

    def __init__(self, handle: RequestHandle, in_flight: InFlight, loop: asyncio.AbstractEventLoop) -> None:
        self.handle = handle
        self._in_flight, self._loop = in_flight, loop
        self._items: asyncio.Queue[TextDelta | _Outcome] = asyncio.Queue()
        self._outcome: _Outcome | None = None
        in_flight.add(handle)
        threading.Thread(target=self._pump, name=f"chunkstore-serve-{handle.request_id}", daemon=True).start()

    @classmethod
    async def submit(cls, engine: Engine, request: Request, in_flight: InFlight) -> "AsyncHandle":
        """Submit on a worker thread (tokenizing a long prompt must not stall the loop). Raises
        ApiError for what the engine refuses (400, 429, 503)."""
        if engine.is_queue_full:  # at once: worker threads may all be busy tokenizing other prompts
            raise ApiError.from_engine(engine.queue_full_error(), is_submit=True)
        try:
            handle = await to_thread.run_sync(engine.submit, request)
        except Exception as exc:
            raise ApiError.from_engine(exc, is_submit=True) from exc
        return cls(handle, in_flight, asyncio.get_running_loop())

    @property
    def prompt_tokens(self) -> int:
        return len(self.handle.prompt_ids)

    def _pump(self) -> None:
        try:
            for delta in self.handle:
                self._post(delta)
        except BaseException:  # noqa: BLE001 - the same error comes back from result() below
            pass
        try:
            outcome = _Outcome(self.handle.result(), None)
        except BaseException as exc:  # noqa: BLE001 - handed to the loop, raised there
            outcome = _Outcome(None, exc)
        self._in_flight.discard(self.handle)
        self._post(outcome)

    def _post(self, item: TextDelta | _Outcome) -> None:
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody waits for this request any more
            pass

    async def deltas(self) -> AsyncIterator[TextDelta]:
        """Text deltas (each with the tokens it covers) as the engine produces them, until the request ends."""
        while self._outcome is None:
            item = await self._items.get()
            if isinstance(item, _Outcome):
                self._outcome = item
            else:
                yield item

    async def result(self) -> GenerationResult:
        """The finished result (after the remaining deltas). Raises ApiError: 503 when the server
        shut down before the request ran, 500 when it failed."""
        async for _ in self.deltas():
            pass
        if self._outcome.error is not None:
            raise ApiError.from_engine(self._outcome.error, is_submit=False) from self._outcome.error
        return self._outcome.result

    async def result_while_connected(self, receive: Receive) -> GenerationResult:
        """``result()``, for a client waiting for the whole answer: when its connection closes
        first (``receive``, the request's ASGI channel, whose body was read, says
        ``http.disconnect``), the request is cancelled, so the engine ends it as ``abort`` at its
        next step and frees its slot (that result is returned, to nobody). Raises as ``result()``."""
        watcher = asyncio.ensure_future(self._cancel_on_disconnect(receive))
        try:
            return await self.result()
        finally:
            watcher.cancel()

    async def _cancel_on_disconnect(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass  # the body was read before the route ran: anything else is an empty piece of it
        self.cancel_unless_done()

    def cancel_unless_done(self) -> None:
        """Stop the request when its caller went away before it ended."""
        if self._outcome is None:
            self.handle.cancel()
