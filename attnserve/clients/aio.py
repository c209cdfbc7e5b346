"""`AsyncClient`: the asyncio (grpc.aio) twin of `Client`, for many concurrent requests.

    async with AsyncClient("127.0.0.1:50051") as client:
        result = await client.generate("def parse_args(", max_new_tokens=32)
        async with client.stream("import ") as stream:
            async for delta in stream:
                print(delta.text, end="", flush=True)

Same prompts (text or token ids), deadlines, errors and retry rule as `Client`. Cancelling
the task that reads a stream cancels the call on the server. Create it inside the event loop
that uses it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnserve.protos.attnserve.v1 import generation_pb2 as pb
from attnserve.protos.attnserve.v1.generation_pb2_grpc import TextGenerationStub

from .channel import DEFAULT_TARGET, ChannelConfig, TlsConfig
from .client import DEFAULT_TIMEOUT
from .errors import AttnserveError, Unknown, from_rpc_error
from .retry import Deadline, RetryPolicy, call_with_retry_async, next_delay
from .types import (
    GenerationResult,
    ModelInfo,
    Prompt,
    StreamAccumulator,
    StreamDelta,
    build_request,
    model_info_from_proto,
    result_from_response,
)


class AsyncStream:
    """Async iterator of `StreamDelta`s of one GenerateStream call; see `Stream`."""

    def __init__(
        self, start: Callable[[float], grpc.aio.UnaryStreamCall], retry: RetryPolicy, deadline: Deadline
    ) -> None:
        self._start, self._retry, self._deadline = start, retry, deadline
        self._accumulator = StreamAccumulator()
        self._attempt = 1
        self._cancelled = False
        self._call = start(deadline.remaining())

    def __aiter__(self) -> AsyncIterator[StreamDelta]:
        return self

    async def __anext__(self) -> StreamDelta:
        while self._accumulator.result is None:
            message = await self._next_message()
            if message is None:
                break
            delta = self._accumulator.feed(message)
            if delta is not None:
                return delta
        raise StopAsyncIteration

    async def _next_message(self) -> pb.GenerateStreamResponse | None:
        while True:
            try:
                message = await self._call.read()
            except asyncio.CancelledError:
                if self._cancelled:  # our own cancel(): grpc.aio reports it this way
                    return None
                self._call.cancel()  # the reading task was cancelled: end the call too
                raise
            except grpc.RpcError as rpc_error:
                if self._cancelled:
                    return None
                error = from_rpc_error(rpc_error)
            else:
                if message is not grpc.aio.EOF:
                    return message
                if self._cancelled:
                    return None
                raise Unknown("the stream ended without a final message")
            await self._retry_or_raise(error)

    async def _retry_or_raise(self, error: AttnserveError) -> None:
        """Start the call again if it failed before any message; otherwise raise."""
        delay = next_delay(self._retry, self._attempt, error, self._deadline)
        if delay is None or self._accumulator.messages:
            raise error
        await asyncio.sleep(delay)
        self._attempt += 1
        self._call = self._start(self._deadline.remaining())

    def cancel(self) -> None:
        """Cancel the call on the server; the result so far gets finish_reason "cancelled"."""
        if self._accumulator.result is None and not self._cancelled:
            self._cancelled = True
            self._call.cancel()
            self._accumulator.cancelled()

    @property
    def request_id(self) -> str:
        """The server's id of this request (empty until its first message)."""
        return self._accumulator.request_id

    async def result(self) -> GenerationResult:
        """Consume the remaining deltas and return the whole completion."""
        async for _ in self:
            pass
        assert self._accumulator.result is not None  # set by the final message or by cancel()
        return self._accumulator.result

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc_info) -> None:
        self.cancel()


class AsyncClient:
    """asyncio client: generate, stream, model_info and health, each with a deadline."""

    def __init__(
        self,
        target: str | Sequence[str] = DEFAULT_TARGET,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        token: str | None = None,
        tls: TlsConfig | None = None,
        retry: RetryPolicy = RetryPolicy(),
        options: Sequence[tuple[str, object]] = (),
    ) -> None:
        self.config = ChannelConfig(target, tls, token, tuple(options))
        self.timeout = timeout
        self.retry = retry
        self._metadata = self.config.metadata()
        self._channel = self.config.aio_channel()
        self._stub = TextGenerationStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def _deadline(self, timeout: float | None) -> Deadline:
        return Deadline(self.timeout if timeout is None else timeout)

    async def generate(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int | None = None,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        seed: int | None = None,
        stop: Sequence[str] = (),
        request_id: str = "",
        timeout: float | None = None,
    ) -> GenerationResult:
        """The whole completion of `prompt` (text, or token ids); unset sampling means greedy."""
        request = build_request(
            prompt,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            repetition_penalty=repetition_penalty,
            seed=seed,
            stop=stop,
            request_id=request_id,
        )
        response = await call_with_retry_async(
            lambda left: self._stub.Generate(request, timeout=left, metadata=self._metadata),
            self.retry,
            self._deadline(timeout),
        )
        return result_from_response(response)

    def stream(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int | None = None,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        seed: int | None = None,
        stop: Sequence[str] = (),
        request_id: str = "",
        timeout: float | None = None,
    ) -> AsyncStream:
        """Start streaming the completion of `prompt`; iterate the returned `AsyncStream`."""
        request = build_request(
            prompt,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            repetition_penalty=repetition_penalty,
            seed=seed,
            stop=stop,
            request_id=request_id,
        )
        return AsyncStream(
            lambda left: self._stub.GenerateStream(request, timeout=left, metadata=self._metadata),
            self.retry,
            self._deadline(timeout),
        )

    async def model_info(self, *, timeout: float | None = None) -> ModelInfo:
        """The served model, its execution provider and the server's limits."""
        message = await call_with_retry_async(
            lambda left: self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=left, metadata=self._metadata),
            self.retry,
            self._deadline(timeout),
        )
        return model_info_from_proto(message)

    async def health(self, service: str = "", *, timeout: float | None = None) -> bool:
        """True if the server reports SERVING (grpc.health.v1); False if not, or unreachable."""
        request = health_pb2.HealthCheckRequest(service=service)
        try:
            response = await self._health.Check(
                request, timeout=self._deadline(timeout).remaining(), metadata=self._metadata
            )
        except grpc.RpcError:
            return False
        return response.status == health_pb2.HealthCheckResponse.SERVING

    async def close(self) -> None:
        """Close the channel; calls in flight are cancelled."""
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()
