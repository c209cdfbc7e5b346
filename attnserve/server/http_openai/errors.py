"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the HTTP status
OpenAI uses for each domain error (400 bad input, 401 without the bearer token, 404 an unknown model,
413 a body over --http-max-body-bytes, 429 a full queue, 503 while starting or draining)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from ...engine.domain import (
    Draining,
    EngineUnavailable,
    InvalidRequest,
    QueueFull,
    ServeError,
    Unauthenticated,
    UnknownModel,
)


class BodyTooLarge(InvalidRequest):
    """The request body is larger than --http-max-body-bytes: 413, and its connection closed, so that the
    rest of the body is never read."""


# ServeError -> (HTTP status, OpenAI's error type, code)
ERRORS: dict[type[ServeError], tuple[int, str, str | None]] = {
    InvalidRequest: (400, "invalid_request_error", None),
    BodyTooLarge: (413, "invalid_request_error", "request_too_large"),
    Unauthenticated: (401, "invalid_request_error", "invalid_api_key"),
    UnknownModel: (404, "invalid_request_error", "model_not_found"),
    QueueFull: (429, "rate_limit_error", "queue_full"),
    Draining: (503, "service_unavailable", "draining"),
    EngineUnavailable: (503, "service_unavailable", "engine_unavailable"),
}


def error_body(error: ServeError) -> tuple[int, dict[str, Any]]:
    status, kind, code = ERRORS.get(type(error), (500, "server_error", None))
    param = error.field if isinstance(error, InvalidRequest) else ("model" if isinstance(error, UnknownModel) else None)
    return status, {"error": {"message": str(error), "type": kind, "param": param, "code": code}}


def error_response(error: ServeError) -> JSONResponse:
    status, body = error_body(error)
    closing = {"connection": "close"} if isinstance(error, BodyTooLarge) else None  # uvicorn then closes it
    return JSONResponse(body, status, headers=closing)
