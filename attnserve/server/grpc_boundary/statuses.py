"""The gRPC status of each domain error, for every gRPC door (attnserve.v1, the Open Inference Protocol)."""

from __future__ import annotations

import grpc

from ...engine.domain import (
    DeadlineExceeded,
    Draining,
    EngineUnavailable,
    InvalidRequest,
    QueueFull,
    ServeError,
    SlowReader,
    Unauthenticated,
    Undecodable,
    UnknownModel,
)

ERROR_CODES: dict[type[ServeError], grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    Undecodable: grpc.StatusCode.INVALID_ARGUMENT,
    QueueFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Draining: grpc.StatusCode.UNAVAILABLE,
    EngineUnavailable: grpc.StatusCode.UNAVAILABLE,
    DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    UnknownModel: grpc.StatusCode.NOT_FOUND,
    SlowReader: grpc.StatusCode.CANCELLED,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
}
