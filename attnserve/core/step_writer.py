"""The engine core's outbox: each engine step's events, with the observations since the last, as one
Step message on the channel to the front end, written by the engine thread itself.

The front end knows its requests by key: a RemoteCaller is one of them here, and leaves `callers`
with its last event. No event loop in the core's process wakes per token. No gRPC here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from ..engine.domain import GenerationRequest, ends_request
from ..engine.sequence import Caller, Event
from .channel import Channel
from .observations import Recorder
from .protocol import Step, to_wire

OBSERVATIONS_WAIT_S = 0.05  # the longest a step's observations wait for a Step message with events in it


class RemoteCaller:
    """A request of the front end's, known here by its key."""

    __slots__ = ("cancelled", "finished", "key", "request")

    def __init__(self, key: int, request: GenerationRequest):
        self.key, self.request = key, request
        self.cancelled = self.finished = False

    def cancel(self) -> None:
        self.cancelled = True


class StepWriter:
    """The Outbox of the core's engine (engine/outbox.py)."""

    def __init__(self, channel: Channel, recorder: Recorder):
        self.channel, self.recorder = channel, recorder
        self.callers: dict[int, RemoteCaller] = {}  # key -> request not yet finished

    def caller(self, key: int, request: GenerationRequest) -> RemoteCaller:
        """The caller of a Submit (the core's main thread)."""
        caller = self.callers[key] = RemoteCaller(key, request)
        return caller

    def deliver(self, events: list[tuple[Caller, Event]], counts: Callable[[], dict[str, int]]) -> None:
        """A step with no event (every request holds its tokens for its stream interval, or only for its
        end) sends nothing unless its observations have waited OBSERVATIONS_WAIT_S or the engine is idle."""
        stats = counts()
        active = stats["active"]
        if not events:
            busy = active or stats["queued"]
            if not self.recorder.seen or (busy and self.recorder.age() < OBSERVATIONS_WAIT_S):
                return
        wire = [(self._key(caller, event), to_wire(event)) for caller, event in events]
        with contextlib.suppress(OSError):  # the front end is gone: the main thread sees the channel close
            self.channel.send(Step(wire, self.recorder.take(), active))

    def _key(self, caller: Any, event: Event) -> int:
        """The caller's key; a request whose last event this is leaves `callers`."""
        if ends_request(event):
            caller.finished = True
            self.callers.pop(caller.key, None)
        return caller.key
