"""An OTLP trace receiver on 127.0.0.1: OpenTelemetry's own protocol definitions (opentelemetry-proto's
TraceService) served by grpcio, keeping every span it is sent, flattened. The tracing tests read what a
server exported from it; benchmarks/tracing.py stops it mid-run, as a collector that goes down.
"""

from __future__ import annotations

import gzip
import http.server
import threading
import time
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


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.otlp_receiver [--port 4317]`: serve until interrupted, printing the spans
    received every --every seconds (a stand-in collector for benchmarks and for trying tracing out)."""
    import argparse

    p = argparse.ArgumentParser(description="An OTLP/gRPC trace receiver that counts what it is sent")
    p.add_argument("--port", type=int, default=4317)
    p.add_argument("--every", type=float, default=5.0, help="seconds between count lines")
    args = p.parse_args(argv)
    receiver = Receiver().start(args.port)
    print(f"OTLP receiver on {receiver.endpoint}", flush=True)
    try:
        while True:
            time.sleep(args.every)
            print(f"{len(receiver.spans)} spans in {receiver.exports} exports", flush=True)
    except KeyboardInterrupt:
        receiver.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
