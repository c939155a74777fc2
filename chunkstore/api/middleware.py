"""Pure ASGI middleware of the management API: its Host refusal, response headers and timing.

Invariants: a request whose Host header is missing or not allowed gets 400 before anything else runs
(DNS rebinding; the rule is chunkstore.http.hosts', the body limit chunkstore.http.body_limit's, the
answers ours); every response carries ``Cache-Control: no-store`` and ``nosniff`` and
never a cookie; the time to each response's start is observed per route template.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chunkstore.api.errors import error_json

_SECURITY_HEADERS = [(b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff")]


def host_refusal(allowed: frozenset[str]) -> Callable[[str], Response]:
    """The management API's 400 for a Host header its rule refuses (chunkstore.http.hosts)."""
    def refuse(raw_host: str) -> Response:
        return error_json(400, "bad_host", f"Host {raw_host!r} is not served here; allowed: loopback names, "
                                           f"{', '.join(sorted(allowed))} (--allowed-host adds names)", param="Host")
    return refuse


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
