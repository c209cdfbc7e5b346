"""The TextGeneration servicer: protobuf in, domain objects to the engine, protobuf out.

Thin on purpose: validation lives in validation.py, decoding in the engine, error mapping in
the interceptor. A client cancel (or a passed deadline) arrives here as CancelledError at an
await; the request's slot is released in `finally` and the error goes on up.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc

from .. import __version__
from ..engine.domain import (
    DeadlineExceeded,
    Delta,
    Final,
    FinishReason,
    GenerationRequest,
    TokenLogprob,
    ends_request,
)
from ..engine.engine import EngineCalls
from ..runtime.contract import Manifest
from ..tokenizer import Tokenizer
from ..v1 import generation_pb2 as pb
from ..v1 import generation_pb2_grpc as pb_grpc
from .stream_pacing import StreamPacer
from .validation import RequestLimits, check_stream_interval, validate

REQUEST_ID_HEADER = "x-request-id"
FINISH_REASONS = {
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.EOS: pb.FINISH_REASON_EOS,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
}


class TextGenerationServicer(pb_grpc.TextGenerationServicer):
    """attnserve.v1.TextGeneration over one Engine."""

    def __init__(self, engine: EngineCalls, limits: RequestLimits, tokenizer: Tokenizer, info: pb.ModelInfo):
        self.engine, self.limits, self.tokenizer, self.info = engine, limits, tokenizer, info

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        """The whole completion in one response (with n > 1: every completion in `completions`, the
        first one's also in the top-level fields, and usage counting all of them)."""
        generation = validate(request, self.limits, self.tokenizer, deadline_of(context))
        done = await completions(self.engine, generation, context)
        first = done[0]
        response = final_response(
            pb.GenerateResponse, generation.request_id, first.text, first.token_ids, first.end, self.tokenizer
        )
        response.logprobs.extend(logprob_messages(first.logprobs, self.tokenizer))
        if generation.n > 1:
            response.usage.completion_tokens = sum(c.end.usage.completion_tokens for c in done)
            response.timings.total_ms = max(c.end.timings.total_ms for c in done)
            response.completions.extend(
                pb.Completion(
                    index=index,
                    text=c.text,
                    token_ids=c.token_ids,
                    finish_reason=FINISH_REASONS[c.end.reason],
                    completion_tokens=c.end.usage.completion_tokens,
                    logprobs=logprob_messages(c.logprobs, self.tokenizer),
                )
                for index, c in enumerate(done)
            )
        return response

    async def GenerateStream(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateStreamResponse]:
        """Deltas as they are decoded, paced by the stream interval, then the final message.

        Deltas ready together go in one message; with a stream interval above 1 token (or a time
        bound), more wait for one message (stream_pacing.py), and whatever waits goes out as soon
        as the generation ends. The request id goes out at once in the initial metadata
        (x-request-id): the caller knows its request was accepted before the first token."""
        generation = validate(request, self.limits, self.tokenizer, deadline_of(context))
        interval = check_stream_interval(request, self.limits)
        generation = replace(generation, interval=interval)  # the engine holds deltas as the pacer would
        pacers = [StreamPacer(interval) for _ in range(generation.n)]  # one per completion
        waits = lambda: min((w for w in (p.wait_s() for p in pacers) if w is not None), default=None)
        request_id = generation.request_id
        async with aclosing(
            generation_events(self.engine, generation, context, announce=True, wait_s=waits)
        ) as batches:
            async for index, deltas, final in paced(batches, pacers):
                if deltas:
                    yield pb.GenerateStreamResponse(
                        request_id=request_id,
                        text="".join(d.text for d in deltas),
                        token_ids=[t for d in deltas for t in d.token_ids],
                        logprobs=logprob_messages([p for d in deltas for p in d.logprobs], self.tokenizer),
                        index=index,
                    )
                if final is not None:
                    last = final_response(pb.GenerateStreamResponse, request_id, final.text, [], final, self.tokenizer)
                    last.index = index
                    yield last

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        """The model, its execution provider and the server's limits."""
        return self.info


async def generation_events(
    engine: EngineCalls,
    generation: GenerationRequest,
    context: grpc.aio.ServicerContext | None,
    announce: bool = False,
    wait_s: Callable[[], float | None] = lambda: None,
) -> AsyncGenerator[list[Delta | Final], None]:
    """Submit, then yield the engine's events in batches until the Final one (errors are raised).

    With `announce` (and a gRPC context), the request id goes out first in the initial metadata. An
    empty batch means
    `wait_s()` seconds passed with no event (a paced stream's time bound). The request's slot is
    released however the caller stops (close the generator: `aclosing`)."""
    handle = engine.submit(generation)
    try:
        if announce and context is not None:
            await context.send_initial_metadata(((REQUEST_ID_HEADER, generation.request_id),))
        while True:
            events: list[Delta | Final] = []
            for event in await handle.next_events(wait_s()):
                if isinstance(event, Exception):
                    raise event
                if isinstance(event, Final) and event.reason == FinishReason.DEADLINE:
                    raise DeadlineExceeded(
                        f"the deadline passed after {event.usage.completion_tokens} tokens "
                        f"({event.timings.total_ms:.0f} ms)"
                    )
                events.append(event)
            yield events
            if events and ends_request(events[-1]):
                return
    finally:
        engine.release(handle)


async def paced(
    batches: AsyncIterator[list[Delta | Final]], pacers: list[StreamPacer]
) -> AsyncIterator[tuple[int, list[Delta], Final | None]]:
    """The messages a stream sends, from the engine's batches of events: (completion index, the deltas
    due, its Final once it came), each completion paced by its own pacer."""
    async for events in batches:
        for index, pacer in enumerate(pacers):
            send = pacer.step([e for e in events if e.index == index])
            if send is not None:
                yield (index, *send)


@dataclass
class Completed:
    """One completion of a request, whole: its text, token ids, the tokens' logprobs and its Final."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    final: Final | None = None

    @property
    def end(self) -> Final:
        assert self.final is not None, "completions() returns completions that ended"
        return self.final


async def completions(
    engine: EngineCalls, generation: GenerationRequest, context: grpc.aio.ServicerContext | None
) -> list[Completed]:
    """Every completion of the request, whole, in index order (errors are raised). The engine hands the
    deltas on with each Final (interval None): nobody reads them before."""
    done = [Completed() for _ in range(generation.n)]
    generation = replace(generation, interval=None)
    async with aclosing(generation_events(engine, generation, context)) as batches:
        async for events in batches:
            for event in events:
                one = done[event.index]
                one.text += event.text
                if isinstance(event, Delta):
                    one.token_ids += event.token_ids
                    one.logprobs += event.logprobs
                else:
                    one.final = event
    assert all(one.final is not None for one in done), "the engine ends every completion with a Final event"
    return done


def logprob_messages(logprobs: list[TokenLogprob], tokenizer: Tokenizer) -> list[pb.TokenLogprob]:
    """The protocol's TokenLogprob messages, each id with its text decoded alone."""
    text = lambda token_id: tokenizer.decode([token_id])
    return [
        pb.TokenLogprob(
            token_id=p.token_id,
            logprob=p.logprob,
            text=text(p.token_id),
            top=[pb.TopLogprob(token_id=i, logprob=lp, text=text(i)) for i, lp in p.top],
        )
        for p in logprobs
    ]


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
    """The call's deadline on time.monotonic()'s clock, or None without one."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def final_response(message_type, request_id: str, text: str, token_ids: list[int], final: Final, tokenizer: Tokenizer):
    """A GenerateResponse or the final GenerateStreamResponse."""
    t = final.timings
    return message_type(
        prompt_logprobs=logprob_messages(list(final.prompt_logprobs), tokenizer),
        request_id=request_id,
        text=text,
        token_ids=token_ids,
        finish_reason=FINISH_REASONS[final.reason],
        usage=pb.Usage(
            prompt_tokens=final.usage.prompt_tokens,
            completion_tokens=final.usage.completion_tokens,
            cached_tokens=final.usage.cached_tokens,
        ),
        timings=pb.Timings(queue_ms=t.queue_ms, time_to_first_token_ms=t.time_to_first_token_ms, total_ms=t.total_ms),
    )


@dataclass(frozen=True)
class ModelFacts:
    """What GetModelInfo tells of the model: its directory, its manifest, the provider its session got."""

    model_dir: Path
    manifest: Manifest
    provider: str
    provider_note: str = ""  # why the session is not on the provider asked for (--provider auto's fallback)
    served_name: str | None = None  # --served-model-name

    @property
    def name(self) -> str:
        """The name clients see: --served-model-name, or the directory's."""
        return self.served_name or self.model_dir.resolve().name


def model_info(
    facts: ModelFacts,
    tokenizer: Tokenizer,
    limits: RequestLimits,
    max_batch: int,
    max_queue: int,
    kv_cache_bytes: int,
    prefix_cache_bytes: int,
) -> pb.ModelInfo:
    """GetModelInfo's answer, built once at start-up."""
    m = facts.manifest
    return pb.ModelInfo(
        model_name=facts.name,
        architecture=m.architecture,
        vocab_size=m.vocab_size,
        d_model=m.d_model,
        n_heads=m.n_heads,
        n_layers=m.n_layers,
        n_encoder_layers=m.n_encoder_layers,
        head_dim=m.head_dim,
        context_length=m.context_length,
        dtype=m.dtype,
        quantization=m.quantization or "",
        execution_provider=f"{facts.provider} ({facts.provider_note})" if facts.provider_note else facts.provider,
        kv_cache=m.kv_cache,
        kv_cache_bytes=kv_cache_bytes,
        prefix_cache_bytes=prefix_cache_bytes,
        limits=pb.Limits(
            max_new_tokens=limits.max_new_tokens,
            max_prompt_tokens=limits.max_prompt_tokens,
            max_batch_size=max_batch,
            max_queue_size=max_queue,
            max_stop_sequences=limits.max_stop_sequences,
            max_stop_bytes=limits.max_stop_bytes,
            stream_interval_tokens=limits.stream_interval.tokens,
            stream_interval_ms=limits.stream_interval.ms,
            max_stop_token_ids=limits.max_stop_token_ids,
            max_logit_bias=limits.max_logit_bias,
            max_logprobs=limits.max_logprobs,
            max_n=limits.max_n,
            max_structure_bytes=limits.max_structure_bytes,
        ),
        tokenizer=pb.TokenizerInfo(
            kind=tokenizer.kind,
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
            pad_id=tokenizer.pad_id,
            vocab_size=tokenizer.vocab_size,
            bos_prepended=tokenizer.add_bos,
        ),
        server_version=__version__,
    )
