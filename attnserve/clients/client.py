"""`Client`: the blocking Python client of an attnserve server (or of several, round_robin).

    with Client("127.0.0.1:50051") as client:
        print(client.generate("def parse_args(", max_new_tokens=32).text)
        with client.stream("import ") as stream:
            for delta in stream:
                print(delta.text, end="", flush=True)
        client.generate([256, 105, 109], max_new_tokens=8)   # token ids, sent as given

A prompt is text (str), which the server's tokenizer encodes, or a sequence of token ids in
[0, model_info().tokenizer.vocab_size), used exactly as given. Every call has a deadline (the
client's `timeout`, or the call's own), failures raise the typed errors of `errors.py`, and
only calls no server began are retried. The asyncio twin is `AsyncClient` in `aio.py`; both
convert messages with `types.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnserve.protos.attnserve.v1 import generation_pb2 as pb
from attnserve.protos.attnserve.v1.generation_pb2_grpc import TextGenerationStub

from .channel import DEFAULT_TARGET, ChannelConfig, TlsConfig
from .errors import AttnserveError, Unknown, from_rpc_error
from .retry import Deadline, RetryPolicy, call_with_retry, next_delay
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

DEFAULT_TIMEOUT = 60.0  # seconds; a generation of a few hundred tokens on CPU fits


def _wait(future: grpc.Future):
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

    def __init__(self, start: Callable[[float], grpc.Call], retry: RetryPolicy, deadline: Deadline) -> None:
        self._start, self._retry, self._deadline = start, retry, deadline
        self._accumulator = StreamAccumulator()
        self._attempt = 1
        self._cancelled = False
        self._call = start(deadline.remaining())

    def __iter__(self) -> Iterator[StreamDelta]:
        return self

    def __next__(self) -> StreamDelta:
        while self._accumulator.result is None:
            message = self._next_message()
            if message is None:
                break
            delta = self._accumulator.feed(message)
            if delta is not None:
                return delta
        raise StopIteration

    def _next_message(self) -> pb.GenerateStreamResponse | None:
        while True:
            try:
                return next(self._call)
            except StopIteration:
                if self._cancelled:
                    return None
                raise Unknown("the stream ended without a final message") from None
            except grpc.RpcError as rpc_error:
                if self._cancelled:
                    return None
                error = from_rpc_error(rpc_error)
            self._retry_or_raise(error)

    def _retry_or_raise(self, error: AttnserveError) -> None:
        """Start the call again if it failed before any message; otherwise raise."""
        delay = next_delay(self._retry, self._attempt, error, self._deadline)
        if delay is None or self._accumulator.messages:
            raise error
        time.sleep(delay)
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

    def result(self) -> GenerationResult:
        """Consume the remaining deltas and return the whole completion."""
        for _ in self:
            pass
        assert self._accumulator.result is not None  # set by the final message or by cancel()
        return self._accumulator.result

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc_info) -> None:
        self.cancel()


class Client:
    """Blocking client: generate, stream, model_info and health, each with a deadline."""

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
        self._channel = self.config.sync_channel()
        self._stub = TextGenerationStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def _deadline(self, timeout: float | None) -> Deadline:
        return Deadline(self.timeout if timeout is None else timeout)

    def generate(
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
        response = call_with_retry(
            lambda left: _wait(self._stub.Generate.future(request, timeout=left, metadata=self._metadata)),
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
    ) -> Stream:
        """Start streaming the completion of `prompt`; iterate the returned `Stream`."""
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
        return Stream(
            lambda left: self._stub.GenerateStream(request, timeout=left, metadata=self._metadata),
            self.retry,
            self._deadline(timeout),
        )

    def model_info(self, *, timeout: float | None = None) -> ModelInfo:
        """The served model, its execution provider and the server's limits."""
        message = call_with_retry(
            lambda left: _wait(
                self._stub.GetModelInfo.future(pb.GetModelInfoRequest(), timeout=left, metadata=self._metadata)
            ),
            self.retry,
            self._deadline(timeout),
        )
        return model_info_from_proto(message)

    def health(self, service: str = "", *, timeout: float | None = None) -> bool:
        """True if the server reports SERVING (grpc.health.v1); False if not, or unreachable."""
        request = health_pb2.HealthCheckRequest(service=service)
        try:
            response = self._health.Check(request, timeout=self._deadline(timeout).remaining(), metadata=self._metadata)
        except grpc.RpcError:
            return False
        return response.status == health_pb2.HealthCheckResponse.SERVING

    def close(self) -> None:
        """Close the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
