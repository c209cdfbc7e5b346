"""When the front end's receiver naps between looks for the engine core's messages, and when it does not.

While requests are in flight the receiver looks for messages every NAP_S instead of sleeping in
poll until the core's write wakes it: on this kind of machine (virtual CPUs) the wake would cost the
core's engine thread ~30 us a step (core_channel.py). But every nap ends by taking the GIL back, and
when this process's event loop is busy the nap waits for the GIL and the loop pays a hand-off (a wake
of the waiting thread) for each: 5,000 a second, measured under the overload test (4x capacity,
~650 calls/s), made refusals and first tokens slower (TTFT p99 115-198 ms against 81-94 ms with no
naps, refusal p50 9-16 ms against 4-5). A nap that comes back late tells: while naps come back late,
the receiver waits in poll for the core's next message for BUSY_S instead, where the loop pays
nothing until a message comes, then tries napping again. Measured on the same machine: naps at one
and 16 streams come back on time (p90 300 us for a 200 us nap); under that overload a quarter to a
half come back more than 500 us after they began.
No sockets here: `sleep` and `clock` are the caller's (time.sleep and time.perf_counter).
"""

from __future__ import annotations

import time
from collections.abc import Callable

NAP_S = 0.0002  # the receiver's look-again period while requests are in flight
LATE_S = 0.0003  # a nap back this much later than asked waited for the GIL
LATE_IN_A_ROW = 2  # late naps, one after the other, that mean the event loop is busy
BUSY_S = 0.05  # then no naps for this long


class Naps:
    """Whether the receiver naps now, and the nap itself (nap() sleeps, or says to wait for a message)."""

    def __init__(
        self,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.sleep, self.clock = sleep, clock
        self.late = 0  # late naps in a row
        self.busy_until = 0.0  # no naps before this (clock)

    def nap(self) -> bool:
        """Nap NAP_S and True; or False, without sleeping, while the event loop was found busy: then
        wait for the core's next message instead."""
        start = self.clock()
        if start < self.busy_until:
            return False
        self.sleep(NAP_S)
        if self.clock() - start - NAP_S <= LATE_S:
            self.late = 0
            return True
        self.late += 1
        if self.late >= LATE_IN_A_ROW:
            self.late, self.busy_until = 0, self.clock() + BUSY_S
        return True
