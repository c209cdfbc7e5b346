"""A gRPC method handler with its behavior wrapped: what each interceptor of the boundary builds on."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import grpc


def wrap_handler(
    handler: grpc.RpcMethodHandler,
    around_unary: Callable,
    around_stream: Callable,
    deserializer: Callable[[bytes], Any] | None = None,
    stream_writes: bool = False,
):
    """The same handler with its behavior passed through `around_*(behavior, request, context)`
    (and its request deserializer replaced, if one is given). With `stream_writes`, around_stream
    is a coroutine that writes the responses itself (context.write) instead of yielding them."""
    unary = unary_behavior(around_unary)
    stream = unary_behavior(around_stream) if stream_writes else stream_behavior(around_stream)
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
                request_deserializer=deserializer or handler.request_deserializer,
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
        async with aclosing(result):  # closed as soon as the caller stops: a request's slot is freed then
            async for response in result:
                yield response
    else:
        await result
