"""A step's host rows picked together (engine/host_picks.py, engine/batch_draw.py) are bitwise the picks each
row gets alone (sampling.pick_row, host_draw.draw): on flat, peaked, tied, wide and banned rows, under every
filter and their combinations, scored or not, whatever shares the batch."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from attnserve.engine import batch_draw, host_picks, sampling
from attnserve.engine.host_draw import draw
from attnserve.engine.sampling import pick_row
from attnserve.engine.seam import PassRow

KINDS = ("flat", "peaked", "tied", "few", "wide", "mixed")


def random_rows(rng: np.random.Generator, n: int, size: int, kind: str) -> np.ndarray:
    """Rows (n, V) float32 of a kind: flat (a random-weight model's), peaked, tied at a few levels, a few ids far
    above the rest, wide (values far below e^-64 of the largest), or rows of each spread; some with banned ids."""
    spread = {"flat": 1.0, "peaked": 4.0, "wide": 30.0, "few": 1.0, "tied": 1.0}.get(kind)
    if kind == "tied":
        rows = rng.integers(-3, 3, (n, size)).astype(np.float64)
    elif kind == "mixed":
        rows = rng.standard_normal((n, size)) * rng.choice([0.1, 1.0, 4.0, 30.0], (n, 1))
    else:
        rows = rng.standard_normal((n, size)) * spread
    if kind == "few":
        rows[:, :5] += 30.0
    rows = rows.astype(np.float32)
    if kind != "tied" and size > 20 and rng.random() < 0.3:
        rows[:, rng.integers(0, size, 10)] = -np.inf
    return rows


@pytest.mark.parametrize("seed", range(4))
def test_draws_together_are_each_rows_draw_alone(seed, whole_draw_kind):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        size, n = int(rng.choice([7, 64, 100, 1024, 5000])), int(rng.integers(1, 17))
        scaled = random_rows(rng, n, size, str(rng.choice(KINDS))).astype(np.float64) / rng.choice(
            [0.5, 1.0, 1.5], (n, 1)
        )
        min_p = np.where(rng.random(n) < 0.3, rng.choice([0.01, 0.05, 0.2], n), 0.0)
        top_k = np.where(rng.random(n) < 0.3, rng.integers(1, size + 2, n), 0)
        top_p = np.where(rng.random(n) < 0.7, rng.choice([0.5, 0.9, 0.95, 0.999], n), 1.0)
        uniform = rng.integers(0, 1 << 24, n) / float(1 << 24) if rng.random() < 0.9 else np.zeros(n)
        got = batch_draw.draws(scaled.copy(), min_p, top_k, top_p, uniform)
        alone = [draw(scaled[i], float(min_p[i]), int(top_k[i]), float(top_p[i]), float(uniform[i])) for i in range(n)]
        assert got.tolist() == alone, (size, n, np.flatnonzero(got != np.array(alone)))


def random_pass_row(rng: np.random.Generator, size: int) -> PassRow:
    """Greedy or a draw, with or without top-k, top-p, min-p, a bias and a ban, penalties, and top ids."""
    temperature = float(rng.choice([0.0, 0.0, 0.7, 1.0, 1.3]))
    bias = tuple(zip(rng.integers(0, size, 2).tolist(), [5.0, -np.inf])) if rng.random() < 0.2 else ()
    row = PassRow(
        temperature,
        int(rng.integers(1, size + 1)) if rng.random() < 0.3 else 0,
        float(rng.choice([0.5, 0.9, 0.95])) if rng.random() < 0.6 else 1.0,
        float(rng.choice([0.01, 0.1])) if rng.random() < 0.2 else 0.0,
        int(rng.integers(0, 1 << 24)) / float(1 << 24),
        bias,
        int(rng.integers(0, 6)),
    )
    if rng.random() < 0.15:
        seen = np.unique(rng.integers(0, size, 5)).astype(np.int64)
        row = replace(
            row,
            repetition=1.3,
            presence=0.5,
            frequency=0.2,
            seen=seen,
            occurred=seen,
            counts=np.ones(seen.size, np.int64),
        )
    return row


@pytest.mark.parametrize("seed", range(4))
def test_picks_together_are_each_rows_pick_alone(seed, whole_draw_kind):
    rng = np.random.default_rng(100 + seed)
    for _ in range(40):
        size = int(rng.choice([7, 1000, host_picks.TOGETHER_UP_TO]))
        n = int(rng.integers(host_picks.TOGETHER_FROM, 3 * host_picks.TOGETHER_FROM))
        logits = list(random_rows(rng, n, size, str(rng.choice(KINDS))) * rng.choice([0.5, 2.0]))
        rows = [random_pass_row(rng, size) for _ in range(n)]
        scored = (rng.random(n) < 0.4).tolist()
        picks = host_picks.pick_together(logits, rows, scored)
        assert all(pick is not None for pick in picks)  # none has a grammar's mask: all together
        assert picks == [pick_row(logits[i], rows[i], scored[i]) for i in range(n)]


def test_a_rows_pick_is_the_same_whatever_it_is_picked_with():
    """One row (top-p, scored), picked beside different rows at different places, and alone: the same pick."""
    rng = np.random.default_rng(7)
    size = 1024
    mine, row = random_rows(rng, 1, size, "flat")[0], PassRow(0.8, 0, 0.95, 0.0, 0.37, (), 5)
    picks = {pick_row(mine, row, True)}
    for place in (0, 5, host_picks.TOGETHER_FROM):
        others = random_rows(rng, host_picks.TOGETHER_FROM, size, "peaked")
        logits = [*others[:place], mine, *others[place:]]
        rows = [random_pass_row(rng, size) for _ in range(len(logits))]
        rows[place] = row
        picks.add(host_picks.pick_together(logits, rows, [True] * len(logits))[place])
    assert len(picks) == 1


def test_few_rows_a_large_vocabulary_or_a_grammars_mask_are_left_to_be_picked_alone():
    rng = np.random.default_rng(3)
    row = PassRow(0.8, 0, 0.95, 0.0, 0.5, (), 0)
    few = host_picks.TOGETHER_FROM - 1
    assert (
        host_picks.pick_together(list(random_rows(rng, few, 100, "flat")), [row] * few, [False] * few) == [None] * few
    )
    many = host_picks.TOGETHER_FROM
    large = list(random_rows(rng, many, host_picks.TOGETHER_UP_TO + 1, "flat"))
    assert host_picks.pick_together(large, [row] * many, [True] * many) == [None] * many  # scored
    biased, top_k = replace(row, bias=((3, 1.0),)), replace(row, top_k=50)
    assert host_picks.pick_together(large, [biased, top_k] * (many // 2), [False] * many) == [None] * many
    masked = replace(row, allowed=np.full(4, -1, np.int32))
    picks = host_picks.pick_together(
        list(random_rows(rng, many + 1, 100, "flat")), [masked, *[row] * many], [False] * (many + 1)
    )
    assert picks[0] is None and all(pick is not None for pick in picks[1:])


def test_a_large_vocabularys_plain_draws_are_drawn_together_as_each_alone(whole_draw_kind):
    """Over a large vocabulary, the draws that ask for no log-probability and change their rows by the
    temperature alone go to the compiled draw together (shared out between its threads): each pick is
    pick_row's of that row alone; with numpy drawing, every row is left to be picked alone."""
    rng = np.random.default_rng(5)
    size = host_picks.TOGETHER_UP_TO + 3001
    for trial in range(6):
        n = int(rng.integers(2, 17))
        logits = list(random_rows(rng, n, size, str(rng.choice(["flat", "peaked", "mixed", "wide"]))))
        rows = [
            PassRow(
                float(rng.choice([0.5, 0.8, 1.2])), 0, float(rng.choice([0.9, 0.95, 1.0])), 0.0, float(rng.random())
            )
            for _ in range(n)
        ]
        rows[0] = replace(rows[0], min_p=0.05)
        scored = [bool(rng.random() < 0.2) for _ in range(n)]
        picks = host_picks.pick_together(logits, rows, scored)
        for i in range(n):
            if whole_draw_kind == "numpy" or scored[i]:
                assert picks[i] is None
            elif picks[i] is not None:
                assert picks[i] == pick_row(logits[i], rows[i], scored=False), (trial, i)
        if whole_draw_kind == "compiled":
            assert sum(pick is not None for pick in picks) >= sum(not s for s in scored[1:])


def test_a_large_vocabularys_greedy_rows_with_logprobs_are_scored_together_as_each_alone(whole_draw_kind):
    """Over a large vocabulary, greedy rows that ask for log-probabilities (some with bans: ignore_eos,
    min_tokens) go to the compiled scores together (shared out between its threads): each pick is pick_row's
    of that row alone, bitwise; a beam's row (judged alone) and a row with a bias are left to be picked alone,
    as every row is with numpy drawing."""
    rng = np.random.default_rng(9)
    size = host_picks.TOGETHER_UP_TO + 3001
    for trial in range(6):
        n = int(rng.integers(4, 17))  # at least two rows to score together besides the beam's and the biased
        logits = list(random_rows(rng, n, size, str(rng.choice(["flat", "peaked", "tied", "wide"]))))
        bans = lambda: tuple((int(i), -np.inf) for i in rng.integers(0, size, int(rng.integers(0, 3))))
        rows = [PassRow(0.0, 0, 1.0, 0.0, 0.0, bans(), top=int(rng.integers(0, 21))) for _ in range(n)]
        rows[0] = replace(rows[0], alone=True)
        rows[-1] = replace(rows[-1], bias=((5, 2.0),))
        picks = host_picks.pick_together(logits, rows, [True] * n)
        for i in range(n):
            if whole_draw_kind == "numpy" or i == 0 or rows[i].bias == ((5, 2.0),):
                assert picks[i] is None, (trial, i)
            else:
                assert picks[i] == pick_row(logits[i], rows[i], scored=True), (trial, i)


def test_a_draw_that_only_bans_ids_is_drawn_from_a_copy_with_them_at_minus_inf(whole_draw_kind):
    """A sampled row whose only change besides its temperature is bans (ignore_eos, min_tokens, suppressed ids)
    is a plain draw: alone and together, the compiled draw reads a float32 copy with the banned ids at -inf, and
    each pick is the definition's, the draw of processed_row's float64 row; the runner's row is left as it was."""
    rng = np.random.default_rng(9)
    size = host_picks.TOGETHER_UP_TO + 3001
    for trial in range(6):
        n = int(rng.integers(2, 9))
        logits = random_rows(rng, n, size, str(rng.choice(["flat", "peaked", "mixed", "wide"])))
        before = logits.copy()
        rows = []
        for i in range(n):
            banned = {int(logits[i].argmax()), *map(int, rng.integers(0, size, int(rng.integers(1, 4))))}
            rows.append(
                PassRow(float(rng.choice([0.5, 0.8])), 0, float(rng.choice([0.9, 1.0])), 0.0, float(rng.random()))
            )
            rows[i] = replace(rows[i], bias=tuple((token, -np.inf) for token in sorted(banned)))
        defined = [
            draw(sampling.processed_row(row_logits, row), 0.0, 0, row.top_p, row.uniform)
            for row_logits, row in zip(logits, rows)
        ]
        together = host_picks.pick_together(list(logits), rows, [False] * n)
        alone = [pick_row(row_logits, row, scored=False) for row_logits, row in zip(logits, rows)]
        assert [pick.token for pick in alone] == defined, trial
        for i, pick in enumerate(together):
            if whole_draw_kind == "compiled":
                assert pick is not None and pick.token == defined[i], (trial, i)
            else:
                assert pick is None
        np.testing.assert_array_equal(logits, before)
