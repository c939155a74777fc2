"""BodyLimitMiddleware: refuse request bodies over a size (413), before or while they are read.

Shared by the server (chunkstore/server/) and the management API (chunkstore/api/), each with its own error
shape. Invariants: a request that declares a larger Content-Length gets 413 before any of its body
reaches the app (a declared body up to ``DRAIN_MAX_BYTES`` is read and dropped first, a chunk at a
time: a client still sending when the answer comes would otherwise see its connection reset and lose
the 413; a larger one is answered at once); a body that grows past the limit while streaming in
(chunked, or lying about its length) is cut off at the limit and gets 413 (raised as an
HTTPException, so the app's handlers shape it); at most ``max_bytes`` of a body are ever handed to
the app; paths under ``exempt`` belong to a mounted app that applies its own limit, so every path
has exactly one. Pure ASGI: no buffering, works under streaming responses.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chunkstore.http.routes import is_under

DRAIN_MAX_BYTES = 1 << 20


async def _drain(receive: Receive) -> None:
    """Read the rest of a refused request's body and drop it."""
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


class BodyLimitMiddleware:
    """``too_large(message)`` builds the 413 response sent when the declared length is too large."""

    def __init__(self, app: ASGIApp, max_bytes: int, too_large: Callable[[str], Response],
                 hint: str = "", exempt: tuple[str, ...] = ()) -> None:
        self.app, self.max_bytes, self.too_large, self.exempt = app, max_bytes, too_large, exempt
        self.message = f"the request body is larger than {max_bytes} bytes{hint}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_under(scope, self.exempt):
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            if int(declared) <= DRAIN_MAX_BYTES:
                await _drain(receive)
            return await self.too_large(self.message)(scope, receive, send)
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, self.message)
            return message

        await self.app(scope, limited_receive, send)
