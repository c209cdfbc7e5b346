"""attnserve.v1's messages from the engine's events: finish reasons, logprobs, the final response."""

from __future__ import annotations

from ...engine.domain import Final, FinishReason, TokenLogprob
from ...tokenizer import Tokenizer
from ...v1 import generation_pb2 as pb

FINISH_REASONS = {
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.EOS: pb.FINISH_REASON_EOS,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
}


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
        score=final.score or 0.0,
    )
