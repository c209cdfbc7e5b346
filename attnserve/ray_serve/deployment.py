"""The Ray Serve replica: one attnserve engine, the attnserve.v1 and grpc.health.v1 RPCs as methods.

Ray's gRPC proxy calls a replica's method named like the RPC, with the request message and a
RayServegRPCContext. Each replica is a Server built and started as `attnserve serve` builds and
starts it (model directory checked, ONNX Runtime session, tokenizer, KV arena, engine, one warm-up
generation: Server.start), except that it binds no port; its RPCs go through the server's own
TextGenerationServicer inside the server's own error boundary, so validation, limits, error codes,
the stream interval and streaming are those of a direct server. Ray starts routing to a replica
once its constructor (the warm-up included) has returned, and calls check_health() every
--health-check-period seconds.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any, TypeVar, cast

import grpc
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from ..engine.domain import QueueFull
from ..engine.engine import EngineObserver, ForwardingObserver
from ..health.v1 import health_pb2
from ..server.app import SERVICE, Server
from ..server.config import ServerConfig
from ..v1 import generation_pb2 as pb
from .context import RayContext

log = logging.getLogger("ray.serve")  # the logger Ray writes to each replica's log file

HEALTH_SERVICES = ("", SERVICE)  # grpc.health.v1 names a replica answers for
STALL_S = 30.0  # a busy engine that has not stepped for this long is unhealthy
T = TypeVar("T")


def generator(stream: AsyncIterator[T]) -> AsyncGenerator[T, None]:
    """A servicer's streaming method, typed as what it is (an async generator, with aclose)."""
    return cast(AsyncGenerator[T, None], stream)


class StepClock(ForwardingObserver):
    """Forwards the engine's reports to the server's metrics and notes when it last stepped."""

    def __init__(self, inner: EngineObserver):
        super().__init__(inner)
        self.last_step = time.monotonic()

    def on_step(self, batch_size: int, queue_depth: int) -> None:
        self.last_step = time.monotonic()
        self.inner.on_step(batch_size, queue_depth)


class TextGeneration:
    """One replica: a warmed-up engine behind attnserve.v1.TextGeneration and grpc.health.v1."""

    async def __init__(self, config: ServerConfig):  # type: ignore[misc]  # Ray awaits it
        """Load and warm up; an error fails the replica's start, which Ray reports and retries."""
        self.server = server = Server(config, observers=[StepClock])
        assert isinstance(server.observer, StepClock), "the outermost observer is the last one given"
        self.clock = server.observer
        self.servicer = server.servicers.v1
        self.door = server.front_door()
        self.replica = serve.get_replica_context().replica_id.unique_id
        await server.start(listen=False, health_services=HEALTH_SERVICES)  # Ray's proxies are the doors
        log.info("replica %s serving %s, %d slots", self.replica, server.info.model_name, server.max_batch)

    def context(self, grpc_context: Any) -> grpc.aio.ServicerContext:
        # RayContext has the methods the servicers call; the cast is for the type checker only.
        return cast(grpc.aio.ServicerContext, RayContext(grpc_context, self.replica))

    async def unary(self, method: str, behavior: Callable, request: Any, grpc_context: Any) -> Any:
        """A unary RPC of the servicer inside the server's error boundary, as on a direct server."""
        context = self.context(grpc_context)
        async with self.server.boundary.boundary(method, request, context):
            return await behavior(request, context)
        raise AssertionError("unreachable: the boundary re-raises what it does not map")  # for mypy

    async def Generate(self, request: pb.GenerateRequest, grpc_context: Any = None) -> pb.GenerateResponse:
        """attnserve.v1.TextGeneration/Generate."""
        return await self.unary("Generate", self.servicer.Generate, request, grpc_context)

    async def GenerateStream(
        self, request: pb.GenerateRequest, grpc_context: Any = None
    ) -> AsyncIterator[pb.GenerateStreamResponse]:
        """attnserve.v1.TextGeneration/GenerateStream: each message is one of the servicer's."""
        context = self.context(grpc_context)
        boundary = self.server.boundary.boundary("GenerateStream", request, context)
        async with boundary, aclosing(generator(self.servicer.GenerateStream(request, context))) as stream:
            async for response in stream:
                yield response

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, grpc_context: Any = None) -> pb.ModelInfo:
        """attnserve.v1.TextGeneration/GetModelInfo (its trailers name the replica, like every call's)."""
        return await self.unary("GetModelInfo", self.servicer.GetModelInfo, request, grpc_context)

    async def Check(
        self, request: health_pb2.HealthCheckRequest, grpc_context: Any = None
    ) -> health_pb2.HealthCheckResponse:
        """grpc.health.v1.Health/Check, answered by the replica Ray routed it to."""
        return await self.server.health.Check(request, self.context(grpc_context))

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, grpc_context: Any = None
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        """grpc.health.v1.Health/Watch; it holds one of the replica's ongoing requests while open."""
        async with aclosing(generator(self.server.health.Watch(request, self.context(grpc_context)))) as updates:
            async for update in updates:
                yield update

    async def __call__(self, request: Request) -> Response:
        """Ray's HTTP proxy (ray-serve --http-port, under /APP-NAME): the OpenAI-compatible routes, as
        `attnserve serve --http-port` answers them."""
        return await self.door.dispatch(request)

    async def check_health(self) -> None:
        """Ray's health check: an idle engine runs a short generation, a busy one must be stepping."""
        stats = self.server.engine.stats()
        if stats["active"] or stats["queued"]:
            stalled = time.monotonic() - self.clock.last_step
            if stalled > STALL_S:
                raise RuntimeError(f"the engine has not stepped for {stalled:.0f} s with {stats} requests")
            return
        with contextlib.suppress(QueueFull):  # requests arrived meanwhile and fill the queue: it takes them
            await self.server.warm_up()

    async def __del__(self) -> None:
        """Ray calls this once the replica's ongoing requests finished or --drain-timeout passed."""
        server = getattr(self, "server", None)  # None: the constructor failed
        if server is not None:
            await server.health.enter_graceful_shutdown()
            server.serving = False
            server.close()
