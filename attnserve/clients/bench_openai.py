"""`attnserve bench --backend openai`: the same run against any OpenAI-compatible server (vLLM, llama.cpp's
server, TGI, attnserve's own HTTP door), as vLLM's `bench serve` measures them.

Each request is a streamed POST to /v1/completions or /v1/chat/completions (--endpoint) with
`stream_options.include_usage`, read as server-sent events (http_events.py). A chunk that carries
text (or, unfinished, any content field: a token whose bytes do not yet make a character) is a
message: the first one's arrival is the time to first token, the gap to each next one an
inter-token latency, as vLLM's bench counts them (a server sends one chunk per token, attnserve's
door at --stream-interval-tokens 1). The tokens are the server's usage.completion_tokens (the
chunks where it reports none). Greedy requests send temperature 0 (OpenAI's default is 1); the
other sampling flags go by their OpenAI and vLLM names, logprobs as each endpoint asks for them.
Prompts are text: an OpenAI-compatible server reports no vocabulary to draw token ids from.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import tempfile
import time
from collections.abc import Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from .bench_prompts import make_prompts
from .bench_report import RequestRecord
from .channel import TlsConfig
from .http_events import Endpoint, HttpError, HttpTarget
from .types import GenerationParams, Prompt

if TYPE_CHECKING:
    from .bench import BenchConfig, Request

COMPLETIONS, CHAT = "completions", "chat"
ENDPOINTS = (COMPLETIONS, CHAT)
PATHS = {COMPLETIONS: "/completions", CHAT: "/chat/completions"}
# GenerationParams' fields sent under the same name when unlike their defaults (OpenAI's, and vLLM's extra ones)
SAME_NAMES = ("top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed")
DEFAULTS = {f.name: f.default for f in fields(GenerationParams)}


def ssl_context(tls: TlsConfig | None) -> ssl.SSLContext | None:
    """An https:// connection's context from the client's TLS settings (the system's roots without a CA)."""
    if tls is None:
        return None
    context = ssl.create_default_context(cadata=tls.root_certificates.decode() if tls.root_certificates else None)
    if tls.certificate_chain and tls.private_key:  # ssl loads a client certificate from files only
        with tempfile.TemporaryDirectory() as folder:
            cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
            for path, pem in ((cert, tls.certificate_chain), (key, tls.private_key)):
                with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                    f.write(pem)
            context.load_cert_chain(cert, key)
    return context


def request_body(endpoint: str, model: str, prompt: str, params: GenerationParams) -> dict[str, Any]:
    """One streamed request's JSON body: `params` by OpenAI's and vLLM's names."""
    body: dict[str, Any] = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
    }
    if endpoint == CHAT:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body.update({name: getattr(params, name) for name in SAME_NAMES if getattr(params, name) != DEFAULTS[name]})
    if params.logprobs:
        body.update(
            {"logprobs": True, "top_logprobs": params.logprobs} if endpoint == CHAT else {"logprobs": params.logprobs}
        )
    if params.ignore_eos:
        body["ignore_eos"] = True
    for name in ("stream_interval_tokens", "stream_interval_ms"):  # attnserve's door's own fields
        if getattr(params, name) is not None:
            body[name] = getattr(params, name)
    return body


class OpenAIBackend:
    """An OpenAI-compatible server as `attnserve bench` drives it (bench.Backend): its model, text
    prompts, and one request streamed and timed."""

    def __init__(self, config: BenchConfig, tls: TlsConfig | None, token: str | None):
        self.config = config
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        server_name = tls.server_name if tls else None
        self.target = HttpTarget(Endpoint.parse(config.target), headers, ssl_context(tls), server_name)
        self.model = config.model  # None: the first the server lists, once describe() has asked

    async def __aenter__(self) -> OpenAIBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass  # every call has its own connection

    async def describe(self) -> dict[str, Any]:
        """The report's "model": the model asked for (--model, which the server must list), by /v1/models."""
        listed = await self.target.get_json("/models")
        data = listed.get("data") if isinstance(listed, dict) else None
        ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        where = f"{self.target.endpoint}/models"
        if not ids:
            raise HttpError(200, f"{where} lists no model")
        if self.model is not None and self.model not in ids:
            raise HttpError(404, f"--model {self.model}: {where} lists {', '.join(map(str, ids))}, not it")
        self.model = self.model or str(ids[0])
        return {
            "model_name": self.model,
            "execution_provider": "unknown (an OpenAI-compatible server does not say)",
            "api": f"OpenAI {self.config.endpoint} at {self.target.endpoint}",
        }

    def prompts(self, count: int, seed: int) -> Sequence[Prompt]:
        return make_prompts(count, self.config.prompt_tokens, seed)

    def prompt_note(self) -> str:
        return (
            f"text: {self.config.prompt_tokens - 1} ASCII bytes per request; the server's tokenizer counts "
            "their tokens (each level's prompt_tokens, from its usage)"
        )

    async def measure(self, request: Request, traceparent: str) -> RequestRecord:
        """Stream one request and time its chunks; a failure is recorded, not raised."""
        record = RequestRecord(start=time.perf_counter(), kind=request.kind)
        assert isinstance(request.prompt, str), "an OpenAI-compatible server is sent text"
        body = request_body(self.config.endpoint, self.model or "", request.prompt, request.params)
        headers = {"traceparent": traceparent} if traceparent else {}
        try:
            text = await asyncio.wait_for(self._read(record, body, headers), self.config.timeout)
            record.output_bytes = len(text.encode("utf-8"))
            record.tokens = record.reported_tokens if record.reported_tokens is not None else record.messages
        except HttpError as error:
            record.status = f"HTTP {error.status}" if error.status else "UNAVAILABLE"
            record.error = error.message
        except asyncio.TimeoutError:
            record.status = "DEADLINE_EXCEEDED"
            record.error = f"no end after --timeout {self.config.timeout:g} s"
        record.end = time.perf_counter()
        return record

    async def _read(self, record: RequestRecord, body: dict[str, Any], headers: dict[str, str]) -> str:
        """The stream's chunks into `record` (times, usage, finish reason); the text."""
        last = record.start
        pieces = []
        async for event in self.target.events(PATHS[self.config.endpoint], body, headers):
            usage = event.get("usage")
            if isinstance(usage, dict):
                record.reported_tokens = usage.get("completion_tokens")
                record.prompt_tokens = usage.get("prompt_tokens")
                details = usage.get("prompt_tokens_details")  # OpenAI's, and vLLM's with prefix caching
                record.cached_tokens = details.get("cached_tokens") if isinstance(details, dict) else None
            for choice in event.get("choices") or ():
                text, carries = self._content(choice)
                record.finish_reason = choice.get("finish_reason") or record.finish_reason
                if not carries:
                    continue
                now = time.perf_counter()
                record.messages += 1
                if record.first_token is None:
                    record.first_token = now
                else:
                    record.itl.append(now - last)
                last = now
                pieces.append(text)
        return "".join(pieces)

    def _content(self, choice: dict[str, Any]) -> tuple[str, bool]:
        """A chunk's text and whether it carries a token: text, or an unfinished chunk's content field
        (not chat's opening, which only names the role)."""
        if self.config.endpoint == CHAT:
            delta = choice.get("delta") or {}
            text = delta.get("content") or ""
            unfinished = "content" in delta and "role" not in delta
        else:
            text = choice.get("text") or ""
            unfinished = "text" in choice
        return text, bool(text) or (unfinished and choice.get("finish_reason") is None)
