"""GET /events: server-sent events of stats snapshots and job changes, for live views.

Invariants: a stream is bounded (``max_events`` ticks and ``events_max_s`` seconds) and always ends
with an ``end`` event naming why (max_events, max_duration, shutdown); it stops at the next tick
once the client goes away or the app closes; each tick sends one ``stats`` event and one ``job``
event per job that changed since the last tick.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from chunkstore.api.backend.base import BackendError
from chunkstore.api.deps import GlobalReaderDep, RuntimeDep, require_reader
from chunkstore.api.errors import ERROR_RESPONSES
from chunkstore.api.runtime import AdminRuntime
from chunkstore.api.schemas.jobs import JobPublic
from chunkstore.api.schemas.stats import StatsPublic

router = APIRouter(tags=["events"], dependencies=[Depends(require_reader)], responses=ERROR_RESPONSES)

_POLL_S = 0.1


def sse(event: str, data: str) -> str:
    return f"event: {event}\ndata: {data}\n\n"


async def _stream(request: Request, runtime: AdminRuntime, interval_s: float, max_events: int) -> AsyncIterator[str]:
    deadline = time.monotonic() + runtime.settings.events_max_s
    seen: dict[str, int] = {}
    reason = "max_events"
    for _ in range(max_events):
        if runtime.closing.is_set():
            reason = "shutdown"
            break
        if time.monotonic() >= deadline:
            reason = "max_duration"
            break
        try:
            snap = await run_in_threadpool(runtime.backend.snapshot)
            yield sse("stats", StatsPublic.of(snap, runtime.backend.kind.value).model_dump_json())
        except BackendError as exc:
            yield sse("unavailable", json.dumps({"message": str(exc)}))
        for job in runtime.jobs.list():
            if seen.get(job.id) != job.version:
                seen[job.id] = job.version
                yield sse("job", JobPublic.of(job).model_dump_json())
        wake = min(time.monotonic() + interval_s, deadline)  # never sleep past the stream's life
        while time.monotonic() < wake and not runtime.closing.is_set():
            if await request.is_disconnected():
                return
            await asyncio.sleep(min(_POLL_S, max(0.0, wake - time.monotonic())))
    yield sse("end", json.dumps({"reason": reason}))


@router.get("/events", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}, "description": "an SSE stream"}})
def events(
    request: Request, caller: GlobalReaderDep, runtime: RuntimeDep,
    interval_s: Annotated[float | None, Query(ge=0.05, le=3600, description="seconds between snapshots")] = None,
    max_events: Annotated[int, Query(ge=1, le=100_000, description="snapshots before the stream ends")] = 100,
) -> StreamingResponse:
    """``event: stats`` (StatsPublic) every interval, ``event: job`` (JobPublic) when a job changes,
    and a final ``event: end``."""
    interval = interval_s if interval_s is not None else runtime.settings.events_interval_s
    return StreamingResponse(_stream(request, runtime, interval, max_events), media_type="text/event-stream",
                             headers={"X-Accel-Buffering": "no"})
