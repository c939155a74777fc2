"""Routes that hand a request to another ASGI app (a whole path prefix, or one path under another
name), and what an app's routes take at a path (``allowed_methods``, ``has_route``).

Invariants: the receiving app sees the request's path unchanged (``PrefixRoute``) or exactly the
target path (``AliasRoute``), so its own routes, auth and errors answer, and an alias never drifts
from what it aliases; neither route ever builds a URL (``url_path_for`` finds nothing); a path is
"under" a prefix when it equals it or continues it after a ``/`` (``/api/v1x`` is not under ``/api/v1``);
the methods a path takes are asked of the routes themselves (``BaseRoute.matches``), never kept
beside them, so ``Allow`` names what the router would dispatch.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.routing import BaseRoute, Match, NoMatchFound
from starlette.types import ASGIApp, Receive, Scope, Send

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def route_path(scope: Scope) -> str:
    """The request's path below the app's root path."""
    return scope["path"].removeprefix(scope.get("root_path", "") or "")


def is_under(scope: Scope, prefixes: tuple[str, ...]) -> bool:
    """Whether the request's path is one of ``prefixes`` or below one."""
    path = route_path(scope)
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def has_route(routes: Sequence[BaseRoute], scope: Scope) -> bool:
    """Whether one of ``routes`` takes this request (its path and its method)."""
    probe = dict(scope)  # matching may note things in the scope: never in the request's own
    return any(route.matches(probe)[0] is Match.FULL for route in routes)


def allowed_methods(routes: Sequence[BaseRoute], scope: Scope) -> list[str]:
    """The methods ``routes`` take at the request's path (Starlette's 405 names only those of the
    first route that has the path, so a path served by two routes lost the other's)."""
    return [method for method in METHODS if has_route(routes, {**scope, "method": method})]


class PrefixRoute(BaseRoute):
    """Hands every request under ``prefix`` to ``app`` with its path unchanged (a Starlette Mount
    strips the prefix, and one at ``/`` would also take the parent's unknown paths)."""

    def __init__(self, prefix: str, app: ASGIApp) -> None:
        self.prefix, self.app = prefix.rstrip("/"), app

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] in ("http", "websocket") and is_under(scope, (self.prefix,)):
            return Match.FULL, {}
        return Match.NONE, {}

    def url_path_for(self, name: str, /, **path_params: str):
        raise NoMatchFound(name, path_params)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


class AliasRoute(BaseRoute):
    """Hands requests for exactly ``path`` to ``app`` as requests for ``target``."""

    def __init__(self, path: str, app: ASGIApp, target: str) -> None:
        self.path, self.app, self.target = path, app, target

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and route_path(scope) == self.path:
            return Match.FULL, {}
        return Match.NONE, {}

    def url_path_for(self, name: str, /, **path_params: str):
        raise NoMatchFound(name, path_params)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = (scope.get("root_path", "") or "") + self.target
        await self.app({**scope, "path": target, "raw_path": target.encode()}, receive, send)
