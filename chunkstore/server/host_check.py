"""LoopbackHostMiddleware: a server bound to loopback answers only requests addressed to a loopback name.

Invariants: when the server listens on 127.0.0.0/8 or ::1, a request whose Host header is not
``localhost``, a 127.x address or ``[::1]`` (any port) gets 400 before any route runs: a web page
that rebinds its own domain name to 127.0.0.1 (DNS rebinding) cannot read this server's answers
or time its cache. A server bound to any other address checks nothing (its clients choose names).
"""

from __future__ import annotations

import ipaddress

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from chunkstore.server.errors import error_body


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is a loopback one."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(header: bytes) -> str:
    text = header.decode("latin-1").strip()
    if text.startswith("["):  # [::1]:8000
        return text[: text.find("]") + 1] if "]" in text else text
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


class LoopbackHostMiddleware:
    """Pure ASGI middleware; install only when the bound address is a loopback one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope.get("headers") or ()).get(b"host", b"")
            if not is_loopback(_host_name(host)):
                message = ("this server listens on a loopback address and answers only requests addressed to "
                           "localhost, 127.0.0.1 or [::1] (Host header)")
                response = JSONResponse(error_body(message, status=400, code="invalid_host"), status_code=400)
                return await response(scope, receive, send)
        await self.app(scope, receive, send)
