"""The receiver's naps (attnserve/core/naps.py) on a clock of the test's own: short naps while they
come back on time, long ones for BUSY_S once LATE_IN_A_ROW came back late, short ones again after;
and none where the core's intra-op threads take every core."""

from attnserve.core.naps import BUSY_NAP_S, BUSY_S, LATE_IN_A_ROW, LATE_S, NAP_S, Naps, naps_pay


class Clock:
    """time.perf_counter and time.sleep of a machine where each sleep overshoots by `late` seconds."""

    def __init__(self) -> None:
        self.now, self.late = 100.0, 0.0
        self.naps: list[float] = []  # each sleep asked for

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds + self.late
        self.naps.append(seconds)


def naps(clock: Clock) -> Naps:
    return Naps(sleep=clock.sleep, clock=clock)


def test_naps_that_come_back_on_time_stay_short():
    clock = Clock()
    clock.late = LATE_S / 2
    napper = naps(clock)
    for _ in range(1000):
        napper.nap()
    assert clock.naps == [NAP_S] * 1000


def test_late_naps_in_a_row_make_the_naps_long_for_busy_s_then_short_again():
    clock = Clock()
    napper = naps(clock)
    clock.late = LATE_S * 2
    for _ in range(LATE_IN_A_ROW):
        napper.nap()  # these came back late
    clock.late = 0.0
    start = clock.now
    while clock.now < start + BUSY_S:
        napper.nap()  # the event loop is busy: long naps, however timely
    busy = clock.naps[LATE_IN_A_ROW:]
    assert busy == [BUSY_NAP_S] * len(busy) and len(busy) >= BUSY_S / BUSY_NAP_S - 1
    napper.nap()
    napper.nap()
    assert clock.naps[-2:] == [NAP_S, NAP_S]


def test_one_late_nap_between_timely_ones_changes_nothing():
    clock = Clock()
    napper = naps(clock)
    for _ in range(100):
        clock.late = LATE_S * 2
        napper.nap()
        clock.late = 0.0
        napper.nap()
    assert clock.naps == [NAP_S] * 200


def test_naps_pay_only_while_the_cores_threads_leave_a_cpu_free_or_it_runs_on_a_gpu():
    assert naps_pay(True, 1, 2)
    assert not naps_pay(True, 2, 2)
    assert not naps_pay(True, 3, 2)
    assert naps_pay(False, 16, 16)
