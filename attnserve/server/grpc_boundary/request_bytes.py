"""Request bytes that do not parse: INVALID_ARGUMENT naming the message, not gRPC's UNKNOWN.

grpc.aio answers a request deserializer that raises with UNKNOWN and never runs the handler, so
no interceptor sees the call. DecodeInterceptor gives every method (attnserve.v1, the inference
protocol, health, reflection) a deserializer that returns an Undecodable marker instead, and
raises domain.Undecodable where the handler would have received it: for a request stream, at
the message that did not parse. It is the innermost interceptor, so the boundary maps and
counts the error like any other and the token is checked first. Knows nothing of the services.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from ...engine.domain import Undecodable
from .handlers import stream_of, wrap_handler


class UndecodableBytes:
    """What the tolerant deserializer returns for bytes that do not parse."""

    def __init__(self, type_name: str, reason: str):
        self.error = Undecodable(f"the request is not a valid {type_name} ({reason})")


def tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """`deserializer`, returning UndecodableBytes where it would raise."""
    if deserializer is None:
        return None
    message_type = getattr(deserializer, "__self__", None)  # FromString of a generated message class
    descriptor = getattr(message_type, "DESCRIPTOR", None)
    type_name = descriptor.full_name if descriptor is not None else "request"

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as error:  # noqa: BLE001 -- protobuf's DecodeError, or a non-protobuf codec's own
            return UndecodableBytes(type_name, f"{len(data)} bytes that do not parse: {error}")

    return deserialize


def checked(request: Any) -> Any:
    """The request itself; raises Undecodable for one that did not parse."""
    if isinstance(request, UndecodableBytes):
        raise request.error
    return request


async def checked_stream(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """The request stream, raising Undecodable at the first message that did not parse."""
    async for request in requests:
        yield checked(request)


class DecodeInterceptor(grpc.aio.ServerInterceptor):
    """Every method gets a tolerant deserializer and raises Undecodable for bytes that do not parse."""

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return handler
        streaming_requests = handler.request_streaming

        def request_of(request: Any) -> Any:
            return checked_stream(request) if streaming_requests else checked(request)

        async def unary(behavior, request, context):
            return await behavior(request_of(request), context)

        async def stream(behavior, request, context):
            async for response in stream_of(behavior, request_of(request), context):
                yield response

        return wrap_handler(handler, unary, stream, tolerant(handler.request_deserializer))
