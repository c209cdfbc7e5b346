"""A request's span at its door: the server span every door opens for a call of attnserve.v1, the Open
Inference Protocol or the OpenAI API, continuing the caller's W3C trace context, with a child span for
validation (reading, parsing, tokenizing) and one for the last write (from the request's end at the
engine to the call's end). The engine core's spans (core_spans.py) hang below it: the request carries
this span's traceparent across the process boundary. Attributes are those of the OpenTelemetry GenAI
and RPC semantic conventions where they name one. Imported only when tracing is on.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from ..engine.domain import Final, GenerationRequest
from .exporting import Tracing, span_context_of, traceparent_of


class RequestTrace:
    """One call's door span (see the module's docstring); `end` ends it with the call's status."""

    __slots__ = (
        "cached",
        "final_at",
        "input_tokens",
        "output_tokens",
        "reasons",
        "request_id",
        "span",
        "start",
        "trace_id",
        "tracer",
    )

    def __init__(self, tracing: Tracing, name: str, carrier: Mapping[str, str], attributes: dict[str, Any]):
        """`name`: the span's (rpc service/method, or HTTP method and route); `carrier`: the call's metadata
        or headers, whose traceparent and tracestate it continues."""
        self.tracer = tracing.tracer
        self.start = time.time_ns()
        parent = span_context_of({k: v for k, v in carrier.items() if k in ("traceparent", "tracestate")})
        self.span = self.tracer.start_span(
            name, context=parent, kind=SpanKind.SERVER, start_time=self.start, attributes=attributes
        )
        self.trace_id = format(self.span.get_span_context().trace_id, "032x")
        self.request_id = ""
        self.final_at: int | None = None  # when the first Final reached the door (time_ns)
        self.input_tokens = self.output_tokens = self.cached = 0
        self.reasons: list[str] = []

    def submitting(self, generation: GenerationRequest) -> GenerationRequest:
        """Validation's span ends now; the request's attributes; the request, carrying this span to the core."""
        now = time.time_ns()
        self._child("validate", self.start).end(end_time=now)
        self.span.set_attributes(request_attributes(generation))
        self.request_id = generation.request_id
        return replace(generation, trace=traceparent_of(self.span))

    def finished(self, final: Final) -> None:
        if self.final_at is None:
            self.final_at = time.time_ns()
            self.input_tokens, self.cached = final.usage.prompt_tokens, final.usage.cached_tokens
            self.span.set_attribute("gen_ai.response.time_to_first_chunk", final.timings.time_to_first_token_ms / 1000)
        self.output_tokens += final.usage.completion_tokens
        self.reasons.append(final.reason.value)

    def end(self, status: str, message: str | None = None, attributes: Mapping[str, Any] | None = None) -> None:
        """End the span: `status` is the call's (a gRPC status code's name, or an HTTP status as text);
        an error's span status says it and `message`."""
        now = time.time_ns()
        if self.final_at is not None:
            self._child("write", self.final_at).end(end_time=now)
            self.span.set_attributes(
                {
                    "gen_ai.usage.input_tokens": self.input_tokens,
                    "gen_ai.usage.output_tokens": self.output_tokens,
                    "gen_ai.usage.cache_read.input_tokens": self.cached,
                    "gen_ai.response.finish_reasons": self.reasons,
                }
            )
        if attributes:
            self.span.set_attributes(attributes)
        if status not in ("OK", "200"):
            self.span.set_status(Status(StatusCode.ERROR, f"{status}: {message}" if message else status))
        self.span.end(end_time=now)

    def _child(self, name: str, start: int) -> trace.Span:
        return self.tracer.start_span(name, context=trace.set_span_in_context(self.span), start_time=start)


def request_attributes(generation: GenerationRequest) -> dict[str, Any]:
    """The validated request, in the GenAI semantic conventions' names (attnserve's where they have none)."""
    s = generation.sampling
    attributes: dict[str, Any] = {
        "gen_ai.response.id": generation.request_id,
        "gen_ai.request.max_tokens": generation.max_new_tokens,
        "gen_ai.request.temperature": s.temperature,
        "gen_ai.request.choice.count": generation.n,
        "gen_ai.request.stream": generation.interval is not None,
        "attnserve.request.prompt_tokens": len(generation.prompt_ids),
    }
    if s.top_k:
        attributes["gen_ai.request.top_k"] = s.top_k
    if s.top_p < 1.0:
        attributes["gen_ai.request.top_p"] = s.top_p
    if s.seed is not None:
        attributes["gen_ai.request.seed"] = s.seed
    if s.repetition_penalty != 1.0:
        attributes["attnserve.request.repetition_penalty"] = s.repetition_penalty
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
