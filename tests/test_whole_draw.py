"""The compiled whole-row draw (engine/whole_draw.c through engine/whole_draw.py): built wherever a C compiler
is, its picks the definition's (tests/test_sampling.py's by_definition: a full sort and a running sum) at the
edges numpy's draw was not asked about: rows of every length modulo its four lanes, ties at top-p's
crossing, one finite id, every id banned, rows read out of a wider buffer, a penalized or biased row read from
its logits, block sums that fall short of the uniform number; and the rows it leaves to numpy.
And its greedy rows' scores (whole_draw.scores: the likeliest ids and the sum of exps) against theirs, and its
top-k draws (whole_draw.top_k) against the definition's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_sampling import by_definition

from attnserve.engine import whole_draw
from attnserve.engine.host_draw import FEW, draw
from attnserve.engine.sampling import changes, pick_whole_row, processed_row
from attnserve.engine.seam import PassRow
from benchmarks import whole_draw_ab

COMPILER = shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0])
NUMPY_ASKED = os.environ.get(whole_draw.ENV, "").lower() == "numpy"
pytestmark = pytest.mark.skipif(
    NUMPY_ASKED or (not whole_draw.available() and COMPILER is None),
    reason=f"{whole_draw.ENV}=numpy, or no C compiler here",
)


def test_it_is_built_and_runs_wherever_a_c_compiler_is():
    """`pip install -e .` (make's .venv) builds it; a skipped build would leave numpy drawing unnoticed."""
    assert whole_draw.available(), f"attnserve.engine._whole_draw not built or not loadable (compiler {COMPILER})"


@pytest.mark.parametrize("size", range(1, 13))
def test_rows_of_every_length_are_drawn_as_defined(size):
    """Lengths across the four lanes' tails, each filter, uniform numbers across [0, 1) and at its ends."""
    rng = np.random.default_rng(size)
    for trial in range(20):
        row = rng.normal(0, [0.1, 1.0, 5.0][trial % 3], size)
        if trial % 5 == 4 and size > 1:
            row[rng.integers(0, size)] = -np.inf
        for min_p, top_p in ((0.0, 1.0), (0.0, 0.9), (0.0, 0.3), (0.05, 1.0), (0.1, 0.8)):
            for uniform in (*rng.random(5), 0.0, 1 - 2**-24):
                assert draw(row, min_p, 0, top_p, uniform) == by_definition(row, min_p, 0, top_p, uniform)


def test_ties_at_the_crossing_keep_the_lower_ids():
    """Four ids tied at the crossing, top-p needing two of them: only ids 0 to 3 are ever drawn, each as often
    as the definition's running sum says (a grid of 10,000 uniform numbers, each the definition's id)."""
    row = np.log(np.array([0.1, 0.3, 0.1, 0.3, 0.1, 0.1]))
    grid = np.arange(10_000) / 10_000
    got = [whole_draw.draw(row, 0.0, 0.75, float(u)) for u in grid]
    assert got == [by_definition(row, 0.0, 0, 0.75, float(u)) for u in grid]
    assert set(got) == {0, 1, 2, 3}


def test_what_it_leaves_to_numpy():
    """Every id banned, and min-p keeping at most 1/FEW of the row (numpy's few-ids path): None, and
    host_draw.draw still answers as defined."""
    assert whole_draw.draw(np.full(10, -np.inf), 0.0, 0.9, 0.5) is None
    row = np.zeros(64 * FEW)
    row[:3] = 10.0  # min-p 0.5 keeps 3 ids
    assert whole_draw.draw(row, 0.5, 1.0, 0.5) is None
    assert draw(row, 0.5, 0, 1.0, 0.5) == by_definition(row, 0.5, 0, 1.0, 0.5)
    lone = np.full(9, -np.inf)
    lone[6] = -3.0
    assert whole_draw.draw(lone, 0.0, 0.5, 0.99) == 6


def test_rows_read_from_a_wider_buffer_are_those_rows_draws():
    """Rows (n, V) that are a slice of a wider (n, W) buffer, as a batch's are: each row's id alone."""
    rng = np.random.default_rng(3)
    wide = rng.normal(0, 1, (5, 3000))
    rows = wide[:, :2990]
    min_p, top_p, uniform = np.zeros(5), np.array([0.9, 1.0, 0.5, 0.95, 0.2]), rng.random(5)
    got = whole_draw.draws(rows, min_p, top_p, uniform)
    assert got.tolist() == [by_definition(rows[i], 0.0, 0, top_p[i], uniform[i]) for i in range(5)]


@pytest.mark.parametrize("size", [5, 64, 1001, 50257])
def test_logits_read_as_they_are_give_the_ids_of_the_divided_rows(size):
    """whole_draws_logits (float32 logits, divided as read) against whole_draws of the rows as
    sampling.processed_row divides them, and an unscored pick (which takes the logits straight) against a
    scored one (which takes the divided copy): bitwise the same ids, on flat, peaked and banned rows."""
    rng = np.random.default_rng(size)
    for trial in range(12):
        logits = (rng.standard_normal((4, size)) * [0.3, 1.0, 4.0][trial % 3]).astype(np.float32)
        if trial % 4 == 3:
            logits[:, rng.integers(0, size, max(1, size // 5))] = -np.inf
        temperature = rng.choice([0.3, 0.7, 1.0, 1.3], 4)
        min_p = np.where(rng.random(4) < 0.3, 0.02, 0.0)
        top_p = rng.choice([0.5, 0.9, 0.95, 1.0], 4)
        uniform = rng.random(4)
        divided = logits.astype(np.float64) / temperature[:, None]
        expected = whole_draw.draws(divided, min_p, top_p, uniform)
        assert whole_draw.draws_logits(logits, temperature, min_p, top_p, uniform).tolist() == expected.tolist()
        for i in range(4):
            row = PassRow(float(temperature[i]), 0, float(top_p[i]), float(min_p[i]), float(uniform[i]))
            assert pick_whole_row(logits[i], row, scored=False).token == pick_whole_row(logits[i], row).token


CHANGES = ("repetition", "occurrences", "bias", "all")


def changed_row(rng, logits, seen, banned, change, trial, drawn) -> PassRow:
    """A row that samples as `drawn` (temperature, min_p, top_p) with the repetition penalty on `seen`, OpenAI's
    penalties on some of them (counts of 1 to 5), or a bias (the bans, finite biases, an id biased twice), or
    all three (`change`)."""
    temperature, min_p, top_p = drawn
    given: dict = {}
    if change in ("repetition", "all"):
        given.update(repetition=[1.3, 0.7][trial % 2], seen=seen.astype(np.int64))
    if change in ("occurrences", "all"):
        occurred = seen[: max(1, seen.size // 2)] if seen.size else np.array([logits.size - 1])
        counts = rng.integers(1, 6, occurred.size)
        presence, frequency = [(0.5, 0.2), (0.0, 1.1), (-0.3, 0.0), (0.1, 0.7)][trial % 4]
        given.update(presence=presence, frequency=frequency, occurred=occurred.astype(np.int64), counts=counts)
    bias = tuple((token, -np.inf) for token in banned.tolist())
    if change in ("bias", "all"):
        ids = rng.integers(0, logits.size, 3).tolist() + [int(np.argmax(logits))]
        bias += tuple(zip(ids + ids[:1], [2.5, -1.25, 0.3, -4.0, 1.0]))
    return PassRow(temperature, 0, top_p, min_p, 0.0, bias, **given)


@pytest.mark.parametrize("size", [*range(1, 20), 63, 64, 65, 1001, 50257])
def test_a_penalized_or_biased_row_draws_the_ids_of_its_processed_row(size):
    """whole_draw.draw_processed (float32 logits, the ids its penalties and bias change patched in as read)
    against whole_draw.draw of the row as sampling.processed_row makes it (a float64 copy, changed, divided):
    bitwise the same ids, with and without top-p. The repetition penalty, OpenAI's, a bias, or all three. Seen
    ids in any order: none, one, the first and last, runs of neighbours across the lanes of four and the blocks
    of 64, the largest logit's; bans of an id also seen and of the largest logit's; penalties above and below 1,
    negative logits, -inf, min-p; and an unscored pick (which takes this draw) against a scored one (which
    takes processed_row's copy)."""
    rng = np.random.default_rng(size + 100)
    for trial in range(8 if size > 5000 else 16):  # a whole vocabulary's rows: every pattern below, fewer times
        logits = (rng.standard_normal(size) * [0.3, 1.0, 4.0, 9.0][trial % 4]).astype(np.float32)
        if trial % 5 == 4:
            logits[rng.integers(0, size, max(1, size // 5))] = -np.inf
        count = [0, 1, size // 3, size // 2][trial % 4]
        seen = rng.choice(size, count, replace=False)
        if trial % 3 == 0:
            run = np.arange(rng.integers(0, size), size)[:70]  # neighbours, past a block's edge where it can
            seen = np.union1d(seen, np.concatenate([run, [0, size - 1, int(np.argmax(logits))]]))
            seen = rng.permutation(seen)
        # no ban, one (EOS under ignore_eos), one that is also seen, the largest logit's
        bans = [[], [size - 1], [int(seen[0])] if seen.size else [], [int(np.argmax(logits)), 0]][trial % 4]
        banned = np.array(sorted(set(bans)), np.int64)
        for change in CHANGES:
            for drawn in ((0.7, 0.0, 1.0), (1.0, 0.0, 0.9), (1.4, 0.05, 1.0), (0.8, 0.0, 0.5)):
                row = changed_row(rng, logits, seen, banned, change, trial, drawn)
                scaled = processed_row(logits, row)
                for uniform in (*rng.random(2), 0.0, 1 - 2**-24):
                    expected = whole_draw.draw(scaled, row.min_p, row.top_p, uniform)
                    got = whole_draw.draw_processed(logits, *drawn, uniform, *changes(row))
                    assert got == expected, (trial, change, drawn)
                    if expected is not None:
                        assert expected == by_definition(scaled, row.min_p, 0, row.top_p, uniform)
                        picked = replace(row, uniform=uniform)
                        assert (
                            pick_whole_row(logits, picked, scored=False).token == pick_whole_row(logits, picked).token
                        )


def test_the_occurrence_penalties_round_their_product_as_numpy_does():
    """frequency * count rounded before presence is added, numpy's two roundings: 0.1 * 5 + 0.2 is 0.7 so, and
    0.7000000000000001 in one fused multiply-add. Id 5 penalized so ties id 6 biased by -0.7 (the row's only
    finite ids, logits 0): top-p 0.5 keeps the lower id of a tie, 5; a fused penalty would leave 6 above."""
    assert 0.1 * 5 + 0.2 == 0.7
    logits = np.full(64, -np.inf, np.float32)
    logits[[5, 6]] = 0.0
    row = PassRow(1.0, 0, 0.5, 0.0, 0.0, ((6, -0.7),), presence=0.2, frequency=0.1)
    row = replace(row, occurred=np.array([5], np.int64), counts=np.array([5], np.int64))
    assert processed_row(logits, row)[5] == processed_row(logits, row)[6]
    for uniform in (0.0, 0.5, 0.99):
        assert by_definition(processed_row(logits, row), 0.0, 0, 0.5, uniform) == 5
        assert whole_draw.draw_processed(logits, 1.0, 0.0, 0.5, uniform, *changes(row)) == 5


def test_a_changed_row_it_leaves_to_numpy():
    """A seen, occurred or biased id outside the row: None (numpy's processed_row then says what is wrong).
    Every id seen is drawn as processed."""
    logits = np.linspace(-2, 2, 100, dtype=np.float32)
    everything = np.arange(100, dtype=np.int64)
    drawn = (1.0, 0.0, 1.0, 0.5)
    assert whole_draw.draw_processed(logits, *drawn, seen=np.array([3, 100], np.int64), penalty=1.2) is None
    outside = {"occurred": np.array([-1], np.int64), "counts": np.array([2], np.int64), "frequency": 0.5}
    assert whole_draw.draw_processed(logits, *drawn, **outside) is None
    biased = {"bias_ids": np.array([7, 100], np.int64), "bias_values": np.array([1.0, -np.inf])}
    assert whole_draw.draw_processed(logits, *drawn, **biased) is None
    row = PassRow(1.0, 0, 0.9, 0.0, 0.5, repetition=1.2, seen=everything)
    expected = by_definition(processed_row(logits, row), 0.0, 0, 0.9, 0.5)
    assert whole_draw.draw_processed(logits, 1.0, 0.0, 0.9, 0.5, seen=everything, penalty=1.2) == expected


@pytest.mark.parametrize("size", [8192, 50257])
def test_a_uniform_number_the_block_sums_fall_short_of_draws_the_last_kept_id(size):
    """Id 0 of weight 1 and every other of 1e-18: each block's 64 tiny weights vanish when added to the running
    sum (under half its last bit), while the four lanes' sums over the row keep theirs, so the largest uniform
    number below 1 times the total passes every running sum. The draw walks back from the last block to its
    last kept id (the nearest to where the exact sum crosses), past the ids banned at the row's end (-inf, or
    below min-p), penalized or not. (The definition's one running sum, in id order, loses every tiny weight
    and gives id 0.)"""
    uniform = float(np.nextafter(1.0, 0.0))
    for tail in (1, 3, 64, 70):
        logits = np.full(size, np.log(1e-18), np.float32)
        logits[0] = 0.0
        last = size - tail - 1
        banned = np.arange(last + 1, size, dtype=np.int64)
        cut = logits.copy()
        cut[banned] = -np.inf
        assert whole_draw.draw(cut.astype(np.float64), 0.0, 1.0, uniform) == last
        assert whole_draw.draw_logits(cut, 1.0, 0.0, 1.0, uniform) == last
        below = logits.copy()
        below[banned] = -50.0  # under min-p's 1e-20 of the largest, and -41.4 above it
        assert whole_draw.draw_logits(below, 1.0, 1e-20, 1.0, uniform) == last
        bans = {"bias_ids": banned, "bias_values": np.full(banned.size, -np.inf)}
        seen = np.array([0, 5], np.int64)
        assert whole_draw.draw_processed(logits, 1.0, 0.0, 1.0, uniform, seen=seen, penalty=1.0, **bans) == last


def test_values_on_the_buckets_edges_are_drawn_as_defined():
    """Top-p finds the crossing bucket's ids by value (the lowest value of a bucket, by halves): rows whose
    lowest value but -inf (-63.984375, 4,095/64 below the largest) makes the scale of their 4,096 buckets
    exactly -64, so that -k/64 is the highest value of bucket k, with values on such edges and a step either
    side of them: float64 steps read as float64, float32 steps read as float32 (at temperatures that keep
    them exact) and as float64. The definition's ids at top-p's crossings in several buckets."""
    rng = np.random.default_rng(17)
    size = 50257  # whole_draw's BUCKETS: 4,096 buckets
    levels = -rng.integers(0, 400, size) / 64
    step = rng.integers(0, 3, size)  # on the edge, a step above it, a step below it

    def stepped(edges: np.ndarray) -> np.ndarray:
        row = np.where(step == 1, np.nextafter(edges, edges.dtype.type(1)), edges)
        row = np.where(step == 2, np.nextafter(edges, edges.dtype.type(-np.inf)), row)
        row[:3] = [0.0, -63.984375, -np.inf]
        return row

    row32, row64 = stepped(levels.astype(np.float32)), stepped(levels)
    for top_p in (0.2, 0.7, 0.95, 0.999):
        for uniform in (*rng.random(4), 0.0, 1 - 2**-24):
            expected = by_definition(row64, 0.0, 0, top_p, uniform)
            assert whole_draw.draw(row64, 0.0, top_p, uniform) == expected, (top_p, uniform)
            for temperature in (1.0, 0.5):
                scaled = row32.astype(np.float64) / temperature
                expected = by_definition(scaled, 0.0, 0, top_p, uniform)
                assert whole_draw.draw(scaled, 0.0, top_p, uniform) == expected, (temperature, top_p, uniform)
                assert whole_draw.draw_logits(row32, temperature, 0.0, top_p, uniform) == expected


def scored_by_definition(logits: np.ndarray, count: int, banned: list[int]) -> tuple[list[int], float]:
    """The `count` likeliest ids but `banned` (a stable sort: the lower id first on ties), and the float64 sum
    over the ids not banned of e^(logit - the likeliest's)."""
    values = logits.astype(np.float64)
    values[banned] = -np.inf
    order = np.argsort(-values, kind="stable")[:count]
    return order.tolist(), float(np.exp(values - values[order[0]]).sum())


@pytest.mark.parametrize("size", [*range(1, 21), 50257])
def test_greedy_scores_are_the_definitions_at_every_length(size):
    """whole_draw.scores on rows of every length across its eight-value and sixteen-value steps' tails: flat,
    peaked and rounded (ties) rows, some ids -inf, bans at the row's ends and on its likeliest id; the ids
    exactly, their logits, and the sum within 1e-13 of the definition's (relative)."""
    rng = np.random.default_rng(size)
    for trial in range(24):
        logits = (rng.standard_normal(size) * [0.3, 1.0, 4.0][trial % 3]).astype(np.float32)
        if trial % 4 == 1:
            logits = np.round(logits, 1)
        if trial % 4 == 2 and size > 2:
            logits[rng.integers(0, size, size // 3)] = -np.inf
            logits[0] = 0.5
        banned = sorted({0, size - 1, int(np.argmax(logits))}) if trial % 3 == 2 and size > 3 else []
        count = min([1, 3, 6, 21][trial % 4], size - len(banned))
        if count < 1 or np.isinf(np.delete(logits, banned)).sum() > size - len(banned) - count:
            continue
        got = whole_draw.scores(logits, count, np.array(banned, np.int64))
        ids, total = scored_by_definition(logits, count, banned)
        assert got is not None and got[0].tolist() == ids, (size, trial)
        assert got[1].tolist() == logits[ids].tolist()
        assert got[2] == pytest.approx(total, rel=1e-13, abs=0)


def trial_row(rng: np.random.Generator, size: int, trial: int) -> np.ndarray:
    """Float32 logits (size,) of one of four kinds by `trial`: flat, peaked, rounded (ties), some ids -inf."""
    logits = (rng.standard_normal(size) * [0.3, 1.0, 4.0][trial % 3]).astype(np.float32)
    if trial % 4 == 1:
        logits = np.round(logits, 1)
    if trial % 4 == 2:
        logits[rng.integers(0, size, size // 3 + 1)] = -np.inf
    return logits


@pytest.mark.parametrize("size", [*range(1, 21), 8192, 50257])
def test_the_likeliest_ids_are_every_id_at_least_the_count_th_largest(size):
    """whole_draw.likeliest (likeliest.candidates' compiled ids) on flat, peaked and rounded (ties at the
    count-th) rows, some ids -inf: every id at least as large as the count-th largest value, ascending;
    None where more than `room` are, or fewer than `count` are above -inf."""
    rng = np.random.default_rng(size + 7)
    for trial in range(24):
        logits = trial_row(rng, size, trial)
        count = min([1, 3, 6, 50][trial % 4], size)
        finite = np.sort(logits[np.isfinite(logits)])
        room = [size, max(1, size // 8)][trial % 2]
        got = whole_draw.likeliest(logits, count, room)
        if finite.size < count:
            assert got is None, (size, trial)
            continue
        expected = np.flatnonzero(logits >= finite[-count])
        assert (got.tolist() if got is not None else None) == (expected.tolist() if expected.size <= room else None)


@pytest.mark.parametrize("size", [8, 9, 15, 16, 17, 64, 1000, 50257])
def test_top_k_draws_are_the_definitions(size):
    """whole_draw.top_k (a top-k draw's few ids, compiled) on flat, peaked and rounded (ties at the k-th) rows,
    some ids -inf, bans on the likeliest id and at the row's ends, under min-p and top-p, uniform numbers across
    [0, 1) and at its ends: the definition's id of the row divided by its temperature, its bans at -inf; None
    where more than an eighth of the ids are at least the k-th largest, or fewer than k are above -inf."""
    rng = np.random.default_rng(size + 11)
    room, drawn = size // 8, 0
    for trial in range(36):
        logits = trial_row(rng, size, trial)
        banned = sorted({0, size - 1, int(np.argmax(logits))}) if trial % 3 == 2 else []
        k = int(rng.integers(1, room + 1)) if room else 1
        temperature, min_p, top_p = (
            [0.7, 1.0, 1.5][trial % 3],
            [0.0, 0.0, 0.05, 0.3][trial % 4],
            [1.0, 0.9, 0.5][trial % 3],
        )
        scaled = logits.astype(np.float64) / temperature
        scaled[banned] = -np.inf
        finite = np.sort(scaled[np.isfinite(scaled)])
        leaves = finite.size < k or np.count_nonzero(scaled >= finite[-k]) > room
        for uniform in (*rng.random(4), 0.0, 1 - 2**-24):
            got = whole_draw.top_k(logits, temperature, min_p, k, top_p, float(uniform), np.array(banned, np.int64))
            expected = None if leaves else by_definition(scaled, min_p, k, top_p, float(uniform))
            assert got == expected, (size, trial, k, min_p, top_p, uniform)
            drawn += got is not None
    assert drawn >= (0 if size < 16 else 100)


def test_top_k_draws_it_leaves_to_numpy():
    """A k over an eighth of the row, more ids tied at the k-th than that, fewer than k ids above -inf but the
    banned, and a row that is not contiguous float32: None."""
    row = np.zeros(64, np.float32)
    row[:10] = np.arange(10, 0, -1)
    none = np.array([], np.int64)
    assert whole_draw.top_k(row, 1.0, 0.0, 8, 1.0, 0.5, none) in range(8)
    assert whole_draw.top_k(row, 1.0, 0.0, 9, 1.0, 0.5, none) is None
    assert whole_draw.top_k(row, 1.0, 0.0, 8, 1.0, 0.5, np.arange(3, dtype=np.int64)) is None  # 54 tied at 0 are kept
    sparse = np.full(64, -np.inf, np.float32)
    sparse[[5, 9, 30]] = 1.0
    assert whole_draw.top_k(sparse, 1.0, 0.0, 3, 1.0, 0.5, none) in (5, 9, 30)
    assert whole_draw.top_k(sparse, 1.0, 0.0, 3, 1.0, 0.5, np.array([9], np.int64)) is None
    assert whole_draw.top_k(np.zeros((64, 2), np.float32)[:, 0], 1.0, 0.0, 1, 1.0, 0.5, none) is None
    assert whole_draw.top_k(row.astype(np.float64), 1.0, 0.0, 1, 1.0, 0.5, none) is None


def test_greedy_scores_it_leaves_to_numpy():
    """Fewer ids than asked for that are neither banned nor -inf, and a row that is not contiguous float32: None."""
    row = np.full(12, -np.inf, np.float32)
    row[[2, 7]] = [1.0, 3.0]
    assert whole_draw.scores(row, 2, np.array([], np.int64))[0].tolist() == [7, 2]
    assert whole_draw.scores(row, 2, np.array([7], np.int64)) is None
    assert whole_draw.scores(row, 3, np.array([], np.int64)) is None
    wide = np.zeros((2, 16), np.float32)
    assert whole_draw.scores(wide[:, 0], 1, np.array([], np.int64)) is None
    assert whole_draw.scores(row.astype(np.float64), 1, np.array([], np.int64)) is None


def test_a_forked_child_draws_rows_shared_out_between_threads():
    """After the parent's pool has run, a forked child (as an engine core may be started) shares its rows out
    with a pool of its own instead of waiting on its parent's thread, which fork did not copy."""
    rng = np.random.default_rng(11)
    logits = list(rng.standard_normal((8, 3000)).astype(np.float32))
    values = (np.full(8, 0.8), np.zeros(8), np.full(8, 0.9), rng.random(8))
    expected = whole_draw.draws_logits(logits, *values)  # the parent's pool thread now runs
    assert in_a_forked_child(lambda: whole_draw.draws_logits(logits, *values).tolist()) == expected.tolist()


def in_a_forked_child(work) -> list[int]:
    """The ids work() gives in a forked child, reported through a pipe; [] where it fails, or waits on a
    thread 20 s (it dies then)."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover -- the child reports through the pipe
        try:
            os.close(read)
            signal.alarm(20)
            os.write(write, np.array(work(), np.int64).tobytes())
        finally:
            os._exit(0)
    os.close(write)
    got = b""
    while chunk := os.read(read, 1 << 16):
        got += chunk
    os.close(read)
    os.waitpid(child, 0)
    return np.frombuffer(got, np.int64).tolist()


# around whole_draw.c's SPLIT_FROM (8,192 ids): below it a row is read in one part, from it in two (the first
# 4,096 ids, then the rest, its tail past the four lanes' too)
SPLIT_EDGES = [8191, 8192, 8195, 8256]


@contextmanager
def helper(share: bool):
    """The library's helper thread awake to take a long row's second part (share), or not, for the block."""
    assert whole_draw.LIBRARY is not None
    whole_draw.LIBRARY.whole_draw_share(int(share))
    whole_draw.wake()
    try:
        yield
    finally:
        whole_draw.rest()
        whole_draw.LIBRARY.whole_draw_share(int(whole_draw.SHARES))


def helping(draw):
    """draw() with the helper awake (woken afresh each time: it stays so 5 ms at most), again until the helper
    has taken a part, as a step's draws find it; what draw() gave last. On a loaded machine the helper may
    share the caller's core, and take a part only once the scheduler runs it in the middle of one: up to 20 s
    of draws."""
    before, end = whole_draw.helped(), time.monotonic() + 20
    while time.monotonic() < end:
        whole_draw.wake()
        got = draw()
        if whole_draw.helped() > before:
            return got
    raise AssertionError("the helper thread never took a part")


def shared(draw, size: int):
    """draw() with the helper awake; where a row of `size` ids is split, once the helper has taken a part."""
    with helper(True):
        return helping(draw) if whole_draw.splits(size) else draw()


def alone(draw):
    """draw() with no helper: the caller weighs both parts."""
    with helper(False):
        return draw()


@pytest.mark.parametrize("size", SPLIT_EDGES)
def test_a_long_rows_parts_give_the_definitions_ids_on_one_thread_or_two(size):
    """A long row is weighed in two parts, the second on the library's helper thread where it is awake: the
    same ids and sums with the helper as without it, and the definition's. Draws under top-p, min-p and
    neither; a penalized row with seen ids on both sides of the parts' edge; greedy scores with bans there."""
    rng = np.random.default_rng(size)
    edge = whole_draw.LIBRARY.whole_draw_split_at(size) if whole_draw.splits(size) else size // 2
    assert whole_draw.splits(size) == (size >= 8192)
    for trial in range(8):
        logits = trial_row(rng, size, trial)
        for temperature, min_p, top_p in ((0.8, 0.0, 0.95), (1.0, 0.05, 1.0), (0.7, 0.0, 1.0), (1.2, 0.0, 0.5)):
            for uniform in rng.random(2):
                draw = lambda: whole_draw.draw_logits(logits, temperature, min_p, top_p, uniform)  # noqa: B023
                got = shared(draw, size)
                assert got == alone(draw)
                if got is not None:
                    divided = logits.astype(np.float64) / temperature
                    assert got == by_definition(divided, min_p, 0, top_p, uniform), (trial, top_p)
        seen = np.array([0, edge - 1, edge, edge + 3, size - 1, int(np.argmax(logits))], np.int64)
        row = PassRow(0.9, 0, [0.9, 1.0][trial % 2], 0.0, float(rng.random()), repetition=1.3, seen=seen)
        draw = lambda: whole_draw.draw_processed(logits, 0.9, 0.0, row.top_p, row.uniform, *changes(row))  # noqa: B023
        got = shared(draw, size)
        assert got == alone(draw) == whole_draw.draw(processed_row(logits, row), 0.0, row.top_p, row.uniform)
        banned = np.array([edge - 1, edge] if trial % 2 else [], np.int64)
        if np.isinf(np.delete(logits, banned)).sum() > size - banned.size - 5:
            continue
        scores = shared(lambda: whole_draw.scores(logits, 5, banned), size)  # noqa: B023
        unshared = alone(lambda: whole_draw.scores(logits, 5, banned))  # noqa: B023
        assert scores is not None and unshared is not None
        assert scores[0].tolist() == unshared[0].tolist() and scores[2] == unshared[2]
        ids, total = scored_by_definition(logits, 5, banned.tolist())
        assert scores[0].tolist() == ids and scores[2] == pytest.approx(total, rel=1e-13, abs=0)


def test_threads_drawing_at_once_share_the_helper_and_draw_each_row_as_alone():
    """Three threads drawing long rows at once, each row by itself (the helper lent to one caller at a time,
    the others weighing both parts themselves), until the helper has taken parts (20 s at most): every id and
    sum is the row's without the helper."""
    rng = np.random.default_rng(12)
    rows = [trial_row(rng, 50257, trial) for trial in range(6)]
    uniforms = rng.random(6)
    none = np.array([], np.int64)

    def drawn() -> list:
        got = []
        for row, u in zip(rows, uniforms):
            whole_draw.wake()
            got.append((whole_draw.draw_logits(row, 0.8, 0.0, 0.95, u), whole_draw.scores(row, 3, none)[2]))
        return got

    expected = alone(drawn)
    before, end = whole_draw.helped(), time.monotonic() + 20

    def until_helped() -> list:
        runs = [drawn() for _ in range(4)]
        while whole_draw.helped() <= before and time.monotonic() < end:
            runs.append(drawn())
        return runs

    with helper(True), ThreadPoolExecutor(3) as pool:
        for run in [pool.submit(until_helped) for _ in range(3)]:
            assert all(got == expected for got in run.result())
    assert whole_draw.helped() > before


def test_a_forked_child_lends_a_long_rows_part_to_a_helper_of_its_own():
    """After the parent's helper thread has run, a forked child draws a long row with a helper of its own
    (fork did not copy the parent's) that takes parts, instead of posting them to one that is not there."""
    rng = np.random.default_rng(13)
    logits = trial_row(rng, 50257, 0)
    draw = lambda: whole_draw.draw_logits(logits, 0.8, 0.0, 0.95, 0.25)
    expected = shared(draw, logits.size)  # the parent's helper has run

    def work() -> list[int]:
        assert whole_draw.helped() == 0  # counted afresh: the parent's helper did not come with it
        return [shared(draw, logits.size) for _ in range(3)]

    assert in_a_forked_child(work) == [expected] * 3


def test_the_ab_benchmark_draws_the_same_ids_with_the_helper_on_one_side(tmp_path):
    """benchmarks/whole_draw_ab.py with --helper b, this tree on both sides: side b's rows are weighed with its
    helper thread, side a's by the caller alone, and every call picks the same ids on both."""
    out = tmp_path / "ab.json"
    tree = str(Path(__file__).resolve().parent.parent)
    argv = ["--tree-a", tree, "--rows", "1", "--rounds", "2", "--vocab", "8192", "--kinds", "top_p_flat,whole"]
    assert whole_draw_ab.main([*argv, "--warm", "--helper", "b", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["helper"] == "b" and [kind["same_ids"] for kind in report["kinds"]] == [True, True]
