"""The host's draw (engine/host_draw.py, which sorts one bucket of a row, not the row, and sums by blocks)
against its definition by a full sort and a running sum, on rows peaked, flat, tied and degenerate; and
the host's draw under top-p against the distribution it leaves."""

from __future__ import annotations

import numpy as np
import pytest
from test_logits_pass import chi_square_p

from attnserve.engine import whole_draw
from attnserve.engine.domain import SamplingParams
from attnserve.engine.host_draw import BUCKETS, draw, kept
from attnserve.engine.sampling import Sampler, counter_uniform, pick_from_few, pick_whole_row
from attnserve.engine.seam import PassRow


def by_sort(values: np.ndarray, top_p: float) -> tuple[int, float]:
    """The definition: sorted descending, the shortest prefix whose mass before its last is below p of all."""
    ordered = np.sort(values)[::-1]
    weights = np.exp(ordered)
    count = int(np.count_nonzero(np.cumsum(weights) - weights < top_p * weights.sum()))
    return count, float(ordered[count - 1])


def crossing(values: np.ndarray, top_p: float) -> tuple[int, float]:
    """How many ids the host's top-p keeps of `values` and the last one's value."""
    keep, shifted = kept(values, 0.0, 0, top_p)
    return int(keep.sum()), float(shifted[keep].min())


def by_definition(scaled: np.ndarray, min_p: float, top_k: int, top_p: float, uniform: float) -> int:
    """The draw's definition: the ids kept (a stable sort of the row for top-p), in id order, the first whose
    running float64 sum of weights passes `uniform` times their total."""
    shifted = scaled - scaled.max()
    edge = np.log(min_p) if min_p > 0.0 else -np.inf
    if 0 < top_k < shifted.size:
        edge = max(edge, np.sort(shifted)[-top_k])
    keep = (shifted >= edge) & (shifted > -np.inf)
    if top_p < 1.0:
        order = np.argsort(-np.where(keep, shifted, -np.inf), kind="stable")[: int(keep.sum())]
        weights = np.exp(shifted[order])
        keep[order[np.cumsum(weights) - weights >= top_p * weights.sum()]] = False
    ids = np.flatnonzero(keep)
    cumulative = np.cumsum(np.exp(shifted[ids]))
    return int(ids[min(np.searchsorted(cumulative, uniform * cumulative[-1], side="right"), ids.size - 1)])


def shapes(rng: np.random.Generator) -> list[np.ndarray]:
    """Log-weights (the largest 0) as rows come: peaked, flat, tied, two values, one value, a far outlier."""
    peaked = rng.normal(0, 1, 5000)
    peaked[rng.integers(0, 5000, 20)] += 9
    rows = [peaked, rng.normal(0, 0.05, 50257), np.round(rng.normal(0, 1, 3000), 1), np.array([0.0, -1.0] * 50)]
    rows += [np.zeros(7), np.append(rng.normal(0, 0.1, 1000), -1e6)]  # one value; a far one: most share a bucket
    return [row - row.max() for row in rows]


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.95, 0.999])
def test_top_p_keeps_the_sorted_prefix(top_p):
    """How many ids top-p keeps and the last one's value: the full sort's, on every shape."""
    for values in shapes(np.random.default_rng(int(top_p * 1000))):
        assert crossing(values, top_p) == by_sort(values, top_p), (values.size, top_p)


def test_a_bucket_holds_every_value_and_the_answer_holds():
    """Values spread over far fewer distinct levels than BUCKETS, and over far more: the same answers."""
    rng = np.random.default_rng(9)
    few = -rng.integers(0, 3, 10_000).astype(np.float64) / 7
    many = -rng.random(20 * BUCKETS) * 3
    for values in (few - few.max(), many - many.max()):
        for top_p in (0.3, 0.8, 0.97):
            assert crossing(values, top_p) == by_sort(values, top_p)


@pytest.mark.parametrize("size", [7, 64, 3001, 50257])
def test_the_draw_is_its_definitions(size, whole_draw_kind):
    """Each filter alone and together, on rows flat, peaked, tied and with -inf ids (bans), at uniform
    numbers across [0, 1) and at its ends: the very id the definition's sort and running sum give."""
    rng = np.random.default_rng(size)
    settings = [(0.0, 0, 0.95), (0.0, 0, 1.0), (0.05, 0, 1.0), (0.0, 5, 1.0), (0.02, 50, 0.9), (0.0, 0, 0.3)]
    for trial in range(24):
        row = rng.normal(0, [0.05, 1.0, 4.0][trial % 3], size)
        if trial % 4 == 1:
            row = np.round(row, 1)
        if trial % 4 == 2:
            row[rng.integers(0, size, size // 3)] = -np.inf
        for min_p, top_k, top_p in settings:
            for uniform in (*rng.random(6), 0.0, 1 - 2**-24):
                expected = by_definition(row, min_p, top_k, top_p, uniform)
                assert draw(row, min_p, top_k, top_p, uniform) == expected, (trial, min_p, top_k, top_p, uniform)


def test_ties_at_the_crossing_keep_the_lower_ids():
    """Four ids tied at the crossing, top-p needing two of them: the two lower ids are kept."""
    scaled = np.log(np.array([0.1, 0.3, 0.1, 0.3, 0.1, 0.1]))  # ids 1 and 3 at 0.3, then 0, 2, 4, 5 at 0.1
    keep, _ = kept(scaled, 0.0, 0, 0.75)  # the mass before each: 0, 0.3, 0.6, 0.7 (< 0.75: kept), 0.8
    assert np.flatnonzero(keep).tolist() == [0, 1, 2, 3]


def test_the_hosts_top_p_draws_follow_the_distribution(whole_draw_kind):
    """100,000 seeded positions of one Sampler under temperature 1 and top-p 0.8 over fixed logits: the
    counts pass a chi-square test against the distribution top-p leaves, and no dropped id comes."""
    p = np.array([0.3, 0.2, 0.15, 0.12, 0.1, 0.08, 0.05])
    logits = np.log(p).astype(np.float32)
    sampler = Sampler(SamplingParams(temperature=1.0, top_p=0.8, seed=11), p.size)
    counts = np.bincount([sampler(logits) for _ in range(100_000)], minlength=p.size)
    keep = (np.cumsum(p) - p) < 0.8 * p.sum()
    expected = np.where(keep, p, 0) / p[keep].sum()
    assert not counts[~keep].any()
    assert chi_square_p(counts[keep], expected[keep] * 100_000) > 0.001


def test_every_seeds_draws_are_uniform_seed_0_included():
    """A draw's uniform number comes from (seed, position) alone: over seeds 0-19,999 the first position's
    numbers spread as uniform ones do (chi-square over 20 bins), and none of seeds 0-999 at positions 0-63
    is 0, where a draw takes the first kept id of any row (mix64(0) is 0: seed 0's first draw was, for every
    prompt, until the seed was mixed from seed + GOLDEN)."""
    first = np.array([counter_uniform(seed, 0) for seed in range(20_000)])
    assert chi_square_p(np.histogram(first, 20, (0.0, 1.0))[0], np.full(20, 1_000.0)) > 0.001
    assert all(counter_uniform(seed, position) > 0.0 for seed in range(1_000) for position in range(64))


@pytest.mark.parametrize(
    ("params", "active"),
    [
        (SamplingParams(), ()),
        (SamplingParams(temperature=0.8, top_p=0.9), ("temperature", "top_p", "draw")),
        (SamplingParams(temperature=1.0, top_k=50, min_p=0.1), ("temperature", "min_p", "top_k", "draw")),
        (SamplingParams(repetition_penalty=1.1), ("repetition_penalty",)),
        (SamplingParams(frequency_penalty=0.5, logit_bias=((3, 1.0),)), ("presence_and_frequency", "logit_bias")),
        (SamplingParams(top_k=50, top_p=0.5, min_p=0.2), ()),  # greedy: the filters do nothing
    ],
)
def test_a_samplers_transforms_are_those_its_parameters_make_active(params, active):
    """In the order they apply; none: plain greedy, the engine's batch-wide argmax."""
    sampler = Sampler(params, 100)
    assert sampler.active == active
    assert sampler.plain_greedy == (not active)


def few_pick_rows(rng: np.random.Generator, size: int) -> list[np.ndarray]:
    """float32 rows as a model gives them: flat, peaked, tied (rounded), and float16's few levels."""
    peaked = rng.normal(0, 2, size)
    peaked[rng.integers(0, size, 30)] += 10
    rows = [rng.normal(0, 1, size), peaked, np.round(rng.normal(0, 2, size), 1)]
    rows.append(rng.normal(0, 3, size).astype(np.float16).astype(np.float64))
    return [row.astype(np.float32) for row in rows]


@pytest.mark.parametrize("size", [8192, 50257])
def test_a_pick_from_the_few_ids_that_decide_it_is_the_whole_rows(size, monkeypatch, whole_draw_kind):
    """pick_from_few against pick_whole_row (the definition): top-k draws with min-p, top-p, a bias that
    bans and one that lifts an id into the top-k, and the three penalties on the likeliest ids; greedy rows'
    log-probabilities and top ids, with and without bans (the likeliest id among them), by numpy (the compiled
    scores turned off here; test_greedy_rows_scored_compiled_are_the_definitions has them). The few ids
    found compiled (whole_draw.likeliest) and by numpy's group maxima. The same pick, bitwise; and the few
    ids do decide most of these rows."""
    monkeypatch.setattr(whole_draw, "scores", lambda *_: None)
    rng = np.random.default_rng(size)
    decided = 0
    for logits in few_pick_rows(rng, size):
        likely = np.argsort(-logits, kind="stable")[:40].astype(np.int64)
        for uniform in (0.0, 0.31, 0.77, 1 - 2**-24):
            rows = [
                PassRow(1.0, 50, 1.0, 0.0, uniform),
                PassRow(0.7, 5, 0.9, 0.05, uniform),
                PassRow(1.3, 40, 0.5, 0.0, uniform, ((int(likely[0]), -np.inf), (int(likely[45 % 40]), 3.0))),
                PassRow(0.8, 20, 1.0, 0.0, uniform, ((int(np.argmin(logits)), 50.0),)),
                PassRow(1.0, 10, 1.0, 0.0, uniform, repetition=1.3, seen=likely[::3]),
                PassRow(
                    0.9,
                    30,
                    0.95,
                    0.0,
                    uniform,
                    presence=0.5,
                    frequency=1.5,
                    occurred=likely[:6],
                    counts=np.arange(1, 7),
                ),
            ]
            for row in rows:
                few = pick_from_few(logits, row, scored=False)
                decided += few is not None
                assert few in (None, pick_whole_row(logits, row, scored=False)), (size, row)
        for row in greedy_scored_rows(size, likely):
            few = pick_from_few(logits, row, scored=True)
            decided += few is not None
            assert few in (None, pick_whole_row(logits, row, scored=True)), (size, row.top, row.bias)
    assert decided >= 0.9 * 4 * (6 * 4 + 4 * 3)


def greedy_scored_rows(size: int, likely: np.ndarray) -> list[PassRow]:
    """Greedy rows asking for 0, 1, 5 and 20 top log-probabilities, alone or with bans (ignore_eos,
    min_tokens): the likeliest id, and the last id, the fourth likeliest and the likeliest at once."""
    bans = (
        ((int(likely[0]), -np.inf),),
        ((size - 1, -np.inf), (int(likely[3]), -np.inf), (int(likely[0]), -np.inf)),
    )
    return [PassRow(0.0, 0, 1.0, 0.0, 0.0, bias, top=top) for top in (0, 1, 5, 20) for bias in ((), *bans)]


@pytest.mark.skipif(not whole_draw.available(), reason="the compiled draw is not built here")
@pytest.mark.parametrize("size", [100, 8192, 50257])
def test_greedy_rows_scored_compiled_are_the_definitions(size):
    """A greedy row with logprobs (and bans) scored by the compiled pass (whole_draw.scores, every row of any
    size) against pick_whole_row: the same token and top ids in the same order, ties included (rounded
    rows); log-probabilities within 1e-12 of the definition's (its sum of exps is added in another order)."""
    rng = np.random.default_rng(size)
    for logits in few_pick_rows(rng, size):
        likely = np.argsort(-logits, kind="stable")[:40].astype(np.int64)
        for row in greedy_scored_rows(size, likely):
            got, want = pick_from_few(logits, row, scored=True), pick_whole_row(logits, row, scored=True)
            assert (got.token, [i for i, _ in got.top]) == (want.token, [i for i, _ in want.top]), (size, row)
            values = [got.logprob, *(value for _, value in got.top)]
            wanted = [want.logprob, *(value for _, value in want.top)]
            assert np.allclose(values, wanted, rtol=0, atol=1e-12), (size, row.top, row.bias)
