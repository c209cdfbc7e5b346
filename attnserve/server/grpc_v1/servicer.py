"""The TextGeneration servicer: protobuf in, domain objects to the engine, protobuf out.

Thin on purpose: validation lives in session/validation.py, decoding in the engine, error mapping
in the gRPC boundary. A client cancel (or a passed deadline) arrives here as CancelledError at an
await; the request's slot is released by the session's events loop and the error goes on up.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace

import grpc

from ...engine.engine import EngineCalls
from ...tokenizer import Tokenizer
from ...v1 import generation_pb2 as pb
from ...v1 import generation_pb2_grpc as pb_grpc
from ..grpc_boundary.calls import deadline_of
from ..session.events import completions, generation_events, messages
from ..session.validation import RequestLimits, check_stream_interval, validate
from .messages import FINISH_REASONS, final_response, logprob_messages
from .request import request_fields

REQUEST_ID_HEADER = "x-request-id"


class TextGenerationServicer(pb_grpc.TextGenerationServicer):
    """attnserve.v1.TextGeneration over one Engine."""

    def __init__(self, engine: EngineCalls, limits: RequestLimits, tokenizer: Tokenizer, info: pb.ModelInfo):
        self.engine, self.limits, self.tokenizer, self.info = engine, limits, tokenizer, info

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        """The whole completion in one response (with n > 1 or num_return_sequences > 1: every completion
        in `completions`, the first one's also in the top-level fields, and usage counting all of them)."""
        self.engine.check_room()  # refused under overload before the request is read
        generation = validate(request_fields(request), self.limits, self.tokenizer, deadline_of(context))
        done = await completions(self.engine, generation)
        first = done[0]
        response = final_response(
            pb.GenerateResponse, generation.request_id, first.text, first.token_ids, first.end, self.tokenizer
        )
        response.logprobs.extend(logprob_messages(first.logprobs, self.tokenizer))
        if len(done) > 1:
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
                    score=c.end.score or 0.0,
                )
                for index, c in enumerate(done)
            )
        return response

    async def GenerateStream(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateStreamResponse]:
        """Deltas as they are decoded, at the stream interval, then the final message.

        Deltas ready together go in one message; with a stream interval above 1 token (or a time
        bound), the engine holds more for one message, and whatever it holds goes out as soon as the
        generation ends. The request id goes out at once in the initial metadata (x-request-id): the
        caller knows its request was accepted before the first token."""
        self.engine.check_room()  # refused under overload before the request is read
        fields = request_fields(request)
        generation = validate(fields, self.limits, self.tokenizer, deadline_of(context))
        generation = replace(generation, interval=check_stream_interval(fields, self.limits))
        request_id = generation.request_id
        announce = lambda: context.send_initial_metadata(((REQUEST_ID_HEADER, request_id),))
        async with aclosing(generation_events(self.engine, generation, announce)) as batches:
            async for index, deltas, final in messages(batches):
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
