"""Run-ahead decoding (--run-ahead): a burst's next step runs while the engine takes the last one's
tokens, with a one-step lag that nobody sees. The worker thread's order (runtime/run_ahead.py), the
engine's handling of the lag over the fake runner in a run-ahead runner's order (the tokens, ends,
usage and deltas of every request as without; test_engine.py's burst test: a cancel, a deadline, an
abort never show the step run ahead, an arrival is admitted after it), the auto rule, and the real arena
runner's steps on ONNX Runtime. Every test of a served model runs with --run-ahead on
(fixtures_server.start_server)."""

import asyncio
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from test_engine import WAIT_S, FakeRunner, alone, deltas_of_all, outcome, running

from attnserve.engine.ahead_rule import runs_ahead
from attnserve.engine.domain import Delta, GenerationRequest, SamplingParams, StreamInterval
from attnserve.engine.engine import Engine, EngineLimits
from attnserve.engine.sequence import Sequence
from attnserve.runtime.arena import Device
from attnserve.runtime.model_sessions import ModelSessions, usable_cores
from attnserve.runtime.opening import open_slot_runner
from attnserve.runtime.run_ahead import RunAhead, may_run_ahead
from attnserve.tokenizer import from_model_dir
from attnserve.tokenizer.utf8 import encode

# ---- the worker thread ------------------------------------------------------------------


class Steps:
    """A burst's steps for RunAhead: step n's tokens are [n]; a log of when each step and each answer
    began and ended, from both threads. Taking step n waits (at most WAIT_S) until step n + 1 has run,
    for n up to `stop_at` (the worker runs one step ahead: it must not need the answer first)."""

    def __init__(self, fail_at: int = 0, stop_at: int = 0, raise_at: int = 0):
        self.log: list[tuple[str, int]] = []
        self.fail_at, self.stop_at, self.raise_at = fail_at, stop_at, raise_at
        self.ran = 0
        self.started = {n: threading.Event() for n in range(1, 64)}

    def first(self) -> np.ndarray:
        return self.step(np.array([0]))

    def step(self, tokens: np.ndarray) -> np.ndarray:
        n = int(tokens[0]) + 1
        self.log.append(("step", n))
        self.started[n].set()
        self.ran = n
        if n == self.fail_at:
            raise RuntimeError("the step failed")
        return np.array([n])

    def enough(self, keys: list[int], tokens: np.ndarray) -> bool:
        n = int(tokens[0])
        self.log.append(("taking", n))
        if n == self.raise_at:
            raise ValueError("the engine's own work failed")
        if n <= self.stop_at:
            self.started[n + 1].wait(WAIT_S)
        self.log.append(("taken", n))
        return n == self.stop_at


def test_the_worker_runs_one_step_ahead_never_two_and_hands_over_the_step_after_the_end():
    ahead, steps = RunAhead(), Steps(stop_at=5)
    try:
        ran = ahead.decode_steps([0], steps.first, steps.step, 10, steps.enough)
    finally:
        ahead.close()
    assert ran == 6 and steps.ran == 6  # step 6 ran while step 5 was taken, and no step after it
    taken = [n for what, n in steps.log if what == "taking"]
    assert taken == [1, 2, 3, 4, 5, 6]
    for n in range(1, 5):  # step n + 1 ran while step n was taken; step n + 2 starts only once it was taken
        assert steps.log.index(("step", n + 1)) < steps.log.index(("taken", n)), steps.log
        assert steps.log.index(("step", n + 2)) > steps.log.index(("taken", n)), steps.log


def test_the_worker_runs_no_more_steps_than_the_bound():
    ahead, steps = RunAhead(), Steps()
    try:
        assert ahead.decode_steps([0], steps.first, steps.step, 4, steps.enough) == 4
    finally:
        ahead.close()
    assert steps.ran == 4 and [n for what, n in steps.log if what == "taking"] == [1, 2, 3, 4]


@pytest.mark.parametrize("where", ["step", "engine"])
def test_an_error_in_a_step_or_in_the_engines_work_is_raised_and_the_worker_serves_the_next_burst(where):
    ahead = RunAhead()
    failing = Steps(fail_at=3) if where == "step" else Steps(raise_at=3)
    try:
        with pytest.raises(RuntimeError if where == "step" else ValueError):
            ahead.decode_steps([0], failing.first, failing.step, 10, failing.enough)
        assert failing.ran <= 4  # the worker stopped at most a step after: nothing left running
        ran_before = failing.ran
        fine = Steps(stop_at=2)
        assert ahead.decode_steps([0], fine.first, fine.step, 10, fine.enough) == 3
        assert failing.ran == ran_before
    finally:
        ahead.close()


# ---- the engine's one-step lag (the fake runner in a run-ahead runner's order) -------------------


def mixed() -> list[GenerationRequest]:
    prompt = tuple(b"stop")
    expected = bytes(alone(prompt, 20)).decode()
    return [
        GenerationRequest("long", tuple(b"long"), 30, interval=None),
        GenerationRequest("short", tuple(b"short"), 5, interval=None),
        GenerationRequest("eos", tuple(b"!abc"), 50, interval=None),
        GenerationRequest("four", tuple(b"four"), 13, interval=StreamInterval(tokens=4)),
        GenerationRequest("each", tuple(b"each"), 9),
        GenerationRequest("stop", prompt, 20, stop=(expected[3:5],), interval=None),
        GenerationRequest("ignore", tuple(b"!xyz"), 12, ignore_eos=True, interval=None),
    ]


def test_every_request_gets_its_tokens_ends_and_deltas_as_without_run_ahead():
    """Unary calls that end by length, EOS and a stop string, streams of interval 1 and 4 and an
    ignore_eos call in one batch: with the runner one step ahead, each request's tokens, text, deltas,
    finish reason and usage are those without (and alone); the lag steps were the bursts' own work."""
    asks = mixed()
    results = {}
    for mode in ("off", "on"):
        runner = FakeRunner(capacity=len(asks))
        results[mode] = (asyncio.run(deltas_of_all(runner, asks, mode)), runner)
    (off, off_runner), (on, on_runner) = results["off"], results["on"]
    for a, (handed, text, final), (handed_on, text_on, final_on) in zip(asks, off, on):
        assert handed_on == handed and text_on == text, a.request_id
        assert (final_on.reason, final_on.usage, final_on.text) == (final.reason, final.usage, final.text), a.request_id
    assert [t for d in off[0][0] for t in d] == alone(tuple(b"long"), 30)
    assert all(on_runner.aheads) and not any(off_runner.aheads)
    # "eos" picks EOS at the 2nd step: the 3rd had run ahead, and the others took it; budgets end bursts
    # where they are due (none runs ahead past one), so each step run ahead was a step of the batch
    assert on_runner.bursts[0] == off_runner.bursts[0] + 1 == 3
    assert sum(on_runner.bursts) == sum(off_runner.bursts)


def shares(*intervals: StreamInterval | None, stops: tuple[str, ...] = ()) -> list[float]:
    """Sequence.takes_per_step of requests with these intervals (None: a unary call) and stop strings."""
    held = [
        SimpleNamespace(request=SimpleNamespace(interval=i), stream=SimpleNamespace(stops=stops)) for i in intervals
    ]
    return [Sequence.takes_per_step(request) for request in held]


def auto(*intervals: StreamInterval | None, stops: tuple[str, ...] = ()) -> bool:
    """What --run-ahead auto decides for a batch of such requests."""
    return runs_ahead("auto", [SimpleNamespace(takes_per_step=lambda t=t: t) for t in shares(*intervals, stops=stops)])


def test_auto_runs_a_burst_ahead_where_the_engine_takes_a_token_a_step_or_more():
    """--run-ahead auto: where the batch's requests take a token a step between them (a stream at interval 1,
    a request with stop strings, enough streams of a longer interval), not where fewer (unary calls)."""
    assert shares(None, StreamInterval(), StreamInterval(tokens=8)) == [0.0, 1.0, 1 / 8]
    assert shares(None, stops=("x",)) == [1.0]
    assert auto(StreamInterval()) and auto(None, stops=("x",)) and auto(*[StreamInterval(tokens=8)] * 8)
    assert not auto(None) and not auto(StreamInterval(tokens=8)) and not auto(*[None] * 16)
    assert runs_ahead("on", []) and not runs_ahead("off", [StreamInterval()])


def test_auto_in_the_engine_runs_a_streams_bursts_ahead_and_a_unary_calls_not():
    asks = [
        GenerationRequest("unary", tuple(b"unary"), 20, interval=None),
        GenerationRequest("each", tuple(b"each"), 20),
    ]
    runner = FakeRunner(capacity=1)

    async def main():
        with running(runner, run_ahead="auto") as engine:
            handles = [engine.submit(a) for a in asks]
            engine.start()
            return [await outcome(h) for h in handles]

    results = asyncio.run(main())
    assert [tokens for tokens, _ in results] == [alone(a.prompt_ids, 20) for a in asks]
    assert runner.aheads == [False, True], runner.aheads


# ---- the arena runner on ONNX Runtime ---------------------------------------------------


def taking(steps: list[list[int]], stop: int):
    """An `enough` that keeps each step's tokens in `steps` and ends the burst once it holds `stop`."""

    def enough(keys: list[int], tokens: np.ndarray) -> bool:
        steps.append(tokens.tolist())
        return len(steps) == stop

    return enough


def bursts_both_ways(model: ModelSessions) -> dict[bool, list[list[int]]]:
    """Two arena runners over `model`, one running ahead: a burst told to end at step 3 (4 without), then
    one of 5 steps from where it ended; each step's tokens by side. Both runners' slots must then hold
    the same positions."""
    prompts = [encode(p) for p in ("def main(", "import os", "The quick")]
    seen: dict[bool, list[list[int]]] = {}
    for ahead in (True, False):
        runner = open_slot_runner(model, 3, 64, run_ahead="on" if ahead else "off")
        steps = seen[ahead] = []
        for key, prompt in enumerate(prompts):
            runner.start(key, tuple(prompt))
        first = runner.prefill()
        first_ids = dict(zip(first.keys, first.rows.argmax(axis=1).tolist()))
        assert runner.decode_steps(first_ids, 10, taking(steps, 3 if ahead else 4), ahead=ahead) == 4
        assert runner.decode_steps(dict(zip(range(3), steps[-1])), 5, taking(steps, 0), ahead=ahead) == 5
        assert list(runner.decoder.arena.lengths[:3]) == [len(p) + 9 for p in prompts]
        assert (runner.ahead is not None) == ahead
    return seen


def test_the_arena_runners_steps_ahead_are_the_steps_without(tiny_model_dir):
    """ArenaRunner.decode_steps with its worker (the tiny model, CPU provider): told to end at step 3, the
    burst ran 4 steps and handed the 4th's tokens over too, each step's tokens those of a twin runner
    without run-ahead told to end at step 4; a next burst of 5 steps goes on from there as the twin's.
    tests/test_gpu.py runs the same on CUDA, with and without CUDA graphs."""
    seen = bursts_both_ways(ModelSessions(tiny_model_dir, provider="cpu", threads=1))
    assert seen[True] == seen[False] and len(seen[True]) == 9


def options(threads: int) -> SimpleNamespace:
    """What spare_core reads of a session: its intra-op threads."""
    return SimpleNamespace(get_session_options=lambda: SimpleNamespace(intra_op_num_threads=threads))


def test_auto_runs_ahead_where_a_core_is_spare():
    """A runner runs ahead where the engine asks only with --run-ahead on, or auto where ONNX Runtime's
    intra-op threads leave two cores free, the front end's and the engine thread's (never on a GPU, where
    an H200 measured no gain)."""
    cores = usable_cores()
    cpu, gpu = Device("cpu"), Device("cuda")
    assert may_run_ahead("on", options(cores), cpu) and not may_run_ahead("off", options(1), gpu)
    assert may_run_ahead("auto", options(cores - 2), cpu) == (cores > 2)  # a core for the front end, one for it
    assert not may_run_ahead("auto", options(cores - 1), cpu) and not may_run_ahead("auto", options(cores), cpu)
    assert not may_run_ahead("auto", options(1), gpu) and may_run_ahead("on", options(cores), gpu)


# ---- drawn rows in bursts on the real arena runner ------------------------------------------

DRAWN_KINDS = [  # rows a burst draws (engine/burst.py BurstDraws): seeded sampling, logprobs, a bias, penalties
    SamplingParams(temperature=0.8, top_k=20, seed=1),
    SamplingParams(temperature=1.0, top_p=0.9, seed=2),
    SamplingParams(temperature=0.7, min_p=0.05, seed=3),
    SamplingParams(logit_bias=((32, 2.0),)),
    SamplingParams(temperature=0.7, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3, seed=4),
]


def drawn_on_the_arena(model: ModelSessions, run_ahead: str, beside: bool) -> list[tuple]:
    """DRAWN_KINDS' requests (the top-p one with 3 logprobs, one more greedy with 2) served together by
    the engine over the tiny model's arena runner (every row through the batched pass where it can pick
    it exactly, the host where not), and `beside` a request whose bans change (min_tokens) that keeps the
    batch stepping: each request's tokens, logprobs and finish reason."""
    tokenizer = from_model_dir(model.model_dir, model.manifest.tokenizer)
    asks = [
        GenerationRequest(f"k{i}", tuple(encode(f"def f{i}(")), 24, sampling, logprobs=3 if i == 1 else None)
        for i, sampling in enumerate(DRAWN_KINDS)
    ]
    asks.append(GenerationRequest("l", tuple(encode("import os")), 24, logprobs=2, interval=StreamInterval(4)))
    least = GenerationRequest(
        "m", tuple(encode("class A")), 30, SamplingParams(temperature=0.7, seed=9), min_new_tokens=30
    )
    asks += [least] if beside else []
    runner = open_slot_runner(model, len(asks), 64, logits_pass="on", run_ahead=run_ahead)
    engine = Engine(runner, tokenizer, EngineLimits(len(asks), 16, 0, None, run_ahead, 0))
    bursts: list[int] = []
    real = runner.decode_steps
    runner.decode_steps = lambda *args: (ran := real(*args), bursts.append(ran))[0]

    async def main():
        handles = [engine.submit(a) for a in asks]
        engine.start()
        try:
            return [await taken(h) for h in handles]
        finally:
            engine.stop()

    results = asyncio.run(main())
    assert bool(bursts) != beside, bursts  # alone they burst; beside the min_tokens one, step by step
    return results[:6]


async def taken(handle) -> tuple:
    tokens, logprobs = [], []
    while True:
        for event in await asyncio.wait_for(handle.next_events(), WAIT_S):
            if isinstance(event, Delta):
                tokens += event.token_ids
                logprobs += [(lp.token_id, lp.logprob, tuple(i for i, _ in lp.top)) for lp in event.logprobs]
            else:
                return tokens, logprobs, event.reason


def test_drawn_rows_burst_on_the_arena_as_they_step_with_and_without_run_ahead(tiny_model_dir):
    """On ONNX Runtime (the tiny model, CPU provider, --logits-pass on): seeded sampling rows (top-k, top-p
    with logprobs, min-p, the three penalties), a greedy row with a bias and one with logprobs decode in
    bursts, with the runner one step ahead and without, to the tokens, log-probabilities and ends they
    take one step at a time."""
    model = ModelSessions(tiny_model_dir, provider="cpu", threads=1)
    stepped = drawn_on_the_arena(model, "off", beside=True)
    for run_ahead in ("off", "on"):
        bursting = drawn_on_the_arena(model, run_ahead, beside=False)
        for (tokens, logprobs, reason), (s_tokens, s_logprobs, s_reason) in zip(bursting, stepped):
            assert (tokens, reason) == (s_tokens, s_reason), run_ahead
            assert [(t, top) for t, _, top in logprobs] == [(t, top) for t, _, top in s_logprobs]
            assert [lp for _, lp, _ in logprobs] == pytest.approx([lp for _, lp, _ in s_logprobs], abs=1e-5)
    assert [len(logprobs) for _, logprobs, _ in stepped] == [0, len(stepped[1][0]), 0, 0, 0, len(stepped[5][0])]
