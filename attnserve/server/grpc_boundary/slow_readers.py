"""Clients that stop reading their stream: the write timeout.

HTTP/2 flow control makes a write wait while the client's window is full, so a client that
stops reading (stalled, or hostile) leaves its call stuck in a write. WriteWatch notes when each
streaming call's write began; a watchdog, once every quarter of --write-timeout, cancels calls
whose write has waited longer, and the write raises SlowReader there: the call ends CANCELLED,
its request's slot is released, and what it held is freed. (The other bound, on events decoded
but not yet written, is the Handle's buffer cap in sequence.py.) One check per write, two dict
operations; no timer per message. Knows nothing of the services.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ...engine.domain import SlowReader

log = logging.getLogger(__name__)


class WriteWatch:
    """Times the writes of streaming calls; `run()` is the watchdog that cuts stuck ones."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.writing: dict[asyncio.Task, float] = {}  # call's task -> when its pending write began
        self.expired: set[asyncio.Task] = set()
        self.cut = 0  # calls ended by the timeout so far

    async def write(self, context, message) -> None:
        """context.write(message); raises SlowReader if the watchdog cuts it."""
        task = asyncio.current_task()
        assert task is not None, "writes happen in a call's task"
        self.writing[task] = time.monotonic()
        try:
            await context.write(message)
        except asyncio.CancelledError:
            if task not in self.expired:
                raise  # the client cancelled, or the server stops
            self.expired.discard(task)
            if hasattr(task, "uncancel"):  # Python 3.11+: this cancellation is handled here
                task.uncancel()
            raise SlowReader(
                f"the client read nothing for {self.timeout_s:g} s (--write-timeout); the stream is cancelled"
            ) from None
        finally:
            self.writing.pop(task, None)

    def check(self, now: float) -> None:
        """Cancel the calls whose write began more than the timeout before `now`."""
        for task, since in list(self.writing.items()):
            if now - since > self.timeout_s and task not in self.expired:
                self.expired.add(task)
                self.cut += 1
                log.warning("a stream's write waited %.1f s (--write-timeout): cancelling it", now - since)
                task.cancel()

    async def run(self) -> None:
        """The watchdog: checks four times per timeout until cancelled."""
        while True:
            await asyncio.sleep(self.timeout_s / 4)
            self.check(time.monotonic())
