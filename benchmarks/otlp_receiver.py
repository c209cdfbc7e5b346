"""An OTLP trace receiver on 127.0.0.1: OpenTelemetry's own protocol definitions (opentelemetry-proto's
TraceService) served by grpcio, keeping every span it is sent, flattened. The tracing tests read what a
server exported from it; benchmarks/tracing.py stops it mid-run, as a collector that goes down. Run as a
command with --print, it is a way to look at traces without Jaeger: each trace, once its spans stop
coming, as an indented tree of spans with their events and attributes (trace_tree).

    python -m benchmarks.otlp_receiver [--port 4317] [--print [--settle S]] [--every S]
"""

from __future__ import annotations

import gzip
import http.server
import threading
import time
from collections import defaultdict
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str  # "" for a root
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind
    status: int  # 0 unset, 1 ok, 2 error
    message: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)  # names, in the order sent
    event_ns: dict[str, int] = field(default_factory=dict)  # name -> time
    resource: dict[str, Any] = field(default_factory=dict)


def value_of(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps the spans of every Export; `start()` serves on a free port of 127.0.0.1."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.exports = 0
        self.lock = threading.Lock()
        self.server: grpc.Server | None = None
        self.http: http.server.ThreadingHTTPServer | None = None  # start_http's
        self.port = 0
        self.arrived: dict[str, float] = {}  # trace id -> when its last span came (time.monotonic())

    def Export(self, request, context):  # noqa: ARG002  # the protocol's name and signature
        self.keep(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def keep(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        """Every span of one export, flattened."""
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: value_of(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.kind,
                            s.status.code,
                            s.status.message,
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                            {a.key: value_of(a.value) for a in s.attributes},
                            [e.name for e in s.events],
                            {e.name: e.time_unix_nano for e in s.events},
                            resource,
                        )
                    )
        with self.lock:
            self.spans += received
            self.exports += 1
            self.arrived.update((span.trace_id, time.monotonic()) for span in received)

    def settled(self, quiet: float) -> list[str]:
        """The traces no span has come for in `quiet` seconds, oldest first."""
        now = time.monotonic()
        with self.lock:
            return [t for t, when in sorted(self.arrived.items(), key=lambda item: item[1]) if now - when >= quiet]

    def start(self, port: int = 0) -> Receiver:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()
        return self

    def start_http(self) -> Receiver:
        """OTLP over HTTP instead (protobuf bodies POSTed to /v1/traces) on a free port of 127.0.0.1."""
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                if self.path == "/v1/traces":
                    receiver.keep(request)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:  # quiet
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=None).wait()
            self.server = None
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
            self.http = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, trace_id: str, names: set[str], timeout: float = 60.0) -> list[ReceivedSpan]:
        """The trace's spans once it holds one of each name (raises TimeoutError after `timeout`)."""
        end = time.monotonic() + timeout
        while True:
            spans = self.trace(trace_id)
            if names <= {s.name for s in spans}:
                return spans
            if time.monotonic() > end:
                raise TimeoutError(f"trace {trace_id}: {sorted(s.name for s in spans)}, waiting for {sorted(names)}")
            time.sleep(0.02)


KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
STATUSES = {0: "unset", 1: "ok", 2: "error"}


def trace_tree(spans: list[ReceivedSpan]) -> list[str]:
    """One trace as lines: `trace ID`, then each span under its parent (spans whose parent is not in
    the trace, such as a caller's, at the top), earliest first: its name, kind, duration and status,
    and below it its events (time from the span's start) and attributes, one a line."""
    ids = {s.span_id for s in spans}
    children: dict[str, list[ReceivedSpan]] = defaultdict(list)
    for span in sorted(spans, key=lambda s: s.start_ns):
        children[span.parent_id if span.parent_id in ids else ""].append(span)
    lines = [f"trace {spans[0].trace_id}"]

    def walk(span: ReceivedSpan, depth: int) -> None:
        pad, status = "  " * depth, STATUSES.get(span.status, str(span.status))
        status += f": {span.message}" if span.message else ""
        ms = (span.end_ns - span.start_ns) / 1e6
        lines.append(f"{pad}{span.name}  [{KINDS.get(span.kind, span.kind)}, {ms:.2f} ms, {status}]")
        lines.extend(
            f"{pad}    event {name} at +{(span.event_ns[name] - span.start_ns) / 1e6:.2f} ms" for name in span.events
        )
        lines.extend(f"{pad}    {key} = {value!r}" for key, value in sorted(span.attributes.items()))
        for child in children[span.span_id]:
            walk(child, depth + 1)

    for root in children[""]:
        walk(root, 1)
    return lines


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.otlp_receiver [--port 4317]`: serve until interrupted, printing the spans
    received every --every seconds (a stand-in collector for benchmarks and for trying tracing out);
    with --print, each trace as a tree once no span has come for it in --settle seconds."""
    import argparse

    p = argparse.ArgumentParser(description="An OTLP/gRPC trace receiver that counts, or prints, what it is sent")
    p.add_argument("--port", type=int, default=4317, help="0: any free port (printed)")
    p.add_argument("--every", type=float, default=5.0, help="seconds between count lines (without --print)")
    p.add_argument("--print", action="store_true", help="print each trace as an indented tree of its spans")
    p.add_argument(
        "--settle", type=float, default=1.0, help="--print: seconds without a new span before a trace prints"
    )
    args = p.parse_args(argv)
    receiver = Receiver().start(args.port)
    print(f"OTLP receiver on {receiver.endpoint}", flush=True)
    printed: set[str] = set()
    try:
        while True:
            time.sleep(min(args.every, args.settle / 4) if args.print else args.every)
            if not args.print:
                print(f"{len(receiver.spans)} spans in {receiver.exports} exports", flush=True)
                continue
            for trace_id in receiver.settled(args.settle):
                if trace_id not in printed:
                    printed.add(trace_id)
                    print("\n".join(trace_tree(receiver.trace(trace_id))), flush=True)
    except KeyboardInterrupt:
        receiver.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
