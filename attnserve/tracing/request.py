"""A request's span at its door: the server span every door opens for a call of attnserve.v1, the Open
Inference Protocol or the OpenAI API, continuing the caller's W3C trace context, with events where
validation (reading, parsing, tokenizing) ended and where the request's end reached the door (from
there to the span's end: the last write), and their durations as attributes. The engine core's span
(core_spans.py) hangs below it: the request carries this span's traceparent across the process
boundary. Events, not child spans: each span costs its process (and the engine core's, its engine
thread's GIL) a span's making and encoding, and a request's trace is two spans, each written whole
when it ends (Tracing.write), not built up call by call through the SDK's live Span. Attributes are those
of the OpenTelemetry GenAI and RPC semantic conventions where they name one. Imported only when
tracing is on.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from ..engine.domain import Final, GenerationRequest
from .exporting import UNSET, Tracing, new_span_id, new_trace_id, parent_of, traceparent


class RequestTrace:
    """One call's door span (see the module's docstring), written whole by `end` with the call's status.
    A call the sampler leaves out (OTEL_TRACES_SAMPLER, or a caller's unsampled traceparent) writes
    nothing, and its request carries no context to the core."""

    __slots__ = (
        "attributes",
        "cached",
        "context",
        "events",
        "final_at",
        "input_tokens",
        "name",
        "output_tokens",
        "parent",
        "reasons",
        "request_id",
        "start",
        "trace_id",
        "tracing",
    )

    def __init__(self, tracing: Tracing, name: str, carrier: Mapping[str, str], attributes: dict[str, Any]):
        """`name`: the span's (rpc service/method, or HTTP method and route); `carrier`: the call's metadata
        or headers, whose traceparent and tracestate it continues."""
        self.tracing, self.name, self.attributes = tracing, name, attributes
        self.start = time.time_ns()
        context, self.parent = parent_of({k: v for k, v in carrier.items() if k in ("traceparent", "tracestate")})
        trace_id = self.parent.trace_id if self.parent is not None else new_trace_id()
        sampled = tracing.sampled(context, trace_id, name, SpanKind.SERVER)
        flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
        state = self.parent.trace_state if self.parent is not None else None
        self.context = SpanContext(trace_id, new_span_id(), False, flags, state)
        self.trace_id = format(trace_id, "032x")
        self.request_id = ""
        self.events: list[tuple[str, int]] = []
        self.final_at: int | None = None  # when the first Final reached the door (time_ns)
        self.input_tokens = self.output_tokens = self.cached = 0
        self.reasons: list[str] = []

    def submitting(self, generation: GenerationRequest) -> GenerationRequest:
        """Validation ends now (an event); the request's attributes; the request, carrying this span to the core."""
        now = time.time_ns()
        self.events.append(("validated", now))
        self.attributes |= request_attributes(generation)
        self.attributes["attnserve.latency.validate"] = (now - self.start) / 1e9
        self.request_id = generation.request_id
        if not self.context.trace_flags.sampled:
            return generation
        return replace(generation, trace=traceparent(self.context))

    def finished(self, final: Final) -> None:
        if self.final_at is None:
            self.final_at = time.time_ns()
            self.input_tokens, self.cached = final.usage.prompt_tokens, final.usage.cached_tokens
            self.attributes["gen_ai.response.time_to_first_chunk"] = final.timings.time_to_first_token_ms / 1000
        self.output_tokens += final.usage.completion_tokens
        self.reasons.append(final.reason.value)

    def end(self, status: str, message: str | None = None, attributes: Mapping[str, Any] | None = None) -> None:
        """Write the span: `status` is the call's (a gRPC status code's name, or an HTTP status as text);
        an error's span status says it and `message`."""
        if not self.context.trace_flags.sampled:
            return
        now = time.time_ns()
        if self.final_at is not None:
            self.events.append(("final", self.final_at))
            self.attributes |= {
                "attnserve.latency.last_write": (now - self.final_at) / 1e9,
                "gen_ai.usage.input_tokens": self.input_tokens,
                "gen_ai.usage.output_tokens": self.output_tokens,
                "gen_ai.usage.cache_read.input_tokens": self.cached,
                "gen_ai.response.finish_reasons": self.reasons,
            }
        if attributes:
            self.attributes |= attributes
        failed = status not in ("OK", "200")
        outcome = Status(StatusCode.ERROR, f"{status}: {message}" if message else status) if failed else UNSET
        times = (self.start, now)
        self.tracing.write(
            self.name, self.context, self.parent, SpanKind.SERVER, times, self.attributes, self.events, outcome
        )


def request_attributes(generation: GenerationRequest) -> dict[str, Any]:
    """The validated request, in the GenAI semantic conventions' names (attnserve's where they have none)."""
    s = generation.sampling
    attributes: dict[str, Any] = {
        "gen_ai.response.id": generation.request_id,
        "gen_ai.request.max_tokens": generation.max_new_tokens,
        "gen_ai.request.temperature": s.temperature,
        "gen_ai.request.choice.count": generation.n,
        "gen_ai.request.stream": generation.interval is not None,
    }
    if s.top_k:
        attributes["gen_ai.request.top_k"] = s.top_k
    if s.top_p < 1.0:
        attributes["gen_ai.request.top_p"] = s.top_p
    if s.seed is not None:
        attributes["gen_ai.request.seed"] = s.seed
    if s.min_p:
        attributes["attnserve.request.min_p"] = s.min_p
    if s.repetition_penalty != 1.0:
        attributes["attnserve.request.repetition_penalty"] = s.repetition_penalty
    if s.presence_penalty:
        attributes["gen_ai.request.presence_penalty"] = s.presence_penalty
    if s.frequency_penalty:
        attributes["gen_ai.request.frequency_penalty"] = s.frequency_penalty
    if generation.stop:
        attributes["gen_ai.request.stop_sequences"] = list(generation.stop)
    if generation.beams is not None:
        attributes["attnserve.request.num_beams"] = generation.beams.num_beams
    if generation.controls:
        attributes["attnserve.request.controls"] = list(generation.controls)
    return attributes


class RequestTraces:
    """Opens each call's RequestTrace with the server's tracing and the model's name."""

    def __init__(self, tracing: Tracing, model: str):
        self.tracing, self.model = tracing, model

    def open(self, name: str, carrier: Mapping[str, str], attributes: dict[str, Any]) -> RequestTrace:
        return RequestTrace(self.tracing, name, carrier, {"gen_ai.request.model": self.model, **attributes})
