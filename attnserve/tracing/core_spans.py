"""The engine core's side of a request's trace: its spans written once the request ends (never one a
token), below the door's span whose traceparent the request carried here (in the Submit message when the
core runs in a process of its own).

One `engine_core` span from the request's arrival at the engine to its end, with children `queue` (to
admission), `prefill` (to the first token: the chunks it took and the prompt tokens the prefix cache
held) and `decode` (to the end), and a `first_token` event. The times are the Final's, counted back
from the end of the step it ended in. Imported only when tracing is on.
"""

from __future__ import annotations

import math
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from ..engine.domain import Final, FinishReason, GenerationRequest
from .exporting import Tracing, span_context_of

MS = 1_000_000  # ns


class CoreSpans:
    """Writes the engine core's spans of traced requests; `prefill_chunk`: the core's --prefill-chunk."""

    def __init__(self, tracing: Tracing, prefill_chunk: int, encoder_decoder: bool = False):
        self.tracing, self.tracer = tracing, tracing.tracer
        self.prefill_chunk, self.encoder_decoder = prefill_chunk, encoder_decoder

    def ended(self, request: GenerationRequest, event: Final | Exception, completion_tokens: int, now: int) -> None:
        """`request` (traced) ended with `event`, its last: a Final, or the error that refused or failed it;
        `completion_tokens`: all its completions'; `now`: the end of the step it ended in (time_ns), which
        the Final's times count back from."""
        parent = span_context_of({"traceparent": request.trace})
        attributes: dict[str, Any] = {
            "gen_ai.response.id": request.request_id,
            "gen_ai.usage.input_tokens": len(request.prompt_ids),
        }
        if not isinstance(event, Final):
            span = self.tracer.start_span("engine_core", context=parent, start_time=now, attributes=attributes)
            span.set_status(Status(StatusCode.ERROR, f"{type(event).__name__}: {event}"))
            span.end(end_time=now)
            return
        t, usage = event.timings, event.usage
        arrival = now - round(t.total_ms * MS)
        admitted, first = arrival + round(t.queue_ms * MS), arrival + round(t.time_to_first_token_ms * MS)
        attributes |= {
            "gen_ai.usage.output_tokens": completion_tokens,
            "gen_ai.usage.cache_read.input_tokens": usage.cached_tokens,
            "gen_ai.response.finish_reasons": [event.reason.value],
        }
        span = self.tracer.start_span("engine_core", context=parent, start_time=arrival, attributes=attributes)
        inside = trace.set_span_in_context(span)
        self.tracer.start_span("queue", context=inside, start_time=arrival).end(end_time=admitted)
        if event.reason not in (FinishReason.CANCELLED, FinishReason.DEADLINE) or usage.completion_tokens:
            prefill = {
                "attnserve.prefill.chunks": self.chunks(usage.prompt_tokens - usage.cached_tokens),
                "attnserve.prefill.tokens": usage.prompt_tokens - usage.cached_tokens,
                "gen_ai.usage.cache_read.input_tokens": usage.cached_tokens,
                "attnserve.prefix_cache.hit": usage.cached_tokens > 0,
            }
            prefilled = self.tracer.start_span("prefill", context=inside, start_time=admitted, attributes=prefill)
            prefilled.end(end_time=first)
            span.add_event("first_token", timestamp=first)
            decode = {"gen_ai.usage.output_tokens": completion_tokens}
            self.tracer.start_span("decode", context=inside, start_time=first, attributes=decode).end(end_time=now)
        if event.reason in (FinishReason.CANCELLED, FinishReason.DEADLINE):
            span.set_status(Status(StatusCode.ERROR, event.reason.value))
        span.end(end_time=now)

    def chunks(self, tokens: int) -> int:
        """Prefill runs a prompt of `tokens` (after the prefix cache's) took: --prefill-chunk tokens each (an
        encoder-decoder's source is encoded whole)."""
        return 1 if self.encoder_decoder else max(1, math.ceil(tokens / self.prefill_chunk))
