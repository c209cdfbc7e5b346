"""The OpenAI-compatible HTTP front door: POST /v1/completions (unary, or server-sent events ending in
`data: [DONE]`), POST /v1/chat/completions (or its answer that this model has no chat template), GET
/v1/models, GET /health; and vLLM's other routes: POST /tokenize and /detokenize (tokenize.py), GET
/version, GET /metrics (the server's Prometheus registry, as on --metrics-port). A Starlette app,
served by uvicorn on the server's event loop (app.py).

Same engine and semantics as attnserve.v1: each body is read within bounds (body.py: its bytes, its
JSON's nesting), its model checked first, then it becomes the session's RequestFields (request.py;
a chat's on a worker thread, as rendering and tokenizing its messages take time: one long chat never
holds up the other calls) checked by the session's `validate` with the same limits and messages;
the answer is answers.py's; errors take OpenAI's shape with the status OpenAI uses (errors.py). A
client that disconnects frees its slot at the next step. No gRPC here.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ... import __version__
from ...engine.domain import Draining, InvalidRequest, ServeError, Unauthenticated, UnknownModel
from ...engine.engine import EngineCalls
from ...tokenizer import Tokenizer
from ...tokenizer.chat_template import ChatTemplate
from ...tracing.current import NO_TRACE, Trace, Traces, opened
from ..bearer import bearer_matches
from ..session.events import completions, generation_events
from ..session.validation import RequestLimits, check_stream_interval, validate
from .answers import Answer, ChatAnswer
from .body import read_json
from .errors import error_response
from .request import CompletionCall, model_of, read_chat, read_completion
from .tokenize import read_detokenize, read_tokenize, tokenized

log = logging.getLogger(__name__)

T = TypeVar("T")


class ClientGone(Exception):
    """The HTTP client disconnected before its answer."""


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
    max_body_bytes: int  # --http-max-body-bytes: a larger body is refused (413) before it is read whole
    started: int = 0  # Unix seconds, the models list's `created`
    chat_template: ChatTemplate | None = None  # tokenizer_config.json's: /v1/chat/completions applies it
    traces: Traces | None = None  # tracing on: each completion's span (--otlp-traces-endpoint)
    metrics: Callable[[str], tuple[bytes, str]] | None = None  # Accept header -> Prometheus exposition, its type


class OpenAIFrontDoor:
    """The routes over one engine; `app` is the ASGI application."""

    def __init__(self, engine: EngineCalls, limits: RequestLimits, tokenizer: Tokenizer, facts: HttpFacts):
        self.engine, self.limits, self.tokenizer, self.facts = engine, limits, tokenizer, facts
        routes = [
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
        ]
        self.app = Starlette(routes=routes)
        self.routes = {(method, route.path): route.endpoint for route in routes for method in route.methods or ()}

    async def dispatch(self, request: Request) -> Response:
        """The route's answer to `request`, for a caller that hands over Requests rather than serving the
        ASGI app (Ray Serve's HTTP proxy); the path is taken below the application's root path."""
        path = request.url.path.removeprefix(request.scope.get("root_path", "")) or "/"
        endpoint = self.routes.get((request.method, path))
        if endpoint is None:
            return await self.dispatch_missing(request)
        return await endpoint(request)

    async def dispatch_missing(self, request: Request) -> Response:
        """404 in OpenAI's error shape."""
        path = request.url.path.removeprefix(request.scope.get("root_path", "")) or "/"
        body = {"message": f"no route {request.method} {path}", "type": "invalid_request_error"}
        return JSONResponse({"error": {**body, "param": None, "code": "not_found"}}, 404)

    # ---- routes ------------------------------------------------------------------------------
    async def health(self, _request: Request) -> Response:
        """200 while serving; 503 while starting or draining (a load balancer's readiness probe)."""
        refusal = self.facts.refusal()
        status = 503 if refusal else 200
        self.facts.count("/health", status)
        return JSONResponse({"status": "draining or starting" if refusal else "serving"}, status)

    async def version(self, _request: Request) -> Response:
        """attnserve's version, as vLLM's /version (no token needed)."""
        self.facts.count("/version", 200)
        return JSONResponse({"version": __version__})

    async def metrics(self, request: Request) -> Response:
        """The server's Prometheus metrics, the registry --metrics-port serves (the bearer token, if set),
        also while starting or draining."""
        try:
            self.check_token(request)
        except ServeError as e:
            self.facts.count("/metrics", 401)
            return error_response(e)
        if self.facts.metrics is None:
            return await self.dispatch_missing(request)
        body, content_type = self.facts.metrics(request.headers.get("accept", ""))
        self.facts.count("/metrics", 200)
        return Response(body, media_type=content_type)

    async def tokenize(self, request: Request) -> Response:
        return await self.answer("/tokenize", request, self.tokenize_text)

    async def detokenize(self, request: Request) -> Response:
        return await self.answer("/detokenize", request, self.detokenize_ids)

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
        """Auth, the refusal while starting or draining, errors in OpenAI's shape, the metrics and the
        call's span (a stream is in flight until its last event is written, or its client goes)."""
        trace: Trace = NO_TRACE
        if counted:
            self.facts.in_flight(+1)
            trace = opened(self.facts.traces, f"POST {route}", request.headers, http_attributes(route))
        response: Response | None = None
        error: str | None = None
        try:
            self.check_token(request)
            refusal = self.facts.refusal()
            if refusal:
                raise Draining(refusal)
            response = await handler(request)
        except ServeError as e:
            response, error = error_response(e), str(e)
        except (ClientGone, ClientDisconnect):  # ClientDisconnect: gone while its body was being read
            response = Response(status_code=499)  # nobody reads it; nginx's "client closed request"
        except Exception:
            request_id = uuid.uuid4().hex
            log.exception("internal error in %s, request id %s", route, request_id)
            body = {"message": f"internal error; request id {request_id}", "type": "server_error"}
            response = JSONResponse({"error": {**body, "param": None, "code": None}}, 500)
        finally:
            if counted and isinstance(response, StreamingResponse):
                response.body_iterator = self.in_flight_until_done(response.body_iterator, trace)
            elif counted:
                self.facts.in_flight(-1)
        if not isinstance(response, StreamingResponse):
            trace.end(str(response.status_code), error, {"http.response.status_code": response.status_code})
        self.facts.count(route, response.status_code)
        return response

    async def in_flight_until_done(self, chunks: AsyncIterable[Any], trace: Trace) -> AsyncIterator[Any]:
        status = 499  # unless the last chunk was written: the client went away (nginx's "client closed request")
        try:
            async for chunk in chunks:
                yield chunk
            status = 200
        finally:
            self.facts.in_flight(-1)
            trace.end(str(status), None, {"http.response.status_code": status})

    def check_token(self, request: Request) -> None:
        if self.facts.token is not None and not bearer_matches(
            request.headers.get("authorization", ""), self.facts.token
        ):
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

    async def tokenize_text(self, request: Request) -> Response:
        call = read_tokenize(await self.body_naming_the_model_or_none(request), self.limits)
        # on a worker thread: tokenizing takes time in proportion to the text
        return JSONResponse(await asyncio.to_thread(tokenized, call, self.tokenizer, self.facts.context_length))

    async def detokenize_ids(self, request: Request) -> Response:
        ids = read_detokenize(await self.body_naming_the_model_or_none(request), self.limits)
        return JSONResponse({"prompt": await asyncio.to_thread(self.tokenizer.decode, ids)})

    async def body_naming_the_model_or_none(self, request: Request) -> Any:
        """A tokenizer route's JSON body, whose `model` is optional, as vLLM's: given, it must be the served one."""
        body = await read_json(request, self.facts.max_body_bytes)
        if isinstance(body, dict) and "model" in body:
            self.check_model(body)
        return body

    def check_model(self, body: Any) -> None:
        """The first check of a body: a call for another model costs nothing more."""
        model = model_of(body)
        if model != self.facts.model_name:
            shown = model if len(model) <= 80 else f"{model[:80]}..."  # a client's string, not echoed whole
            raise UnknownModel(f"the model `{shown}` does not exist (this server serves {self.facts.model_name})")

    # ---- /v1/completions ---------------------------------------------------------------------
    async def complete(self, request: Request) -> Response:
        self.engine.check_room()  # refused under overload before the body is read
        body = await read_json(request, self.facts.max_body_bytes)
        self.check_model(body)
        return await self.respond(request, read_completion(body), Answer)

    async def chat_complete(self, request: Request) -> Response:
        """A chat completion: the messages through the model's chat template, then answered as a completion."""
        self.engine.check_room()  # refused under overload before the body is read
        template = self.facts.chat_template
        if template is None:
            raise InvalidRequest(
                "messages", "this model has no chat template (a plain language model): use /v1/completions"
            )
        body = await read_json(request, self.facts.max_body_bytes)
        self.check_model(body)
        # on a worker thread: rendering and tokenizing take time in proportion to the messages
        call = await asyncio.to_thread(read_chat, body, template, self.limits, self.tokenizer.encode_chat)
        return await self.respond(request, call, ChatAnswer)

    async def respond(self, request: Request, call: CompletionCall, kind: type[Answer]) -> Response:
        """The call run through the engine: one JSON response, or server-sent events."""
        generation = validate(call.request, self.limits, self.tokenizer)
        interval = check_stream_interval(call.request, self.limits)
        answer = kind(call, generation.request_id, self.facts.model_name, self.tokenizer)
        if not call.stream:
            done = await until_gone(request, completions(self.engine, generation))
            return JSONResponse(answer.whole(done))
        generation = replace(generation, interval=interval)
        events = generation_events(self.engine, generation)
        try:  # the first events before the headers: a refusal (a full queue) is still an HTTP status
            first = await until_gone(request, anext(events))
        except BaseException:
            await events.aclose()
            raise
        return StreamingResponse(answer.stream(first, events, generation.n), media_type="text/event-stream")


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


def http_attributes(route: str) -> dict[str, str]:
    """The HTTP and GenAI semantic conventions' attributes of a POST to `route`."""
    operation = "chat" if route.endswith("/chat/completions") else "text_completion"
    return {"http.request.method": "POST", "http.route": route, "gen_ai.operation.name": operation}
