"""How long the front end's receiver naps between looks for the engine core's messages.

While requests are in flight the receiver looks for messages every NAP_S instead of sleeping in
poll until the core's write wakes it: on this kind of machine (virtual CPUs) the wake would cost the
core's engine thread ~30 us a step (core_channel.py). But every nap ends by taking the GIL back, and
when this process's event loop is busy the nap waits for the GIL and the loop pays a hand-off (a wake
of the waiting thread) for each: 5,000 a second, measured under the overload test (4x capacity,
~650 calls/s), made refusals and first tokens slower (TTFT p99 115-198 ms against 81-94 ms with no
naps, refusal p50 9-16 ms against 4-5). A nap that comes back late tells: while naps come back late,
the receiver naps BUSY_S at a time for BUSY_NAP_S, a thousand hand-offs a second at most, then tries
short naps again. Measured on the same machine: naps at one and 16 streams come back on time (p90
300 us for a 200 us nap); under that overload a quarter to a half come back more than 500 us after
they began.

Busy, the receiver used to wait in poll for the core's next message instead: then every write of the
core woke it (at 16 streams and interval 1, 40% of the core's sends took more than 15 us, 21 us on
average, on the core's critical path) and the loop still paid a hand-off per message. A long nap
takes several steps' messages at once and wakes nobody: through gRPC, servers side by side, 3 rounds,
16 streams 11,079 -> 13,184 tok/s at interval 1 and 14,025 -> 14,521 at interval 8, 64 streams
12,959 -> 13,397 and 16,407 -> 16,837. The overload test (one slot), 7 runs each alternating: accepted
TTFT p50 60-64 -> 51-59 ms, p99 81-89 -> 66-81 ms but for one run of 153 ms against its 122 ms bound
(7 of 7 -> 6 of 7 passed; beside a CPU-burning process 2 of 2 each), refusal p50 2.6-3.0 -> 1.8-2.1
ms, 774-807 -> 805-942 requests served in the 6 s.
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
