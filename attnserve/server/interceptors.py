"""The gRPC boundary: errors become status codes here, once; bearer-token auth; draining.

BoundaryInterceptor wraps the attnserve service: domain errors (ServeError subclasses) map to
their status codes, anything unexpected becomes INTERNAL with a request id (the detail is
logged, never sent), every call is counted by status, and new calls get UNAVAILABLE while the
server drains. AuthInterceptor checks `authorization: Bearer <token>` in constant time on every
service except grpc.health.v1, so load balancers can probe without the token.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import uuid
from collections.abc import Callable

import grpc

from .domain import DeadlineExceeded, Draining, InvalidRequest, QueueFull, ServeError, UnknownModel

log = logging.getLogger("attnserve.server")

# The services whose calls are counted, mapped and refused while draining: attnserve.v1 and the
# Open Inference Protocol. The protocol's own health calls still answer while draining (ready: false).
SERVICE_PREFIXES = ("/attnserve.v1.", "/inference.GRPCInferenceService/")
ANSWER_WHILE_DRAINING = frozenset({"ServerLive", "ServerReady", "ModelReady"})
HEALTH_PREFIX = "/grpc.health.v1.Health/"
ERROR_CODES: dict[type[ServeError], grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    QueueFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Draining: grpc.StatusCode.UNAVAILABLE,
    DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    UnknownModel: grpc.StatusCode.NOT_FOUND,
}


def wrap_handler(handler: grpc.RpcMethodHandler, around_unary: Callable, around_stream: Callable):
    """The same handler with its behavior passed through `around_*(behavior, request, context)`."""
    unary, stream = unary_behavior(around_unary), stream_behavior(around_stream)
    kinds = [
        ("unary_unary", grpc.unary_unary_rpc_method_handler, unary),
        ("unary_stream", grpc.unary_stream_rpc_method_handler, stream),
        ("stream_unary", grpc.stream_unary_rpc_method_handler, unary),
        ("stream_stream", grpc.stream_stream_rpc_method_handler, stream),
    ]
    for attribute, make, wrap in kinds:
        behavior = getattr(handler, attribute)
        if behavior is not None:
            return make(
                wrap(behavior),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


def unary_behavior(around: Callable) -> Callable[[Callable], Callable]:
    """Wraps a behavior that returns one response: `around(behavior, request, context)` awaited."""

    def wrap(behavior: Callable) -> Callable:
        async def wrapped(request, context):
            return await around(behavior, request, context)

        return wrapped

    return wrap


def stream_behavior(around: Callable) -> Callable[[Callable], Callable]:
    """Wraps a behavior that streams responses: each one `around(behavior, request, context)` yields."""

    def wrap(behavior: Callable) -> Callable:
        async def wrapped(request, context):
            async for response in around(behavior, request, context):
                yield response

        return wrapped

    return wrap


async def stream_of(behavior, request, context):
    """Responses of a server-streaming behavior, whether it yields or writes with context.write."""
    result = behavior(request, context)
    if hasattr(result, "__aiter__"):
        async for response in result:
            yield response
    else:
        await result


class BoundaryInterceptor(grpc.aio.ServerInterceptor):
    """Maps errors to status codes, counts calls by status, refuses new calls while draining."""

    def __init__(self, count: Callable[[str, str], None] | None = None):
        self.count = count or (lambda method, code: None)
        self.draining = False

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or not details.method.startswith(SERVICE_PREFIXES):
            return handler
        method = details.method.rsplit("/", 1)[-1]

        async def unary(behavior, request, context):
            async with self.boundary(method, request, context):
                return await behavior(request, context)

        async def stream(behavior, request, context):
            async with self.boundary(method, request, context):
                async for response in stream_of(behavior, request, context):
                    yield response

        return wrap_handler(handler, unary, stream)

    def boundary(self, method: str, request, context) -> _Boundary:
        return _Boundary(self, method, request, context)


class _Boundary:
    """One call's error mapping and accounting (an async context manager)."""

    def __init__(self, owner: BoundaryInterceptor, method: str, request, context):
        self.owner, self.method, self.request, self.context = owner, method, request, context

    async def __aenter__(self):
        if self.owner.draining and self.method not in ANSWER_WHILE_DRAINING:
            self.owner.count(self.method, grpc.StatusCode.UNAVAILABLE.name)
            await self.context.abort(
                grpc.StatusCode.UNAVAILABLE, "the server is draining (shutting down); retry on another replica"
            )
        return self

    async def __aexit__(self, kind, error, traceback) -> bool:
        code, message = self.classify(error)
        self.owner.count(self.method, code.name)
        if message is not None:
            await self.context.abort(code, message)
        return False

    def classify(self, error: BaseException | None) -> tuple[grpc.StatusCode, str | None]:
        """The call's status, and the message to abort with (None: the call already has its status)."""
        if error is None:
            return grpc.StatusCode.OK, None
        if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
            remaining = self.context.time_remaining()
            expired = remaining is not None and remaining <= 0
            return (grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED), None
        if isinstance(error, grpc.aio.AbortError):
            return self.context.code() or grpc.StatusCode.UNKNOWN, None
        if isinstance(error, ServeError):
            return ERROR_CODES.get(type(error), grpc.StatusCode.INTERNAL), str(error)
        request_id = getattr(self.request, "request_id", "") or uuid.uuid4().hex
        log.error("internal error in %s, request id %s", self.method, request_id, exc_info=error)
        return grpc.StatusCode.INTERNAL, f"internal error; request id {request_id}"


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Every call but health must carry `authorization: Bearer <token>`."""

    def __init__(self, token: str):
        self.expected = f"Bearer {token}".encode()

    def authorized(self, context: grpc.aio.ServicerContext) -> bool:
        given = dict(context.invocation_metadata() or ()).get("authorization", "")
        return hmac.compare_digest(given.encode() if isinstance(given, str) else given, self.expected)

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or details.method.startswith(HEALTH_PREFIX):
            return handler

        async def unary(behavior, request, context):
            await self.check(context)
            return await behavior(request, context)

        async def stream(behavior, request, context):
            await self.check(context)
            async for response in stream_of(behavior, request, context):
                yield response

        return wrap_handler(handler, unary, stream)

    async def check(self, context) -> None:
        if not self.authorized(context):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "missing or invalid bearer token (metadata 'authorization: Bearer <token>')",
            )
