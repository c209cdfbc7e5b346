"""The periodic stats line (`--log-stats-interval`): throughput, batch and queue, as vLLM logs one.

Every interval with traffic (tokens generated, or requests running or waiting), one INFO line:
generated tokens/s (counted per engine step), prompt tokens/s (of the requests that ended in the
interval), requests running and queued, and finishes by reason. An idle server writes nothing.
With --api-server-count, the engine's steps are counted by the first front end alone: each other's
line starts with its number and tells its own requests only (prompt tokens/s, running and queued,
finishes).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ..engine.domain import FinishReason
from .metrics import Metrics

log = logging.getLogger(__name__)


class StatsLog:
    """Reads the server's metrics every `interval` seconds and logs what changed."""

    def __init__(self, metrics: Metrics, stats: Callable[[], dict[str, int]], interval: float, front_end: int = 0):
        """`front_end`: which of --api-server-count's this server is (0: the first, which sees the steps)."""
        self.metrics, self.stats, self.interval, self.front_end = metrics, stats, interval, front_end
        self.last = self.totals()
        self.since = time.monotonic()

    def totals(self) -> dict[str, float]:
        """Counters: tokens generated (per step), prompt tokens, finishes by reason."""
        value = self.metrics.registry.get_sample_value
        out = {"generated": float(self.metrics.step_tokens), "prompt": value("attnserve_prompt_tokens_total") or 0.0}
        for reason in FinishReason:
            out[reason.value] = value("attnserve_generations_finished_total", {"reason": reason.value}) or 0.0
        return out

    def line(self) -> str | None:
        """The line for the interval since the last call, or None when nothing happened in it."""
        now, totals, stats = time.monotonic(), self.totals(), self.stats()
        seconds = max(now - self.since, 1e-9)
        change = {key: totals[key] - self.last[key] for key in totals}
        self.last, self.since = totals, now
        if not any(change.values()) and not stats["active"] and not stats["queued"]:
            return None
        finishes = ", ".join(f"{int(change[r.value])} {r.value}" for r in FinishReason if change[r.value])
        steps = f"generated {change['generated'] / seconds:,.1f} tokens/s, " if not self.front_end else ""
        return (
            f"{f'front end {self.front_end}: ' if self.front_end else ''}{steps}prompt "
            f"{change['prompt'] / seconds:,.1f} tokens/s (of requests ended); running {stats['active']}, queued "
            f"{stats['queued']}; ended in {seconds:.1f} s: {finishes or 'none'}"
        )

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            line = self.line()
            if line is not None:
                log.info("%s", line)
