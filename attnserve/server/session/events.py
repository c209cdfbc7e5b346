"""One request's run through the engine, as every door drives it: submit, then the engine's events in
batches until the Final one, the slot released however the caller stops; a stream's messages, one
per completion per batch; a unary call's completions gathered whole. The stream interval is the
engine's alone (engine/sequence.py holds each completion's tokens until a Delta falls due, on the
engine's clock, in the engine core's process): whatever comes here is due. No gRPC, no HTTP: a door
writes the events in its own protocol's words.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace

from ...engine.domain import DeadlineExceeded, Delta, Final, FinishReason, GenerationRequest, TokenLogprob, ends_request
from ...engine.engine import EngineCalls
from ...tracing.current import current


async def generation_events(
    engine: EngineCalls,
    generation: GenerationRequest,
    announce: Callable[[], Awaitable[None]] | None = None,
) -> AsyncGenerator[list[Delta | Final], None]:
    """Submit, then yield the engine's events in batches until the Final one (errors are raised).

    `announce` runs once the request is accepted (attnserve.v1 sends the request id in its initial
    metadata). The call's trace (tracing/current.py) marks validation's end and each Final, and the
    request carries its context to the engine core.

    The request's slot is released however the caller stops (close the generator: `aclosing`)."""
    trace = current()  # the call's, taken in its door's task (a stream's body may be written from another)
    handle = engine.submit(trace.submitting(generation))
    try:
        if announce is not None:
            await announce()
        while True:
            events: list[Delta | Final] = []
            for event in await handle.next_events():
                if isinstance(event, Exception):
                    raise event
                if isinstance(event, Final):
                    if event.reason == FinishReason.DEADLINE:
                        raise DeadlineExceeded(
                            f"the deadline passed after {event.usage.completion_tokens} tokens "
                            f"({event.timings.total_ms:.0f} ms)"
                        )
                    trace.finished(event)
                events.append(event)
            yield events
            if events and ends_request(events[-1]):
                return
    finally:
        engine.release(handle)


async def messages(
    batches: AsyncIterator[list[Delta | Final]],
) -> AsyncIterator[tuple[int, list[Delta], Final | None]]:
    """The messages a stream sends, from the engine's batches of events: per batch, one for each
    completion with events in it, in index order: (its index, its deltas, its Final once it came)."""
    async for events in batches:
        for index in sorted({event.index for event in events}):
            mine = [event for event in events if event.index == index]
            final = mine[-1] if isinstance(mine[-1], Final) else None
            yield index, [event for event in mine if isinstance(event, Delta)], final


@dataclass
class Completed:
    """One completion of a request, whole: its text, token ids, the tokens' logprobs and its Final."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    final: Final | None = None

    @property
    def end(self) -> Final:
        assert self.final is not None, "completions() returns completions that ended"
        return self.final


async def completions(engine: EngineCalls, generation: GenerationRequest) -> list[Completed]:
    """Every completion of the request, whole, in index order (errors are raised). The engine hands the
    deltas on with each Final (interval None): nobody reads them before."""
    done: dict[int, Completed] = {}  # n of them, or a beam search's hypotheses (fewer, where it kept fewer)
    generation = replace(generation, interval=None)
    async with aclosing(generation_events(engine, generation)) as batches:
        async for events in batches:
            for event in events:
                one = done.setdefault(event.index, Completed())
                one.text += event.text
                if isinstance(event, Delta):
                    one.token_ids += event.token_ids
                    one.logprobs += event.logprobs
                else:
                    one.final = event
    assert all(one.final is not None for one in done.values()), "the engine ends every completion with a Final event"
    return [done[index] for index in sorted(done)]
