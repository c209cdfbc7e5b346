"""When a burst runs ahead: its next decode step computing while the engine takes the last one's tokens.

A runner that runs ahead (runtime/run_ahead.py) runs a burst's steps on a thread of its own, one step
ahead of the engine, so that the engine's own work on a step (its requests' tokens, text, stops and
events) overlaps the model's next step instead of following it. What it gains is that work's time; what
it costs is two threads' hand-offs a step (a thread woken, the GIL passed). Measured on a 2-core CPU, the
engine in one process with a core to itself (docs/reports/run-ahead.md): it pays where the engine hands
on at least a token a step (1, 4 and 16 streams at interval 1: 1.12-1.13x; 16 at interval 8: 1.07x) and
loses where it hands on less (1 or 4 streams at interval 8, unary calls: 0.94-0.98x; 16 unary calls
gained 1.02x, not taken). `auto` runs a burst ahead where its requests take a token a step or more
between them (each its share: a stream 1 / its interval, a request with stop strings every token, a
unary call none until its end); `on` always; `off` never. The runner runs ahead only where it may:
`--run-ahead on`, or auto on the CPU where the engine's thread has a core to itself (runtime/run_ahead.spare_core;
not on a GPU, where an H200 measured no gain served).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

MODES = ("auto", "on", "off")


class Taking(Protocol):
    def takes_per_step(self) -> float:
        """Its tokens the engine takes a step, in a burst (sequence.Sequence)."""
        ...


def runs_ahead(mode: str, batch: Iterable[Taking]) -> bool:
    """Whether a burst of `batch` runs ahead under --run-ahead `mode`."""
    if mode != "auto":
        return mode == "on"
    return sum(each.takes_per_step() for each in batch) >= 1
