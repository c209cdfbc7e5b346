"""The batched logits pass (runtime/logits_pass.py) against its numpy oracle (engine/sampling.py's
pick_row), on a real ONNX Runtime session: every transform and their combinations on random rows,
the draw's distribution, a row's pick whatever shares its batch, every dtype's graph; then on a real
server over the tiny model: the rows it picks are what the host side picks, and a seeded request's
tokens are the same alone and beside 15 others."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import onnxruntime as ort
import pytest
from fixtures_server import idle, request, start_server, wait_until

from attnserve.engine.beam_search import BeamSearch, row_candidates, top_candidates
from attnserve.engine.domain import BeamParams
from attnserve.engine.host_draw import kept
from attnserve.engine.sampling import counter_uniform, log_softmax, pick_row, processed_row
from attnserve.engine.seam import PassRow
from attnserve.engine.sequence import Sequence
from attnserve.export import logits_pass_graph
from attnserve.export.logits_pass_graph import ROW_ALIGN
from attnserve.runtime import logits_pass
from attnserve.runtime.arena import Device
from attnserve.runtime.logits_pass import LogitsPass, draws_whole, graph_file, host_us, worth_passing
from attnserve.runtime.ort_session import BFLOAT16
from attnserve.tokenizer.utf8 import encode
from attnserve.v1 import generation_pb2 as pb

V = 3001
TIMEOUT = 120
PROMPTS = [f"def f{i}(x):" for i in range(9)]
# what production asks, each served by the pass: sampling (top-p, top-k, min-p), logprobs, fixed length, a bias,
# the penalties, a grammar's mask
KINDS = [
    {"temperature": 0.8, "top_p": 0.95, "seed": 7},
    {"temperature": 1.0, "top_k": 50, "seed": 3, "logprobs": 2},
    {"temperature": 0.7, "min_p": 0.1, "seed": 5},
    {"logprobs": 5},
    {"ignore_eos": True},
    {"logit_bias": {101: -100.0, 32: 3.0}},
    {"temperature": 0.7, "repetition_penalty": 1.3, "seed": 2},
    {"presence_penalty": 1.0, "frequency_penalty": 0.5, "logprobs": 3},
    {"temperature": 0.9, "seed": 4, "logprobs": 2, "structured_output": pb.StructuredOutput(regex="[a-z ]{30,60}")},
]


@pytest.fixture(scope="module")
def pass_cpu():
    return LogitsPass("float32", Device(), threads=1)


@pytest.fixture(scope="module")
def pass_on():
    """Every row through the pass, the nucleus graph among them (under auto the CPU picks flat rows on the host)."""
    return LogitsPass("float32", Device(), threads=1, mode="on")


def random_rows(rng: np.random.Generator, n: int, vocab: int = V) -> np.ndarray:
    """Rows as a model's look: a few likely ids over a long tail, some flat, some with ties."""
    rows = rng.normal(0, 1, (n, vocab))
    for i in range(n):
        rows[i, rng.integers(0, vocab, 20)] += rng.uniform(2, 12)  # a head of likely ids
        if i % 5 == 0:
            rows[i] = np.round(rows[i], 1)  # ties
    return rows.astype(np.float32)


def grammar_mask(rng: np.random.Generator, vocab: int, density: float) -> np.ndarray:
    """A grammar's packed mask (Matcher.allowed's layout) allowing about `density` of the ids, one at least."""
    allowed = rng.random(vocab) < density
    allowed[rng.integers(vocab)] = True
    return np.packbits(np.pad(allowed, (0, -vocab % 32)), bitorder="little").view(np.int32)


def plans(rng: np.random.Generator, n: int, vocab: int = V, masks: bool = True) -> list[PassRow]:
    """Every kind a request can ask, and combinations: greedy, temperature, min-p, top-k, top-p,
    banned ids, biases, top log-probabilities, and (`masks`) a grammar's mask (a few ids or most: run()
    applies it, not a width's graph alone)."""
    out = []
    for i in range(n):
        temperature = [0.0, 0.7, 1.0, 1.3][i % 4]
        top_k = [0, 1, 5, 50][(i // 4) % 4]
        top_p = [1.0, 0.9, 0.5, 0.99][(i // 16) % 4]
        min_p = [0.0, 0.05][(i // 64) % 2]
        bias = tuple((int(t), float(rng.uniform(-5, 5))) for t in rng.choice(vocab, i % 3, replace=False))
        if i % 7 == 0:
            bias += ((int(rng.integers(0, vocab)), -np.inf),)  # a banned id (ignore_eos, min_tokens)
        row = PassRow(temperature, top_k, top_p, min_p, float(rng.random()), bias, [0, 1, 5, 20][i % 4])
        if masks and i % 6 == 5:
            row = replace(row, allowed=grammar_mask(rng, vocab, [0.002, 0.6][i % 4 // 2]))
        out.append(row)
    return out


def penalized(rng: np.random.Generator, rows: np.ndarray, plan: list[PassRow]) -> list[PassRow]:
    """Penalties on some of `plan`'s rows, at ids that matter: a row's 10 likeliest and 30 others seen
    (repetition 1.3 or 0.7), its 5 likeliest and 10 others occurred 1 to 4 times (presence and
    frequency, either sign)."""
    out = []
    for i, (row, p) in enumerate(zip(rows, plan)):
        likeliest = np.argsort(row)[::-1]
        if i % 3 == 1:
            seen = np.unique(np.concatenate([likeliest[:10], rng.choice(row.size, 30, replace=False)]))
            p = replace(p, repetition=[1.3, 0.7][i % 2], seen=rng.permutation(seen))
        if i % 4 == 2:
            occurred = np.unique(np.concatenate([likeliest[:5], rng.choice(row.size, 10, replace=False)]))
            counts = rng.integers(1, 5, occurred.size)
            p = replace(p, presence=[0.5, -0.4][i % 2], frequency=[0.3, -0.2][i % 2], occurred=occurred, counts=counts)
        out.append(p)
    return out


def test_the_checked_in_graphs_are_what_the_builder_writes():
    """`python -m attnserve.export.logits_pass_graph` wrote the graphs the package serves."""
    widths = {width.name: width for width in logits_pass_graph.WIDTHS}
    assert list(widths) == list(logits_pass.WIDTHS)
    assert (widths["wide"].groups, ROW_ALIGN) == (logits_pass.WIDE_GROUPS, logits_pass.ROW_ALIGN)
    for dtype in logits_pass_graph.DTYPES:
        for width in logits_pass_graph.WIDTHS:
            assert graph_file(dtype, width.name).read_bytes() == logits_pass_graph.serialized(dtype, width), dtype
        mask = logits_pass_graph.build_mask(dtype).SerializeToString(deterministic=True)
        assert graph_file(dtype, logits_pass.MASK).read_bytes() == mask, dtype


def test_the_pass_picks_what_the_oracle_picks(pass_cpu):
    """Greedy ids exact, drawn ids exact (one uniform number each, the same steps), log-probabilities
    within 1e-5, the top ids exact, on 128 rows of every combination, penalties among them; rows the
    head cannot hold come back unpicked, and are rare on rows shaped like a model's."""
    rng = np.random.default_rng(0)
    rows = random_rows(rng, 128)
    plan = penalized(rng, rows, plans(rng, 128))
    picks = pass_cpu.run(rows[:, None, :], list(range(128)), plan)
    held = [i for i, pick in enumerate(picks) if pick is not None]
    assert len(held) >= 100, len(held)
    for i in held:
        ours, oracle = picks[i], pick_row(rows[i], plan[i])
        if draws_whole(plan[i], V):
            assert_drawn_at(rows[i], plan[i], ours.token)
        else:
            assert ours.token == oracle.token, (i, plan[i])
        assert ours.logprob == pytest.approx(oracle.logprob, abs=1e-5)
        assert [t for t, _ in ours.top] == [t for t, _ in oracle.top], i
        assert np.allclose([lp for _, lp in ours.top], [lp for _, lp in oracle.top], atol=1e-5)


def assert_drawn_at(logits: np.ndarray, row: PassRow, token: int, tolerance: float = 1e-5) -> None:
    """`token` is where the row's uniform number falls in the distribution its filters keep, over every id
    in id order (the oracle's steps in float64), to within `tolerance` of an edge: the whole and nucleus
    passes' weights are float32's."""
    scaled = processed_row(logits, row)
    keep, _ = kept(scaled, row.min_p, row.top_k, row.top_p)
    probabilities = np.where(keep, np.exp(log_softmax(scaled)), 0.0)
    cumulative = np.cumsum(probabilities)
    target = row.uniform * cumulative[-1]
    assert probabilities[token] > 0, token
    assert cumulative[token] - probabilities[token] - tolerance <= target <= cumulative[token] + tolerance, token


def test_a_row_the_head_cannot_hold_comes_back_unpicked(pass_cpu):
    """A flat row under top-p 0.99 keeps nearly every id, and under top-k 10 every id (ties are kept):
    more than the graph's head. Greedy is picked all the same, and top-k 10 of a row without ties."""
    logits = np.zeros((2, 1, V), np.float32)
    logits[1, 0] = -np.arange(V) / V  # descending, no ties
    plan = [PassRow(1.0, 0, 0.99, 0.0, 0.5), PassRow(1.0, 10, 1.0, 0.0, 0.5), PassRow(0.0, 0, 1.0, 0.0, 0.5, top=3)]
    picks = pass_cpu.run(logits, [0, 0, 0, 1], [*plan, PassRow(1.0, 10, 1.0, 0.0, 0.5)])
    assert picks[0] is None and picks[1] is None
    assert picks[2] is not None and picks[2].token == 0 and [t for t, _ in picks[2].top] == [0, 1, 2]
    assert picks[3] is not None and picks[3].token == pick_row(logits[1, 0], PassRow(1.0, 10, 1.0, 0.0, 0.5)).token


@pytest.mark.parametrize("width", ["narrow", "wide"])
def test_a_row_each_width_calls_exact_is_the_oracles_pick(pass_cpu, width):
    """Each width alone, on rows of 20,011 ids (1,251 groups: both leave groups out), peaked, flat and
    tied, under every plan (and top-k 100, past the narrow pass's candidates on a flat row): where it
    says exact, its pick is the oracle's; and it says so of most peaked rows."""
    vocab = 20_011
    rng = np.random.default_rng(4)
    rows = random_rows(rng, 96, vocab)
    rows[1::3] *= 0.05  # flat: its top-p and min-p rows keep thousands of ids
    plan = [replace(p, top_k=100) if i % 5 == 2 else p for i, p in enumerate(plans(rng, 96, vocab, masks=False))]
    picks, _ = pass_cpu.run_width(width, rows[:, None, :], list(range(96)), plan)
    for i, pick in enumerate(picks):
        if pick is not None:
            oracle = pick_row(rows[i], plan[i])
            assert (pick.token, [t for t, _ in pick.top]) == (oracle.token, [t for t, _ in oracle.top]), (i, plan[i])
            assert pick.logprob == pytest.approx(oracle.logprob, abs=1e-5)
    peaked = [pick for i, pick in enumerate(picks) if i % 3 != 1]
    assert sum(pick is not None for pick in peaked) >= 0.75 * len(peaked)


def test_the_narrow_pass_widens_only_rows_the_wide_one_might_pick(pass_cpu):
    """Rows of 50,257 ids with 0 to 400 likely ids over a flat tail, under top-p, top-k and min-p: a row
    the narrow pass leaves and does not widen, the wide pass cannot pick either (it would be a wasted
    run); one it widens, the wide pass picks mostly; a flat row under top-p is not widened."""
    vocab, n = 50_257, 48
    rng = np.random.default_rng(8)
    rows = rng.normal(0, 1, (n, vocab)).astype(np.float32)
    for i in range(n):
        rows[i, rng.choice(vocab, [0, 20, 100, 200, 400][i % 5], replace=False)] += 9
    kinds = [PassRow(0.8, 0, 0.95, 0.0, 0.3), PassRow(1.0, 150, 1.0, 0.0, 0.3), PassRow(1.0, 300, 1.0, 0.0, 0.3)]
    plan = [kinds[i % 3] for i in range(n)]
    narrow, widen = pass_cpu.run_width("narrow", rows[:, None, :], list(range(n)), plan)
    wide, _ = pass_cpu.run_width("wide", rows[:, None, :], list(range(n)), plan)
    for i in range(n):
        if narrow[i] is None and not widen[i]:
            assert wide[i] is None, (i, plan[i])
        if narrow[i] is not None:
            assert not widen[i]
    widened = [i for i in range(n) if widen[i]]
    assert widened and sum(wide[i] is not None for i in widened) >= 0.5 * len(widened)
    assert not widen[0]  # flat, top-p 0.95


def test_a_draw_from_the_whole_distribution_is_picked_whatever_its_width(pass_cpu):
    """Rows of 50,257 ids, flat and peaked, drawing with no top-k, top-p or min-p (some penalized, some
    banning an id, some asking logprobs): the whole pass picks every one, where its uniform number falls
    in the distribution over every id (to within float32's sums), never a banned id."""
    vocab, n = 50_257, 24
    rng = np.random.default_rng(6)
    rows = rng.normal(0, 1, (n, vocab)).astype(np.float32)
    rows[::2, :50] += 6  # peaked
    plan = [
        PassRow([1.0, 0.7, 1.5][i % 3], 0, 1.0, 0.0, float(rng.random()), ((7, -np.inf),) if i % 4 == 0 else (), i % 3)
        for i in range(n)
    ]
    plan = penalized(rng, rows, plan)
    picks = pass_cpu.run(rows[:, None, :], list(range(n)), plan)
    for i, pick in enumerate(picks):
        assert pick is not None and draws_whole(plan[i], vocab)
        assert_drawn_at(rows[i], plan[i], pick.token, tolerance=1e-4)
        expected = log_softmax(processed_row(rows[i], plan[i]))
        assert pick.logprob == pytest.approx(float(expected[pick.token]), abs=1e-5)
        assert [t for t, _ in pick.top] == [int(t) for t in np.argsort(-expected, kind="stable")[: plan[i].top]]
        assert not (plan[i].bias and pick.token == 7)


def test_a_row_tied_at_the_left_out_groups_maximum_comes_back_unpicked(pass_cpu):
    """Of 8,000 ids, three likely and the rest tied at 0 (500 groups, all but the likely ones' at 0): the
    groups the pass looks at are some of those tied, so an id at 0 it might keep or report could be
    another; such a row comes back unpicked. The three likely ids are picked and reported exactly."""
    vocab = 8000
    logits = np.zeros((1, 1, vocab), np.float32)
    logits[0, 0, [4000, 7000, 9]] = [12.0, 11.0, 10.0]
    cases = {
        PassRow(0.0, 0, 1.0, 0.0, 0.0, top=3): True,  # greedy with the 3 likely ids
        PassRow(1.0, 2, 1.0, 0.0, 0.3, top=2): True,  # top-k 2: the two likeliest
        PassRow(1.0, 0, 0.5, 0.0, 0.3): True,  # top-p 0.5: the likeliest alone
        PassRow(0.0, 0, 1.0, 0.0, 0.0, top=5): False,  # two of its top ids are at 0: which two?
        PassRow(1.0, 5, 1.0, 0.0, 0.3): False,  # top-k 5 keeps every id at 0
        PassRow(1.0, 0, 0.9999, 0.0, 0.3): False,  # top-p reaches into the ids at 0
    }
    picks = pass_cpu.run(logits, [0] * len(cases), list(cases))
    for (row, exact), pick in zip(cases.items(), picks):
        assert (pick is not None) == exact, row
        if pick is not None:
            oracle = pick_row(logits[0, 0], row)
            assert [t for t, _ in pick.top] == [t for t, _ in oracle.top] and pick.token == oracle.token, row


def flat_plans(rng: np.random.Generator, rows: np.ndarray) -> tuple[np.ndarray, list[PassRow]]:
    """Rows flattened as a random model's are (and some rounded to float16, whose values tie), and plans
    whose top-p or min-p keep thousands of their ids: temperatures, a ban, a bias of -100 (far below the
    rest), top log-probabilities."""
    n, vocab = rows.shape
    rows = rows * rng.choice([0.05, 0.3, 1.0], (n, 1))
    rows[1::4] = rows[1::4].astype(np.float16)
    plan = []
    for i in range(n):
        bias = (((int(rng.integers(vocab)), -np.inf),) if i % 3 == 0 else ()) + (
            ((int(rng.integers(vocab)), -100.0),) if i % 5 == 1 else ()
        )
        top_p, min_p = [(0.5, 0.0), (0.9, 0.0), (0.95, 0.0), (0.99, 0.0), (0.95, 0.02), (1.0, 0.05)][i % 6]
        plan.append(PassRow([0.6, 1.0, 1.3][i % 3], 0, top_p, min_p, float(rng.random()), bias, [0, 5][i % 2]))
    return rows.astype(np.float32), plan


@pytest.mark.parametrize("vocab", [50_257, 3001], ids=["narrow and wide first", "row pass first"])
def test_the_nucleus_pass_picks_flat_rows_as_the_oracle_does(pass_cpu, pass_on, vocab):
    """Flat rows under top-p and min-p keep more ids than any head holds: the narrow, wide and row passes
    leave nearly all (auto on the CPU picks them on the host); the nucleus pass picks them, each where its
    uniform number falls in the distribution the oracle's filters keep (to within 1e-6 of an edge), the
    same token as the oracle for nearly all, with the oracle's top ids."""
    rng = np.random.default_rng(12)
    rows, plan = flat_plans(rng, rng.normal(0, 1, (36, vocab)))
    assert sum(pick is None for pick in pass_cpu.run(rows[:, None, :], list(range(36)), plan)) >= 30
    picks = pass_on.run(rows[:, None, :], list(range(36)), plan)
    assert sum(pick is not None for pick in picks) >= 33
    same = 0
    for i, pick in enumerate(picks):
        if pick is None:
            continue
        assert_drawn_at(rows[i], plan[i], pick.token, tolerance=1e-6)
        oracle = pick_row(rows[i], plan[i])
        same += pick.token == oracle.token
        assert pick.logprob == pytest.approx(oracle.logprob, abs=1e-5)
        assert [t for t, _ in pick.top] == [t for t, _ in oracle.top], i
    assert same >= sum(pick is not None for pick in picks) - 1


def test_the_nucleus_pass_keeps_the_lower_of_ids_tied_at_top_ps_edge(pass_on):
    """A row of descending distinct values but for 40 ids tied in its middle, top-p's edge among them:
    the nucleus pass keeps the lower tied ids, as many as the oracle, for uniform numbers all along the
    kept mass. With more ids tied at the edge than it sorts (CROSSING), a row comes back unpicked."""
    vocab = 400
    logits = np.linspace(0, -4, vocab).astype(np.float32)
    tied = np.arange(100, 140)
    logits[tied] = logits[100]
    rng = np.random.default_rng(13)
    logits = logits[rng.permutation(vocab)]  # the tied ids anywhere in the row
    shifted = logits - logits.max()
    order = np.sort(shifted)[::-1]
    cumulative = np.cumsum(np.exp(order)) / np.exp(order).sum()
    top_p = float((cumulative[119] + cumulative[120]) / 2)  # the edge: the 21st of the tied ids
    plan = [PassRow(1.0, 0, top_p, 0.0, (k + 0.5) / 200) for k in range(200)]
    picks, _ = pass_on.run_width("nucleus", np.broadcast_to(logits, (200, 1, vocab)).copy(), list(range(200)), plan)
    assert [pick.token for pick in picks] == [pick_row(logits, row).token for row in plan]
    all_tied = np.zeros((1, 1, 1000), np.float32)
    assert pass_on.run_width("nucleus", all_tied, [0], [PassRow(1.0, 0, 0.5, 0.0, 0.5)])[0] == [None]


@pytest.mark.parametrize("vocab", [V, 20_011], ids=["row pass", "narrow and wide passes"])
def test_a_rows_pick_does_not_depend_on_its_batch(pass_cpu, vocab):
    """The same row and PassRow alone and among 15 others, at another index: the same Pick (or none),
    whichever graphs its vocabulary takes, penalties among the plans."""
    rng = np.random.default_rng(1)
    rows = random_rows(rng, 16, vocab)
    plan = penalized(rng, rows, plans(rng, 16, vocab))
    together = pass_cpu.run(rows[:, None, :], list(range(16)), plan)
    assert sum(pick is not None for pick in together) >= 8
    for i in range(16):
        alone = pass_cpu.run(rows[i : i + 1, None, :], [0], [plan[i]])[0]
        assert alone == together[i], i


def test_a_flat_rows_nucleus_pick_does_not_depend_on_its_batch(pass_on):
    """The nucleus pass's picks of flat rows, alone and among 15 others at another index: the same."""
    rng = np.random.default_rng(14)
    rows, plan = flat_plans(rng, rng.normal(0, 1, (16, 20_011)))
    together = pass_on.run(rows[:, None, :], list(range(16)), plan)
    assert sum(pick is not None for pick in together) >= 14
    for i in range(16):
        assert pass_on.run(rows[i : i + 1, None, :], [0], [plan[i]])[0] == together[i], i


@pytest.mark.parametrize(
    "row",
    [
        PassRow(1.0, 0, 1.0, 0.0, 0.0),
        PassRow(0.7, 0, 1.0, 0.0, 0.0),
        PassRow(1.0, 3, 1.0, 0.0, 0.0),
        PassRow(1.0, 0, 0.8, 0.0, 0.0),
        PassRow(1.0, 0, 1.0, 0.2, 0.0),
    ],
    ids=["temperature", "temperature 0.7", "top_k 3", "top_p 0.8", "min_p 0.2"],
)
def test_the_draws_follow_the_distribution(pass_cpu, row):
    """100,000 draws from fixed logits, one uniform number each from (seed, position): their counts pass
    a chi-square test against the distribution the filters leave (p > 0.001)."""
    logits = np.log(np.array([0.3, 0.2, 0.15, 0.12, 0.1, 0.08, 0.05], np.float32))
    draws = 100_000
    rows = np.broadcast_to(logits, (draws, 1, logits.size))
    plan = [PassRow(row.temperature, row.top_k, row.top_p, row.min_p, counter_uniform(7, n)) for n in range(draws)]
    tokens = np.array([pick.token for pick in pass_cpu.run(np.ascontiguousarray(rows), list(range(draws)), plan)])
    scaled = logits.astype(np.float64) / row.temperature
    p = np.exp(scaled - scaled.max())
    p /= p.sum()
    keep = p >= row.min_p * p.max()
    if row.top_k:
        keep &= np.arange(p.size) < row.top_k  # p descends by id here
    before = np.cumsum(np.where(keep, p, 0)) - np.where(keep, p, 0)
    keep &= before < row.top_p * np.where(keep, p, 0).sum()
    expected = np.where(keep, p, 0) / np.where(keep, p, 0).sum()
    counts = np.bincount(tokens, minlength=p.size)
    assert not counts[~keep].any()
    assert chi_square_p(counts[keep], expected[keep] * draws) > 0.001


def test_the_nucleus_pass_draws_follow_the_distribution(pass_on):
    """100,000 draws through the nucleus pass from 64 ids, min-p 0.25 cutting the tail and top-p 0.8 then
    less (over the mass min-p keeps), one uniform number each from (seed, position): their counts pass a
    chi-square test against the distribution the filters leave (p > 0.001); no other id is drawn."""
    p = np.linspace(1.0, 0.2, 64)
    p /= p.sum()
    logits, draws, chunk = np.log(p).astype(np.float32), 100_000, 2000
    tokens = []
    for first in range(0, draws, chunk):
        plan = [PassRow(1.0, 0, 0.8, 0.25, counter_uniform(9, n)) for n in range(first, first + chunk)]
        rows = np.broadcast_to(logits, (chunk, 1, logits.size)).copy()
        picks, _ = pass_on.run_width("nucleus", rows, list(range(chunk)), plan)
        tokens += [pick.token for pick in picks]
    keep = p >= 0.25 * p.max()
    before = np.cumsum(np.where(keep, p, 0)) - np.where(keep, p, 0)
    keep &= before < 0.8 * np.where(keep, p, 0).sum()
    assert 0 < keep.sum() < (p >= 0.25 * p.max()).sum() < p.size  # both filters cut
    expected = np.where(keep, p, 0) / np.where(keep, p, 0).sum()
    counts = np.bincount(tokens, minlength=p.size)
    assert not counts[~keep].any()
    assert chi_square_p(counts[keep], expected[keep] * draws) > 0.001


def chi_square_p(observed: np.ndarray, expected: np.ndarray) -> float:
    """Pearson's chi-square test's p-value (the upper regularized gamma function of torch)."""
    import torch

    statistic = float(((observed - expected) ** 2 / expected).sum())
    df = observed.size - 1
    if df == 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(statistic / 2)))


def test_every_dtypes_graph_picks_what_float32_picks_of_the_same_values(pass_cpu):
    """float16 and bfloat16 logits (a float16 export's, a bfloat16 one's), bound as they are: the picks
    float32's graph makes of the same values."""
    rng = np.random.default_rng(3)
    rows, plan = random_rows(rng, 32), plans(rng, 32)
    half = rows.astype(np.float16)
    expected = pass_cpu.run(half.astype(np.float32)[:, None, :], list(range(32)), plan)
    assert LogitsPass("float16", Device(), 1).run(half[:, None, :], list(range(32)), plan) == expected
    bits = (rows.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16: a float32's top half
    expected = pass_cpu.run((bits.astype(np.uint32) << 16).view(np.float32)[:, None, :], list(range(32)), plan)
    bound = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits[:, None, :], BFLOAT16)
    assert LogitsPass("bfloat16", Device(), 1).run(bound, list(range(32)), plan) == expected


def test_auto_passes_the_rows_whose_host_work_costs_more(whole_draw_kind):
    """On the CPU, auto passes sampled and logprobs rows when enough of them share the step to pay for a
    run (a few of a large vocabulary, more of a small one; with the compiled draw more sampled rows, none of
    a small vocabulary, whose host pick costs less than its share, and no greedy logprobs row, which the
    compiled scores pick for less than its share), a beam's row of a large
    vocabulary by itself, and never a greedy row that only bans ids (a copy and an argmax on the host), a
    top-k draw with no logprobs (its likeliest ids alone) nor a whole-row draw (its host pick costs less
    than a run); on CUDA every row; on and off are what they say."""
    sample, logprobs, ban = (
        PassRow(0.8, 0, 0.95, 0.0, 0.5),
        PassRow(0.0, 0, 1.0, 0.0, 0.5, top=5),
        PassRow(0.0, 0, 1.0, 0.0, 0.5, ((0, -np.inf),)),
    )
    cpu, cuda = Device(), Device("cuda", 0, 1)
    compiled = whole_draw_kind == "compiled"
    assert worth_passing([sample, logprobs, ban], 50257, cpu) == [False, False, False]  # one run costs more
    two = worth_passing([sample, sample, logprobs, ban], 50257, cpu)
    assert two == ([False] * 4 if compiled else [True, True, True, False])
    assert worth_passing([sample] * 5 + [logprobs, ban], 50257, cpu) == [True] * 5 + [not compiled, False]
    assert worth_passing([logprobs] * 4, 50257, cpu) == [False] * 4
    assert worth_passing([logprobs] * 9, 50257, cpu) == [not compiled] * 9
    assert worth_passing([replace(logprobs, alone=True)] * 16, 50257, cpu) == [True] * 16  # a beam's: numpy
    top_k = PassRow(1.0, 50, 1.0, 0.0, 0.5)  # its likeliest ids alone on the host: less than a row's share
    assert worth_passing([top_k] * 16, 50257, cpu) == [False] * 16
    assert (host_us(top_k, 50257) < host_us(replace(top_k, repetition=1.1), 50257) / 2) is compiled  # whole_draw.top_k
    assert worth_passing([replace(top_k, top=5)] * 16, 50257, cpu) == [True] * 16  # with logprobs: the row
    assert worth_passing([sample], 2048, cpu) == [False]
    assert worth_passing([sample] * 16, 2048, cpu) == [not compiled] * 16
    assert worth_passing([ban] * 64, 50257, cpu) == [False] * 64
    assert worth_passing([sample, ban], 2048, cuda) == [True, True]
    whole = PassRow(1.0, 0, 1.0, 0.0, 0.5)  # a draw over every id: passed where that saves time alone
    assert worth_passing([whole] * 16, 50257, cpu) == [False] * 16
    assert worth_passing([whole], 50257, cuda) == [True]
    assert worth_passing([whole] * 16 + [sample] * 16, 2048, cpu) == [False] * 16 + [not compiled] * 16
    beam = PassRow(0.0, 0, 1.0, 0.0, 0.0, top=9, alone=True)  # a beam's candidates: its side by its own cost
    assert worth_passing([beam], 58101, cpu) == [True]
    assert worth_passing([beam] * 16 + [sample] * 16, 8000, cpu) == [False] * 16 + [not compiled] * 16
    assert worth_passing([ban], 50257, cpu, "on") == [True]
    assert worth_passing([sample] * 16, 50257, cpu, "off") == [False] * 16
    # penalties copy the row once more on the host, but where the compiled draw patches them in as it reads
    penalized = replace(sample, repetition=1.1, presence=0.5)
    assert (host_us(penalized, 50257) > host_us(sample, 50257)) is not compiled
    assert host_us(replace(logprobs, repetition=1.1), 50257) > host_us(logprobs, 50257)


@pytest.mark.parametrize("vocab", [V, 20_011], ids=["row pass", "narrow and wide passes"])
def test_a_beams_candidates_from_the_pass_are_the_hosts_and_search_alike(pass_cpu, vocab):
    """A beam's row picked by the pass (its keep plus its bans likeliest ids, the bans left out after) gives
    the ids the host's log-softmax and top give, their log-probabilities within 1e-5; and a search of 4
    beams over 12 steps of rows takes the same beams and tokens, and keeps the same hypotheses, fed
    either way."""
    rng = np.random.default_rng(11)
    params, banned = BeamParams(num_beams=4, length_penalty=0.6, num_return_sequences=4), (3, 17)
    host, passed = (BeamSearch(params, frozenset({5}), 12) for _ in range(2))
    keep = host.keep
    row = PassRow(0.0, 0, 1.0, 0.0, 0.0, top=keep + len(banned), alone=True)
    for step in range(12):
        rows = random_rows(rng, 4, vocab)
        rows[:, 5] += 14.0 * (step in (3, 6))  # the end id likely now and then: hypotheses end early
        rows[:, banned] += 20.0  # the bans the likeliest: the pass's top holds them, the host masks them
        ids, logprobs = row_candidates(rows, banned, keep)
        picks = pass_cpu.run(rows[:, None, :], list(range(4)), [row] * 4)
        got = [top_candidates(pick.top, banned, keep) for pick in picks]
        assert [g[0].tolist() for g in got] == ids.tolist()
        assert np.stack([g[1] for g in got]) == pytest.approx(logprobs, abs=1e-5)
        moves = host.step(ids, logprobs)
        assert passed.step(np.stack([g[0] for g in got]), np.stack([g[1] for g in got])) == moves
        if host.done:
            break
    mine, theirs = host.hypotheses(), passed.hypotheses()
    assert host.done and passed.done and any(h.ended for h in mine)  # an end id ended hypotheses too
    assert [h.tokens for h in mine] == [h.tokens for h in theirs]
    # a score sums a log-probability per step, each within 1e-5 (above): within 1e-5 a step
    assert [h.score for h in mine] == pytest.approx([h.score for h in theirs], abs=1e-5 * 12)


@pytest.fixture(scope="module")
def busy(tiny_model_dir):
    running = start_server(tiny_model_dir, max_batch=16, logits_pass="on")  # a tiny vocabulary: auto passes none
    yield running
    running.stop()


def generated(stub, prompt: str, **fields) -> tuple[list[int], list[tuple[int, float, list[int]]]]:
    """A unary call's token ids and logprobs (id, logprob, top ids)."""
    reply = stub.Generate(request(prompt, max_new_tokens=24, **fields), timeout=TIMEOUT)
    return list(reply.token_ids), [(p.token_id, p.logprob, [t.token_id for t in p.top]) for p in reply.logprobs]


def test_served_rows_are_picked_by_the_pass_as_the_host_picks_them(busy, tiny_model_dir, monkeypatch):
    """Every kind production sends, served with --logits-pass on: its rows after the first token come
    back as the pass's picks (step by step, or in bursts), and its tokens, logprobs (within 1e-5) and top
    ids are those of the same requests picked on the host, row by row (every pass_row and burst_row
    None: no bursts but greedy ones), and of a server with --logits-pass off."""
    taken: list[int] = []
    drawn: list[int] = []  # a burst's rows the pass did not pick, picked on the host (Sequence.draw)
    real, draw = Sequence.take_pick, Sequence.draw
    monkeypatch.setattr(Sequence, "take_pick", lambda self, pick: (taken.append(pick.token), real(self, pick))[1])
    monkeypatch.setattr(Sequence, "draw", lambda self, *args: (drawn.append(0), draw(self, *args))[1])
    on_device = [generated(busy.stub, PROMPTS[0], **kind) for kind in KINDS]
    assert len(taken) - len(drawn) >= 10 * len(KINDS), (len(taken), len(drawn))
    monkeypatch.setattr(Sequence, "pass_row", lambda self: None)
    monkeypatch.setattr(Sequence, "burst_row", lambda self: None)
    taken.clear()
    on_host = [generated(busy.stub, PROMPTS[0], **kind) for kind in KINDS]
    assert not taken
    monkeypatch.undo()
    off = start_server(tiny_model_dir, logits_pass="off")
    try:
        taken.clear()
        on_host_off = [generated(off.stub, PROMPTS[0], **kind) for kind in KINDS]
    finally:
        off.stop()
    assert on_host_off == on_host
    for kind, (tokens, logprobs), (host_tokens, host_logprobs) in zip(KINDS, on_device, on_host):
        assert tokens == host_tokens, kind
        assert [(t, top) for t, _, top in logprobs] == [(t, top) for t, _, top in host_logprobs], kind
        assert [lp for _, lp, _ in logprobs] == pytest.approx([lp for _, lp, _ in host_logprobs], abs=1e-5)
    biased = next(i for i, kind in enumerate(KINDS) if "logit_bias" in kind)
    assert 101 not in on_device[biased][0]  # its bias of -100


def test_a_seeded_request_decodes_alike_alone_and_beside_15_others(busy):
    """Each kind's request alone, then all of them at once with more beside them (16 in the batch):
    the same tokens and logprobs, the row's pick independent of its batch."""
    alone = [generated(busy.stub, prompt, **kind) for prompt, kind in zip(PROMPTS, KINDS)]
    others = [{"temperature": 0.9, "top_p": 0.9}, {}, {"logprobs": 1}, {"temperature": 1.2, "top_k": 5}]
    with ThreadPoolExecutor(16) as pool:
        mine = [pool.submit(generated, busy.stub, prompt, **kind) for prompt, kind in zip(PROMPTS, KINDS)]
        rest = [pool.submit(generated, busy.stub, PROMPTS[i % 8], **others[i % 4]) for i in range(16 - len(KINDS))]
        together = [f.result() for f in mine]
        for f in rest:
            f.result()
    assert together == alone
    wait_until(lambda: idle(busy.engine), what="the batch to empty")


def test_tie_order_sorts_each_run_of_equal_values_by_place_whatever_order_topk_gave():
    """CUDA's TopK gives tied values in no set order (an H200 gave higher ids first); the head's and the
    nucleus's TopK put them in ONNX's order again (lower place first) by tie_order, here handed TopK's
    output in the worst order, each run of equal values by place descending, -inf's among them."""
    from onnx import TensorProto, helper

    b = logits_pass_graph.Builder()
    logits_pass_graph.constants(b, logits_pass_graph.WIDTHS[0])
    logits_pass_graph.tie_order(b, "values", "places", "k", "ordered", "ordered_places")
    graph = helper.make_graph(
        b.nodes, "tie_order",
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, ["R", "K"]),
         helper.make_tensor_value_info("places", TensorProto.INT64, ["R", "K"]),
         helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("ordered", TensorProto.FLOAT, ["R", "K"]),
         helper.make_tensor_value_info("ordered_places", TensorProto.INT64, ["R", "K"])],
        b.constants,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", logits_pass_graph.OPSET)], ir_version=10)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    rows, k = 6, 40
    values = np.round(rng.normal(0, 1, (rows, 3 * k)), 0).astype(np.float32)
    values[:, rng.integers(0, 3 * k, 30)] = -np.inf
    places = np.array([rng.permutation(3 * k)[:k] for _ in range(rows)])
    got_values = np.take_along_axis(values, places, 1)
    worst = np.array([np.lexsort((-p, -v)) for v, p in zip(got_values, places)])  # ties: higher place first
    given = np.take_along_axis(got_values, worst, 1), np.take_along_axis(places, worst, 1)
    assert any(given[1][r, i] > given[1][r, i + 1] for r in range(rows) for i in range(k - 1))  # some ties out of order
    ordered, ordered_places = session.run(None, {"values": given[0], "places": given[1], "k": np.array([k])})
    best = np.array([np.lexsort((p, -v)) for v, p in zip(got_values, places)])
    assert np.array_equal(ordered_places, np.take_along_axis(places, best, 1))
    assert np.array_equal(ordered, np.take_along_axis(got_values, best, 1))


def recording(run, runs: list[list[int]]):
    """LogitsPass.run, each call's rows appended to `runs`."""

    def recorded(logits, rows, plan):
        runs.append(list(rows))
        return run(logits, rows, plan)

    return recorded


def test_a_row_the_pass_could_not_pick_is_held_back_for_a_while_on_the_cpu(tiny_model_dir):
    """The arena runner on the CPU (the tiny model; every row worth passing, as a large vocabulary's are
    under auto): a row the pass cannot pick (top-k past its head) goes to the host for HOLD_BACK steps,
    its row read and picked there, then the pass tries it again; a row it picks stays with it; and
    without holding back (CUDA, or --logits-pass on) each step tries both."""
    from attnserve.runtime.arena_runner import HOLD_BACK
    from attnserve.runtime.model_sessions import ModelSessions
    from attnserve.runtime.opening import open_slot_runner

    model = ModelSessions(tiny_model_dir, provider="cpu", threads=1)
    vocab = model.spec.vocab_size
    flat, held = PassRow(1.0, vocab - 1, 1.0, 0.0, 0.5), PassRow(1.0, 20, 1.0, 0.0, 0.5)
    assert vocab - 1 > 256  # past the row pass's head of 256
    tried: dict[bool, list[list[int]]] = {}
    for holding in (True, False):
        runner = open_slot_runner(model, 2, 64, logits_pass="on")
        runner.decoder.logits_pass.holds_back = holding
        runner.decoder.logits_pass.run = recording(runner.decoder.logits_pass.run, tried.setdefault(holding, []))
        for key, prompt in enumerate(("def main(", "import os")):
            runner.start(key, tuple(encode(prompt)))
        first = runner.prefill()
        ids = dict(zip(first.keys, first.rows.argmax(axis=1).tolist()))
        for _ in range(2 * HOLD_BACK + 3):
            logits = runner.decode(ids, frozenset({0, 1}), {0: flat, 1: held})
            assert set(logits.picks) == {1} and np.isfinite(logits.rows[0]).all()  # key 0's row came back
            ids = {0: pick_row(logits.rows[0], flat).token, 1: logits.picks[1].token}
    assert tried[True] == ([[0, 1]] + [[1]] * HOLD_BACK) * 2 + [[0, 1]]
    assert tried[False] == [[0, 1]] * (2 * HOLD_BACK + 3)
