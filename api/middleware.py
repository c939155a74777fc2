"""Pure ASGI middleware of the management API: Host check, body limit, response headers and timing.

Invariants: a request whose Host header is missing or not an allowed name gets 400 before anything
else runs (DNS rebinding); a body declared or found larger than the limit gets 413 and at most the
limit is ever handed on; every response carries ``Cache-Control: no-store`` and ``nosniff`` and
never a cookie; the time to each response's start is observed per route template.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chunkstore.api.errors import error_json

_SECURITY_HEADERS = [(b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff")]


def host_name(header: str) -> str:
    """'example.org:8001' -> 'example.org'; '[::1]:8001' -> '::1' (lower case)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    if header.count(":") == 1:
        return header.split(":", 1)[0]
    return header


class HostCheckMiddleware:
    def __init__(self, app: ASGIApp, allowed: frozenset[str]) -> None:
        self.app, self.allowed = app, allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        raw = dict(scope.get("headers") or ()).get(b"host", b"").decode("latin-1")
        if host_name(raw) not in self.allowed:
            response = error_json(400, "bad_host", f"Host {raw!r} is not served here; allowed: "
                                                   f"{', '.join(sorted(self.allowed))} (--allowed-host adds names)",
                                  param="Host")
            return await response(scope, receive, send)
        await self.app(scope, receive, send)


def body_too_large(message: str):
    """The management API's 413 (for chunkstore.body_limit.BodyLimitMiddleware)."""
    return error_json(413, "body_too_large", message, headers={"Connection": "close"})


class ResponseMiddleware:
    """Adds the security headers and reports (route template, method, status, seconds to the
    response's start) to ``observe``."""

    def __init__(self, app: ASGIApp, observe: Callable[[str, str, int, float], None]) -> None:
        self.app, self.observe = app, observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"set-cookie"]
                message = {**message, "headers": headers + _SECURITY_HEADERS}
                route = scope.get("route")
                template = getattr(route, "path_format", None) or getattr(route, "path", None) or "unmatched"
                self.observe(template, scope["method"], message["status"], time.perf_counter() - start)
            await send(message)

        await self.app(scope, receive, send_with_headers)
