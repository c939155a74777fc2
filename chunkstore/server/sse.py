"""Server-sent events as OpenAI and SGLang stream them: ``data: {json}\\n\\n`` events, then ``data: [DONE]\\n\\n``.

Invariants: a stream always ends with ``[DONE]``, after an error event when the request failed
(the HTTP status is already 200 by then); a stream whose client went away cancels its request; an
unexpected error is logged and sent as an error event, never left to cut the connection.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from chunkstore.server.errors import ApiError, error_body
from chunkstore.server.handles import AsyncHandle

log = logging.getLogger(__name__)

DONE = "data: [DONE]\n\n"
# The OpenAPI description of a streamed 200: each event's `data` is a JSON chunk, the last `[DONE]`.
OPENAPI_RESPONSE = {
    "description": "the answer; with `stream`, server-sent events",
    "content": {"text/event-stream": {"schema": {
        "type": "object", "required": ["data"],
        "properties": {"data": {"type": "string", "description": "a JSON chunk; the last event is [DONE]"}}}}}}


def event(payload: dict) -> str:
    """One SSE event carrying ``payload`` as compact JSON."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def _guarded(handle: AsyncHandle, events: AsyncIterator[str]) -> AsyncIterator[str]:
    try:
        async for item in events:
            yield item
    except ApiError as exc:
        yield event(exc.body)
    except Exception:
        log.exception("stream of request %d failed", handle.handle.request_id)
        yield event(error_body("internal server error", status=500, code="internal_error"))
    finally:  # also when the client went away (the task is cancelled at an await)
        handle.cancel_unless_done()
    yield DONE


def event_stream(handle: AsyncHandle, events: AsyncIterator[str]) -> StreamingResponse:
    """The streaming response of ``events`` (SSE strings) for ``handle``'s request."""
    return StreamingResponse(_guarded(handle, events), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
