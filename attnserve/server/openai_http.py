"""The OpenAI-compatible HTTP front door: POST /v1/completions (unary, or server-sent events ending in
`data: [DONE]`), GET /v1/models, GET /health, and POST /v1/chat/completions's answer that this model
has no chat template. A Starlette app, served by uvicorn on the server's event loop (app.py).

Same engine and semantics as attnserve.v1: each request becomes a GenerateRequest
(openai_request.py) checked by `validation.validate` with the same limits and messages; errors take
OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the status OpenAI uses (400
bad input, 401 without the bearer token, 404 an unknown model, 429 a full queue, 503 while starting
or draining). A client that disconnects frees its slot at the next step. No gRPC here.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..engine.domain import (
    Delta,
    Draining,
    EngineUnavailable,
    Final,
    FinishReason,
    InvalidRequest,
    QueueFull,
    ServeError,
    TokenLogprob,
    Unauthenticated,
    UnknownModel,
    Usage,
)
from ..engine.engine import EngineCalls
from ..tokenizer import Tokenizer
from ..tokenizer.chat_template import ChatTemplate
from .oip_request import renamed
from .openai_request import CompletionCall, chat_to_completion, read_completion
from .servicer import completions, generation_events, paced
from .stream_pacing import StreamPacer
from .validation import RequestLimits, check_stream_interval, validate

log = logging.getLogger("attnserve.server")

T = TypeVar("T")
MIN_LOGPROB = -9999.0  # JSON has no -inf: a masked id's logprob, as vLLM writes it
# ServeError -> (HTTP status, OpenAI's error type, code)
ERRORS: dict[type[ServeError], tuple[int, str, str | None]] = {
    InvalidRequest: (400, "invalid_request_error", None),
    Unauthenticated: (401, "invalid_request_error", "invalid_api_key"),
    UnknownModel: (404, "invalid_request_error", "model_not_found"),
    QueueFull: (429, "rate_limit_error", "queue_full"),
    Draining: (503, "service_unavailable", "draining"),
    EngineUnavailable: (503, "service_unavailable", "engine_unavailable"),
}
REASONS = {
    FinishReason.LENGTH: "length",
    FinishReason.STOP: "stop",
    FinishReason.EOS: "stop",
    FinishReason.CANCELLED: "abort",
    FinishReason.DEADLINE: "abort",
}


class ClientGone(Exception):
    """The HTTP client disconnected before its answer."""


def error_body(error: ServeError) -> tuple[int, dict[str, Any]]:
    status, kind, code = ERRORS.get(type(error), (500, "server_error", None))
    param = error.field if isinstance(error, InvalidRequest) else ("model" if isinstance(error, UnknownModel) else None)
    return status, {"error": {"message": str(error), "type": kind, "param": param, "code": code}}


def error_response(error: ServeError) -> JSONResponse:
    status, body = error_body(error)
    return JSONResponse(body, status)


def sse(payload: dict[str, Any] | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def logprob(value: float) -> float:
    return max(value, MIN_LOGPROB)


@dataclass(frozen=True)
class HttpFacts:
    """What the front door tells and checks that is not a request's: the model's name and context, the
    bearer token, and why calls are refused now (starting, draining; None: serving)."""

    model_name: str
    context_length: int
    token: str | None
    refusal: Callable[[], str | None]
    count: Callable[[str, int], None]  # (route, HTTP status): the metrics
    in_flight: Callable[[int], None]
    started: int = 0  # Unix seconds, the models list's `created`
    chat_template: ChatTemplate | None = None  # tokenizer_config.json's: /v1/chat/completions applies it


class OpenAIFrontDoor:
    """The routes over one engine; `app` is the ASGI application."""

    def __init__(self, engine: EngineCalls, limits: RequestLimits, tokenizer: Tokenizer, facts: HttpFacts):
        self.engine, self.limits, self.tokenizer, self.facts = engine, limits, tokenizer, facts
        routes = [
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
        ]
        self.app = Starlette(routes=routes)
        self.routes = {(method, route.path): route.endpoint for route in routes for method in route.methods or ()}

    async def dispatch(self, request: Request) -> Response:
        """The route's answer to `request`, for a caller that hands over Requests rather than serving the
        ASGI app (Ray Serve's HTTP proxy); the path is taken below the application's root path."""
        path = request.url.path.removeprefix(request.scope.get("root_path", "")) or "/"
        endpoint = self.routes.get((request.method, path))
        if endpoint is None:
            body = {"message": f"no route {request.method} {path}", "type": "invalid_request_error"}
            return JSONResponse({"error": {**body, "param": None, "code": "not_found"}}, 404)
        return await endpoint(request)

    # ---- routes ------------------------------------------------------------------------------
    async def health(self, _request: Request) -> Response:
        """200 while serving; 503 while starting or draining (a load balancer's readiness probe)."""
        refusal = self.facts.refusal()
        status = 503 if refusal else 200
        self.facts.count("/health", status)
        return JSONResponse({"status": "draining or starting" if refusal else "serving"}, status)

    async def models(self, request: Request) -> Response:
        return await self.answer("/v1/models", request, self.model_list)

    async def chat(self, request: Request) -> Response:
        return await self.answer("/v1/chat/completions", request, self.chat_complete, counted=True)

    async def completions(self, request: Request) -> Response:
        return await self.answer("/v1/completions", request, self.complete, counted=True)

    # ---- the call's boundary -----------------------------------------------------------------
    async def answer(
        self, route: str, request: Request, handler: Callable[[Request], Awaitable[Response]], counted: bool = False
    ) -> Response:
        """Auth, the refusal while starting or draining, errors in OpenAI's shape, and the metrics (a
        stream is in flight until its last event is written, or its client goes)."""
        if counted:
            self.facts.in_flight(+1)
        response: Response | None = None
        try:
            self.check_token(request)
            refusal = self.facts.refusal()
            if refusal:
                raise Draining(refusal)
            response = await handler(request)
        except ServeError as e:
            response = error_response(e)
        except (ClientGone, ClientDisconnect):  # ClientDisconnect: gone while its body was being read
            response = Response(status_code=499)  # nobody reads it; nginx's "client closed request"
        except Exception:
            request_id = uuid.uuid4().hex
            log.exception("internal error in %s, request id %s", route, request_id)
            body = {"message": f"internal error; request id {request_id}", "type": "server_error"}
            response = JSONResponse({"error": {**body, "param": None, "code": None}}, 500)
        finally:
            if counted and isinstance(response, StreamingResponse):
                response.body_iterator = self.in_flight_until_done(response.body_iterator)
            elif counted:
                self.facts.in_flight(-1)
        self.facts.count(route, response.status_code)
        return response

    async def in_flight_until_done(self, chunks: AsyncIterable[Any]) -> AsyncIterator[Any]:
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            self.facts.in_flight(-1)

    def check_token(self, request: Request) -> None:
        if self.facts.token is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.facts.token}".encode()):
            raise Unauthenticated("missing or invalid bearer token (header 'Authorization: Bearer <token>')")

    async def model_list(self, _request: Request) -> Response:
        model = {
            "id": self.facts.model_name,
            "object": "model",
            "created": self.facts.started,
            "owned_by": "attnserve",
            "max_model_len": self.facts.context_length,
        }
        return JSONResponse({"object": "list", "data": [model]})

    # ---- /v1/completions ---------------------------------------------------------------------
    async def complete(self, request: Request) -> Response:
        call = read_completion(await body_of(request))
        return await self.respond(request, call, Answer)

    async def chat_complete(self, request: Request) -> Response:
        """A chat completion: the messages through the model's chat template, then as a completion."""
        template = self.facts.chat_template
        if template is None:
            raise InvalidRequest(
                "messages", "this model has no chat template (a plain language model): use /v1/completions"
            )
        completion, renames = chat_to_completion(await body_of(request), template)
        completion["prompt"] = self.tokenizer.encode_chat(completion["prompt"])  # its special tokens as ids
        try:
            call = read_completion(completion)
        except InvalidRequest as e:
            raise renamed(e, renames) from None
        call = replace(call, origins={name: renames.get(key, key) for name, key in call.origins.items()})
        return await self.respond(request, call, ChatAnswer)

    async def respond(self, request: Request, call: CompletionCall, kind: type[Answer]) -> Response:
        """The call run through the engine: one JSON response, or server-sent events."""
        if call.model != self.facts.model_name:
            raise UnknownModel(f"the model `{call.model}` does not exist (this server serves {self.facts.model_name})")
        try:
            generation = validate(call.request, self.limits, self.tokenizer)
            interval = check_stream_interval(call.request, self.limits)
        except InvalidRequest as e:
            raise renamed(e, call.origins) from None
        answer = kind(call, generation.request_id, self.facts.model_name, self.tokenizer)
        if not call.stream:
            done = await until_gone(request, completions(self.engine, generation, None))
            return JSONResponse(answer.whole(done))
        generation = replace(generation, interval=interval)
        pacers = [StreamPacer(interval) for _ in range(generation.n)]
        waits = lambda: min((w for w in (p.wait_s() for p in pacers) if w is not None), default=None)
        events = generation_events(self.engine, generation, None, wait_s=waits)
        try:  # the first events before the headers: a refusal (a full queue) is still an HTTP status
            first = await until_gone(request, anext(events))
        except BaseException:
            await events.aclose()
            raise
        return StreamingResponse(answer.stream(first, events, pacers), media_type="text/event-stream")


async def body_of(request: Request) -> Any:
    try:
        return await request.json()
    except ValueError as e:
        raise InvalidRequest("body", f"not JSON: {e}") from None


async def until_gone(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, or ClientGone (and `work` cancelled) once the client disconnects."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(disconnected(request))
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        gone.cancel()
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientGone


async def disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Answer:
    """The response to one completions call: whole, or as server-sent events."""

    OBJECT = CHUNK = "text_completion"  # the whole response's `object`, and a streamed chunk's
    PREFIX = "cmpl-"

    def __init__(self, call: CompletionCall, request_id: str, model: str, tokenizer: Tokenizer):
        self.call, self.tokenizer = call, tokenizer
        self.head = {"id": f"{self.PREFIX}{request_id}", "created": int(time.time()), "model": model}
        prompt = call.request
        self.echo = (prompt.prompt or tokenizer.decode(list(prompt.prompt_token_ids))) if call.echo else ""
        self.offsets = [len(self.echo)] * max(1, prompt.n)  # each completion's text so far (logprobs' text_offset)
        self.wants_logprobs = call.request.HasField("logprobs")

    def whole(self, done: list) -> dict[str, Any]:
        choices = [self.choice(i, self.echo + c.text, c.logprobs, REASONS[c.end.reason]) for i, c in enumerate(done)]
        generated = sum(c.end.usage.completion_tokens for c in done)
        return {**self.head, "object": self.OBJECT, "choices": choices, "usage": usage(done[0].end.usage, generated)}

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
        self, first: list[Delta | Final], events: AsyncGenerator[list[Delta | Final], None], pacers: list[StreamPacer]
    ) -> AsyncIterator[str]:
        """Chunks as the engine's events come (paced as gRPC streams are), then usage if asked, then [DONE]."""
        prompt: Usage | None = None  # completion 0's: the prompt's counts
        generated = 0
        async with aclosing(events):
            try:
                for opening in filter(None, map(self.opening, range(len(pacers)))):
                    yield self.chunk([opening])
                async for index, deltas, final in paced(starting_with(first, events), pacers):
                    if deltas:
                        text = "".join(d.text for d in deltas)
                        picked = [p for d in deltas for p in d.logprobs]
                        yield self.chunk([self.piece(index, text, picked, None)])
                    if final is not None:
                        yield self.chunk([self.piece(index, final.text, [], REASONS[final.reason])])
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
