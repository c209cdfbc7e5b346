"""One request's run through the engine, as every door drives it: submit, then the engine's events in
batches until the Final one, the slot released however the caller stops; a stream's messages paced
per completion; a unary call's completions gathered whole. No gRPC, no HTTP: a door writes the
events in its own protocol's words.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace

from ...engine.domain import DeadlineExceeded, Delta, Final, FinishReason, GenerationRequest, TokenLogprob, ends_request
from ...engine.engine import EngineCalls
from .pacing import StreamPacer


async def generation_events(
    engine: EngineCalls,
    generation: GenerationRequest,
    announce: Callable[[], Awaitable[None]] | None = None,
    wait_s: Callable[[], float | None] = lambda: None,
) -> AsyncGenerator[list[Delta | Final], None]:
    """Submit, then yield the engine's events in batches until the Final one (errors are raised).

    `announce` runs once the request is accepted (attnserve.v1 sends the request id in its initial
    metadata). An empty batch means `wait_s()` seconds passed with no event (a paced stream's time
    bound). The request's slot is released however the caller stops (close the generator: `aclosing`)."""
    handle = engine.submit(generation)
    try:
        if announce is not None:
            await announce()
        while True:
            events: list[Delta | Final] = []
            for event in await handle.next_events(wait_s()):
                if isinstance(event, Exception):
                    raise event
                if isinstance(event, Final) and event.reason == FinishReason.DEADLINE:
                    raise DeadlineExceeded(
                        f"the deadline passed after {event.usage.completion_tokens} tokens "
                        f"({event.timings.total_ms:.0f} ms)"
                    )
                events.append(event)
            yield events
            if events and ends_request(events[-1]):
                return
    finally:
        engine.release(handle)


def pacers_for(generation: GenerationRequest) -> tuple[list[StreamPacer], Callable[[], float | None]]:
    """One pacer per completion of a streamed request, and how long the soonest of them may wait."""
    assert generation.interval is not None, "a streamed request has its stream interval"
    pacers = [StreamPacer(generation.interval) for _ in range(generation.n)]
    waits = lambda: min((w for w in (p.wait_s() for p in pacers) if w is not None), default=None)
    return pacers, waits


async def paced(
    batches: AsyncIterator[list[Delta | Final]], pacers: list[StreamPacer]
) -> AsyncIterator[tuple[int, list[Delta], Final | None]]:
    """The messages a stream sends, from the engine's batches of events: (completion index, the deltas
    due, its Final once it came), each completion paced by its own pacer."""
    async for events in batches:
        for index, pacer in enumerate(pacers):
            send = pacer.step([e for e in events if e.index == index])
            if send is not None:
                yield (index, *send)


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
    done = [Completed() for _ in range(generation.n)]
    generation = replace(generation, interval=None)
    async with aclosing(generation_events(engine, generation)) as batches:
        async for events in batches:
            for event in events:
                one = done[event.index]
                one.text += event.text
                if isinstance(event, Delta):
                    one.token_ids += event.token_ids
                    one.logprobs += event.logprobs
                else:
                    one.final = event
    assert all(one.final is not None for one in done), "the engine ends every completion with a Final event"
    return done
