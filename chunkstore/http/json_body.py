"""JsonBodyGate: what a request that carries a body must pass before a route reads it.

Shared by the server (chunkstore/server/) and the management API (chunkstore/api/), each with its
own credentials check and error envelope. Invariants, for a POST, PUT, PATCH or DELETE that a route
of the app takes (anything else goes on untouched, for the router's 404 or 405): the caller's
credentials are checked before a byte of the body is read (401 before any 400); a body with a
Content-Encoding is refused (415 ``unsupported_encoding``: bodies are sent as is); a JSON body
(``application/json``, ``application/*+json``) must be UTF-8 (400 ``invalid_encoding``), JSON text
(400 ``invalid_json``; Python's NaN and Infinity pass, for the fields to refuse by name) and nested
at most ``MAX_DEPTH`` arrays or objects deep (400 ``too_deep``, so nothing downstream recurses
without bound); a body that passes is handed to the app byte for byte (it is parsed twice, the
second time by FastAPI: C-speed, and bounded by the body limit). Pure ASGI: the body limit (413)
still applies while the body is read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chunkstore.http.errors import ErrorCode, ErrorEnvelope, HttpError
from chunkstore.http.routes import has_route, is_under

MAX_DEPTH = 64  # a chat request nests 4 deep, a tool's JSON schema a dozen or so
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

# Checks a request's Authorization header (None: absent); raises HttpError (401) when it does not do.
CredentialsCheck = Callable[["str | None"], object]


def is_json(content_type: str | None) -> bool:
    """Whether a Content-Type names JSON, as FastAPI decides which bodies it parses."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def _depth(value: Any) -> int:
    """How deep arrays and objects nest in ``value``, counted up to ``MAX_DEPTH + 1`` (iterative:
    the value may be as deep as the parser allows)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            break
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def check_json(body: bytes) -> None:
    """Raises HttpError 400 unless ``body`` is UTF-8 JSON text nested at most ``MAX_DEPTH`` deep
    (an empty body passes: the route says whether it needs one)."""
    if not body:
        return
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HttpError(400, ErrorCode.INVALID_ENCODING, f"the request body is not UTF-8 text (a byte "
                                                         f"{body[exc.start]:#04x} at {exc.start}): send JSON "
                                                         f"as UTF-8") from None
    try:
        depth = _depth(json.loads(text))
    except RecursionError:  # deeper than the parser goes, so deeper than we allow
        depth = MAX_DEPTH + 1
    except json.JSONDecodeError as exc:
        raise HttpError(400, ErrorCode.INVALID_JSON, f"the request body is not valid JSON: {exc.msg} (line "
                                                     f"{exc.lineno} column {exc.colno})") from None
    if depth > MAX_DEPTH:
        raise HttpError(400, ErrorCode.TOO_DEEP, f"the request body nests arrays and objects more than "
                                                 f"{MAX_DEPTH} deep")


def check_encoding(headers: Headers) -> None:
    """Raises HttpError 415 when the body has a Content-Encoding other than ``identity``."""
    codings = [c.strip().lower() for c in headers.get("content-encoding", "").split(",") if c.strip()]
    if any(c != "identity" for c in codings):
        raise HttpError(415, ErrorCode.UNSUPPORTED_ENCODING,
                        f"Content-Encoding {', '.join(codings)} is not supported: send the body as is",
                        headers={"Accept-Encoding": "identity"})


class _Disconnected(Exception):
    """The client went away while its body was read."""


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that hands ``body`` over once, then whatever the connection says (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class JsonBodyGate:
    """Pure ASGI middleware: ``check_credentials`` runs before a body is read; the answers are
    ``envelope``'s; paths under ``exempt`` belong to a mounted app that has its own gate. Add it
    inside the body limit (so reading here counts against the limit)."""

    def __init__(self, app: ASGIApp, envelope: ErrorEnvelope, check_credentials: CredentialsCheck | None = None,
                 exempt: tuple[str, ...] = ()) -> None:
        self.app, self.envelope, self.check_credentials, self.exempt = app, envelope, check_credentials, exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = scope.get("app")  # the app whose middleware this is (Starlette sets it)
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS or is_under(scope, self.exempt) \
                or app is None or not has_route(app.router.routes, scope):
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        try:
            if self.check_credentials is not None:
                self.check_credentials(headers.get("authorization"))
            check_encoding(headers)
            if is_json(headers.get("content-type")):
                body = await _read_body(receive)
                check_json(body)
                receive = _replaying(body, receive)
        except HttpError as exc:
            return await self.envelope.answer(exc, headers.get("authorization"))(scope, receive, send)
        except HTTPException as exc:
            if exc.status_code != 413:
                raise
            return await self.envelope.too_large(str(exc.detail))(scope, receive, send)  # the body limit
        except _Disconnected:
            return None
        await self.app(scope, receive, send)
