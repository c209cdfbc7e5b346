"""Python clients of an attnserve server: `Client` (blocking) and `AsyncClient` (asyncio).

A client host needs only grpcio, grpcio-health-checking and the generated protos: nothing here
imports numpy, torch or the server.
"""

from .aio import AsyncClient, AsyncStream
from .channel import DEFAULT_TARGET, TlsConfig
from .client import Client, Stream
from .errors import (
    AttnserveError,
    Cancelled,
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    from_rpc_error,
)
from .retry import NO_RETRY, RetryPolicy
from .types import GenerationParams, GenerationResult, ModelInfo, Prompt, StreamDelta, Timings, Usage

__all__ = [
    "DEFAULT_TARGET",
    "NO_RETRY",
    "AsyncClient",
    "AsyncStream",
    "AttnserveError",
    "Cancelled",
    "Client",
    "DeadlineExceeded",
    "GenerationParams",
    "GenerationResult",
    "Internal",
    "InvalidArgument",
    "ModelInfo",
    "PermissionDenied",
    "Prompt",
    "ResourceExhausted",
    "RetryPolicy",
    "Stream",
    "StreamDelta",
    "Timings",
    "TlsConfig",
    "Unauthenticated",
    "Unavailable",
    "Usage",
    "from_rpc_error",
]
