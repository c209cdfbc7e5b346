"""TEST ONLY: a brake on every engine step, so that a test outside the server's process finds
generations still running. The engine core reads it from its own environment wherever it runs (a
thread of the server, its own process, a Ray Serve replica): $ATTNSERVE_TEST_STEP_DELAY_MS, which
server/test_switches.py names too, beside the server's other test switch (a test binds the two).
No product signature carries it."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping

from ..engine.engine import EngineObserver, ForwardingObserver
from .loading import StartupError

log = logging.getLogger(__name__)

STEP_DELAY_VARIABLE = "ATTNSERVE_TEST_STEP_DELAY_MS"


class SlowSteps(ForwardingObserver):
    """Every engine step with a batch sleeps `ms` after reporting to `inner`."""

    def __init__(self, inner: EngineObserver, ms: int):
        super().__init__(inner)
        self.seconds = ms / 1000.0

    def on_step(self, batch_size: int, queue_depth: int) -> None:
        self.inner.on_step(batch_size, queue_depth)
        if batch_size:
            time.sleep(self.seconds)


def step_delay_ms(environ: Mapping[str, str] = os.environ) -> int:
    """$ATTNSERVE_TEST_STEP_DELAY_MS, a whole number of ms (0 where unset); StartupError naming it."""
    text = environ.get(STEP_DELAY_VARIABLE, "0")
    if not text.isdigit():
        raise StartupError(f"${STEP_DELAY_VARIABLE} must be a number of ms, not {text!r}")
    return int(text)


def slowed(observer: EngineObserver, ms: int) -> EngineObserver:
    """`observer`, slowed by `ms` a step where a test asked for it (step_delay_ms)."""
    if not ms:
        return observer
    log.warning("TEST ONLY: every engine step sleeps %d ms ($%s)", ms, STEP_DELAY_VARIABLE)
    return SlowSteps(observer, ms)
