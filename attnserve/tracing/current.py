"""The request the running task serves, as the door's RequestTrace (request.py) left it: the session
marks its stages on it, the logs read its ids. Off, it is NO_TRACE, whose calls do nothing.
A LoggedTrace wraps either one where the logs want the call (--log-format json, --log-requests).
Standard library and the engine's domain only: no OpenTelemetry here.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, Protocol

from ..engine.domain import Final, GenerationRequest


class Trace(Protocol):
    """A request's door span, as the session and the logs see it."""

    request_id: str
    trace_id: str  # 32 hex digits ("": no trace)

    def submitting(self, generation: GenerationRequest) -> GenerationRequest:
        """The request validated: `generation` carrying its trace context to the engine core."""
        ...

    def finished(self, final: Final) -> None:
        """One of the request's completions ended (its Final reached the door)."""
        ...

    def end(self, status: str, message: str | None = None, attributes: Mapping[str, Any] | None = None) -> None:
        """The call ended with `status` (a gRPC status code's name, or an HTTP status)."""
        ...


class Traces(Protocol):
    """Opens a Trace for each call at a door (tracing on: request.py's RequestTraces)."""

    def open(self, name: str, carrier: Mapping[str, str], attributes: dict[str, Any]) -> Trace: ...


class NoTrace:
    """Tracing off, or no request: nothing is recorded."""

    request_id = trace_id = ""

    def submitting(self, generation: GenerationRequest) -> GenerationRequest:
        return generation

    def finished(self, final: Final) -> None:
        pass

    def end(self, status: str, message: str | None = None, attributes: Mapping[str, Any] | None = None) -> None:
        pass


NO_TRACE = NoTrace()
CURRENT: ContextVar[Trace] = ContextVar("attnserve_trace", default=NO_TRACE)
REQUESTS = logging.getLogger("attnserve.requests")  # --log-requests' lines
# W3C traceparent: version (never ff), trace id (never all zeros), parent id, flags
TRACEPARENT = re.compile(r"(?!ff)[0-9a-f]{2}-(?!0{32})([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}(-.*)?")


def caller_trace_id(carrier: Mapping[str, str]) -> str:
    """The trace id of the call's W3C traceparent ("": none, or not a valid one)."""
    match = TRACEPARENT.fullmatch(carrier.get("traceparent", "").strip())
    return match.group(1) if match else ""


class LoggedTrace:
    """A call's trace (`inner`: its span's, or NO_TRACE with tracing off) as the logs see it: its request
    id once validated, its trace id (the span's; with tracing off, the caller's traceparent's) and,
    with `log_requests`, one line from the logger attnserve.requests as it ends, for a call that
    submitted a generation or ended in an error."""

    __slots__ = (
        "completion_tokens",
        "inner",
        "log_requests",
        "name",
        "prompt_tokens",
        "reasons",
        "request_id",
        "start",
        "submitted",
        "trace_id",
    )

    def __init__(self, inner: Trace, name: str, carrier: Mapping[str, str], log_requests: bool):
        self.inner, self.name, self.log_requests = inner, name, log_requests
        self.start = time.monotonic()
        self.request_id = ""
        self.trace_id = inner.trace_id or caller_trace_id(carrier)
        self.submitted = False
        self.prompt_tokens = self.completion_tokens = 0
        self.reasons: list[str] = []

    def submitting(self, generation: GenerationRequest) -> GenerationRequest:
        self.request_id, self.submitted = generation.request_id, True
        self.prompt_tokens = len(generation.prompt_ids)
        return self.inner.submitting(generation)

    def finished(self, final: Final) -> None:
        if not self.reasons:
            self.prompt_tokens = final.usage.prompt_tokens
        self.completion_tokens += final.usage.completion_tokens
        self.reasons.append(final.reason.value)
        self.inner.finished(final)

    def end(self, status: str, message: str | None = None, attributes: Mapping[str, Any] | None = None) -> None:
        self.inner.end(status, message, attributes)
        if self.log_requests and (self.submitted or status not in ("OK", "200")):
            REQUESTS.info(
                "request %s ended %s: %d prompt + %d completion tokens, finish %s (%s, %.0f ms)%s",
                self.request_id or "-",
                status,
                self.prompt_tokens,
                self.completion_tokens,
                ",".join(self.reasons) or "none",
                self.name,
                (time.monotonic() - self.start) * 1000,
                f": {message}" if message else "",
                extra={"request_id": self.request_id, "trace_id": self.trace_id},
            )


class LoggedTraces:
    """Opens each call's LoggedTrace around `inner`'s trace (tracing on) or NO_TRACE (off)."""

    def __init__(self, inner: Traces | None, log_requests: bool):
        self.inner, self.log_requests = inner, log_requests

    def open(self, name: str, carrier: Mapping[str, str], attributes: dict[str, Any]) -> Trace:
        inner = self.inner.open(name, carrier, attributes) if self.inner is not None else NO_TRACE
        return LoggedTrace(inner, name, carrier, self.log_requests)


def current() -> Trace:
    """The running task's request's trace (NO_TRACE outside one, or with tracing off)."""
    return CURRENT.get()


def opened(traces: Traces | None, name: str, carrier: Mapping[str, str], attributes: dict[str, Any]) -> Trace:
    """A call's trace, made the running task's current one (NO_TRACE where `traces` is None: neither tracing
    nor the logs want the call)."""
    if traces is None:
        return NO_TRACE
    trace = traces.open(name, carrier, attributes)
    CURRENT.set(trace)
    return trace
