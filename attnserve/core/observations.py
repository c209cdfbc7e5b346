"""The engine's observations, recorded in the engine core's process and replayed in the front end's.

Metrics live in the front end. The core's engine reports to a Recorder, which keeps each report as
a typed observation (a msgspec Struct that travels in the Step message, core/protocol.py); the
front end's receiver applies each to its own EngineObserver with `apply`. A finish is not one of
them: its Final is among the step's events, and the front end counts it from there. No sockets here.
"""

from __future__ import annotations

import time

import msgspec

from ..engine.domain import Final, GenerationRequest
from ..engine.engine import EngineObserver


class StepSeen(msgspec.Struct, tag=True, array_like=True):
    batch_size: int
    queue_depth: int

    def apply(self, observer: EngineObserver) -> None:
        observer.on_step(self.batch_size, self.queue_depth)


class TokensSeen(msgspec.Struct, tag=True, array_like=True):
    first: list[float]
    inter: list[float]

    def apply(self, observer: EngineObserver) -> None:
        observer.on_tokens(self.first, self.inter)


class PrefixSeen(msgspec.Struct, tag=True, array_like=True):
    hits: int
    misses: int
    saved: int
    held_bytes: int

    def apply(self, observer: EngineObserver) -> None:
        observer.on_prefix_cache(self.hits, self.misses, self.saved, self.held_bytes)


class SpeculationSeen(msgspec.Struct, tag=True, array_like=True):
    proposed: int
    accepted: int

    def apply(self, observer: EngineObserver) -> None:
        observer.on_speculation(self.proposed, self.accepted)


class SpansDropped(msgspec.Struct, tag=True, array_like=True):
    count: int

    def apply(self, observer: EngineObserver) -> None:
        observer.on_spans_dropped(self.count)


Observation = StepSeen | TokensSeen | PrefixSeen | SpeculationSeen | SpansDropped


class Recorder(EngineObserver):
    """The engine's observations since the last Step message; it overrides every hook, so that a new one
    is carried or declined here, not dropped by inheritance (tests/test_core_protocol.py)."""

    def __init__(self) -> None:
        self.seen: list[Observation] = []
        self.since = 0.0  # when the oldest of `seen` was recorded (perf_counter)

    def age(self) -> float:
        """Seconds the oldest observation not yet taken has waited (0 with none)."""
        return time.perf_counter() - self.since if self.seen else 0.0

    def on_step(self, batch_size: int, queue_depth: int) -> None:
        self.record(StepSeen(batch_size, queue_depth))

    def on_tokens(self, first: list[float], inter: list[float]) -> None:
        self.record(TokensSeen(first, inter))

    def on_prefix_cache(self, hits: int, misses: int, saved: int, held_bytes: int) -> None:
        self.record(PrefixSeen(hits, misses, saved, held_bytes))

    def on_speculation(self, proposed: int, accepted: int) -> None:
        self.record(SpeculationSeen(proposed, accepted))

    def on_spans_dropped(self, count: int) -> None:
        self.record(SpansDropped(count))

    def on_submit(self, request: GenerationRequest) -> None:
        """Not carried: the front end counts a submit as it sends it (the core's engine sees none)."""

    def on_finish(self, final: Final, request: GenerationRequest | None = None) -> None:
        """Not carried: the Final is among the step's events, and the front end counts it from there."""

    def record(self, observation: Observation) -> None:
        if not self.seen:
            self.since = time.perf_counter()
        self.seen.append(observation)

    def take(self) -> list[Observation]:
        seen, self.seen = self.seen, []
        return seen
