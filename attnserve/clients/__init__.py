"""Python clients of an attnserve server: `Client` (blocking) and `AsyncClient` (asyncio).

A client host needs only grpcio, grpcio-health-checking and the generated protos: nothing here
imports numpy, torch or the server.

client.py (`Client`) and aio.py (`AsyncClient`, its asyncio twin) over channel.py (targets, balancing,
TLS and the token, one ChannelConfig for both) and retry.py (the one retry rule, handed to gRPC);
types.py (plain results, and their conversions to and from the protocol's messages) and errors.py (a
typed exception for every status code). The commands: generate_cli.py (`attnserve generate`) and bench.py
(`attnserve bench`: its flags and outputs in bench_cli.py, the kinds of request it sends and the
production mix in bench_mix.py, its prompts in bench_prompts.py, its statistics, table and plot in
bench_report.py; bench_openai.py drives an OpenAI-compatible server instead, over http_events.py's
server-sent events on asyncio's streams), sharing cli_common.py's flags and errors.
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
