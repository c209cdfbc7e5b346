"""The answer to one completions or chat completions call, in OpenAI's JSON: whole, or as server-sent
events at the stream interval as gRPC streams are, ending in `data: [DONE]`. With vLLM's `prompt_logprobs`,
each prompt token's logprob, rank and top alternatives as vLLM writes them: in each choice of a completion,
at the top of a chat's response (streamed: in the chunk that ends the choice). No engine calls here: the
door hands in the session's events."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, TypeVar

from ...engine.domain import Delta, Final, ServeError, TokenLogprob, Usage
from ...tokenizer import Tokenizer
from ..session.events import messages
from ..session.vllm_names import FINISH_REASONS
from .errors import error_body
from .request import CompletionCall

T = TypeVar("T")
MIN_LOGPROB = -9999.0  # JSON has no -inf: a masked id's logprob, as vLLM writes it


def sse(payload: dict[str, Any] | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def logprob(value: float) -> float:
    return max(value, MIN_LOGPROB)


class Answer:
    """The response to one completions call: whole, or as server-sent events."""

    OBJECT = CHUNK = "text_completion"  # the whole response's `object`, and a streamed chunk's
    PREFIX = "cmpl-"

    def __init__(self, call: CompletionCall, request_id: str, model: str, tokenizer: Tokenizer):
        self.call, self.tokenizer = call, tokenizer
        self.head = {"id": f"{self.PREFIX}{request_id}", "created": int(time.time()), "model": model}
        prompt = call.request
        self.echo = (prompt.prompt or tokenizer.decode(list(prompt.prompt_token_ids))) if call.echo else ""
        self.offsets = [len(self.echo)] * max(1, prompt.n or 1)  # each completion's text so far (text_offset)
        self.wants_logprobs = call.request.logprobs is not None
        self.wants_prompt_logprobs = call.request.prompt_logprobs is not None

    def whole(self, done: list) -> dict[str, Any]:
        choices = [
            self.choice(i, self.echo + c.text, c.logprobs, FINISH_REASONS[c.end.reason]) for i, c in enumerate(done)
        ]
        generated = sum(c.end.usage.completion_tokens for c in done)
        body = {**self.head, "object": self.OBJECT, "choices": choices, "usage": usage(done[0].end.usage, generated)}
        if self.wants_prompt_logprobs:
            self.add_prompt_logprobs(body, [c.end for c in done])
        return body

    def add_prompt_logprobs(self, body: dict[str, Any], finals: list[Final]) -> None:
        """vLLM's completions: each choice's prompt_logprobs."""
        for choice, final in zip(body["choices"], finals):
            choice["prompt_logprobs"] = self.prompt_logprobs(final)

    def prompt_logprobs(self, final: Final) -> list[dict[str, Any] | None]:
        """vLLM's prompt_logprobs: None for the first prompt token (nothing predicts it), then for each
        one a dict by token id of it and the top alternatives asked for, each with its logprob, rank (1:
        the likeliest) and decoded_token."""
        entry = lambda token_id, value, rank: {
            "logprob": logprob(value),
            "rank": rank,
            "decoded_token": self.tokenizer.decode([token_id]),
        }
        positions: list[dict[str, Any] | None] = [None]
        for p in final.prompt_logprobs:
            position = {str(p.token_id): entry(p.token_id, p.logprob, p.rank)}
            for rank, (token_id, value) in enumerate(p.top, 1):
                position.setdefault(str(token_id), entry(token_id, value, rank))
            positions.append(position)
        return positions

    def ending(self, index: int, final: Final) -> str:
        """The streamed chunk that ends completion `index`: its last text and finish reason (and, for
        completions, its prompt_logprobs, if asked)."""
        piece = self.piece(index, final.text, [], FINISH_REASONS[final.reason])
        if self.wants_prompt_logprobs:
            piece["prompt_logprobs"] = self.prompt_logprobs(final)
        return self.chunk([piece])

    def chunk(self, choices: list[dict[str, Any]], **more: Any) -> str:
        return sse({**self.head, "object": self.CHUNK, "choices": choices, **more})

    def choice(self, index: int, text: str, logprobs: list[TokenLogprob], reason: str | None) -> dict[str, Any]:
        """A choice of the whole response, or a streamed piece of one (completions: the same shape)."""
        return {
            "text": text,
            "index": index,
            "logprobs": self.logprobs(index, logprobs) if self.wants_logprobs else None,
            "finish_reason": reason,
        }

    def piece(self, index: int, text: str, logprobs: list[TokenLogprob], reason: str | None) -> dict[str, Any]:
        return self.choice(index, text, logprobs, reason)

    def opening(self, index: int) -> dict[str, Any] | None:
        """A completion's first chunk, before its tokens: the echoed prompt, if asked for."""
        return self.piece(index, self.echo, [], None) if self.echo else None

    def logprobs(self, index: int, logprobs: list[TokenLogprob]) -> dict[str, Any]:
        """OpenAI's completions logprobs: each token's text, logprob, top alternatives and text offset."""
        text = lambda token_id: self.tokenizer.decode([token_id])
        tokens = [text(p.token_id) for p in logprobs]
        offsets = []
        for token in tokens:
            offsets.append(self.offsets[index])
            self.offsets[index] += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [logprob(p.logprob) for p in logprobs],
            "top_logprobs": [{text(i): logprob(lp) for i, lp in p.top} for p in logprobs],
            "text_offset": offsets,
        }

    async def stream(
        self, first: list[Delta | Final], events: AsyncGenerator[list[Delta | Final], None], n: int
    ) -> AsyncIterator[str]:
        """Chunks of the `n` completions as the engine's events come (at the stream interval, as gRPC
        streams are), then usage if asked, then [DONE]."""
        prompt: Usage | None = None  # completion 0's: the prompt's counts
        generated = 0
        async with aclosing(events):
            try:
                for opening in filter(None, map(self.opening, range(n))):
                    yield self.chunk([opening])
                async for index, deltas, final in messages(starting_with(first, events)):
                    if deltas:
                        text = "".join(d.text for d in deltas)
                        picked = [p for d in deltas for p in d.logprobs]
                        yield self.chunk([self.piece(index, text, picked, None)])
                    if final is not None:
                        yield self.ending(index, final)
                        prompt = final.usage
                        generated += final.usage.completion_tokens
            except ServeError as e:  # after the headers: the error as the last event
                yield sse(error_body(e)[1])
            else:
                if self.call.include_usage and prompt is not None:
                    yield self.chunk([], usage=usage(prompt, generated))
            yield sse("[DONE]")


class ChatAnswer(Answer):
    """The response to one chat completions call: an assistant message, or its deltas."""

    OBJECT, CHUNK, PREFIX = "chat.completion", "chat.completion.chunk", "chatcmpl-"

    def choice(self, index: int, text: str, logprobs: list[TokenLogprob], reason: str | None) -> dict[str, Any]:
        return {
            "index": index,
            "message": {"role": "assistant", "content": text},
            "logprobs": self.logprobs(index, logprobs) if self.wants_logprobs else None,
            "finish_reason": reason,
        }

    def piece(self, index: int, text: str, logprobs: list[TokenLogprob], reason: str | None) -> dict[str, Any]:
        return {
            "index": index,
            "delta": {"content": text} if text or reason is None else {},
            "logprobs": self.logprobs(index, logprobs) if self.wants_logprobs and reason is None else None,
            "finish_reason": reason,
        }

    def add_prompt_logprobs(self, body: dict[str, Any], finals: list[Final]) -> None:
        """vLLM's chat completions: the response's prompt_logprobs, once (the prompt is every choice's)."""
        body["prompt_logprobs"] = self.prompt_logprobs(finals[0])

    def ending(self, index: int, final: Final) -> str:
        """The streamed chunk that ends completion `index` (the first: with the prompt_logprobs, if asked)."""
        piece = self.piece(index, final.text, [], FINISH_REASONS[final.reason])
        if self.wants_prompt_logprobs and index == 0:
            return self.chunk([piece], prompt_logprobs=self.prompt_logprobs(final))
        return self.chunk([piece])

    def opening(self, index: int) -> dict[str, Any]:
        """The first chunk of each completion says the assistant's role, as OpenAI's do."""
        return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}

    def logprobs(self, _index: int, logprobs: list[TokenLogprob]) -> dict[str, Any]:
        """OpenAI's chat logprobs: each token's text, logprob, UTF-8 bytes and top alternatives (no text
        offsets: the index of the completion is not needed)."""
        entry = lambda token_id, value: {
            "token": (token := self.tokenizer.decode([token_id])),
            "logprob": logprob(value),
            "bytes": list(token.encode()),
        }
        return {
            "content": [{**entry(p.token_id, p.logprob), "top_logprobs": [entry(*t) for t in p.top]} for p in logprobs]
        }


async def starting_with(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    yield first
    async for item in rest:
        yield item


def usage(prompt: Usage, completion_tokens: int) -> dict[str, Any]:
    """OpenAI's usage: the prompt's tokens (and how many the prefix cache served), every completion's."""
    return {
        "prompt_tokens": prompt.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt.prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": prompt.cached_tokens},
    }
