"""OpenTelemetry traces of requests (`attnserve serve --otlp-traces-endpoint`), below the server and the
engine core, which both export their spans of a request to one trace.

settings.py reads the flag and the standard OTEL_* variables; exporting.py starts the OpenTelemetry
SDK with its OTLP exporter behind a bounded queue that counts what it drops; request.py is a
request's span at its door, and the current request's ids for the logs (current.py); core_spans.py
writes the engine core's spans of a request from its Final. The SDK is imported only when tracing
is on: off, a request costs one context-variable lookup.
"""
