"""How long the front end's receiver naps between looks for the engine core's messages.

While requests are in flight and none waits for a slot, the receiver looks for messages every
NAP_S instead of sleeping in poll until the core's write wakes it: on this kind of machine
(virtual CPUs) the wake would cost the core's engine thread ~30 us a step (channel.py). But every
nap ends by taking the GIL back, and when this process's event loop is busy the loop pays a
hand-off (a wake of the waiting thread) for each, which slows refusals and first tokens. A nap
that comes back late tells: while naps come back late, the receiver naps BUSY_NAP_S at a time for
BUSY_S, a thousand hand-offs a second at most, then tries short naps again; a long nap takes
several steps' messages at once and wakes nobody (docs/design/decisions/receiver-naps.md). While
requests wait for a slot (the server saturated, refusing), the receiver sleeps in poll instead:
under open-loop overload the naps' hand-offs cost the event loop more refusals than they save the
core (core/client.py). Naps pay only while the core's ONNX Runtime threads leave a CPU to the
front end (naps_pay): where they take every core, as a large model's do by default, each nap's
wake takes a core from them mid-step, and the receiver sleeps in poll instead.
No sockets here: `sleep` and `clock` are the caller's (time.sleep and time.perf_counter).
"""

from __future__ import annotations

import time
from collections.abc import Callable

NAP_S = 0.0002  # the receiver's look-again period while requests are in flight
LATE_S = 0.0003  # a nap back this much later than asked waited for the GIL
LATE_IN_A_ROW = 2  # late naps, one after the other, that mean the event loop is busy
BUSY_S = 0.05  # then long naps for this long
BUSY_NAP_S = 0.001  # the long nap


def naps_pay(on_cpu: bool, threads: int, cores: int) -> bool:
    """Whether the receiver naps while requests are in flight (True) or sleeps in poll until the core's
    next write wakes it: naps while the core runs on a GPU (not `on_cpu`) or its `threads` intra-op
    threads leave one of this host's `cores` free. Threads on every core (a large model's default, spinning) share them
    with the receiver, and its 5,000 wakes a second cost a served GPT-2 124M 1.2-1.3x in tokens/s
    (docs/design/decisions/receiver-naps.md)."""
    return not on_cpu or threads < cores


class Naps:
    """The receiver's naps: short while they come back on time, long while the event loop is busy."""

    def __init__(
        self,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.sleep, self.clock = sleep, clock
        self.late = 0  # late naps in a row
        self.busy_until = 0.0  # long naps until then (clock)

    def nap(self) -> None:
        """Sleep NAP_S, or BUSY_NAP_S while the event loop was found busy."""
        start = self.clock()
        if start < self.busy_until:
            self.sleep(BUSY_NAP_S)
            return
        self.sleep(NAP_S)
        if self.clock() - start - NAP_S <= LATE_S:
            self.late = 0
            return
        self.late += 1
        if self.late >= LATE_IN_A_ROW:
            self.late, self.busy_until = 0, self.clock() + BUSY_S
