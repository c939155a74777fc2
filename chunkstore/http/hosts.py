"""Host headers: one parser and one allow rule for every app (DNS-rebinding protection).

Invariants: a Host header is reduced to its lower-case name without port or IPv6 brackets
(``[::1]:8000`` -> ``::1``); a loopback name is ``localhost``, a name ending in ``.localhost``
(RFC 6761: resolvers and browsers answer it with loopback, never from DNS), or an address in
127.0.0.0/8 or ::1, and a loopback name is always allowed; any other name is allowed only when it is
in the rule's names; a missing or empty Host is refused. The refusal is the caller's response,
so each app answers in its own error envelope, before any route runs.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from chunkstore.http.routes import is_under

WILDCARD_ADDRESSES = frozenset({"0.0.0.0", "::", ""})


def host_name(header: str) -> str:
    """The name a Host header (or a bind address) names: 'Example.org:8001' -> 'example.org',
    '[::1]:8001' -> '::1', '::1' -> '::1'."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    if header.count(":") == 1:
        return header.split(":", 1)[0]
    return header


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name, an address, or a Host header) names this machine only."""
    name = host_name(host)
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class HostRule:
    """Which Host names an app answers: every loopback name, and ``names`` (lower case, no port)."""

    names: frozenset[str] = frozenset()

    @classmethod
    def of(cls, names: Iterable[str]) -> "HostRule":
        return cls(frozenset(host_name(n) for n in names if host_name(n)))

    def allows(self, header: str) -> bool:
        name = host_name(header)
        return bool(name) and (is_loopback(name) or name in self.names)


class HostCheckMiddleware:
    """Pure ASGI middleware: a request whose Host ``rule`` does not allow gets ``refuse(raw_host)``.
    Paths under ``exempt`` (prefixes) belong to a mounted app that checks them by its own rule."""

    def __init__(self, app: ASGIApp, rule: HostRule, refuse: Callable[[str], Response],
                 exempt: tuple[str, ...] = ()) -> None:
        self.app, self.rule, self.refuse, self.exempt = app, rule, refuse, exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and not is_under(scope, self.exempt):
            raw = dict(scope.get("headers") or ()).get(b"host", b"").decode("latin-1")
            if not self.rule.allows(raw):
                return await self.refuse(raw)(scope, receive, send)
        await self.app(scope, receive, send)
