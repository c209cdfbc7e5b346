"""`AsyncClient`: the asyncio (grpc.aio) twin of `Client`, for many concurrent requests.

    async with AsyncClient("127.0.0.1:50051") as client:
        result = await client.generate("def parse_args(", max_new_tokens=32)
        async with client.stream("import ") as stream:
            async for delta in stream:
                print(delta.text, end="", flush=True)

Same prompts (text or token ids), `GenerationParams`, deadlines, errors and retry rule as
`Client`. Cancelling the task that reads a stream cancels the call on the server. Create it
inside the event loop that uses it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import suppress
from typing import TYPE_CHECKING

import grpc

from attnserve.health.v1 import health_pb2
from attnserve.v1 import generation_pb2 as pb

from .channel import ChannelConfig
from .client import ClientBase
from .errors import Unknown, from_rpc_error, typed_errors
from .types import (
    GenerationParams,
    GenerationResult,
    ModelInfo,
    ParamFields,
    Prompt,
    StreamAccumulator,
    StreamDelta,
    build_request,
    completions_of,
    model_info_from_proto,
    result_from_response,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack


class AsyncStream:
    """Async iterator of `StreamDelta`s of one GenerateStream call; see `Stream`."""

    def __init__(self, call: grpc.aio.UnaryStreamCall, n: int = 1) -> None:
        self._call = call
        self._accumulator = StreamAccumulator(n)
        self._cancelled = False

    def __aiter__(self) -> AsyncIterator[StreamDelta]:
        return self

    async def __anext__(self) -> StreamDelta:
        while self._accumulator.result is None:
            message = await self._next_message()
            if message is None:
                break
            delta = self._accumulator.feed(message)
            if self._accumulator.result is not None:
                await self._finish()
            if delta is not None:
                return delta
        raise StopAsyncIteration

    async def _finish(self) -> None:
        """Read the call's status after the final message, so that it ends OK, not cancelled when dropped."""
        with suppress(grpc.RpcError):  # the completion is whole already
            await self._call.read()

    async def _next_message(self) -> pb.GenerateStreamResponse | None:
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
            raise from_rpc_error(rpc_error) from None
        if message is not grpc.aio.EOF:
            return message
        if self._cancelled:
            return None
        raise Unknown("the stream ended without a final message")

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

    async def __aexit__(self, *exc_info: object) -> None:
        self.cancel()


class AsyncClient(ClientBase):
    """asyncio client: generate, stream, model_info and health, each with a deadline."""

    def _open_channel(self, config: ChannelConfig) -> grpc.aio.Channel:
        return config.aio_channel()

    async def generate(
        self,
        prompt: Prompt,
        params: GenerationParams | None = None,
        *,
        request_id: str = "",
        timeout: float | None = None,
        traceparent: str = "",
        **overrides: Unpack[ParamFields],
    ) -> GenerationResult:
        """The whole completion of `prompt` (text, or token ids); no params means greedy."""
        request = build_request(prompt, params, request_id=request_id, **overrides)
        with typed_errors():
            metadata = self._traced(traceparent)
            response = await self._stub.Generate(request, timeout=self._timeout(timeout), metadata=metadata)
        return result_from_response(response)

    def stream(
        self,
        prompt: Prompt,
        params: GenerationParams | None = None,
        *,
        request_id: str = "",
        timeout: float | None = None,
        traceparent: str = "",
        **overrides: Unpack[ParamFields],
    ) -> AsyncStream:
        """Start streaming the completion of `prompt`; iterate the returned `AsyncStream`."""
        request = build_request(prompt, params, request_id=request_id, **overrides)
        return AsyncStream(
            self._stub.GenerateStream(request, timeout=self._timeout(timeout), metadata=self._traced(traceparent)),
            completions_of(request),
        )

    async def model_info(self, *, timeout: float | None = None) -> ModelInfo:
        """The served model, its execution provider and the server's limits."""
        request = pb.GetModelInfoRequest()
        with typed_errors():
            message = await self._stub.GetModelInfo(request, timeout=self._timeout(timeout), metadata=self._metadata)
        return model_info_from_proto(message)

    async def health(self, service: str = "", *, timeout: float | None = None) -> bool:
        """True if the server reports SERVING (grpc.health.v1); False if not, or unreachable."""
        request = health_pb2.HealthCheckRequest(service=service)
        try:
            response = await self._health.Check(request, timeout=self._timeout(timeout), metadata=self._metadata)
        except grpc.RpcError:
            return False
        return response.status == health_pb2.HealthCheckResponse.SERVING

    async def close(self) -> None:
        """Close the channel; calls in flight are cancelled."""
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
