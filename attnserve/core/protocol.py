"""What the front end and the engine core say to each other: msgpack messages (msgspec Structs).

Front end -> core: Submit a request under the front end's key, Cancel a key
(the caller went away, a slow reader was cut), Abort (drain timeout: every request of that front
end's), Stop (the first front end's alone: the one that started the core).
Core -> front end: Ready once the model is loaded (or Failed, with the error's
kind and its one-line message), then one Step message per engine step that produced anything:
every request's events of that step, the step's metric observations (observations.py), and the
core's active count. channel.py carries them.

The domain's dataclasses travel as themselves where msgspec can type them (GenerationRequest);
events are tagged Structs here, so that one union decodes them. No gRPC, no ONNX Runtime.
"""

from __future__ import annotations

import msgspec

from ..engine.domain import (
    Delta,
    Draining,
    Final,
    FinishReason,
    GenerationRequest,
    QueueFull,
    Timings,
    TokenLogprob,
    Usage,
)
from .observations import Observation


class Submit(msgspec.Struct, tag=True):
    key: int
    request: GenerationRequest


class SubmitTogether(msgspec.Struct, tag=True):
    """Requests the engine queues at once (Engine.submit_together): one step boundary admits them all."""

    submits: list[Submit]


class Cancel(msgspec.Struct, tag=True):
    key: int


class Abort(msgspec.Struct, tag=True):
    pass


class Stop(msgspec.Struct, tag=True):
    pass


Inbound = Submit | SubmitTogether | Cancel | Abort | Stop


class Ready(msgspec.Struct, tag=True):
    """The core has its session and arena: the facts the front end cannot read from the directory."""

    provider: str  # the execution provider the session really got
    capacity: int  # KV arena slots (--max-batch, or what auto found)
    kv_cache_bytes: int
    provider_note: str = ""  # why it is not the one asked for
    prefix_cache_bytes: int = 0  # the prefix cache's pool (0: off)
    threads: int = 0  # the session's intra-op threads (0: not said)
    pid: int = 0  # the core's process (a front end more did not start it: --api-server-count)


class Failed(msgspec.Struct, tag=True):
    """Start-up failed: `kind` names the error class (ModelDirError, ProviderError, StartupError); any
    other exception comes as a StartupError whose one-line message starts with its class."""

    kind: str
    message: str


WireLogprobs = tuple[tuple[int, float, tuple[tuple[int, float], ...], int], ...]  # TokenLogprob's fields, each


class DeltaEvent(msgspec.Struct, tag=True, array_like=True):
    token_ids: tuple[int, ...]
    text: str
    logprobs: WireLogprobs = ()
    index: int = 0


class FinalEvent(msgspec.Struct, tag=True, array_like=True):
    reason: str
    text: str
    prompt_tokens: int
    completion_tokens: int
    queue_ms: float
    time_to_first_token_ms: float
    total_ms: float
    prompt_logprobs: WireLogprobs = ()
    index: int = 0
    remaining: int = 0
    cached_tokens: int = 0
    score: float | None = None
    speculated: tuple[int, int] | None = None


class ErrorEvent(msgspec.Struct, tag=True, array_like=True):
    """The request was refused (QueueFull, Draining) or a run failed under it (an internal error)."""

    kind: str  # the exception's class name
    message: str


WireEvent = DeltaEvent | FinalEvent | ErrorEvent


class Step(msgspec.Struct, tag=True):
    events: list[tuple[int, WireEvent]]  # (key, event), in the order the engine emitted them
    observations: list[Observation]  # the engine's reports since the last Step (observations.py)
    active: int  # requests in the batch or its prefill (the front end counts the rest in flight itself)


Outbound = Ready | Failed | Step


def wire_logprobs(logprobs: tuple[TokenLogprob, ...]) -> WireLogprobs:
    return tuple((p.token_id, p.logprob, p.top, p.rank) for p in logprobs)


def domain_logprobs(wire: WireLogprobs) -> tuple[TokenLogprob, ...]:
    return tuple(
        TokenLogprob(token, logprob, tuple((i, p) for i, p in top), rank) for token, logprob, top, rank in wire
    )


def to_wire(event: Delta | Final | Exception) -> WireEvent:
    if isinstance(event, Delta):
        return DeltaEvent(event.token_ids, event.text, wire_logprobs(event.logprobs), event.index)
    if isinstance(event, Final):
        usage, t = event.usage, event.timings
        return FinalEvent(
            event.reason.value,
            event.text,
            usage.prompt_tokens,
            usage.completion_tokens,
            t.queue_ms,
            t.time_to_first_token_ms,
            t.total_ms,
            wire_logprobs(event.prompt_logprobs),
            event.index,
            event.remaining,
            usage.cached_tokens,
            event.score,
            event.speculated,
        )
    return ErrorEvent(type(event).__name__, str(event))


def from_wire(event: WireEvent) -> Delta | Final | Exception:
    if isinstance(event, DeltaEvent):
        return Delta(tuple(event.token_ids), event.text, domain_logprobs(event.logprobs), event.index)
    if isinstance(event, FinalEvent):
        return Final(
            FinishReason(event.reason),
            event.text,
            Usage(event.prompt_tokens, event.completion_tokens, event.cached_tokens),
            Timings(event.queue_ms, event.time_to_first_token_ms, event.total_ms),
            domain_logprobs(event.prompt_logprobs),
            event.index,
            event.remaining,
            event.score,
            None if event.speculated is None else (event.speculated[0], event.speculated[1]),
        )
    refusal = REFUSALS.get(event.kind)
    return refusal(event.message) if refusal else RuntimeError(f"{event.kind}: {event.message}")


REFUSALS = {"QueueFull": QueueFull, "Draining": Draining}
INBOUND_DECODER = msgspec.msgpack.Decoder(Inbound)
OUTBOUND_DECODER = msgspec.msgpack.Decoder(Outbound)
