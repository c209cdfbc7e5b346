"""The engine core's side of a request's trace: its spans written once the request ends (never one a
token), below the door's span whose traceparent the request carried here (in the Submit message when
the core runs in a process of its own).

One `engine_core` span from the request's arrival at the engine to its end, with an `admitted` event
(the queue's end, prefill's start) and a `first_token` event (prefill's end, decode's start), the
durations as vLLM's span attributes name them (gen_ai.latency.time_in_queue, time_to_first_token,
time_in_model_prefill, time_in_model_decode, e2e), the prefill's chunks, the prompt tokens the
prefix cache held, and with speculative decoding the ids proposed and kept. One span, not a span a
stage: the engine thread makes it, and this process's export encodes it, under the GIL the engine
steps with. The times are the Final's, counted back from the end of the step it ended in. Imported
only when tracing is on.
"""

from __future__ import annotations

import math
from typing import Any

from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

from ..engine.domain import Final, FinishReason, GenerationRequest
from .exporting import UNSET, Tracing, new_span_id, remote_parent

MS = 1_000_000  # ns
INTERNAL = SpanKind.INTERNAL


class CoreSpans:
    """Writes the engine core's spans of traced requests; `prefill_chunk`: the core's --prefill-chunk."""

    def __init__(self, tracing: Tracing, prefill_chunk: int, encoder_decoder: bool = False):
        self.tracing = tracing
        self.prefill_chunk, self.encoder_decoder = prefill_chunk, encoder_decoder

    def ended(self, request: GenerationRequest, event: Final | Exception, completion_tokens: int, now: int) -> None:
        """`request` (traced) ended with `event`, its last: a Final, or the error that refused or failed it;
        `completion_tokens`: all its completions'; `now`: the end of the step it ended in (time_ns), which
        the Final's times count back from."""
        parent = remote_parent(request.trace)
        if parent is None:
            return
        context = SpanContext(parent.trace_id, new_span_id(), False, parent.trace_flags, parent.trace_state)
        attributes: dict[str, Any] = {"gen_ai.response.id": request.request_id}
        if not isinstance(event, Final):
            failed = Status(StatusCode.ERROR, f"{type(event).__name__}: {event}")
            self.tracing.write("engine_core", context, parent, INTERNAL, (now, now), attributes, (), failed)
            return
        t, usage = event.timings, event.usage
        arrival = now - round(t.total_ms * MS)
        events = [("admitted", arrival + round(t.queue_ms * MS))]
        fresh = usage.prompt_tokens - usage.cached_tokens
        attributes |= {  # the prompt's tokens and the finish reasons are the door span's
            "gen_ai.usage.output_tokens": completion_tokens,
            "gen_ai.latency.time_in_queue": t.queue_ms / 1000,
            "gen_ai.latency.e2e": t.total_ms / 1000,
            "attnserve.prefill.chunks": self.chunks(fresh),
            "attnserve.prefill.tokens": fresh,
        }
        if usage.completion_tokens:
            events.append(("first_token", arrival + round(t.time_to_first_token_ms * MS)))
            attributes |= {
                "gen_ai.latency.time_to_first_token": t.time_to_first_token_ms / 1000,
                "gen_ai.latency.time_in_model_prefill": (t.time_to_first_token_ms - t.queue_ms) / 1000,
                "gen_ai.latency.time_in_model_decode": (t.total_ms - t.time_to_first_token_ms) / 1000,
            }
        if event.speculated is not None:  # --speculative-config: the ids proposed and those kept
            proposed, kept = event.speculated
            attributes |= {
                "attnserve.speculative.draft_tokens": proposed,
                "attnserve.speculative.accepted_tokens": kept,
            }
        status = UNSET
        if event.reason in (FinishReason.CANCELLED, FinishReason.DEADLINE):
            status = Status(StatusCode.ERROR, event.reason.value)
        self.tracing.write("engine_core", context, parent, INTERNAL, (arrival, now), attributes, events, status)

    def chunks(self, tokens: int) -> int:
        """Prefill runs a prompt of `tokens` (after the prefix cache's) took: --prefill-chunk tokens each (an
        encoder-decoder's source is encoded whole)."""
        return 1 if self.encoder_decoder else max(1, math.ceil(tokens / self.prefill_chunk))
