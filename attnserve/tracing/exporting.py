"""The OpenTelemetry SDK, started for one process (the server's front end, or its engine core): a
tracer whose ended spans wait in a bounded queue and go to the collector in batches from a thread
of their own, through the SDK's OTLP exporter (gRPC or HTTP).

A collector that is down or slow never slows a request: ending a span only appends it to the
queue; when the queue is full the span is dropped, and so are the spans of an export that failed
(the exporter retries within its timeout, OTEL_EXPORTER_OTLP_TIMEOUT, 10 s by default). Both are
counted (`dropped`), for the metrics. Imported only when tracing is on.
"""

from __future__ import annotations

import collections
import logging
import os
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import __version__
from .settings import GRPC, TraceSettings, redacted

log = logging.getLogger(__name__)

PROPAGATOR = TraceContextTextMapPropagator()  # W3C traceparent and tracestate
UNSET = Status(StatusCode.UNSET)
SHUTDOWN_WAIT_S = 5.0  # how long a stopping process waits for its last spans to go


def otlp_exporter(settings: TraceSettings) -> SpanExporter:
    """The SDK's OTLP span exporter for the settings' protocol and endpoint."""
    if settings.protocol == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=settings.endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=settings.endpoint)


class BoundedExport(SpanProcessor):
    """Ended spans to `exporter` in batches, from a thread; a full queue drops (and counts) a span."""

    def __init__(self, exporter: SpanExporter, settings: TraceSettings, on_drop: Callable[[int], None] | None = None):
        """`on_drop(n)`: told of each loss, on the thread that saw it."""
        self.exporter, self.settings, self.on_drop = exporter, settings, on_drop or (lambda _: None)
        self.queue: collections.deque[ReadableSpan] = collections.deque()
        self.dropped = 0  # spans lost: the queue was full, or their export failed
        self.exported = 0
        self._counting = threading.Lock()  # drops are seen on the threads that end spans and on this one
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="attnserve-trace-export", daemon=True)
        self._thread.start()

    def on_end(self, span: ReadableSpan) -> None:
        """On the thread that ended the span: an append, or a drop."""
        if len(self.queue) >= self.settings.queue_spans:
            self._drop(1)
            return
        self.queue.append(span)
        if len(self.queue) >= self.settings.batch_spans:
            self._wake.set()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self.settings.export_every_s)
            self._wake.clear()
            self._export_waiting()
        self._export_waiting()

    def _export_waiting(self) -> None:
        while self.queue:
            batch = [self.queue.popleft() for _ in range(min(len(self.queue), self.settings.batch_spans))]
            try:
                result = self.exporter.export(batch)
            except Exception:  # an exporter's bug must not end the thread
                log.exception("exporting %d spans failed", len(batch))
                result = SpanExportResult.FAILURE
            if result == SpanExportResult.SUCCESS:
                self.exported += len(batch)
            else:
                self._drop(len(batch))

    def _drop(self, count: int) -> None:
        with self._counting:
            self.dropped += count
        self.on_drop(count)

    def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(SHUTDOWN_WAIT_S)
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:  # noqa: ARG002
        self._wake.set()
        return True


class Tracing:
    """Tracing on, in one process: `write` hands a finished span to `export`, which counts what it sent
    and dropped; `sampled` is the OTEL_TRACES_SAMPLER's decision (parent-based, always on, by default)."""

    def __init__(self, settings: TraceSettings, role: str, on_drop: Callable[[int], None] | None = None):
        """`role`: which of the server's processes this is (front_end, engine_core), a resource attribute;
        `on_drop(n)`: told of spans lost (BoundedExport)."""
        self.settings = settings
        resource = Resource.create({"service.name": "attnserve", "service.version": __version__})
        resource = resource.merge(Resource({"attnserve.process": role, "process.pid": os.getpid()}))
        if "OTEL_SERVICE_NAME" in os.environ:  # the standard variable names the service, over ours
            resource = resource.merge(Resource({"service.name": os.environ["OTEL_SERVICE_NAME"]}))
        self.resource = resource
        self.sampler = TracerProvider(resource=resource).sampler  # the SDK's, as OTEL_TRACES_SAMPLER says
        self.scope = InstrumentationScope("attnserve", __version__)
        self.export = BoundedExport(otlp_exporter(settings), settings, on_drop)
        log.info("tracing: spans to %s (OTLP, %s)", redacted(settings.endpoint), settings.protocol)

    @property
    def dropped(self) -> int:
        return self.export.dropped

    def sampled(self, parent: Context, trace_id: int, name: str, kind: SpanKind) -> bool:
        return self.sampler.should_sample(parent, trace_id, name, kind).decision.is_sampled()

    def write(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        times: tuple[int, int],
        attributes: dict[str, Any],
        events: Sequence[tuple[str, int]] = (),
        status: Status = UNSET,
    ) -> None:
        """A finished span, made in one step (the SDK's ReadableSpan, to the export queue): a request's
        span is written once, when it ends, never built up call by call. `times`: start and end, time_ns."""
        span = ReadableSpan(
            name,
            context,
            parent,
            self.resource,
            attributes,
            tuple(Event(event, timestamp=at) for event, at in events),
            kind=kind,
            status=status,
            start_time=times[0],
            end_time=times[1],
            instrumentation_scope=self.scope,
        )
        self.export.on_end(span)

    def shutdown(self) -> None:
        """Send what waits (up to SHUTDOWN_WAIT_S), then stop."""
        self.export.shutdown()


def new_span_id() -> int:
    return random.getrandbits(64) or 1  # never the invalid 0


def new_trace_id() -> int:
    return random.getrandbits(128) or 1


def parent_of(carrier: Mapping[str, str]) -> tuple[Context, SpanContext | None]:
    """The context a W3C `traceparent` (and `tracestate`) in `carrier` continues, and its span context:
    (an empty context, None) without one, or with one that does not parse (the specification's rule)."""
    context = PROPAGATOR.extract(carrier)
    parent = trace.get_current_span(context).get_span_context()
    return context, parent if parent.is_valid else None


def traceparent(context: SpanContext) -> str:
    """The W3C traceparent that makes the span of `context` the parent of another process's span."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def remote_parent(value: str) -> SpanContext | None:
    """The span context of a traceparent this server wrote (traceparent()); None for "" or another."""
    parts = value.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    return SpanContext(int(parts[1], 16), int(parts[2], 16), True, TraceFlags(int(parts[3], 16)))
