"""The A/B benchmarks start their servers in turn a first and b first (benchmarks/serving.py's launches): a
server started after another can run faster all its life, so neither side may always start second."""

from __future__ import annotations

import pytest

from benchmarks.serving import launches


def test_each_launch_starts_the_sides_in_turn_forwards_and_backwards_and_closes_them_before_the_next():
    events: list[tuple[str, str, int]] = []

    def start(side: str) -> tuple[str, int]:
        launch = sum(e[0] == "start" for e in events) // 2  # two servers a launch
        events.append(("start", side, launch))
        return side, launch

    def close(server: tuple[str, int]) -> None:
        events.append(("close", *server))

    seen = []
    for launch, servers in enumerate(launches(start, close, ("a", "b"), 3)):
        assert list(servers) == ["a", "b"]  # by side, whichever started first
        assert servers == {"a": ("a", launch), "b": ("b", launch)}
        seen.append(launch)
    assert seen == [0, 1, 2]
    assert [e for e in events if e[0] == "start"] == [
        ("start", "a", 0),
        ("start", "b", 0),
        ("start", "b", 1),
        ("start", "a", 1),
        ("start", "a", 2),
        ("start", "b", 2),
    ]
    for number in range(3):  # a launch's servers are closed before the next launch starts any
        last_close = max(i for i, e in enumerate(events) if e[0] == "close" and e[2] == number)
        later_starts = [i for i, e in enumerate(events) if e[0] == "start" and e[2] > number]
        assert all(i > last_close for i in later_starts)
    assert sum(e[0] == "close" for e in events) == 6


def test_a_server_that_fails_to_start_closes_the_one_already_started():
    closed = []

    def start(side: str) -> str:
        if side == "b":
            raise RuntimeError("attnserve serve did not start")
        return side

    with pytest.raises(RuntimeError, match="did not start"):
        for _ in launches(start, closed.append, ("a", "b"), 2):
            pass
    assert closed == ["a"]
