"""When a stream sends a message: fewer, fuller messages for a slow wire or a proxy.

vLLM's --stream-interval, with a time bound beside the token count: the first delta goes out at
once (time to first token is unchanged); after it, waiting deltas go out together once
`interval.tokens` tokens wait or `interval.ms` milliseconds have passed since the last message,
whichever comes first. The servicer flushes whatever waits when the generation ends, so the end
is never held back. Knows nothing of gRPC or the engine's threads; the clock is a parameter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from ...engine.domain import Delta, Final, StreamInterval


class StreamPacer:
    """One stream's waiting deltas, and whether (or how long until) they are due."""

    def __init__(self, interval: StreamInterval, clock: Callable[[], float] = time.monotonic):
        self.interval, self.clock = interval, clock
        self.waiting: list[Delta] = []
        self.tokens = 0  # tokens in `waiting`
        self.sent = 0  # messages taken so far
        self.last = clock()  # when the last message was taken

    def add(self, deltas: Iterable[Delta]) -> None:
        for delta in deltas:
            self.waiting.append(delta)
            self.tokens += len(delta.token_ids)

    def due(self) -> bool:
        """Waiting deltas should go now: the first message, enough tokens, or enough time."""
        return self.wait_s() == 0.0

    def wait_s(self) -> float | None:
        """Seconds until the waiting deltas are due (0.0: now); None: nothing waits, or only for tokens."""
        if not self.waiting:
            return None
        if self.sent == 0 or self.tokens >= self.interval.tokens:
            return 0.0
        if self.interval.ms <= 0:
            return None
        return max(0.0, self.last + self.interval.ms / 1000 - self.clock())

    def step(self, events: list[Delta | Final]) -> tuple[list[Delta], Final | None] | None:
        """One batch of engine events in; what to send now: the deltas due (maybe none) and the Final
        once it came, with whatever waited (the end is never held back); None: nothing yet."""
        self.add(event for event in events if isinstance(event, Delta))
        final = events[-1] if events and isinstance(events[-1], Final) else None
        if final is None and not self.due():
            return None
        return self.take(), final

    def take(self) -> list[Delta]:
        """The waiting deltas, to send as one message; the interval starts again."""
        deltas, self.waiting, self.tokens = self.waiting, [], 0
        self.sent += 1
        self.last = self.clock()
        return deltas
