"""Errors as every API of the server answers them: OpenAI's shape, ``{"error": {"message", "type", "code", "param"}}``.

Invariants: every error response, whichever API or layer it comes from (a route, the body gate,
request validation, an unknown route, the body limit), has this shape, a 4xx/5xx status and a code
(chunkstore.http.errors' for the faults the management API shares); engine errors map to one
status each (queue full 429 with ``Retry-After``, prompt too long 400, shutting down 503); only our
own messages reach a client: an unexpected exception (a bug, a torch error) is logged with its
traceback and answered with a generic 500; the OpenAPI spec documents these answers (400, never
FastAPI's 422) with their schema, always as JSON; nothing here depends on a route. The handlers are
chunkstore.http's, with this envelope (``ENVELOPE``).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from chunkstore.engine.request import EngineClosedError, InvalidPromptError, PromptTooLongError, QueueFullError
from chunkstore.http.errors import ErrorCode, ErrorEnvelope, HttpError, code_of, error_field, main_error
from chunkstore.http.errors import install_error_handlers as install_shared_handlers

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1  # what a 429 tells the client to wait

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
          415: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable_error"}


def error_body(message: str, *, status: int, code: str | None = None, param: str | None = None) -> dict:
    """The JSON of an error: OpenAI's shape, with ``type`` derived from the status."""
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "code": code,
                      "param": param}}


class ApiError(HttpError):
    """An error answered to the client as ``status`` with ``error_body`` (``code`` None: the
    status's own, chunkstore.http.errors.code_of)."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(status, code, message, param=param, headers=headers)

    @property
    def body(self) -> dict:
        return error_body(self.message, status=self.status, code=self.code or code_of(self.status, None),
                          param=self.param)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body, status_code=self.status, headers=self.headers)

    @classmethod
    def bad_request(cls, message: str, *, param: str | None = None,
                    code: str = ErrorCode.INVALID_REQUEST) -> "ApiError":
        return cls(400, message, code=code, param=param)

    @classmethod
    def from_engine(cls, exc: BaseException, *, is_submit: bool) -> "ApiError":
        """The answer to an error the engine raised for a request: at ``submit`` (the request's
        fault, or a full queue) or as its result (the server's fault, or a shutdown)."""
        if isinstance(exc, ApiError):
            return exc
        if isinstance(exc, EngineClosedError):
            return cls(503, "the server is shutting down; retry later", code="shutting_down")
        if is_submit and isinstance(exc, QueueFullError):
            return cls.queue_full(str(exc))
        if is_submit and isinstance(exc, PromptTooLongError):
            return cls(400, str(exc), code="context_length_exceeded", param="prompt")
        if is_submit and isinstance(exc, InvalidPromptError):  # the engine's checks: empty prompt, ids out of range
            return cls.bad_request(str(exc), param="prompt")
        # Anything else is a bug or a failure inside (torch, the cache): its text is for the log only.
        log.error("request failed", exc_info=exc)
        return cls(500, "generation failed: internal error (see the server's log)", code=ErrorCode.INTERNAL_ERROR)

    @classmethod
    def queue_full(cls, message: str) -> "ApiError":
        return cls(429, message, code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: str = Field(description="what went wrong, for programs (docs/SERVER.md lists the codes)")
    param: str | None = Field(description="the field or header at fault, when one is")


class ErrorResponse(BaseModel):
    """Every error's body (OpenAI's shape)."""

    error: ErrorDetail


_WHEN = {400: "invalid request (the message says why; `param` names the field)",
         401: "missing or invalid API key (when keys are configured)",
         404: "unknown model or path", 405: "method not allowed", 413: "request body too large",
         415: "the body has a Content-Encoding (send it as is)",
         429: "the request queue is full (see Retry-After)", 503: "the server is shutting down"}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries for these error statuses, with the error schema."""
    return {status: {"model": ErrorResponse, "description": _WHEN[status]} for status in statuses}


def _validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None, str]:
    """(message, param, code) for pydantic's errors: the main one (``main_error``) names the field."""
    first = main_error(errors)
    param = error_field(first.get("loc", ()))
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if param is None and first.get("type") in ("missing", "model_attributes_type", "dict_type"):
        return ("the request body must be a JSON object (send it with Content-Type: application/json)",
                None, ErrorCode.INVALID_REQUEST)
    extra = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return (f"{param}: {msg}" if param else msg) + extra, param, ErrorCode.INVALID_REQUEST


def _body(status: int, code: str, message: str, param: str | None) -> dict:
    return error_body(message, status=status, code=code, param=param)


ENVELOPE = ErrorEnvelope(_body, validation_status=400, validation_message=_validation_message, model=ErrorResponse)


def install_error_handlers(app: FastAPI) -> None:
    """Make every error ``app`` answers OpenAI-shaped, and its OpenAPI spec say so (400, never 422)."""
    install_shared_handlers(app, ENVELOPE, {})
