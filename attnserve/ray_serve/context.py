"""The servicer context of an RPC that came through Ray Serve's gRPC proxy.

TextGenerationServicer, the health servicer and the server's error boundary take a
grpc.aio.ServicerContext; in a replica they get this, over the RayServegRPCContext that Ray
passes along (None when a DeploymentHandle calls). What differs from a direct server:

- time_remaining() is None: Ray's proxy does not pass the client's deadline on. A call whose
  deadline passes is cancelled at the proxy, and Ray cancels the replica's task, which frees the
  request's batch slot as a direct server does.
- Ray sends a replica's metadata only as trailers, so send_initial_metadata (x-request-id) adds
  to the trailers. Every call's trailers also name the replica that served it (attnserve-replica).
- abort() sets the status on Ray's context and raises; Ray's proxy answers with that code and
  message, as a direct server does.

Knows nothing of the engine; imports no ray (the context is duck-typed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

import grpc

REPLICA_HEADER = "attnserve-replica"


class ReplicaAbort(grpc.aio.AbortError):
    """abort() was called: the status is on the context, for Ray's proxy to send (the boundary
    treats it as grpc's own AbortError: the call already has its status)."""


class RayContext:
    """The part of grpc.aio.ServicerContext that attnserve's servicers use, over Ray's context."""

    def __init__(self, ray_context: Any | None, replica: str):
        self.ray = ray_context
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self.trailers: list[tuple[str, str]] = [(REPLICA_HEADER, replica)]
        self._send_trailers()

    def time_remaining(self) -> float | None:
        return None  # Ray's proxy keeps the client's deadline to itself

    async def send_initial_metadata(self, metadata: Sequence[tuple[str, str]]) -> None:
        self.trailers += metadata
        self._send_trailers()

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> NoReturn:
        self.set_code(code)
        self.set_details(details)
        raise ReplicaAbort(details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code
        if self.ray is not None:
            self.ray.set_code(code)

    def set_details(self, details: str) -> None:
        self._details = details
        if self.ray is not None:
            self.ray.set_details(details)

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details

    def invocation_metadata(self) -> Sequence[tuple[str, str]]:
        return self.ray.invocation_metadata() if self.ray is not None else ()

    def peer(self) -> str:
        return self.ray.peer() if self.ray is not None else ""

    def _send_trailers(self) -> None:
        if self.ray is not None:
            self.ray.set_trailing_metadata(list(self.trailers))
