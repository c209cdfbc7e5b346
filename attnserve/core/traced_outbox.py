"""The engine's outbox with tracing on: each step's events handed on first, then the engine core's
spans of every traced request that ended in the step (tracing/core_spans.py), on the engine thread,
once a request, never a token. With tracing off the engine has no such outbox: nothing is looked at.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..engine.domain import Delta, Final, ends_request
from ..engine.outbox import Outbox
from ..engine.sequence import Caller, Event

if TYPE_CHECKING:
    from ..tracing.core_spans import CoreSpans


class TracedOutbox:
    """`inner`'s deliveries, then `spans` of the traced requests that ended; `report_drops(n)` is told
    of spans the core's export dropped since it last was (a core in a process of its own)."""

    def __init__(self, inner: Outbox, spans: CoreSpans, report_drops: Callable[[int], None] | None = None):
        self.inner, self.spans, self.report_drops = inner, spans, report_drops
        self.tokens: dict[int, int] = {}  # id(caller) -> completion tokens of its earlier Finals (n > 1)
        self.dropped = 0  # as last reported

    def deliver(self, events: list[tuple[Caller, Event]], counts: Callable[[], dict[str, int]]) -> None:
        """The step's end (time_ns) is taken before it is handed on: a request's span ends before the front
        end can have its Final."""
        ended = time.time_ns()
        self.inner.deliver(events, counts)
        for caller, event in events:
            if caller.request.trace and not isinstance(event, Delta):
                self._ended(caller, event, ended)
        if self.report_drops is not None and self.spans.tracing.dropped != self.dropped:
            dropped = self.spans.tracing.dropped
            self.report_drops(dropped - self.dropped)
            self.dropped = dropped

    def _ended(self, caller: Caller, event: Event, ended: int) -> None:
        tokens = self.tokens.pop(id(caller), 0) + (event.usage.completion_tokens if isinstance(event, Final) else 0)
        if ends_request(event):
            self.spans.ended(caller.request, event, tokens, ended)  # type: ignore[arg-type]  # a Final or an error
        else:
            self.tokens[id(caller)] = tokens
