"""grpc.health.v1 for the server: Check and Watch over a status per service name.

Our own, on our generated code for the protocol (attnserve/health), so that a serving
host does not need grpcio-health-checking, whose generated code works on one protobuf major
version only. It behaves as that package's asyncio servicer does: Check answers NOT_FOUND for a
service never set; Watch sends the current status (SERVICE_UNKNOWN for an unknown service) and
then every change; after enter_graceful_shutdown every service is NOT_SERVING for good. Runs on
the server's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from ..health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
Status = health_pb2.HealthCheckResponse.ServingStatus


class HealthServicer(health_pb2_grpc.HealthServicer):
    """Serving statuses by service name ("" is the server as a whole)."""

    def __init__(self) -> None:
        self.statuses: dict[str, Status] = {}
        self.watchers: dict[str, set[asyncio.Queue[Status]]] = {}
        self.shutting_down = False

    async def set(self, service: str, status: Status) -> None:
        """Record a status and tell the service's watchers; ignored once shutting down."""
        if self.shutting_down:
            return
        self._set(service, status)

    async def enter_graceful_shutdown(self) -> None:
        """Every service NOT_SERVING from now on, whatever set() is called with later."""
        for service in self.statuses:
            self._set(service, NOT_SERVING)
        self.shutting_down = True

    def _set(self, service: str, status: Status) -> None:
        changed = self.statuses.get(service) != status
        self.statuses[service] = status
        if changed:
            for queue in self.watchers.get(service, ()):
                queue.put_nowait(status)

    async def Check(self, request: health_pb2.HealthCheckRequest, context) -> health_pb2.HealthCheckResponse:
        if request.service not in self.statuses:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=self.statuses[request.service])

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        queue: asyncio.Queue[Status] = asyncio.Queue()
        self.watchers.setdefault(request.service, set()).add(queue)
        try:
            yield health_pb2.HealthCheckResponse(status=self.statuses.get(request.service, SERVICE_UNKNOWN))
            while True:
                yield health_pb2.HealthCheckResponse(status=await queue.get())
        finally:
            self.watchers[request.service].discard(queue)
