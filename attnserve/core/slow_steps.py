"""TEST ONLY: an observer that slows every engine step, so that a test outside the server's process
finds generations still running ($ATTNSERVE_TEST_STEP_DELAY_MS: server/test_switches.py)."""

from __future__ import annotations

import time

from ..engine.engine import EngineObserver, ForwardingObserver


class SlowSteps(ForwardingObserver):
    """Every engine step with a batch sleeps `ms` after reporting to `inner`."""

    def __init__(self, inner: EngineObserver, ms: int):
        super().__init__(inner)
        self.seconds = ms / 1000.0

    def on_step(self, batch_size: int, queue_depth: int) -> None:
        self.inner.on_step(batch_size, queue_depth)
        if batch_size:
            time.sleep(self.seconds)


def slowed(observer: EngineObserver, ms: int) -> EngineObserver:
    """`observer`, slowed by `ms` a step where a test asked for it."""
    return SlowSteps(observer, ms) if ms else observer
