"""benchmarks/first_requests.py: a round's figures over the launches, b/a launch by launch, and the counts
it refuses."""

from __future__ import annotations

import pytest

from benchmarks import first_requests


def test_a_rounds_ratio_pairs_each_launch_of_a_with_the_same_launch_of_b():
    runs = {
        "a": [{"tokens_per_s": 100.0, "ttft_ms": 400.0}, {"tokens_per_s": 200.0, "ttft_ms": 300.0}],
        "b": [{"tokens_per_s": 150.0, "ttft_ms": 200.0}, {"tokens_per_s": 220.0, "ttft_ms": 150.0}],
    }
    row = first_requests.row_of(0, runs)
    assert row["round"] == 1
    assert row["a"]["tokens_per_s"] == {"median": 150.0, "min": 100.0, "max": 200.0}
    assert row["b_over_a"] == {"median": pytest.approx(1.3), "min": pytest.approx(1.1), "max": pytest.approx(1.5)}
    assert row["ttft_b_over_a"]["min"] == pytest.approx(0.5) and row["ttft_b_over_a"]["max"] == pytest.approx(0.5)


@pytest.mark.parametrize("flag", ["--streams", "--max-batch", "--rounds", "--launches"])
def test_a_count_below_one_is_refused_naming_the_flag(flag, capsys):
    with pytest.raises(SystemExit):
        first_requests.main(["--model", "m", flag, "0"])
    assert f"{flag} must be at least 1, got 0" in capsys.readouterr().err
