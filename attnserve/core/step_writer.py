"""The engine core's outbox: each engine step's events, with the observations since the last, as one
Step message on the channel to the front end, written by the engine thread itself.

The front end knows its requests by key: a RemoteCaller is one of them here, and leaves `callers`
with its last event. With front ends more (--api-server-count), each request's events go to the
front end that sent it, a Step message each; the engine's observations (metrics of the whole engine:
batch, queue, time to first token, inter-token latency, prefix cache, speculation) go to the first
front end alone, whose metrics port serves them. No event loop in the core's process wakes per
token. No gRPC here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from ..engine.domain import GenerationRequest, ends_request
from ..engine.sequence import Caller, Event
from .channel import Channel
from .observations import Recorder
from .protocol import Step, WireEvent, to_wire

OBSERVATIONS_WAIT_S = 0.05  # the longest a step's observations wait for a Step message with events in it
FIRST = 0  # the front end that started the core: its channel carries the observations and Stop


class RemoteCaller:
    """A request of a front end's, known here by its key there."""

    __slots__ = ("cancelled", "finished", "front", "key", "request")

    def __init__(self, key: int, request: GenerationRequest, front: int = FIRST):
        self.key, self.request, self.front = key, request, front
        self.cancelled = self.finished = False

    def cancel(self) -> None:
        self.cancelled = True


class StepWriter:
    """The Outbox of the core's engine (engine/outbox.py)."""

    def __init__(self, channel: Channel, recorder: Recorder):
        self.recorder = recorder
        self.channels: dict[int, Channel] = {FIRST: channel}  # front end -> its channel; the main thread
        # replaces it whole as front ends come and go, the engine thread reads it
        self.callers: dict[tuple[int, int], RemoteCaller] = {}  # (front end, key) -> request not yet finished

    def caller(self, key: int, request: GenerationRequest, front: int = FIRST) -> RemoteCaller:
        """The caller of a Submit (the core's main thread)."""
        caller = self.callers[front, key] = RemoteCaller(key, request, front)
        return caller

    def join(self, front: int, channel: Channel) -> None:
        """A front end more connected (the main thread)."""
        self.channels = {**self.channels, front: channel}

    def leave(self, front: int) -> list[RemoteCaller]:
        """A front end more is gone (the main thread): no Step goes to it again; its requests not finished."""
        self.channels = {index: channel for index, channel in self.channels.items() if index != front}
        return self.callers_of(front)

    def callers_of(self, front: int) -> list[RemoteCaller]:
        """The requests of front end `front` not yet finished."""
        return [caller for (index, _), caller in list(self.callers.items()) if index == front]

    def deliver(self, events: list[tuple[Caller, Event]], counts: Callable[[], dict[str, int]]) -> None:
        """A step with no event (every request holds its tokens for its stream interval, or only for its
        end) sends nothing unless its observations have waited OBSERVATIONS_WAIT_S or the engine is idle."""
        stats = counts()
        active = stats["active"]
        recorder = self.recorder
        due = bool(recorder.seen) and (not (active or stats["queued"]) or recorder.age() >= OBSERVATIONS_WAIT_S)
        if not events and not due:
            return
        channels = self.channels
        if len(channels) == 1:
            wire = [(self._key(caller, event), to_wire(event)) for caller, event in events]
            self._send(channels[FIRST], Step(wire, recorder.take(), active))
            return
        fronts: dict[int, list[tuple[int, WireEvent]]] = {FIRST: []}
        for caller, event in events:  # RemoteCallers: the core's engine has no other
            front = caller.front  # type: ignore[attr-defined]
            fronts.setdefault(front, []).append((self._key(caller, event), to_wire(event)))
        # a request that ends takes the observations to the first front end, whoever's it was: the last
        # step before the engine idles leaves none behind
        due = due or (bool(recorder.seen) and any(ends_request(event) for _, event in events))
        for front, wire in fronts.items():
            channel = channels.get(front)
            if channel is None or not (wire or (front == FIRST and due)):
                continue
            self._send(channel, Step(wire, recorder.take() if front == FIRST else [], active))

    @staticmethod
    def _send(channel: Channel, step: Step) -> None:
        with contextlib.suppress(OSError):  # the front end is gone: the main thread sees the channel close
            channel.send(step)

    def _key(self, caller: Any, event: Event) -> int:
        """The caller's key; a request whose last event this is leaves `callers`."""
        if ends_request(event):
            caller.finished = True
            self.callers.pop((caller.front, caller.key), None)
        return caller.key
