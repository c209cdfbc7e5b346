"""Where the engine thread hands each step's events: the engine's delivery seam.

An Outbox takes one step boundary's events, (caller, event) pairs in the order the engine emitted
them, and a way to ask the engine's counts after the step (asked only by an outbox that needs
them). LoopOutbox, the default, puts them on the callers' Handles through their event loops, one
call per loop; the engine core's process writes them to the front end as one message instead
(core/step_writer.py). No I/O here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Protocol

from .sequence import Caller, Event, Handle


class Outbox(Protocol):
    """Takes each step's events on the engine thread; it must not block for long (the batch waits)."""

    def deliver(self, events: list[tuple[Caller, Event]], counts: Callable[[], dict[str, int]]) -> None:
        """`events`: this step's, maybe none; `counts()`: the engine's stats after the step, "active"
        (in the batch or its prefill) and "queued" (waiting for a slot)."""


class LoopOutbox:
    """The engine's own callers are submit's Handles: their events go to their event loops."""

    def deliver(self, events: list[tuple[Caller, Event]], counts: Callable[[], dict[str, int]]) -> None:  # noqa: ARG002
        """The counts are the core's business (Outbox's signature): never asked here."""
        assert all(isinstance(handle, Handle) for handle, _ in events), "submit's callers are Handles"
        post(events)  # type: ignore[arg-type]  # Handles, as asserted


def deliver(batch: list[tuple[Handle, Event]]) -> None:
    """Queue events on their handles; runs on the callers' event loop."""
    for handle, event in batch:
        handle.put(event)


def post(pairs: Iterable[tuple[Handle, Event]]) -> None:
    """Hand events to their handles' event loops, one call per loop (from any thread)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Handle, Event]]] = {}
    for handle, event in pairs:
        by_loop.setdefault(handle.loop, []).append((handle, event))
    for loop, batch in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the caller's loop has closed: nobody is listening
            loop.call_soon_threadsafe(deliver, batch)
