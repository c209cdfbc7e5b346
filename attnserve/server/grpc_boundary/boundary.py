"""The gRPC boundary: errors become status codes here, once; calls counted; draining.

BoundaryInterceptor wraps every method: domain errors (ServeError subclasses) map to their
status codes, anything unexpected becomes INTERNAL with a request id (the detail is logged,
never sent), and every call is counted by status (a write that fails because its client hung up
counts CANCELLED); calls of attnserve.v1 and the inference protocol are also counted in flight,
and new ones get UNAVAILABLE while the server starts or drains; the responses of streaming calls
are written through a WriteWatch (--write-timeout).
The status of each error is statuses.py's; auth.py checks the bearer token.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from contextlib import aclosing

import grpc
from grpc._cython.cygrpc import ExecuteBatchError  # what grpc.aio's own server takes for a call its client closed

from ...engine.domain import Draining, ServeError
from ...tracing.current import NO_TRACE, Trace, Traces, opened
from .handlers import stream_of, wrap_handler
from .slow_readers import WriteWatch
from .statuses import ERROR_CODES

log = logging.getLogger(__name__)

# The services whose calls are counted, mapped and refused while starting or draining: attnserve.v1
# and the Open Inference Protocol. The protocol's own health calls always answer (ready: false then).
SERVICE_PREFIXES = ("/attnserve.v1.", "/inference.GRPCInferenceService/")
GENERATE = "text_completion"  # the GenAI semantic conventions' operation of both gRPC doors' calls
ALWAYS_ANSWERED = frozenset({"ServerLive", "ServerReady", "ModelReady"})


class BoundaryInterceptor(grpc.aio.ServerInterceptor):
    """Maps errors to status codes and counts calls by status, on every method; on attnserve.v1 and
    the inference protocol, also tracks calls in flight and refuses new ones while the server starts
    or drains (`refusal`)."""

    def __init__(
        self,
        count: Callable[[str, str], None] | None = None,
        in_flight: Callable[[int], None] | None = None,
        writes: WriteWatch | None = None,
    ):
        """`in_flight(+1 or -1)` as a served call starts and ends; `writes` times streamed writes
        (--write-timeout)."""
        self.count = count or (lambda *_: None)
        self.in_flight = in_flight or (lambda _: None)
        self.writes = writes
        self.refusal: str | None = None  # why new calls get UNAVAILABLE now (starting, draining); None: serving
        self.traces: Traces | None = None  # tracing on: each served call's span (--otlp-traces-endpoint)

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return handler
        path = details.method
        method = path.rsplit("/", 1)[-1]
        served = path.startswith(SERVICE_PREFIXES)
        writes = self.writes

        async def unary(behavior, request, context):
            async with _Boundary(self, method, served, request, context, unary=True, path=path) as call:
                return await call.admit(behavior)(request, context)

        async def stream(behavior, request, context):
            async with _Boundary(self, method, served, request, context, path=path) as call:
                async for response in stream_of(call.admit(behavior), request, context):
                    yield response

        async def stream_written(behavior, request, context):
            assert writes is not None
            async with (
                _Boundary(self, method, served, request, context, path=path) as call,
                aclosing(stream_of(call.admit(behavior), request, context)) as responses,
            ):
                async for response in responses:
                    await writes.write(context, response)

        return wrap_handler(handler, unary, stream_written if writes else stream, stream_writes=writes is not None)

    def boundary(self, method: str, request, context) -> _Boundary:
        """The boundary of one call of attnserve.v1 or the protocol, for callers outside gRPC (Ray Serve)."""
        return _Boundary(self, method, True, request, context, aborts=True)


class _Boundary:
    """One call's error mapping and accounting (an async context manager).

    A mapped error ends a gRPC stream with its status set on the context and the error swallowed,
    not with context.abort(), whose kept exception held each refused call and its HTTP/2 stream in
    a reference cycle, counted against --max-concurrent-streams, until the cycle collector ran
    (docs/design/decisions/status-not-abort.md). A `unary` call ends with abort() all the same, its
    exception swallowed and its traceback dropped (no cycle): grpc.aio sends a unary call whose
    status was set with an empty message before the status, and a call that got a message is
    committed, so no gRPC client would retry its UNAVAILABLE; abort() sends the status alone
    (Trailers-Only). With `aborts` (callers outside gRPC, Ray Serve), the error is raised as abort()."""

    def __init__(
        self,
        owner: BoundaryInterceptor,
        method: str,
        served: bool,
        request,
        context,
        aborts: bool = False,
        unary: bool = False,
        path: str = "",
    ):
        """`path`: the call's /package.Service/Method, its span's name (without it, the method's)."""
        self.owner, self.method, self.served, self.request, self.context = owner, method, served, request, context
        self.aborts, self.unary = aborts, unary
        # Why this call is refused (the server starts or drains), taken once as it arrives; None: served
        self.refusal = owner.refusal if served and method not in ALWAYS_ANSWERED else None
        self.tracked = served and self.refusal is None  # counted in flight
        self.trace: Trace = NO_TRACE
        if owner.traces is not None and served:
            self.trace = opened(owner.traces, path.lstrip("/") or method, call_metadata(context), rpc_attributes(path))

    def admit(self, behavior: Callable) -> Callable:
        """The call's behavior, or, while it is refused, one that raises Draining: the refusal then
        ends the call like any mapped error (set on the context, never context.abort())."""
        if self.refusal is None:
            return behavior
        refusal = self.refusal

        async def refuse(*_):  # a behavior's (request, context)
            raise Draining(refusal)

        return refuse

    async def __aenter__(self):
        if self.tracked:
            self.owner.in_flight(+1)
        return self

    async def __aexit__(self, kind, error, traceback) -> bool:
        if self.tracked:
            self.owner.in_flight(-1)
        code, message = self.classify(error)
        self.owner.count(self.method, code.name)
        self.trace.end(code.name, message, {"rpc.grpc.status_code": code.value[0]})
        if message is None:
            return False
        if self.aborts:
            await self.context.abort(code, message)
        if self.unary:
            await self.end_with_status_alone(code, message)
            return True
        self.context.set_code(code)
        self.context.set_details(message)
        return True

    async def end_with_status_alone(self, code: grpc.StatusCode, message: str) -> None:
        """abort(): the status goes out now, alone; its AbortError stops here, holding no frame."""
        try:
            await self.context.abort(code, message)
        except grpc.aio.AbortError as aborted:
            aborted.__traceback__ = aborted.__context__ = None

    def classify(self, error: BaseException | None) -> tuple[grpc.StatusCode, str | None]:
        """The call's status, and the message to abort with (None: the call already has its status)."""
        if error is None:
            return grpc.StatusCode.OK, None
        if isinstance(error, (asyncio.CancelledError, GeneratorExit, ExecuteBatchError)):
            # ExecuteBatchError: a write (context.write, under --write-timeout) failed because the call
            # ended under it (the client cancelled or hung up) before grpc.aio cancelled the call's task
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


def call_metadata(context) -> dict[str, str]:
    """The call's metadata (W3C traceparent and tracestate among it), as text."""
    metadata = getattr(context, "invocation_metadata", lambda: None)() or ()
    return {key: value for key, value in metadata if isinstance(value, str)}


def rpc_attributes(path: str) -> dict[str, str]:
    """The RPC semantic conventions' attributes of a call to /package.Service/Method."""
    service, _, method = path.lstrip("/").rpartition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method, "gen_ai.operation.name": GENERATE}
