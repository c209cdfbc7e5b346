"""`Client`: the blocking Python client of an attnserve server (or of several, round_robin).

    with Client("127.0.0.1:50051") as client:
        print(client.generate("def parse_args(", max_new_tokens=32).text)
        with client.stream("import ") as stream:
            for delta in stream:
                print(delta.text, end="", flush=True)
        client.generate([256, 105, 109], max_new_tokens=8)   # token ids, sent as given

A prompt is text (str), which the server's tokenizer encodes, or a sequence of token ids in
[0, model_info().tokenizer.vocab_size), used exactly as given. How to decode is one
`GenerationParams` (`client.generate(prompt, params)`), or keyword arguments that override its
fields. Every call has a deadline (the client's `timeout`, or the call's own), failures raise
the typed errors of `errors.py`, and gRPC retries only calls no server began (`retry.py`). The
asyncio twin is `AsyncClient` in `aio.py`; both convert messages with `types.py`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import grpc

from attnserve.health.v1 import health_pb2, health_pb2_grpc
from attnserve.v1 import generation_pb2 as pb
from attnserve.v1.generation_pb2_grpc import TextGenerationStub

from .channel import DEFAULT_TARGET, ChannelConfig, TlsConfig
from .errors import Unknown, from_rpc_error, typed_errors
from .retry import RetryPolicy, check_timeout
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

DEFAULT_TIMEOUT = 60.0  # seconds; a generation of a few hundred tokens on CPU fits


def _wait(future: grpc.Future) -> Any:
    """The future's result; Ctrl-C while waiting cancels the call on the server too."""
    try:
        return future.result()
    except KeyboardInterrupt:
        future.cancel()
        raise


class Stream:
    """Iterator of `StreamDelta`s of one GenerateStream call.

    `cancel()` (from any thread) ends the call on the server, which frees its batch slot; the
    iteration then stops. `result()` drains what is left and returns the whole completion.
    """

    def __init__(self, call: grpc.Call, n: int = 1) -> None:  # also the iterator of its messages
        self._call = call
        self._accumulator = StreamAccumulator(n)
        self._cancelled = False

    def __iter__(self) -> Iterator[StreamDelta]:
        return self

    def __next__(self) -> StreamDelta:
        while self._accumulator.result is None:
            message = self._next_message()
            if message is None:
                break
            delta = self._accumulator.feed(message)
            if self._accumulator.result is not None:
                self._finish()
            if delta is not None:
                return delta
        raise StopIteration

    def _finish(self) -> None:
        """Read the call's status after the final message, so that it ends OK, not cancelled when dropped."""
        with suppress(grpc.RpcError, StopIteration):  # the completion is whole already
            next(self._call)

    def _next_message(self) -> pb.GenerateStreamResponse | None:
        try:
            return next(self._call)
        except StopIteration:
            if self._cancelled:
                return None
            raise Unknown("the stream ended without a final message") from None
        except grpc.RpcError as rpc_error:
            if self._cancelled:
                return None
            raise from_rpc_error(rpc_error) from None

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

    def result(self) -> GenerationResult:
        """Consume the remaining deltas and return the whole completion."""
        for _ in self:
            pass
        assert self._accumulator.result is not None  # set by the final message or by cancel()
        return self._accumulator.result

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cancel()


class ClientBase:
    """What Client and AsyncClient share: the channel's configuration, stubs and deadlines."""

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
        self.config = ChannelConfig(target, tls, token, tuple(options), retry, timeout)
        self.timeout = timeout
        self.retry = retry
        self._metadata = self.config.metadata()
        self._channel = self._open_channel(self.config)
        self._stub = TextGenerationStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def _open_channel(self, config: ChannelConfig) -> Any:
        raise NotImplementedError

    def _timeout(self, timeout: float | None) -> float:
        return check_timeout(self.timeout if timeout is None else timeout)

    def _traced(self, traceparent: str) -> tuple[tuple[str, str], ...]:
        """The call's metadata: the channel's, and a W3C `traceparent` the server's trace continues."""
        return (*self._metadata, ("traceparent", traceparent)) if traceparent else tuple(self._metadata)


class Client(ClientBase):
    """Blocking client: generate, stream, model_info and health, each with a deadline."""

    def _open_channel(self, config: ChannelConfig) -> grpc.Channel:
        return config.sync_channel()

    def generate(
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
        future = self._stub.Generate.future(request, timeout=self._timeout(timeout), metadata=self._traced(traceparent))
        with typed_errors():
            return result_from_response(_wait(future))

    def stream(
        self,
        prompt: Prompt,
        params: GenerationParams | None = None,
        *,
        request_id: str = "",
        timeout: float | None = None,
        traceparent: str = "",
        **overrides: Unpack[ParamFields],
    ) -> Stream:
        """Start streaming the completion of `prompt`; iterate the returned `Stream`."""
        request = build_request(prompt, params, request_id=request_id, **overrides)
        return Stream(
            self._stub.GenerateStream(request, timeout=self._timeout(timeout), metadata=self._traced(traceparent)),
            completions_of(request),
        )

    def model_info(self, *, timeout: float | None = None) -> ModelInfo:
        """The served model, its execution provider and the server's limits."""
        request = pb.GetModelInfoRequest()
        future = self._stub.GetModelInfo.future(request, timeout=self._timeout(timeout), metadata=self._metadata)
        with typed_errors():
            return model_info_from_proto(_wait(future))

    def health(self, service: str = "", *, timeout: float | None = None) -> bool:
        """True if the server reports SERVING (grpc.health.v1); False if not, or unreachable."""
        request = health_pb2.HealthCheckRequest(service=service)
        try:
            response = self._health.Check(request, timeout=self._timeout(timeout), metadata=self._metadata)
        except grpc.RpcError:
            return False
        return response.status == health_pb2.HealthCheckResponse.SERVING

    def close(self) -> None:
        """Close the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
