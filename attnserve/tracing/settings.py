"""Where traces go: `--otlp-traces-endpoint` or the standard OTEL_* environment variables.

The flag wins; without it, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, then OTEL_EXPORTER_OTLP_ENDPOINT
(with /v1/traces added for OTLP over HTTP, as the specification says) turn tracing on.
OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn it off. The protocol is
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL's (or OTEL_EXPORTER_OTLP_PROTOCOL's): grpc, the default, or
http/protobuf; an endpoint whose path ends in /v1/traces means http/protobuf when neither says.
The SDK reads the rest itself (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER,
OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_TIMEOUT, ...). Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlparse

GRPC, HTTP = "grpc", "http/protobuf"
PROTOCOLS = (GRPC, HTTP)
HTTP_PATH = "/v1/traces"
QUEUE_SPANS = 2048  # spans waiting for export, at most, per process: more are dropped and counted
BATCH_SPANS = 512  # spans per export
EXPORT_EVERY_S = 1.0  # a batch goes out at least this often while spans wait


@dataclass(frozen=True)
class TraceSettings:
    """Tracing on: where the spans go and how."""

    endpoint: str  # an http:// or https:// URL
    protocol: str = GRPC  # grpc or http/protobuf
    queue_spans: int = QUEUE_SPANS
    batch_spans: int = BATCH_SPANS
    export_every_s: float = EXPORT_EVERY_S


def redacted(endpoint: str) -> str:
    """The URL as logs and errors may show it: a user and password, and the query's values, as ***."""
    url = urlparse(endpoint)
    netloc = url.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query = "&".join(f"{part.partition('=')[0]}=***" for part in url.query.split("&")) if url.query else ""
    return url._replace(netloc=netloc, query=query).geturl()


def endpoint_problem(endpoint: str) -> str | None:
    """Why `endpoint` is no OTLP endpoint (None: it is one); the endpoint shown redacted."""
    url = urlparse(endpoint)
    if url.scheme not in ("http", "https") or not url.hostname:
        return f"must be an http:// or https:// URL such as http://127.0.0.1:4317, not {redacted(endpoint)!r}"
    try:
        url.port  # noqa: B018  # raises ValueError for a port out of range
    except ValueError:
        return f"has no valid port: {redacted(endpoint)!r}"
    return None


def trace_settings(flag: str | None, environ: Mapping[str, str]) -> TraceSettings | None:
    """Tracing's settings, or None for off; ValueError naming the flag or the variable that is wrong."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if flag is None and environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    protocol = protocol.strip()
    if protocol and protocol not in PROTOCOLS:
        raise ValueError(f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL must be grpc or http/protobuf, not {protocol!r}")
    name, endpoint = "--otlp-traces-endpoint", flag
    if endpoint is None:
        name, endpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if endpoint is None and environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        name, endpoint = "OTEL_EXPORTER_OTLP_ENDPOINT", environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
        if (protocol or GRPC) == HTTP:
            endpoint = endpoint.rstrip("/") + HTTP_PATH
    if endpoint is None:
        return None
    problem = endpoint_problem(endpoint)
    if problem is not None:
        raise ValueError(f"{name} {problem}")
    if not protocol:
        protocol = HTTP if urlparse(endpoint).path.rstrip("/").endswith(HTTP_PATH) else GRPC
    return TraceSettings(endpoint, protocol)
