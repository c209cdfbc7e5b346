"""The real Engine over a fake SlotRunner: scheduling proved in milliseconds, no ONNX Runtime.

FakeRunner answers with deterministic logits: a row's next token is a function of every id it has
been fed (`next_id`), so a row that got another's token, or lost one of its own, decodes something
else than it does alone (`alone`). A gate in decode lets a test act between two steps; tests wait
for events (the gate reached, a request's events), never for time.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from attnserve.engine import engine as engine_module
from attnserve.engine import host_picks
from attnserve.engine.beam_search import BeamSearch, log_softmax, row_candidates, top
from attnserve.engine.domain import (
    BeamParams,
    Delta,
    Draining,
    Final,
    FinishReason,
    GenerationRequest,
    QueueFull,
    SamplingParams,
    StreamInterval,
)
from attnserve.engine.engine import Engine, EngineLimits, EngineObserver
from attnserve.engine.outbox import LoopOutbox
from attnserve.engine.seam import Bans, Draws, Enough, Logits, ModelSpec, PassRow, Verified, greedy_tokens, stepwise
from attnserve.engine.sequence import Handle, Sequence
from attnserve.engine.speculation import Speculation
from attnserve.tokenizer.utf8 import ByteTokenizer

TOKENIZER = ByteTokenizer()
SPEC = ModelSpec(TOKENIZER.vocab_size, 128, TOKENIZER.bos_id)
WAIT_S = 10.0  # the longest a test waits for an event before it fails
EOS_PROMPT_START = ord("!")  # a row whose prompt starts with "!" ends with EOS once it holds EOS_AT ids
EOS_AT = 6
COPY_PROMPT_START = ord("^")  # a row whose prompt starts with "^" repeats its id of COPY_PERIOD ids before
COPY_PERIOD = 5


def next_id(history: list[int]) -> int:
    """The fake model: a lowercase letter from every id the row holds (or, after "^", a copy)."""
    if history[0] == EOS_PROMPT_START and len(history) >= EOS_AT:
        return TOKENIZER.eos_id
    if history[0] == COPY_PROMPT_START and len(history) > COPY_PERIOD:
        return history[-COPY_PERIOD]
    return ord("a") + sum(i * (n + 1) for n, i in enumerate(history)) % 26


def alone(prompt: tuple[int, ...], max_new_tokens: int, min_new_tokens: int = 0) -> list[int]:
    """What greedy decoding of `prompt` gives with nobody else in the batch; with EOS banned before
    `min_new_tokens` (all of the budget: ignore_eos), where the fake's id is EOS the argmax over the
    others, all 0, is the lowest id."""
    history, out = list(prompt), []
    lowest = min(i for i in range(TOKENIZER.vocab_size) if i != TOKENIZER.eos_id)
    while len(out) < max_new_tokens:
        token = next_id(history)
        if token == TOKENIZER.eos_id and len(out) < min_new_tokens:
            token = lowest
        if token == TOKENIZER.eos_id:
            break
        out.append(token)
        history.append(token)
    return out


class FakeRunner:
    """A SlotRunner: `capacity` slots, prompts over `chunk` ids prefilled one chunk per round (one
    long prompt at a time, as the arena does), a log of every call, and a gate before each decode."""

    def __init__(self, capacity: int, chunk: int = 1000, spec: ModelSpec = SPEC):
        self.spec, self.capacity, self.chunk = spec, capacity, chunk
        self.rows: dict[int, list[int]] = {}  # key -> every id fed (prompt included)
        self.waiting: list[tuple[int, list[int]]] = []
        self.chunking: tuple[int, list[int], int] | None = None  # key, prompt, ids done
        self.log: list[tuple] = []
        self.forks: dict[int, list[int]] = {}  # key -> the keys its prefilled state is copied to
        self.gate, self.at_gate = threading.Event(), threading.Event()
        self.gate.set()
        self.fail_next_decode = False
        self.pause_at = 0  # the decode call (counting from 1) that finds the gate closed; 0: none
        self.decodes = 0
        self.bursts: list[int] = []  # the steps each decode_steps call ran
        self.aheads: list[bool] = []  # whether each decode_steps call was asked to run ahead
        self.sampled: list[frozenset[int]] = []  # the keys each decode call was told sample
        self.verified_rows: list[frozenset[int]] = []  # the keys each verify call was told sample
        self.verified: list[dict[int, tuple[int, ...]]] = []  # each verify call's proposals
        self.model: Callable[[list[int]], int] = next_id  # the next id after a history (a draft's may differ)
        self.now = 0.0  # the engine's clock (running): a decode step takes 1, a verify call verify_cost
        self.verify_cost = 1.0

    def free_slots(self) -> int:
        reserved = sum(len(forks) for forks in self.forks.values())
        return self.capacity - len(self.rows) - len(self.waiting) - (self.chunking is not None) - reserved

    def start(
        self, key: int, prompt: tuple[int, ...], prompt_logits: bool = False, forks: tuple[int, ...] = ()
    ) -> None:
        assert self.free_slots() > len(forks), "the engine admits only up to free_slots()"
        self.log.append(("start", key, prompt))
        self.waiting.append((key, list(prompt)))
        self.forks[key] = list(forks)

    def prefill(self) -> Logits:
        short = [item for item in self.waiting if len(item[1]) <= self.chunk]
        done = {}
        for key, prompt in short:
            done.update(self._take(key, prompt))
        self.waiting = [item for item in self.waiting if item not in short]
        if self.chunking is None and self.waiting:
            key, prompt = self.waiting.pop(0)
            self.chunking = (key, prompt, 0)
        if self.chunking is not None:
            key, prompt, n = self.chunking
            self.log.append(("chunk", key))
            self.chunking = (key, prompt, n + self.chunk) if n + self.chunk < len(prompt) else None
            if self.chunking is None:
                done.update(self._take(key, prompt))
        return Logits.of(done)

    def _take(self, key: int, prompt: list[int]) -> dict[int, np.ndarray]:
        """The prompt's last logits for `key` and for each of its forks (its prefilled state copied)."""
        keys = [key, *self.forks.pop(key, [])]
        for each in keys:
            self.rows[each] = list(prompt)
        return {each: self._logits(key) for each in keys}

    def _logits(self, key: int) -> np.ndarray:
        row = np.zeros(self.spec.vocab_size, dtype=np.float32)
        row[self.model(self.rows[key])] = 1.0
        return row

    def copy_cache(self, src: int, dst: int) -> None:
        self.log.append(("copy", src, dst))
        self.rows[dst] = list(self.rows[src])

    def decode(
        self,
        next_ids: dict[int, int],
        sampled: frozenset[int] | None = None,
        passes: Mapping[int, PassRow] | None = None,
        bans: Bans | None = None,
    ) -> Logits:
        """The next rows; told which keys sample, every row's argmax too (a key in `bans`: over the other
        ids) and the others' rows as NaN (stale, as the arena runner leaves them)."""
        self.decodes += 1
        if self.decodes == self.pause_at:
            self.gate.clear()
        if not self.gate.is_set():
            self.at_gate.set()
            self.gate.wait(WAIT_S)
        self.log.append(("decode", tuple(sorted(next_ids))))
        self.now += 1.0
        if self.fail_next_decode:
            self.fail_next_decode = False
            raise RuntimeError("the fake run failed")
        for key, token in next_ids.items():
            self.rows[key].append(token)
        logits = Logits.of({key: self._logits(key) for key in next_ids})
        if sampled is None:
            return logits
        self.sampled.append(sampled)
        stale = np.array([key not in sampled for key in logits.keys])
        rows = logits.rows.copy()
        rows[stale] = np.nan
        return Logits(logits.keys, rows, greedy_tokens(logits, bans or {}))

    def decode_steps(
        self,
        next_ids: dict[int, int],
        steps: int,
        enough: Enough,
        bans: Bans | None = None,
        ahead: bool = False,
        draws: Draws | None = None,
    ) -> int:
        """Step by step through decode() (its gate and log), as a runner without a faster way does; with
        `ahead`, in a run-ahead runner's order (each step run before the one before is taken)."""
        self.log.append(("burst", steps))
        self.aheads.append(ahead)
        ran = stepwise(self, next_ids, steps, enough, bans, ahead, draws)
        self.bursts.append(ran)
        return ran

    def verify(
        self, next_ids: dict[int, int], proposals: Mapping[int, tuple[int, ...]], sampled: frozenset[int] = frozenset()
    ) -> Verified:
        """Each key's argmax after its next token and after each of its proposals, all of them fed (a key
        in `sampled`: its rows after each)."""
        self.log.append(("verify", tuple(sorted(next_ids))))
        self.now += self.verify_cost
        self.verified.append(dict(proposals))
        self.verified_rows.append(sampled)
        verified = Verified()
        for key, token in next_ids.items():
            argmax, rows = [], []
            for fed in (token, *proposals.get(key, ())):
                self.rows[key].append(fed)
                argmax.append(self.model(self.rows[key]))
                rows.append(self._logits(key))
            if key in sampled:
                verified.rows[key] = np.stack(rows)
            else:
                verified.tokens[key] = argmax
        return verified

    def rewind(self, key: int, count: int) -> None:
        self.log.append(("rewind", key, count))
        assert 0 < count <= len(self.rows[key]), "a rewind forgets some of the ids a verify fed, no more"
        del self.rows[key][-count:]

    def release(self, key: int) -> None:
        self.log.append(("release", key))
        self.rows.pop(key, None)
        self.forks.pop(key, None)
        self.waiting = [item for item in self.waiting if item[0] != key]
        if self.chunking is not None and self.chunking[0] == key:
            self.chunking = None

    def reset(self) -> None:
        self.log.append(("reset",))
        self.rows.clear()
        self.forks.clear()
        self.waiting.clear()
        self.chunking = None

    def keys_started(self) -> dict[tuple[int, ...], int]:
        return {entry[2]: entry[1] for entry in self.log if entry[0] == "start"}


@contextmanager
def running(
    runner: FakeRunner,
    max_queue: int = 16,
    speculation: Speculation | None = None,
    draft: FakeRunner | None = None,
    run_ahead: str = "off",
    max_waiting_steps: int = 0,
):
    """The engine over `runner` (its clock the runner's), stopped after; bursts never run ahead unless
    `run_ahead` says (tests/test_run_ahead.py: the one-step lag); requests start at the next step unless
    `max_waiting_steps` says."""
    limits = EngineLimits(runner.capacity, max_queue, 0, speculation, run_ahead, max_waiting_steps)
    engine = Engine(runner, TOKENIZER, limits, draft=draft, clock=lambda: runner.now)
    try:
        yield engine
    finally:
        runner.gate.set()
        engine.stop()


def ask(prompt: str, max_new_tokens: int, deadline: float | None = None) -> GenerationRequest:
    return GenerationRequest(prompt, tuple(prompt.encode()), max_new_tokens, deadline=deadline)


async def outcome(handle) -> tuple[list[int], Final | Exception]:
    """A request's generated ids, and its Final (or the error it ended with)."""
    tokens: list[int] = []
    while True:
        for event in await asyncio.wait_for(handle.next_events(), WAIT_S):
            if isinstance(event, Delta):
                tokens += event.token_ids
            else:
                return tokens, event


def served(
    runner: FakeRunner,
    asks: list[GenerationRequest],
    speculation: Speculation | None = None,
    draft: FakeRunner | None = None,
) -> list[tuple[list[int], Final | Exception]]:
    """Every outcome of `asks`, all queued before the engine runs (so admitted in their order)."""

    async def main():
        with running(runner, speculation=speculation, draft=draft) as engine:
            handles = [engine.submit(a) for a in asks]
            engine.start()
            return [await outcome(h) for h in handles]

    return asyncio.run(main())


async def at_gate(runner: FakeRunner) -> None:
    assert await asyncio.to_thread(runner.at_gate.wait, WAIT_S), "the engine never reached a decode step"


def test_requests_start_in_arrival_order_and_each_decodes_what_it_would_alone():
    """Six requests of different lengths through two slots: every retirement refills a slot while
    the other slot's request goes on, and nobody's tokens change."""
    asks = [ask(f"prompt {i}", 3 + 2 * i) for i in range(6)]
    runner = FakeRunner(capacity=2)
    results = served(runner, asks)
    starts = [entry[2] for entry in runner.log if entry[0] == "start"]
    assert starts == [a.prompt_ids for a in asks]
    for a, (tokens, final) in zip(asks, results):
        assert tokens == alone(a.prompt_ids, a.max_new_tokens), a.request_id
        assert isinstance(final, Final) and final.reason == FinishReason.LENGTH
        assert final.usage.completion_tokens == a.max_new_tokens
    assert max(len(entry[1]) for entry in runner.log if entry[0] == "decode") == 2  # the batch was full


def test_a_full_queue_refuses_and_the_queued_requests_are_served():
    runner = FakeRunner(capacity=1)

    async def main():
        with running(runner, max_queue=2) as engine:
            engine.check_room()  # room: no error
            handles = [engine.submit(ask(f"q{i}", 2)) for i in range(2)]
            with pytest.raises(QueueFull, match="--max-queue"):
                engine.check_room()  # what a door asks before it reads a request
            with pytest.raises(QueueFull, match="--max-queue"):
                engine.submit(ask("one too many", 2))
            engine.start()
            return [await outcome(h) for h in handles]

    assert [tokens for tokens, _ in asyncio.run(main())] == [alone(tuple(b"q0"), 2), alone(tuple(b"q1"), 2)]
    assert len([entry for entry in runner.log if entry[0] == "start"]) == 2


def test_requests_submitted_together_are_queued_all_or_none():
    """submit_together: more than the queue takes is refused whole; those it takes are all admitted at one
    step boundary (the start-up warm-up's whole batch)."""
    runner = FakeRunner(capacity=3)

    async def main():
        with running(runner, max_queue=3) as engine:
            engine.submit(ask("first", 2))
            with pytest.raises(QueueFull, match="--max-queue"):
                engine.submit_together([ask(f"t{i}", 2) for i in range(3)])  # 1 + 3 > 3
            assert engine.stats() == {"active": 0, "queued": 1}
            handles = engine.submit_together([ask(f"t{i}", 2) for i in range(2)])
            engine.start()
            return [await outcome(h) for h in handles]

    assert [tokens for tokens, _ in asyncio.run(main())] == [alone(tuple(b"t0"), 2), alone(tuple(b"t1"), 2)]
    assert max(len(entry[1]) for entry in runner.log if entry[0] == "decode") == 3  # one step decoded all three


def test_cancel_frees_the_slot_at_the_next_step_for_the_queued_request():
    runner = FakeRunner(capacity=1)
    runner.gate.clear()

    async def main():
        with running(runner) as engine:
            long, queued = engine.submit(ask("long", 50)), engine.submit(ask("queued", 3))
            engine.start()
            await at_gate(runner)  # the long one has its first token and waits for its second
            engine.release(long)  # what the servicer does when its caller goes away
            runner.gate.set()
            return await outcome(long), await outcome(queued), engine.stats()

    (long_tokens, long_final), (tokens, final), stats = asyncio.run(main())
    assert isinstance(long_final, Final) and long_final.reason == FinishReason.CANCELLED
    assert long_final.usage.completion_tokens == len(long_tokens) == 2  # the step under way, then no more
    assert tokens == alone(tuple(b"queued"), 3) and final.reason == FinishReason.LENGTH
    keys = runner.keys_started()
    assert runner.log.index(("release", keys[tuple(b"long")])) < runner.log.index(
        ("start", keys[tuple(b"queued")], tuple(b"queued"))
    )
    assert stats == {"active": 0, "queued": 0}


class Counted(EngineObserver):
    def __init__(self):
        self.finals: list[Final] = []

    def on_finish(self, final: Final, request=None) -> None:
        self.finals.append(final)


def test_a_released_queued_request_ends_cancelled_at_once_counted_and_never_started():
    """The public way to end a request from another thread: a queued one's Final goes out at the
    engine thread's next step boundary (the burst under way ends for it), not when a slot frees,
    and the observer counts it."""
    runner = FakeRunner(capacity=1)
    runner.gate.clear()
    observer = Counted()

    async def main():
        engine = Engine(runner, TOKENIZER, EngineLimits(runner.capacity, 16, 0, None, "off", 0), observer)
        try:
            long, queued = engine.submit(ask("long", 50)), engine.submit(ask("queued", 3))
            engine.start()
            await at_gate(runner)
            engine.release(queued)
            runner.gate.set()
            return await outcome(queued), await outcome(long)
        finally:
            runner.gate.set()
            engine.stop()

    (tokens, final), (long_tokens, _) = asyncio.run(main())
    assert tokens == [] and isinstance(final, Final) and final.reason == FinishReason.CANCELLED
    assert final.usage.completion_tokens == 0
    assert tuple(b"queued") not in runner.keys_started()
    assert long_tokens == alone(tuple(b"long"), 50)
    assert [f.reason for f in observer.finals] == [FinishReason.CANCELLED, FinishReason.LENGTH]
    assert runner.bursts[0] == 1  # the burst under way stopped after its step for the ending


def test_a_refusal_handed_to_the_engine_is_its_callers_only_event():
    """refuse(): a request never queued (the engine core found it over its bounds) gets its error
    from the engine thread, the one that delivers every event."""
    runner = FakeRunner(capacity=1)

    async def main():
        with running(runner) as engine:
            engine.start()
            handle = Handle(ask("refused", 3), asyncio.get_running_loop())
            engine.refuse(handle, QueueFull("full"))
            return await asyncio.wait_for(handle.next_events(), WAIT_S), engine.stats()

    events, stats = asyncio.run(main())
    assert len(events) == 1 and isinstance(events[0], QueueFull) and str(events[0]) == "full"
    assert stats == {"active": 0, "queued": 0} and not runner.keys_started()


class Clock:
    """time.monotonic and time.perf_counter for the engine module, moved by the test."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now


def test_a_deadline_ends_a_decoding_request_and_a_queued_one_at_the_next_step(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(engine_module, "time", clock)
    runner = FakeRunner(capacity=1)
    runner.gate.clear()

    async def main():
        with running(runner) as engine:
            decoding = engine.submit(ask("decoding", 50, deadline=clock.now + 5))
            queued = engine.submit(ask("queued", 3, deadline=clock.now + 5))
            engine.start()
            await at_gate(runner)
            clock.now += 10  # both deadlines pass while the step is under way
            runner.gate.set()
            return await outcome(decoding), await outcome(queued)

    (tokens, final), (queued_tokens, queued_final) = asyncio.run(main())
    assert isinstance(final, Final) and final.reason == FinishReason.DEADLINE and len(tokens) == 2
    assert isinstance(queued_final, Final) and queued_final.reason == FinishReason.DEADLINE and not queued_tokens
    assert [entry[2] for entry in runner.log if entry[0] == "start"] == [tuple(b"decoding")]  # never admitted


def test_drain_refuses_new_requests_and_finishes_the_queued_and_active_ones():
    runner = FakeRunner(capacity=1)

    async def main():
        with running(runner) as engine:
            handles = [engine.submit(ask("active", 4)), engine.submit(ask("queued", 4))]
            engine.close()
            with pytest.raises(Draining):
                engine.check_room()
            with pytest.raises(Draining):
                engine.submit(ask("too late", 4))
            engine.start()
            return [await outcome(h) for h in handles]

    results = asyncio.run(main())
    assert [tokens for tokens, _ in results] == [alone(tuple(b"active"), 4), alone(tuple(b"queued"), 4)]


@pytest.mark.parametrize("interval", [StreamInterval(), None], ids=["stream", "unary"])
def test_a_long_prompt_is_prefilled_one_chunk_per_decode_step_of_the_running_batch(interval):
    """Whether the running request streams or waits for its end (a greedy unary call would otherwise
    decode in bursts), the batch runs one decode step between two chunks of a long prompt."""
    runner = FakeRunner(capacity=2, chunk=4)
    runner.gate.clear()
    long_prompt = "a prompt of 22 ids ..."

    async def main():
        with running(runner) as engine:
            decoding = engine.submit(GenerationRequest("tick", tuple(b"tick"), 20, interval=interval))
            engine.start()
            await at_gate(runner)
            long = engine.submit(ask(long_prompt, 3))
            runner.gate.set()
            return await outcome(decoding), await outcome(long)

    (tick, _), (tokens, _) = asyncio.run(main())
    assert tick == alone(tuple(b"tick"), 20) and tokens == alone(tuple(long_prompt.encode()), 3)
    chunks = [n for n, entry in enumerate(runner.log) if entry[0] == "chunk"]
    assert len(chunks) == 6  # 22 ids in chunks of 4
    assert all(runner.log[a + 1 : b] == [("decode", (0,))] for a, b in itertools.pairwise(chunks)), runner.log


def test_a_failed_run_fails_the_active_requests_and_the_queued_one_is_served_after_a_reset():
    runner = FakeRunner(capacity=2)
    runner.fail_next_decode = True
    (_, first), (_, second), (tokens, third) = served(runner, [ask(p, 5) for p in ("one", "two", "three")])
    assert isinstance(first, RuntimeError) and isinstance(second, RuntimeError)
    assert isinstance(third, Final) and tokens == alone(tuple(b"three"), 5)
    assert ("reset",) in runner.log


def test_eos_ends_a_request_and_its_slot_goes_to_the_next():
    (tokens, final), (next_tokens, _) = served(FakeRunner(capacity=1), [ask("!ab", 50), ask("next", 3)])
    assert isinstance(final, Final) and final.reason == FinishReason.EOS
    assert tokens == alone(tuple(b"!ab"), 50) and len(tokens) == EOS_AT - 3
    assert next_tokens == alone(tuple(b"next"), 3)


def test_an_encoder_decoder_runner_gets_the_source_and_the_decoder_budget_counts_from_bos():
    """An encoder-decoder's prompt is its source; its decoder starts from BOS alone, so a source
    longer than the context still leaves context - 1 tokens to generate."""
    spec = ModelSpec(TOKENIZER.vocab_size, 8, TOKENIZER.bos_id, encoder_decoder=True)
    runner = FakeRunner(capacity=1, spec=spec)
    source = ask("a source longer than the context", 50)

    async def main():
        with running(runner) as engine:
            handle = engine.submit(source)
            engine.start()
            return await outcome(handle)

    tokens, final = asyncio.run(main())
    assert runner.log[0] == ("start", 0, source.prompt_ids)
    assert isinstance(final, Final) and final.reason == FinishReason.LENGTH and len(tokens) == 8 - 1
    assert final.usage.prompt_tokens == len(source.prompt_ids)


async def deltas(handle) -> tuple[list[tuple[int, ...]], str, Final]:
    """A request's Deltas as the engine handed them on (their token ids), their text, and its Final."""
    handed: list[tuple[int, ...]] = []
    text = ""
    while True:
        for event in await asyncio.wait_for(handle.next_events(), WAIT_S):
            assert not isinstance(event, Exception), event
            text += event.text
            if isinstance(event, Final):
                return handed, text, event
            handed.append(event.token_ids)


async def deltas_of_all(runner: FakeRunner, asks: list[GenerationRequest], run_ahead: str = "off") -> list:
    """`asks` submitted together to an engine over `runner`, then each one's deltas()."""
    with running(runner, run_ahead=run_ahead) as engine:
        handles = [engine.submit(a) for a in asks]
        engine.start()
        return [await deltas(h) for h in handles]


def test_the_engine_hands_deltas_on_at_each_requests_interval_and_a_unary_calls_with_its_end():
    """Every step's token (the default), the first at once then every 4 tokens (a stream's interval of
    4), or all at the end (interval None: a unary call): the same tokens and text each way, nothing lost."""
    prompt = tuple(b"paced")
    intervals = {"each": StreamInterval(), "four": StreamInterval(tokens=4), "end": None}

    async def main():
        with running(FakeRunner(capacity=3)) as engine:
            handles = {
                name: engine.submit(GenerationRequest(name, prompt, 11, interval=interval))
                for name, interval in intervals.items()
            }
            engine.start()
            return {name: await deltas(handle) for name, handle in handles.items()}

    got = asyncio.run(main())
    expected = alone(prompt, 11)
    for name, (handed, text, final) in got.items():
        assert [t for d in handed for t in d] == expected and text == bytes(expected).decode(), name
        assert final.reason == FinishReason.LENGTH and final.usage.completion_tokens == 11, name
    assert [len(d) for d in got["each"][0]] == [1] * 11
    assert [len(d) for d in got["four"][0]] == [1, 4, 4, 2]
    assert [len(d) for d in got["end"][0]] == [11]


def test_a_streams_time_bound_hands_on_what_it_holds_once_it_has_passed():
    """Sequence by itself, its clock given: with 100 tokens or 5 ms, a delta goes at the first token,
    then at the first token 5 ms or more after it; the end hands on the rest before the Final."""
    request = GenerationRequest("timed", (1, 2), 10, interval=StreamInterval(tokens=100, ms=5))
    sequence = Sequence(request, SimpleNamespace(request=request, cancelled=False, finished=False), TOKENIZER, SPEC)
    at = lambda ms: 1000.0 + ms / 1000
    assert [e.token_ids for e in sequence.advance(ord("a"), at(0))] == [(ord("a"),)]
    assert sequence.advance(ord("b"), at(2)) == [] and sequence.advance(ord("c"), at(4.9)) == []
    assert [e.token_ids for e in sequence.advance(ord("d"), at(5.1))] == [(ord("b"), ord("c"), ord("d"))]
    assert sequence.advance(ord("e"), at(6)) == []
    *held, final = sequence.end(FinishReason.CANCELLED)
    assert [e.token_ids for e in held] == [(ord("e"),)] and final.text == "" and final.usage.completion_tokens == 5


@pytest.mark.parametrize("max_burst", [8, engine_module.MAX_BURST])
def test_greedy_unary_and_paced_requests_decode_in_bursts_and_each_gets_what_it_would_alone(monkeypatch, max_burst):
    """Unary calls and a stream of interval 4, all greedy: the runner runs decode steps back to back (at
    most MAX_BURST), each request takes its tokens when its Delta falls due or its budget ends, and the
    burst ends after a step where one ended or picked EOS; every request's tokens, deltas and ends are
    as alone."""
    monkeypatch.setattr(engine_module, "MAX_BURST", max_burst)
    asks = [
        GenerationRequest("long", tuple(b"long"), 30, interval=None),
        GenerationRequest("short", tuple(b"short"), 5, interval=None),
        GenerationRequest("eos", tuple(b"!abc"), 50, interval=None),
        GenerationRequest("four", tuple(b"four"), 13, interval=StreamInterval(tokens=4)),
    ]
    runner = FakeRunner(capacity=4)
    results = asyncio.run(deltas_of_all(runner, asks))
    reasons = [FinishReason.LENGTH, FinishReason.LENGTH, FinishReason.EOS, FinishReason.LENGTH]
    for a, (handed, text, final), reason in zip(asks, results, reasons):
        tokens = [t for d in handed for t in d]
        assert tokens == alone(a.prompt_ids, a.max_new_tokens) and text == bytes(tokens).decode(), a.request_id
        assert final.reason == reason and final.usage.completion_tokens == len(tokens), a.request_id
    assert [len(d) for d in results[3][0]] == [1, 4, 4, 4]
    # "eos" picks EOS at the 2nd step, "short" reaches its budget 2 steps later, "four" 8 steps after that;
    # then "long" alone, MAX_BURST steps at a time, to its budget
    assert runner.bursts == ([2, 2, 8, 8, 8, 1] if max_burst == 8 else [2, 2, 8, 17])
    last = max(i for i, entry in enumerate(runner.log) if entry[0] == "burst")
    assert [entry[0] for entry in runner.log[last + 1 :]] == ["decode"] * runner.bursts[-1] + ["release"]


def test_ignore_eos_and_rows_past_min_new_tokens_decode_in_bursts_and_never_take_eos():
    """Greedy rows whose only transform is a ban that stays (ignore_eos; min_new_tokens once reached: EOS
    free again, so no ban) run in bursts like plain greedy ones: the runner's argmax, and where that is
    EOS under ignore_eos, the best other id. Before min_new_tokens a row's ban ends later: one step at a
    time. Each gets what decoding alone with its bans gives."""
    asks = [
        GenerationRequest("ignore", tuple(b"!abc"), 12, ignore_eos=True, interval=None),
        GenerationRequest("min", tuple(b"!xyz"), 12, min_new_tokens=4, interval=None),
        GenerationRequest("plain", tuple(b"long"), 12, interval=None),
    ]
    runner = FakeRunner(capacity=3)
    results = served(runner, asks)
    (ignored, ignore_final), (least, min_final), (plain, _) = results
    assert ignored == alone(asks[0].prompt_ids, 12, 12) and ignore_final.reason == FinishReason.LENGTH
    assert len(alone(asks[0].prompt_ids, 12)) == 2  # its argmax is EOS from its 3rd token on: banned
    assert least == alone(asks[1].prompt_ids, 12, 4) and min_final.reason == FinishReason.EOS
    assert len(least) == 4 and plain == alone(asks[2].prompt_ids, 12)
    # the first tokens come with the prefill; 3 single steps while "min" has EOS banned, then bursts: one
    # step where "min" picks EOS and ends, then the rest of the budgets
    assert [entry[0] for entry in runner.log[3:]] == ["decode"] * 3 + ["burst", "decode", "release", "burst"] + [
        "decode"
    ] * 7 + ["release"] * 2, runner.log
    assert runner.bursts == [1, 7]


@pytest.mark.parametrize("least", [0, 10], ids=["drawn, in bursts", "min_tokens to its end, step by step"])
def test_beside_a_sampled_row_an_ignore_eos_row_takes_the_runners_argmax_with_its_bans(least: int):
    """Beside a row that samples (drawn in bursts; with EOS banned until min_tokens, one step at a time), a
    greedy ignore_eos row is not among the keys that sample: its row of logits need not come back (nor go
    through the pass); the runner's argmax over every id but EOS is its token, as decoding alone with the
    ban gives."""
    sampling = SamplingParams(temperature=0.8, seed=1)
    asks = [
        GenerationRequest("ignore", tuple(b"!abc"), 10, ignore_eos=True, interval=None),
        GenerationRequest("s", tuple(b"sampled"), 10, sampling, interval=None, min_new_tokens=least),
    ]
    runner = FakeRunner(capacity=2)
    (ignored, final), (_, s_final) = served(runner, asks)
    assert ignored == alone(asks[0].prompt_ids, 10, 10) and final.reason == FinishReason.LENGTH
    assert isinstance(s_final, Final) and s_final.usage.completion_tokens == 10
    assert any(entry[0] == "burst" for entry in runner.log) == (least == 0), runner.log
    assert runner.sampled and all(sampled == {1} for sampled in runner.sampled), runner.sampled


def test_a_unary_call_with_a_stop_string_ends_its_burst_at_the_step_that_completes_it():
    """Beside a long unary call, a unary call whose stop string its 4th and 5th tokens make: the burst
    ends after the step that took the 5th (a unary call otherwise takes its tokens at the burst's end,
    and its row would decode on to MAX_BURST steps), and its answer is what step-by-step gives."""
    prompt = tuple(b"stop")
    expected = bytes(alone(prompt, 20)).decode()
    stop = expected[3:5]
    assert expected.find(stop) == 3
    asks = [
        GenerationRequest("stop", prompt, 20, stop=(stop,), interval=None),
        GenerationRequest("long", tuple(b"long"), 30, interval=None),
    ]
    runner = FakeRunner(capacity=2)
    (_, text, final), _ = asyncio.run(deltas_of_all(runner, asks))
    assert (text, final.reason, final.usage.completion_tokens) == (expected[:3], FinishReason.STOP, 5)
    assert runner.bursts[0] == 4  # tokens 2 to 5 (the first came from the prefill)


@pytest.mark.parametrize("run_ahead", ["off", "on"])
@pytest.mark.parametrize("news", ["cancel", "deadline", "abort", "arrival"])
def test_a_cancel_a_deadline_or_an_arrival_ends_a_burst_after_the_step_under_way(monkeypatch, news, run_ahead):
    """A burst looks at its callers after every step: a request cancelled, aborted or past its deadline during
    a step ends with that step's token, and a queued request with a free slot is admitted after it. Run
    ahead (tests/test_run_ahead.py), the step after it has run too (seam.SlotRunner's lag): what it ends
    never shows that step's token, and an arrival is admitted after it."""
    clock = Clock()
    monkeypatch.setattr(engine_module, "time", clock)
    runner = FakeRunner(capacity=2)
    runner.gate.clear()

    async def main():
        with running(runner, run_ahead=run_ahead) as engine:
            long = engine.submit(GenerationRequest("l", tuple(b"long"), 50, deadline=clock.now + 5, interval=None))
            engine.start()
            await at_gate(runner)  # its first token came with its prefill; a burst's first step waits
            late = None
            if news == "cancel":
                engine.release(long)
            elif news == "deadline":
                clock.now += 10
            elif news == "abort":
                engine.abort()
            else:
                late = engine.submit(GenerationRequest("n", tuple(b"new"), 3, interval=None))
            runner.gate.set()
            return await outcome(long), late and await outcome(late)

    (tokens, final), late = asyncio.run(main())
    first = next(i for i, entry in enumerate(runner.log) if entry[0] == "burst")
    ran = 2 if run_ahead == "on" else 1
    after = first + 1 + ran
    assert [entry[0] for entry in runner.log[first + 1 : after + 1]] == ["decode"] * ran + [runner.log[after][0]]
    assert runner.log[after][0] != "decode" and runner.bursts[0] == ran, runner.log
    if news == "arrival":
        assert runner.log[after][:2] == ("start", 1) and late[0] == alone(tuple(b"new"), 3)
        assert tokens == alone(tuple(b"long"), 50) and final.reason == FinishReason.LENGTH
    else:
        reason = FinishReason.DEADLINE if news == "deadline" else FinishReason.CANCELLED
        assert isinstance(final, Final) and final.reason == reason and tokens == alone(tuple(b"long"), 2)
        assert final.usage.completion_tokens == 2 and runner.log[after][0] == "release"


@pytest.mark.parametrize("arrivals", [1, 2])
@pytest.mark.parametrize("wait", [0, 5])
def test_max_waiting_steps_holds_an_arrival_while_fewer_wait_than_decode(wait, arrivals):
    """--max-waiting-steps: with two requests decoding, one arrival waits `wait` decode steps (counted from
    the step under way when it came) before its prefill pauses them, the burst going on meanwhile; two
    arrivals, as many as decode, start after the step under way, as every arrival does with 0. Nobody's
    tokens change."""
    runner = FakeRunner(capacity=4)
    runner.gate.clear()

    async def main():
        with running(runner, max_waiting_steps=wait) as engine:
            longs = [
                engine.submit(GenerationRequest(f"l{i}", (108, 111, 110, 103, i), 40, interval=None)) for i in (1, 2)
            ]
            engine.start()
            await at_gate(runner)
            late = [
                engine.submit(GenerationRequest(f"n{i}", (110, 101, 119, i), 3, interval=None)) for i in range(arrivals)
            ]
            runner.gate.set()
            return [await outcome(h) for h in longs], [await outcome(h) for h in late]

    longs, late = asyncio.run(main())
    gated = next(i for i, entry in enumerate(runner.log) if entry[0] == "burst") + 1  # the step under way
    started = next(i for i, entry in enumerate(runner.log) if entry[0] == "start" and entry[1] == 2)
    decodes = [entry for entry in runner.log[gated:started] if entry[0] == "decode"]
    assert len(decodes) == (wait if arrivals == 1 and wait else 1), runner.log
    assert all(len(entry[1]) == 2 for entry in decodes)  # the two that decode, in a burst
    for i, (tokens, final) in zip((1, 2), longs):
        assert tokens == alone((108, 111, 110, 103, i), 40) and final.reason == FinishReason.LENGTH
    assert [tokens for tokens, _ in late] == [alone((110, 101, 119, i), 3) for i in range(arrivals)]


def test_a_row_whose_pick_changes_by_more_than_its_draw_means_one_step_at_a_time():
    """A sampling row whose bans change (EOS banned until min_tokens, here its whole budget) is picked after
    every step: no bursts; its greedy neighbour decodes what it decodes alone."""
    sampling = SamplingParams(temperature=0.8, repetition_penalty=1.2, seed=1)
    sampled = GenerationRequest("s", tuple(b"sampled"), 10, sampling, interval=None, min_new_tokens=10)
    runner = FakeRunner(capacity=2)
    (_, s_final), (g_tokens, _) = served(runner, [sampled, GenerationRequest("g", tuple(b"greedy"), 10, interval=None)])
    assert isinstance(s_final, Final) and s_final.usage.completion_tokens == 10
    assert g_tokens == alone(tuple(b"greedy"), 10)
    assert not any(entry[0] == "burst" for entry in runner.log), runner.log


DRAWN = [  # rows a burst draws: sampling (seeded), logprobs, a bias, penalties, streams of 1 and 4 tokens a Delta
    GenerationRequest("k", tuple(b"top k"), 12, SamplingParams(temperature=0.8, top_k=20, seed=1), ignore_eos=True),
    GenerationRequest(
        "p", tuple(b"top p"), 12, SamplingParams(temperature=1.0, top_p=0.9, seed=2), ignore_eos=True, logprobs=3
    ),
    GenerationRequest("l", tuple(b"greedy"), 12, logprobs=2, interval=StreamInterval(4)),
    GenerationRequest("b", tuple(b"bias"), 12, SamplingParams(logit_bias=((ord("q"), 5.0),)), interval=None),
    GenerationRequest(
        "r",
        tuple(b"penalties"),
        12,
        SamplingParams(temperature=0.7, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.4, seed=4),
        logprobs=1,
    ),
    GenerationRequest("e", tuple(b"!abc"), 12, SamplingParams(temperature=0.5, seed=3), ignore_eos=True, interval=None),
]


async def tokens_and_logprobs(handle) -> tuple[list[int], list, Final | Exception]:
    """A request's tokens, their log-probabilities and its last event."""
    tokens, logprobs = [], []
    while True:
        for event in await asyncio.wait_for(handle.next_events(), WAIT_S):
            if isinstance(event, Delta):
                tokens += event.token_ids
                logprobs += event.logprobs
            else:
                return tokens, logprobs, event


def drawn_outcomes(asks: list[GenerationRequest]) -> tuple[FakeRunner, list]:
    runner = FakeRunner(capacity=len(asks))

    async def main():
        with running(runner) as engine:
            handles = [engine.submit(a) for a in asks]
            engine.start()
            return [await tokens_and_logprobs(h) for h in handles]

    return runner, asyncio.run(main())


def test_drawn_rows_run_in_bursts_and_take_what_one_step_at_a_time_gives():
    """Rows whose PassRow changes from step to step by its uniform number and its penalties' ids alone
    (seeded sampling with top-k or top-p, logprobs, a bias, the repetition, presence and frequency
    penalties, ignore_eos while sampling) run in bursts, the runner picking each step's draw (here the
    host's Draws.pick_on_host: the fake has no pass); each takes the tokens and log-probabilities it takes one
    step at a time, beside a row whose bans change (min_tokens) that keeps the batch stepping."""
    bursting, together = drawn_outcomes(DRAWN)
    least = GenerationRequest("m", tuple(b"min"), 14, SamplingParams(temperature=0.7, seed=9), min_new_tokens=14)
    stepping, beside = drawn_outcomes([*DRAWN, least])
    assert not any(entry[0] == "burst" for entry in stepping.log), stepping.log
    assert bursting.bursts and sum(bursting.bursts) == 11, bursting.log  # 11 of 12 tokens: the first is the prefill's
    assert all(entry[1] == tuple(range(6)) for entry in bursting.log if entry[0] == "decode"), bursting.log
    assert all(sampled == set(range(6)) for sampled in bursting.sampled), bursting.sampled
    for (tokens, logprobs, final), (alone_tokens, alone_logprobs, alone_final) in zip(together, beside):
        assert isinstance(final, Final) and final.usage.completion_tokens == 12, final
        assert (tokens, logprobs, final.reason) == (alone_tokens, alone_logprobs, alone_final.reason)
    assert [len(logprobs) for _, logprobs, _ in together] == [0, 12, 12, 0, 12, 0]
    assert together[5][0] != alone(DRAWN[5].prompt_ids, 12, 12)  # it sampled: not greedy's tokens
    assert TOKENIZER.eos_id not in together[5][0]


def test_a_stream_in_a_burst_gets_each_token_as_its_step_ends():
    """An interval-1 stream beside a unary call: the burst hands the stream each step's token as the
    step ends (not at the burst's end), while the unary call's wait for its end."""
    runner = FakeRunner(capacity=2)
    runner.pause_at = 3  # the burst's third step waits at the gate

    async def main():
        with running(runner) as engine:
            stream = engine.submit(GenerationRequest("s", tuple(b"stream"), 20))
            unary = engine.submit(GenerationRequest("u", tuple(b"unary"), 20, interval=None))
            engine.start()
            await at_gate(runner)
            early: list[int] = []
            while len(early) < 3:  # the prefill's token and the first two steps'
                early += [t for e in await asyncio.wait_for(stream.next_events(), WAIT_S) for t in e.token_ids]
            unary_early = unary.events.qsize()
            runner.gate.set()
            return early, unary_early, await outcome(stream), await outcome(unary)

    early, unary_early, (tokens, _), (unary_tokens, _) = asyncio.run(main())
    first = next(i for i, entry in enumerate(runner.log) if entry[0] == "burst")
    assert runner.log[first + 1 : first + 4] == [("decode", (0, 1))] * 3  # one burst, paused at its third step
    assert early == alone(tuple(b"stream"), 3) and unary_early == 0
    assert early + tokens == alone(tuple(b"stream"), 20) and unary_tokens == alone(tuple(b"unary"), 20)


class FinalsAfterFree(LoopOutbox):
    """The engine's own outbox, noting the engine's active count each time it hands a Final on."""

    def __init__(self):
        self.active_at_finals: list[int] = []

    def deliver(self, events, counts):
        if any(isinstance(event, Final) for _, event in events):
            self.active_at_finals.append(counts()["active"])
        super().deliver(events, counts)


@pytest.mark.parametrize("interval", [StreamInterval(), None], ids=["stream", "unary"])
def test_a_request_that_ends_in_a_burst_is_freed_before_its_final_goes_out(interval):
    """As step by step, a caller that has its Final finds the request gone from the engine's counts
    (its slot already free for the next): the burst's step where it ended hands its events on only
    after the request is freed."""
    runner = FakeRunner(capacity=1)

    async def main():
        outbox = FinalsAfterFree()
        engine = Engine(runner, TOKENIZER, EngineLimits(runner.capacity, 16, 0, None, "off", 0), outbox=outbox)
        try:
            handle = engine.submit(GenerationRequest("e", tuple(b"ends"), 5, interval=interval))
            engine.start()
            return outbox, await outcome(handle)
        finally:
            engine.stop()

    outbox, (tokens, final) = asyncio.run(main())
    assert tokens == alone(tuple(b"ends"), 5) and final.reason == FinishReason.LENGTH
    assert runner.bursts == [4] and outbox.active_at_finals == [0]


def beams_alone(prompt: tuple[int, ...], params: BeamParams, budget: int) -> list[tuple[tuple[int, ...], float]]:
    """The hypotheses a beam search of `prompt` finds with the fake model and nobody else in the batch:
    each beam's history kept whole here, no slot moved."""
    search = BeamSearch(params, frozenset({TOKENIZER.eos_id}), budget)
    histories = [list(prompt)] * params.num_beams
    while True:
        rows = np.zeros((params.num_beams, SPEC.vocab_size), np.float32)
        for row, history in enumerate(histories):
            rows[row, next_id(history)] = 1.0
        moves = search.step_rows(rows)
        if search.done:
            return [(h.tokens[:-1] if h.ended else h.tokens, h.score) for h in search.hypotheses()]
        histories = [histories[parent] + [token] for parent, token in moves]


async def hypotheses(handle) -> list[tuple[tuple[int, ...], float, FinishReason]]:
    """A beam request's completions (tokens, score, finish reason) by index, once its last Final came."""
    found: dict[int, list] = {}
    while True:
        for event in await asyncio.wait_for(handle.next_events(), WAIT_S):
            entry = found.setdefault(event.index, [(), 0.0, None])
            if isinstance(event, Delta):
                entry[0] += event.token_ids
            else:
                entry[1:] = [event.score, event.reason]
                if event.remaining == 0:
                    return [tuple(found[i]) for i in sorted(found)]


def test_the_beams_best_take_the_lower_index_among_ties_at_the_last_place_too():
    """beam_search.top: ties broken by index everywhere, the k-th place included (a partition alone picks
    any of the tied), so a row's best `keep` are a prefix of its order and the search's candidates from
    each row's best are the whole rows' best (BeamSearch.step)."""
    scores = np.array([1.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0], np.float32)
    for k in range(1, scores.size + 1):
        expected = sorted(range(scores.size), key=lambda i: (-scores[i], i))[:k]
        assert top(scores, k).tolist() == expected, k
    # from each row's best 3 or from the whole rows: the same next beams
    rows = np.zeros((2, 40), np.float32)
    rows[0, [7, 9]], rows[1, 2] = 1.0, 1.0
    whole, candidates = (BeamSearch(BeamParams(num_beams=2), frozenset({0}), 8) for _ in range(2))
    whole.keep = candidates.keep = 4  # the search's best 4 of the 2 x 40 continuations: ties past the ones
    scores = log_softmax(rows)
    expected = whole.step(np.tile(np.arange(40), (2, 1)), scores)
    assert candidates.step(*row_candidates(rows, (), 4)) == expected


def test_a_beam_group_waits_for_its_slots_and_decodes_beside_others_as_it_would_alone():
    """A greedy request, a beam search of 3 beams and another greedy request through 4 slots: the group
    is admitted with 3 free slots, the last request waits for one; the beams' slots are copied where two
    beams continue one (the runner's copy_cache), and every result is what it is alone."""
    params = BeamParams(num_beams=3, length_penalty=1.0, num_return_sequences=2)
    first, last = ask("greedy one", 12), ask("greedy two", 5)
    search = replace(ask("beam me", 9), beams=params)
    runner = FakeRunner(capacity=4)

    async def main():
        with running(runner) as engine:
            handles = [engine.submit(a) for a in (first, search, last)]
            engine.start()
            return await outcome(handles[0]), await hypotheses(handles[1]), await outcome(handles[2])

    one, found, two = asyncio.run(main())
    assert one[0] == alone(first.prompt_ids, 12) and two[0] == alone(last.prompt_ids, 5)
    expected = beams_alone(search.prompt_ids, params, 9)
    assert [(tokens, score) for tokens, score, _ in found] == [(tuple(t), s) for t, s in expected]
    assert {reason for _, _, reason in found} <= {FinishReason.LENGTH, FinishReason.EOS}
    assert any(entry[0] == "copy" for entry in runner.log)  # beams continued one beam and took another's slot
    starts = [entry[1] for entry in runner.log if entry[0] == "start"]
    assert len(starts) == 3 and not runner.rows  # every slot freed


def test_a_negative_length_penalty_over_many_steps_keeps_its_hypotheses_and_fails_nobody():
    """length_penalty -5 (in range) scores a hypothesis by its log-probability times length ** 5: past 32
    tokens that is below a finite "ruled out" score, and a search that ranked empty slots above it ended
    with no hypothesis (an assertion that failed the whole batch). Every request here gets its result."""
    params = BeamParams(num_beams=2, length_penalty=-5.0, num_return_sequences=2)
    search = replace(ask("beam me", 40), beams=params)
    others = [ask(f"greedy {i}", 45) for i in range(3)]
    runner = FakeRunner(capacity=5)

    async def main():
        with running(runner) as engine:
            handles = [engine.submit(a) for a in (others[0], search, *others[1:])]
            engine.start()
            return await hypotheses(handles[1]), [await outcome(h) for h in handles[:1] + handles[2:]]

    found, served_others = asyncio.run(main())
    expected = beams_alone(search.prompt_ids, params, 40)
    assert len(found) == 2 and [(tokens, score) for tokens, score, _ in found] == [(tuple(t), s) for t, s in expected]
    assert all(len(tokens) == 40 and score < -1e9 for tokens, score, _ in found)  # below transformers' -1e9
    for asked, (tokens, final) in zip(others, served_others):
        assert isinstance(final, Final) and tokens == alone(asked.prompt_ids, 45)


def test_where_the_picks_together_raise_each_row_is_picked_alone_and_only_its_own_failure_ends_it(monkeypatch):
    """A burst's drawn rows left to the host are picked together (host_picks); where that raises, each is
    picked alone, so that the request whose own draw raises ends with its error and every other gets the
    very tokens it gets when nothing fails."""
    asks = [
        replace(ask(f"sampled {i}", 12), sampling=SamplingParams(temperature=0.8, top_p=0.9, seed=i))
        for i in range(host_picks.TOGETHER_FROM + 1)
    ]
    real, calls = host_picks.picked, itertools.count(1)
    together: list[int] = []

    def counted(*args):
        together.append(len(args[0]))
        return real(*args)

    monkeypatch.setattr(host_picks, "picked", counted)
    expected = served(FakeRunner(capacity=len(asks)), asks)
    assert together and max(together) == len(asks)  # the rows went together

    def failing(*args):
        if next(calls) >= 3:
            raise ValueError("injected into the picks together")
        return real(*args)

    monkeypatch.setattr(host_picks, "picked", failing)
    fail_one(monkeypatch, Sequence, "draw", "sampled 0")
    (_, victim_end), *rest = served(FakeRunner(capacity=len(asks)), asks)
    assert isinstance(victim_end, ValueError) and str(victim_end) == "injected into draw"
    assert all(isinstance(final, Final) for _, final in rest)
    assert [tokens for tokens, _ in rest] == [tokens for tokens, _ in expected[1:]]


def fail_one(monkeypatch, cls, method: str, prompt: str, after: int = 3):
    """`cls.method` raises for the request of `prompt` from its `after`-th call on (one row's own work)."""
    real, calls = getattr(cls, method), itertools.count(1)

    def failing(self, *args, **kwargs):
        request = self.sequence.request if hasattr(self, "sequence") else self.request
        if request.request_id == prompt and next(calls) >= after:
            raise ValueError(f"injected into {method}")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, failing)


@pytest.mark.parametrize(
    ("where", "sampling"),
    [("advance", False), ("pick", True), ("draw", True), ("beam", False), ("advance", True)],
)
def test_one_requests_own_failure_ends_it_alone_and_the_busy_batch_goes_on(monkeypatch, where, sampling):
    """An exception in one request's own work (its text and stops, its sampler step by step or drawing in a
    burst, its beam search), in a burst of greedy steps or with drawn rows, or a step with sampled rows:
    that request alone ends with the error, its slots are freed, and every other request of the batch
    gets what it gets alone."""
    from attnserve.engine.beam_group import BeamGroup

    methods = {"advance": (Sequence, "advance"), "pick": (Sequence, "pick"), "draw": (Sequence, "draw")}
    cls, method = {**methods, "beam": (BeamGroup, "step")}[where]
    fail_one(monkeypatch, cls, method, "victim")
    victim = ask("victim", 20)
    if where == "beam":
        victim = replace(victim, beams=BeamParams(num_beams=2, length_penalty=1.0, num_return_sequences=1))
    if sampling:  # "pick": min_tokens keeps it stepping, its sampler picking on the host; else drawn in bursts
        victim = replace(victim, sampling=SamplingParams(temperature=0.5, seed=3))
        victim = replace(victim, min_new_tokens=20 if where == "pick" else 0)
    others = [ask(f"bystander {i}", 12) for i in range(4)]
    runner = FakeRunner(capacity=6)
    (_, victim_end), *rest = served(runner, [victim, *others])
    assert isinstance(victim_end, ValueError) and str(victim_end) == f"injected into {method}"
    for asked, (tokens, final) in zip(others, rest):
        assert isinstance(final, Final) and tokens == alone(asked.prompt_ids, 12), asked.prompt
    assert not runner.rows and ("reset",) not in runner.log  # every slot freed, the runner never reset
