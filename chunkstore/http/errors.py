"""One error class and its handlers for an app, parameterised by its error envelope (the one thing the apps differ in).

Invariants: every error an app answers, whichever layer raises it (a route, the body gate, request
validation, an unknown route or method, the body limit), is built by the app's ``ErrorEnvelope``
and carries a code (``ErrorCode`` for the faults both apps share: the same fault has the same code
on either API); request validation is answered with the envelope's status (the server's 400, the
admin API's 422) naming the field at fault, while a body that is not JSON is 400 on both; a 405 names
every method the path takes in ``Allow``; an unexpected exception is logged with its traceback and
answered 500 without its text. The OpenAPI spec agrees: every error answer is JSON, and when
validation is not 422 the spec drops FastAPI's default 422 answers.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request

from chunkstore.http.routes import allowed_methods

log = logging.getLogger(__name__)


class ErrorCode(StrEnum):
    """The codes of the faults both APIs share (docs/SERVER.md and docs/API.md list them)."""

    INVALID_JSON = "invalid_json"  # the body is not JSON text (a stray byte, a NUL, a cut-off object)
    INVALID_ENCODING = "invalid_encoding"  # the body is not UTF-8
    TOO_DEEP = "too_deep"  # arrays and objects nested deeper than the body gate allows
    UNSUPPORTED_ENCODING = "unsupported_encoding"  # a Content-Encoding (gzip, ...): bodies are sent as is
    INVALID_REQUEST = "invalid_request"  # a field is missing, of the wrong type or out of bounds
    MISSING_API_KEY = "missing_api_key"  # 401: no Authorization header (OpenAI's name; a token on the admin API)
    INVALID_API_KEY = "invalid_api_key"  # 401: a malformed Authorization header, or a key nobody holds
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    CONFLICT = "conflict"
    BODY_TOO_LARGE = "body_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    RATE_LIMITED = "rate_limited"
    INTERNAL_ERROR = "internal_error"
    UNAVAILABLE = "unavailable"


# The code of an HTTP error raised without one (by Starlette, FastAPI, or an HTTPException).
HTTP_CODES: dict[int, str] = {
    400: ErrorCode.INVALID_REQUEST, 403: ErrorCode.FORBIDDEN,
    404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED, 409: ErrorCode.CONFLICT,
    413: ErrorCode.BODY_TOO_LARGE, 415: ErrorCode.UNSUPPORTED_MEDIA_TYPE, 422: ErrorCode.INVALID_REQUEST,
    429: ErrorCode.RATE_LIMITED, 500: ErrorCode.INTERNAL_ERROR, 503: ErrorCode.UNAVAILABLE,
}


def code_of(status: int, authorization: str | None) -> str:
    """The code of an error raised without one: a 401's says whether the request carried an
    Authorization header at all; any other status has one code (``HTTP_CODES``)."""
    if status == 401:
        return ErrorCode.INVALID_API_KEY if authorization and authorization.strip() else ErrorCode.MISSING_API_KEY
    return HTTP_CODES.get(status, ErrorCode.INVALID_REQUEST if status < 500 else ErrorCode.INTERNAL_ERROR)


class HttpError(Exception):
    """An error answered as ``status`` with ``code`` (None: ``code_of`` the status), ``message``
    and ``param`` (the field at fault), in the envelope of the app that answers it."""

    def __init__(self, status: int, code: str | None, message: str, *, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers
        self.code = str(code) if code is not None else None


# (status, code, message, param) -> the JSON body of an error
BodyBuilder = Callable[[int, str, str, "str | None"], dict]
# pydantic's errors -> (message, param, code)
ValidationMessage = Callable[[list[dict[str, Any]]], tuple[str, "str | None", str]]
Handler = Callable[[Request, Exception], Awaitable[JSONResponse]]


@dataclass(frozen=True, slots=True)
class ErrorEnvelope:
    """How one app writes its errors: ``body`` builds the JSON that ``model`` describes."""

    body: BodyBuilder
    validation_status: int
    validation_message: ValidationMessage
    model: type[BaseModel]

    def response(self, status: int, code: str, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(status, str(code), message, param), status_code=status, headers=headers)

    def answer(self, exc: HttpError, authorization: str | None) -> JSONResponse:
        """The response to ``exc``, for a request with this Authorization header (``code_of``)."""
        code = exc.code if exc.code is not None else code_of(exc.status, authorization)
        return self.response(exc.status, code, exc.message, exc.param, exc.headers)

    def too_large(self, message: str) -> JSONResponse:
        """The 413 of BodyLimitMiddleware (the connection closes: the rest of the body is unread)."""
        return self.response(413, ErrorCode.BODY_TOO_LARGE, message, headers={"Connection": "close"})


_REQUEST_PARTS = frozenset({"body", "query", "path", "header"})
_FIELD_NAME = re.compile(r"[a-z_][a-z0-9_]*")  # our fields are snake_case; pydantic's union branches are not
_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "none", "list", "dict"})


def main_error(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The error to name among pydantic's: the one that got deepest into the value (of a union's
    branches, the one the value was meant for: ``[1, -1]`` fails on its item, not on not being text)."""
    return max(errors, key=lambda e: len(e.get("loc", ())), default={"msg": "invalid request", "loc": ()})


def error_field(loc: tuple[Any, ...]) -> str | None:
    """The field an error is about, dotted (``messages.0.role``): ``loc`` without the part of the
    request it came from and without the union branches pydantic names in it (a model's class,
    ``constrained-str``, ``list[int]``); None for the body as a whole."""
    parts = [str(p) for p in loc if isinstance(p, int) or (
        isinstance(p, str) and p not in _REQUEST_PARTS and p not in _TYPE_NAMES and _FIELD_NAME.fullmatch(p))]
    return ".".join(parts) or None


def _first_json_error(errors: list[dict[str, Any]]) -> str | None:
    """The message of a JSON syntax error FastAPI reports as a validation error, else None."""
    first = errors[0] if errors else {}
    if first.get("type") != "json_invalid":
        return None
    detail = (first.get("ctx") or {}).get("error", "")
    return f"the request body is not valid JSON: {detail}".rstrip(": ")


def install_error_handlers(app: FastAPI, envelope: ErrorEnvelope, own: Mapping[type[Exception], Handler]) -> None:
    """Make every error ``app`` answers ``envelope``-shaped; ``own`` handles the app's own error
    classes (registered first, so they win over the generic ones)."""
    for exc_class, handler in own.items():
        app.add_exception_handler(exc_class, handler)

    async def on_error(request: Request, exc: HttpError) -> JSONResponse:
        return envelope.answer(exc, request.headers.get("authorization"))

    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        syntax = _first_json_error(errors)
        if syntax is not None:  # not a request of the wrong shape: not a request at all
            return envelope.response(400, ErrorCode.INVALID_JSON, syntax)
        message, param, code = envelope.validation_message(errors)
        return envelope.response(envelope.validation_status, code, message, param)

    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:  # Starlette names the methods of the first route only
            headers["Allow"] = ", ".join(allowed_methods(request.app.router.routes, request.scope))
        code = code_of(exc.status_code, request.headers.get("authorization"))
        return envelope.response(exc.status_code, code, str(exc.detail), headers=headers or None)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return envelope.response(500, ErrorCode.INTERNAL_ERROR, "internal server error")

    app.add_exception_handler(HttpError, on_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
    amend_openapi(app, lambda spec: errors_in_spec(spec, envelope))


def amend_openapi(app: FastAPI, amend: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Make ``app``'s OpenAPI spec ``amend(spec)``, built once, on first use."""
    build_openapi = app.openapi
    amended: dict[str, Any] | None = None

    def openapi() -> dict[str, Any]:
        nonlocal amended
        if amended is None:
            amended = amend(build_openapi())
            app.openapi_schema = amended
        return amended

    app.openapi = openapi


# What any operation that reads a JSON body may answer before its route runs (chunkstore.http.json_body).
_BODY_ANSWERS = {"400": "the body is not JSON, not UTF-8, nested too deep, or invalid",
                 "413": "the body is larger than the limit",
                 "415": "the body has a Content-Encoding (send it as is)"}


def errors_in_spec(schema: dict[str, Any], envelope: ErrorEnvelope) -> dict[str, Any]:
    """``schema`` (an OpenAPI spec) saying what the handlers do: an error is JSON whatever the
    route's own media type (``envelope.model`` under ``application/json``); an operation with a
    request body documents the body gate's answers; FastAPI's 422 goes when validation is not 422."""
    ref = {"$ref": f"#/components/schemas/{envelope.model.__name__}"}
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if not isinstance(operation, dict):
                continue
            responses = operation.setdefault("responses", {})
            if envelope.validation_status != 422:
                responses.pop("422", None)
            if "requestBody" in operation:
                for status, description in _BODY_ANSWERS.items():
                    responses.setdefault(status, {"description": description})
            for status, response in responses.items():
                if not status.isdigit() or int(status) < 400:
                    continue
                content = response.setdefault("content", {})
                for media_type in [m for m, c in content.items() if c.get("schema") == ref and m != "application/json"]:
                    del content[media_type]
                if not content or status in _BODY_ANSWERS and "application/json" not in content:
                    content["application/json"] = {"schema": dict(ref)}
    if envelope.validation_status != 422:
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
    return schema
