"""What a route can ask for: the runtime, the backend, the store, and the authenticated caller.

Invariants: everything comes from ``app.state.admin`` (set once by ``create_app``); ``CallerDep``
reads only the Authorization header (never cookies) and is cached per request; ``ReaderDep`` lets
an anonymous caller read only while the API binds loopback and no namespace has a token;
``WriterDep`` always needs a token; ``AdminDep`` refuses namespace tokens (403); routes that take a
namespace confine a namespace caller to its own through ``scoped_namespace`` / ``check_namespace``.
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from fastapi import Depends, Header, Request

from chunkstore.api.backend.base import AdminBackend
from chunkstore.api.errors import AdminError
from chunkstore.api.runtime import AdminRuntime
from chunkstore.api.security import Caller, Role
from chunkstore.http.bearer import MalformedAuthorization, bearer_token
from chunkstore.http.hosts import is_loopback

audit_log = logging.getLogger("chunkstore.api.audit")


def get_runtime(request: Request) -> AdminRuntime:
    return request.app.state.admin


def get_backend(request: Request) -> AdminBackend:
    return request.app.state.admin.backend


RuntimeDep = Annotated[AdminRuntime, Depends(get_runtime)]
BackendDep = Annotated[AdminBackend, Depends(get_backend)]


def authenticate(runtime: RuntimeDep, authorization: Annotated[str | None, Header()] = None) -> Caller:
    """The caller: anonymous without an Authorization header. Raises 401 for a malformed or unknown token."""
    try:
        token = bearer_token(authorization)
    except MalformedAuthorization:
        raise AdminError.unauthorized("send the token as `Authorization: Bearer <token>`") from None
    if token is None:
        return Caller(Role.ANONYMOUS)
    caller = runtime.token.ring.identify(token)
    if caller is None:
        where = f" (the admin token is in {runtime.token_path})" if runtime.token_path else ""
        raise AdminError.unauthorized(f"invalid token{where}")
    return caller


CallerDep = Annotated[Caller, Depends(authenticate)]


def _token_hint(runtime: AdminRuntime) -> str:
    where = f" (the admin token is in {runtime.token_path})" if runtime.token_path else ""
    return f"send `Authorization: Bearer <token>`{where}"


def require_reader(caller: CallerDep, runtime: RuntimeDep) -> Caller:
    if caller.role is Role.ANONYMOUS and runtime.reads_need_token:
        why = [reason for reason, holds in (
            ("this API binds beyond loopback", not is_loopback(runtime.settings.host)),
            ("namespace tokens (or the server's API keys) are configured", runtime.token.ring.has_namespace_tokens))
            if holds]
        raise AdminError.unauthorized(f"{' and '.join(why)}, so reads need a token too: {_token_hint(runtime)}")
    return caller


def require_writer(caller: CallerDep, runtime: RuntimeDep) -> Caller:
    if caller.role is Role.ANONYMOUS:
        raise AdminError.unauthorized(f"requests that change state need a token: {_token_hint(runtime)}")
    return caller


def require_admin(caller: Annotated[Caller, Depends(require_writer)]) -> Caller:
    if caller.is_namespace_scoped:
        raise AdminError.forbidden("this needs the admin token; a namespace token may only read its namespace, "
                                   "evict from it on disk, and pin or unpin its chunks")
    return caller


def require_global_reader(caller: Annotated[Caller, Depends(require_reader)]) -> Caller:
    """A reader of cache-wide figures (not a namespace token: they include other tenants' activity)."""
    if caller.is_namespace_scoped:
        raise AdminError.forbidden("cache-wide figures include other namespaces' activity; a namespace token "
                                   "sees GET /stats (its namespace), /namespaces and /chunks only")
    return caller


ReaderDep = Annotated[Caller, Depends(require_reader)]
GlobalReaderDep = Annotated[Caller, Depends(require_global_reader)]
WriterDep = Annotated[Caller, Depends(require_writer)]
AdminDep = Annotated[Caller, Depends(require_admin)]


def check_namespace(caller: Caller, namespace: str) -> None:
    """Raises 403 when a namespace caller asks about another namespace."""
    if caller.is_namespace_scoped and namespace != caller.namespace:
        raise AdminError.forbidden(f"this token sees only namespace {caller.namespace!r}")


def scoped_namespace(caller: Caller, requested: str | None) -> str | None:
    """The namespace a request works in: a namespace caller's own (403 when it asks for another),
    else the one asked for (None: all)."""
    if caller.is_namespace_scoped:
        if requested is not None:
            check_namespace(caller, requested)
        return caller.namespace
    return requested


def audit(request: Request, caller: Caller, params: dict[str, Any], *, is_destructive: bool = True) -> None:
    """Log a state-changing call with its parameters (warning level when it destroys data)."""
    level = logging.WARNING if is_destructive else logging.INFO
    audit_log.log(level, "%s %s by %s: %s", request.method, request.url.path, caller.describe(),
                  json.dumps(params, sort_keys=True, default=str))
