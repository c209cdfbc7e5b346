"""The receiver's naps (attnserve/server/naps.py) on a clock of the test's own: naps while they come
back on time, none for BUSY_S once LATE_IN_A_ROW came back late, naps again after."""

from attnserve.server.naps import BUSY_S, LATE_IN_A_ROW, LATE_S, Naps


class Clock:
    """time.perf_counter and time.sleep of a machine where each sleep overshoots by `late` seconds."""

    def __init__(self) -> None:
        self.now, self.late, self.slept = 100.0, 0.0, 0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds + self.late
        self.slept += 1


def naps(clock: Clock) -> Naps:
    return Naps(sleep=clock.sleep, clock=clock)


def test_naps_that_come_back_on_time_go_on():
    clock = Clock()
    clock.late = LATE_S / 2
    napper = naps(clock)
    assert all(napper.nap() for _ in range(1000))
    assert clock.slept == 1000


def test_late_naps_in_a_row_stop_the_naps_for_busy_s_then_they_resume():
    clock = Clock()
    napper = naps(clock)
    clock.late = LATE_S * 2
    assert all(napper.nap() for _ in range(LATE_IN_A_ROW))  # these napped, and came back late
    assert clock.slept == LATE_IN_A_ROW
    assert not napper.nap()  # the event loop is busy: wait for the core's message instead
    assert clock.slept == LATE_IN_A_ROW  # ... without sleeping
    clock.now += BUSY_S * 0.99
    assert not napper.nap()
    clock.now += BUSY_S * 0.02
    clock.late = 0.0
    assert napper.nap()
    assert clock.slept == LATE_IN_A_ROW + 1


def test_one_late_nap_between_timely_ones_stops_nothing():
    clock = Clock()
    napper = naps(clock)
    for _ in range(100):
        clock.late = LATE_S * 2
        assert napper.nap()
        clock.late = 0.0
        assert napper.nap()
    assert clock.slept == 200
