"""Errors as the management API answers them: ``{"error": {"code", "message", "param"}}`` and a 4xx/5xx status.

Invariants: every error response, from a route, the body gate (400, 401, 415), request validation
(422, naming the field), an unknown route or method, the Host check (400) or the body limit (413),
has this shape and a code (chunkstore.http.errors' for the faults the server shares: the same fault
has the same code on both) and is in the OpenAPI spec (``ERROR_RESPONSES``); a backend error maps to
its own status; an unexpected error is logged with its traceback and answered 500 without details.
The handlers are chunkstore.http's, with this envelope (``ENVELOPE``).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.requests import Request

from chunkstore.api.backend.base import BackendError
from chunkstore.http.errors import ErrorCode, ErrorEnvelope, HttpError, error_field, main_error
from chunkstore.http.errors import install_error_handlers as install_shared_handlers

log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    code: str
    message: str
    param: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


def error_json(status: int, code: str, message: str, param: str | None = None,
               headers: dict[str, str] | None = None) -> JSONResponse:
    return ENVELOPE.response(status, code, message, param, headers)


class AdminError(HttpError):
    """An error answered as ``status`` with ``code`` (None: the status's own,
    chunkstore.http.errors.code_of) and ``message``."""

    def __init__(self, status: int, code: str | None, message: str, *, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(status, code, message, param=param, headers=headers)

    @classmethod
    def unauthorized(cls, message: str) -> "AdminError":
        """A 401; its code says whether the request sent credentials (missing_api_key or invalid_api_key)."""
        return cls(401, None, message, headers={"WWW-Authenticate": "Bearer"})

    @classmethod
    def forbidden(cls, message: str) -> "AdminError":
        return cls(403, ErrorCode.FORBIDDEN, message)

    @classmethod
    def not_found(cls, message: str, param: str | None = None) -> "AdminError":
        return cls(404, ErrorCode.NOT_FOUND, message, param=param)

    @classmethod
    def invalid(cls, message: str, param: str | None = None) -> "AdminError":
        return cls(422, ErrorCode.INVALID_REQUEST, message, param=param)

    @classmethod
    def conflict(cls, message: str, param: str | None = None) -> "AdminError":
        return cls(409, ErrorCode.CONFLICT, message, param=param)


_DESCRIPTIONS = {400: "Host header not allowed, or a body that is not JSON (not UTF-8, nested too deep)",
                 401: "missing or invalid bearer token",
                 403: "the token may not do this (another namespace's data, or admin only)",
                 404: "no such chunk, job or route",
                 405: "the path is a resource without this method (`Allow` names its methods)",
                 409: "conflicts with the current state",
                 413: "request body over the limit", 415: "the body has a Content-Encoding (send it as is)",
                 422: "invalid request (the message names the field)",
                 503: "the backend is unavailable (closed, or rebuilding its index)"}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text} for status, text in _DESCRIPTIONS.items()
}


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """(message, param) for pydantic's errors: the main one (``main_error``) names its field; the
    rest are counted."""
    first = main_error(errors)
    param = error_field(first.get("loc", ()))
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    extra = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return (f"{param}: {msg}" if param else msg) + extra, param


async def _on_backend_error(request: Request, exc: BackendError) -> JSONResponse:
    return error_json(exc.status, exc.code, str(exc))


def _body(status: int, code: str, message: str, param: str | None) -> dict:
    return ErrorBody(error=ErrorDetail(code=code, message=message, param=param)).model_dump()


def _validation(errors: list[dict[str, Any]]) -> tuple[str, str | None, str]:
    message, param = validation_message(errors)
    return message, param, ErrorCode.INVALID_REQUEST


ENVELOPE = ErrorEnvelope(_body, validation_status=422, validation_message=_validation, model=ErrorBody)


def install_error_handlers(app: FastAPI) -> None:
    """Make every error ``app`` answers admin-shaped (chunkstore.http's handlers with ``ENVELOPE``)."""
    install_shared_handlers(app, ENVELOPE, {BackendError: _on_backend_error})
