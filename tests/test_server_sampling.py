"""Per-request sampling in numpy: greedy is torch's argmax, filters keep what model/generate keeps."""

import numpy as np
import pytest
import torch

from attnserve.engine.domain import SamplingParams
from attnserve.engine.host_draw import kept
from attnserve.engine.sampling import Sampler, apply_occurrence_penalties, apply_repetition_penalty
from attnserve.model.generate import next_token

V = 259


def kept_mask(row: np.ndarray, min_p: float = 0.0, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """Which ids of the row sampling keeps (a bool per id)."""
    return kept(row.astype(np.float64), min_p, top_k, top_p)[0]


def logits_rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, size=(n, V)).astype(np.float32)


def test_greedy_is_torch_argmax_including_ties():
    rows = logits_rows(50)
    rows[0, [3, 7, 200]] = 99.0  # a three-way tie: the first index wins
    ours = [Sampler(SamplingParams(), V)(row) for row in rows]
    assert ours == torch.from_numpy(rows).argmax(-1).tolist()
    assert ours[0] == 3


@pytest.mark.parametrize("k", [1, 5, 40, V])
def test_top_k_keeps_the_same_tokens_as_the_reference(k):
    row = logits_rows(1, seed=k)[0]
    kept_ = kept_mask(row, top_k=k)
    reference = torch.from_numpy(row)[None]
    kth = reference.topk(min(k, V), dim=-1).values[:, -1:]
    assert kept_.tolist() == (reference >= kth)[0].tolist()


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.999])
def test_top_p_keeps_the_same_tokens_as_the_reference(p):
    row = logits_rows(1, seed=int(p * 1000))[0].astype(np.float64)
    kept_ = kept_mask(row, top_p=p)
    logits = torch.from_numpy(row)[None]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    drop = sorted_logits.softmax(-1).cumsum(-1) - sorted_logits.softmax(-1) >= p
    reference = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    assert kept_.tolist() == torch.isfinite(reference)[0].tolist()
    assert kept_.sum() >= 1


def top_p_by_stable_sort(logits: np.ndarray, p: float) -> np.ndarray:
    """Top-p as it was written first: a stable argsort of the whole row (equal logits by id)."""
    order = np.argsort(-logits, kind="stable")
    shifted = np.exp(logits[order] - logits[order].max())
    probs = shifted / shifted.sum()
    out = logits.copy()
    out[order[np.cumsum(probs) - probs >= p]] = -np.inf
    return out


@pytest.mark.parametrize("vocab", [V, 2048])
def test_top_p_keeps_exactly_what_a_stable_sort_of_the_whole_row_keeps(vocab):
    """Sorting only the ids min-p and top-k keep keeps the very same ids, equal logits at the edge
    included (lowest ids first), with masked ids, flat rows and p near 1."""
    rng = np.random.default_rng(vocab)
    for trial in range(400):
        row = rng.normal(0, [0.05, 1, 3, 20][trial % 4], vocab)
        if trial % 3 == 0:
            row = np.round(row, 1)  # ties, some at the edge
        if trial % 5 == 0:
            row[rng.integers(0, vocab, vocab // 3)] = -np.inf  # banned or masked ids, a top-k
        if trial % 11 == 0:
            row[:] = 0.5  # every id alike
        p = [0.05, 0.5, 0.9, 0.95, 0.999999][trial % 5]
        assert np.array_equal(kept_mask(row, top_p=p), np.isfinite(top_p_by_stable_sort(row, p))), (trial, p)


def test_same_seed_same_tokens_other_seed_other_tokens():
    rows = logits_rows(64, seed=1)
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=1234)
    a, b = Sampler(params, V), Sampler(params, V)
    c = Sampler(SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=99), V)
    run_a, run_b, run_c = ([s(row) for row in rows] for s in (a, b, c))
    assert run_a == run_b
    assert run_a != run_c


def test_sampling_follows_the_distribution():
    logits = np.full(V, -np.inf, dtype=np.float32)
    logits[[10, 20, 30]] = np.log([0.2, 0.3, 0.5])
    sampler = Sampler(SamplingParams(temperature=1.0, seed=0), V)
    draws = np.array([sampler(logits) for _ in range(4000)])
    freq = [np.mean(draws == t) for t in (10, 20, 30)]
    assert set(np.unique(draws)) <= {10, 20, 30}
    assert np.allclose(freq, [0.2, 0.3, 0.5], atol=0.04), freq


def test_low_temperature_approaches_greedy():
    rows = logits_rows(20, seed=3)
    sampler = Sampler(SamplingParams(temperature=1e-4, seed=0), V)
    assert [sampler(r) for r in rows] == rows.argmax(-1).tolist()


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    logits = np.array([2.0, -2.0, 1.0, 0.5], dtype=np.float32)
    seen = np.array([True, True, False, False])
    assert apply_repetition_penalty(logits, seen, 2.0).tolist() == [1.0, -4.0, 1.0, 0.5]


def test_repetition_penalty_steers_greedy_away_from_seen_tokens():
    logits = np.zeros(V, dtype=np.float32)
    logits[65], logits[66] = 3.0, 2.0
    plain = Sampler(SamplingParams(), V, prompt_ids=(256, 65))
    penalized = Sampler(SamplingParams(repetition_penalty=2.0), V, prompt_ids=(256, 65))
    assert plain(logits) == 65 and penalized(logits) == 66


def test_reference_sampler_agrees_on_what_greedy_means():
    rows = torch.from_numpy(logits_rows(8, seed=5))
    assert next_token(rows).tolist() == [Sampler(SamplingParams(), V)(r) for r in rows.numpy()]


@pytest.mark.parametrize("penalty", [float(np.float32(1e-45)), 1e-30, 100.0])
@pytest.mark.parametrize("temperature", [float(np.float32(1e-45)), 1e-6, 100.0])
def test_extreme_valid_parameters_stay_finite(penalty, temperature):
    """Found by tests/test_fuzz.py: a penalty near 0 overflowed float32 logits to inf, and the
    sampler then drew from NaN probabilities. The seen tokens' logits must stay finite and win."""
    logits = np.array([1.0, 5.0, 3.0, -2.0, 0.5, 0.1, 2.0, 4.0], dtype=np.float32)
    sampler = Sampler(SamplingParams(temperature=temperature, repetition_penalty=penalty, seed=3), 8, (2, 6))
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is fine
        tokens = [sampler(logits) for _ in range(8)]
    if penalty < 1e-20 and temperature < 1e-5:  # seen positive logits / penalty dwarf the rest
        assert set(tokens) <= {2, 6}, tokens


@pytest.mark.parametrize("min_p", [0.0, 0.01, 0.1, 0.5, 1.0])
def test_min_p_keeps_what_transformers_min_p_keeps(min_p):
    from transformers.generation.logits_process import MinPLogitsWarper

    for seed in range(20):
        row = logits_rows(1, seed=seed)[0].astype(np.float64)
        if seed % 4 == 0:
            row = np.round(row, 0)  # ties, some at the edge
        kept_ = kept_mask(row, min_p=min_p)
        reference = torch.from_numpy(row)[None]
        if min_p > 0:
            reference = MinPLogitsWarper(min_p)(None, reference)
        assert kept_.tolist() == torch.isfinite(reference)[0].tolist(), (min_p, seed)
        assert kept_[np.argmax(row)]


def test_presence_and_frequency_penalties_are_openais_formula():
    """mu[j] - c[j] * frequency - (c[j] > 0) * presence (OpenAI's parameter details), c the count in
    the completion: the prompt's ids do not count."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, V).astype(np.float32)
    counts = np.zeros(V, dtype=np.int64)
    counts[[5, 9, 40]] = [1, 3, 2]
    expected = [float(logits[j]) - counts[j] * 0.7 - (counts[j] > 0) * 1.5 for j in range(V)]
    ids = np.array([40, 5, 9])
    penalized = apply_occurrence_penalties(logits, ids, counts[ids], 1.5, 0.7)
    assert penalized.tolist() == pytest.approx(expected, abs=1e-12)

    sampler = Sampler(SamplingParams(presence_penalty=1.5, frequency_penalty=0.7), V, prompt_ids=(256, 65, 66))
    tokens = [sampler(logits) for _ in range(30)]
    occurred = np.zeros(V, dtype=np.int64)
    occurred[sampler.occurred.ids] = sampler.occurred.counts
    assert occurred.tolist() == np.bincount(tokens, minlength=V).tolist()
    assert not sampler.plain_greedy


@pytest.mark.parametrize(("presence", "frequency"), [(2.0, 0.0), (0.0, 2.0), (-2.0, 0.0)])
def test_the_occurrence_penalties_steer_greedy_by_the_completion_alone(presence, frequency):
    """Two ids 1.0 apart: greedy takes the first; once the completion holds it, a penalty of 2 takes
    the second, and a negative one keeps the first. The prompt holding them changes nothing."""
    logits = np.zeros(V, dtype=np.float32)
    logits[65], logits[66] = 3.0, 2.0
    sampler = Sampler(SamplingParams(presence_penalty=presence, frequency_penalty=frequency), V, prompt_ids=(65, 66))
    first, second = sampler(logits), sampler(logits)
    assert first == 65
    assert second == (65 if presence + frequency < 0 else 66)
