"""BodyLimitMiddleware: refuse request bodies over a size (413), before or while they are read.

Invariants: a request that declares a larger Content-Length gets 413 before any of its body is
read; a body that grows past the limit while streaming in (chunked, or lying about its length) is
cut off at the limit and gets 413 (raised as an HTTPException, so the app's handlers shape it); at
most ``max_bytes`` of a body are ever handed to the app.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chunkstore.server.errors import error_body


def _too_large(max_bytes: int) -> str:
    return f"the request body is larger than {max_bytes} bytes (the server's --max-body-bytes)"


class BodyLimitMiddleware:
    """Pure ASGI middleware (no buffering, works under streaming responses)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            response = JSONResponse(error_body(_too_large(self.max_bytes), status=413, code="body_too_large"),
                                    status_code=413, headers={"Connection": "close"})
            return await response(scope, receive, send)
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, _too_large(self.max_bytes))
            return message

        await self.app(scope, limited_receive, send)
