"""Bearer-token auth on every gRPC call but grpc.health.v1's, so that load balancers probe without it."""

from __future__ import annotations

import grpc

from ...engine.domain import Unauthenticated
from ..bearer import bearer_matches
from .handlers import stream_of, wrap_handler

HEALTH_PREFIX = "/grpc.health.v1.Health/"


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Every call but health must carry `authorization: Bearer <token>`."""

    def __init__(self, token: str):
        self.token = token

    def authorized(self, context: grpc.aio.ServicerContext) -> bool:
        return bearer_matches(dict(context.invocation_metadata() or ()).get("authorization", ""), self.token)

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
            raise Unauthenticated("missing or invalid bearer token (metadata 'authorization: Bearer <token>')")
