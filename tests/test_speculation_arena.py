"""Speculative decoding on the real parts: the arena runner's verify and rewind over the trained tiny
model's export on ONNX Runtime, the engine speculating over it, and a served `attnserve serve
--speculative-config` (engine core in its own process) whose greedy tokens are PyTorch's. The
engine's rules over a fake runner are tests/test_speculation.py's."""

from __future__ import annotations

import asyncio
import re
import secrets
import urllib.request
from dataclasses import replace

import pytest
from fixtures_server import request, start_server
from fixtures_train import BYTE_IDS

from attnserve.engine.domain import Delta, Final, GenerationRequest, SamplingParams, TokenLogprob
from attnserve.engine.engine import Engine, EngineLimits, EngineObserver
from attnserve.engine.speculation import Speculation
from attnserve.model.generate import generate
from attnserve.runtime.model_sessions import ModelSessions
from attnserve.runtime.opening import open_slot_runner
from attnserve.tokenizer.utf8 import ByteTokenizer, encode
from attnserve.v1 import generation_pb2 as pb

PASSAGE = "The arena holds every request's keys and values in place. "
# prompts whose continuation may repeat what they hold (a passage and its start again), and plain ones
PROMPTS = [PASSAGE + PASSAGE[:20], "def f(x):\n    return x\ndef g(x):\n    return", "The server", "a", "x" * 30]
SPECULATION = Speculation(num_speculative_tokens=4, prompt_lookup_max=4, prompt_lookup_min=1, disable_by_batch_size=4)
STEPS = 40
TIMEOUT = 60


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return ModelSessions(tiny_model_dir, "cpu", threads=1)


def single_steps(runner, key: int, prompt: list[int], steps: int) -> list[int]:
    """Greedy tokens of `prompt` alone, one decode step each (the runner's NEXT_TOKEN argmax)."""
    runner.start(key, tuple(prompt))
    tokens = [int(runner.prefill().rows[0].argmax())]
    for _ in range(steps - 1):
        tokens.append(int(runner.decode({key: tokens[-1]}, frozenset()).tokens[0]))
    runner.release(key)
    return tokens


def test_a_verification_brings_back_the_single_steps_argmax_and_a_rewind_forgets_what_was_not_kept(model):
    """Right proposals come back as the argmax after each; after wrong ones, a rewind of the positions
    not kept and single steps go on as if nothing had been proposed. Two slots, one proposing."""
    runner = open_slot_runner(model, 2, 256)
    prompts = [encode(PROMPTS[0]), encode(PROMPTS[2])]
    alone = [single_steps(runner, key, prompt, STEPS) for key, prompt in enumerate(prompts)]
    for key, prompt in zip((10, 11), prompts):
        runner.start(key, tuple(prompt))
    first = runner.prefill()
    assert [int(row.argmax()) for row in first.rows] == [alone[0][0], alone[1][0]]
    # key 10 proposes its next four tokens (all right); key 11 proposes nothing (one position)
    verified = runner.verify({10: alone[0][0], 11: alone[1][0]}, {10: tuple(alone[0][1:5])})
    assert verified.tokens == {10: alone[0][1:6], 11: alone[1][1:2]} and not verified.rows
    # key 10 now feeds alone[0][5] and proposes a wrong id after one right one: two positions forgotten;
    # key 11 samples: its row comes back
    wrong = (alone[0][7] + 1) % 256
    verified = runner.verify({10: alone[0][5], 11: alone[1][1]}, {10: (alone[0][6], wrong, alone[0][8])}, {11})
    assert verified.tokens[10][:2] == alone[0][6:8] and list(verified.tokens) == [10]
    assert verified.rows[11].shape == (1, runner.spec.vocab_size) and int(verified.rows[11][0].argmax()) == alone[1][2]
    runner.rewind(10, 2)
    tokens = {10: alone[0][7], 11: alone[1][2]}
    got: dict[int, list[int]] = {10: alone[0][:8], 11: alone[1][:3]}
    while len(got[10]) < STEPS:
        picked = runner.decode(tokens, frozenset()).tokens
        tokens = dict(zip(runner.decoding, picked.tolist()))
        for key in (10, 11):
            got[key].append(tokens[key])
    assert got[10] == alone[0][:STEPS] and got[11] == alone[1][: len(got[11])]


class Counted(EngineObserver):
    def __init__(self) -> None:
        self.proposed = self.accepted = 0

    def on_speculation(self, proposed: int, accepted: int) -> None:
        self.proposed += proposed
        self.accepted += accepted


def greedy(prompt: str) -> GenerationRequest:
    return GenerationRequest(prompt, tuple(encode(prompt)), STEPS, interval=None)


def engine_events(
    model,
    asks: list[GenerationRequest],
    speculation: Speculation | None,
    observer: EngineObserver | None = None,
    draft: ModelSessions | None = None,
) -> list[list[Delta | Final]]:
    """Every request's events from the real engine over a 4-slot arena (and the draft model's, if any),
    all submitted at once."""
    runner = open_slot_runner(model, 4, 256)
    drafts = open_slot_runner(draft, 4, 256) if draft is not None else None
    engine = Engine(runner, ByteTokenizer(), EngineLimits(4, 16, 0, speculation, "off", 0), observer, draft=drafts)

    async def main():
        handles = [engine.submit(a) for a in asks]
        engine.start()
        out = []
        for handle in handles:
            events = []
            while not events or not isinstance(events[-1], Final):
                events += await asyncio.wait_for(handle.next_events(), TIMEOUT)
            out.append(events)
        return out

    try:
        return asyncio.run(main())
    finally:
        engine.stop()


def tokens_of(events: list[Delta | Final]) -> list[int]:
    return [token for event in events if isinstance(event, Delta) for token in event.token_ids]


def text_of(events: list[Delta | Final]) -> str:
    return "".join(event.text for event in events)


def logprobs_of(events: list[Delta | Final]) -> list[TokenLogprob]:
    return [logprob for event in events if isinstance(event, Delta) for logprob in event.logprobs]


def test_the_engine_speculating_over_the_arena_gives_every_request_its_tokens_without(model):
    counted = Counted()
    asks = [greedy(p) for p in PROMPTS]
    on, off = engine_events(model, asks, SPECULATION, counted), engine_events(model, asks, None)
    assert [tokens_of(events) for events in on] == [tokens_of(events) for events in off]
    assert counted.proposed > 0 and 0 <= counted.accepted <= counted.proposed


# seeded draws that copy what the prompt holds often enough to keep proposals: a cool temperature
SAMPLED = [
    replace(greedy(PROMPTS[0]), sampling=SamplingParams(temperature=0.3, top_p=0.95, seed=11), logprobs=2),
    replace(greedy(PROMPTS[1]), sampling=SamplingParams(temperature=0.5, top_k=5, seed=12, repetition_penalty=1.05)),
    replace(greedy(PROMPTS[4]), sampling=SamplingParams(temperature=0.2, seed=13, presence_penalty=0.1)),
    replace(greedy(PROMPTS[0]), logprobs=1, min_new_tokens=10),
    replace(greedy(PROMPTS[2]), ignore_eos=True),
]


def test_sampled_requests_speculating_over_the_arena_draw_every_token_they_draw_without(model):
    """Seeded draws, logprobs, penalties and bans: with speculation their rows come back from the
    verification and each request picks from them what it picks from its single steps' (there, the
    runner's batched pass), its logprobs within float32's last bits."""
    counted = Counted()
    on, off = engine_events(model, SAMPLED, SPECULATION, counted), engine_events(model, SAMPLED, None)
    for a, with_it, without in zip(SAMPLED, on, off):
        assert tokens_of(with_it) == tokens_of(without), a
        assert text_of(with_it) == text_of(without) and with_it[-1].reason == without[-1].reason
        pairs = list(zip(logprobs_of(with_it), logprobs_of(without), strict=True))
        assert len(pairs) == (len(tokens_of(without)) if a.logprobs is not None else 0)
        for p, q in pairs:
            assert p.token_id == q.token_id and [i for i, _ in p.top] == [i for i, _ in q.top]
            assert [p.logprob, *(v for _, v in p.top)] == pytest.approx([q.logprob, *(v for _, v in q.top)], abs=1e-4)
    assert counted.accepted > 0 and counted.accepted < counted.proposed


DRAFTING = Speculation(num_speculative_tokens=4, disable_by_batch_size=4, method="draft_model", model="int8")


@pytest.fixture(scope="module")
def int8_draft(tiny_int8_model_dir):
    """The same model with int8 weights: a draft that mostly agrees with the float32 target, not always."""
    return ModelSessions(tiny_int8_model_dir, "cpu", threads=1)


def test_a_draft_model_over_its_own_arena_gives_every_request_its_tokens_without(model, int8_draft):
    """The float32 model drafted by its int8 export: greedy and seeded requests, four at a time, each get
    the tokens they get without speculation; most proposals are kept, not all."""
    counted = Counted()
    asks = [*(greedy(p) for p in PROMPTS), *SAMPLED]
    on, off = engine_events(model, asks, DRAFTING, counted, int8_draft), engine_events(model, asks, None)
    for a, with_it, without in zip(asks, on, off):
        assert tokens_of(with_it) == tokens_of(without) and text_of(with_it) == text_of(without), a
    assert 0 < counted.accepted < counted.proposed


@pytest.fixture(scope="module")
def receiver():
    otlp = pytest.importorskip("benchmarks.otlp_receiver", reason="opentelemetry-proto comes with the [cpu] extra")
    running = otlp.Receiver().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def speculating(tiny_model_dir, receiver):
    """A server speculating (engine core in its own process), its metrics on, its traces to `receiver`."""
    config = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}'
    running = start_server(
        tiny_model_dir,
        speculative_config=config,
        engine_core="process",
        metrics_port=0,
        otlp_traces_endpoint=receiver.endpoint,
    )
    yield running
    running.stop()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_a_speculating_server_streams_pytorchs_greedy_tokens(speculating, reference_model, prompt):
    expected = generate(reference_model, [encode(prompt)], max_new_tokens=STEPS, **BYTE_IDS)[0]
    unary = speculating.stub.Generate(request(prompt, max_new_tokens=STEPS), timeout=TIMEOUT)
    assert list(unary.token_ids) == expected and unary.usage.completion_tokens == len(expected)
    messages = list(speculating.stub.GenerateStream(request(prompt, max_new_tokens=STEPS), timeout=TIMEOUT))
    assert [t for m in messages for t in m.token_ids] == expected
    assert "".join(m.text for m in messages) == unary.text


def test_a_speculating_server_draws_a_seeded_requests_tokens_as_the_engine_draws_them_without(speculating, model):
    """Through the gRPC door to a speculating engine core, a seeded draw with logprobs gets the tokens the
    in-process engine without speculation gets for it."""
    (without,) = engine_events(model, SAMPLED[:1], None)
    fields = dict(max_new_tokens=STEPS, temperature=0.3, top_p=0.95, seed=11, logprobs=2)
    unary = speculating.stub.Generate(request(PROMPTS[0], **fields), timeout=TIMEOUT)
    assert list(unary.token_ids) == tokens_of(without) and unary.text == text_of(without)


REGEX = pb.StructuredOutput(regex="(ab ){2,9}x")
REQUESTS = [
    dict(prompt="ab ab ab ab ab ab ", structured_output=REGEX),
    dict(prompt="ab ab ab ab ab ab ", structured_output=REGEX, temperature=0.8, seed=5, logprobs=3),
    dict(prompt=PROMPTS[0], structured_output=pb.StructuredOutput(json_schema='{"enum": ["arena", "keys"]}')),
    dict(prompt=PROMPTS[0], temperature=0.4, seed=6, repetition_penalty=1.2, presence_penalty=0.3, min_new_tokens=12),
    dict(prompt=PROMPTS[1], temperature=0.5, seed=7, n=3, logprobs=1, stop=["g("]),
    dict(prompt=PROMPTS[4], ignore_eos=True, logprobs=2),
]


@pytest.mark.parametrize("fields", REQUESTS)
def test_a_speculating_server_gives_every_kind_of_request_what_a_plain_server_gives(speculating, stub, fields):
    """Structured output (greedy and sampled), penalties, bans, stop strings, n completions, logprobs:
    through the speculating server every completion is the plain server's, token for token."""
    ask = request(**{**fields, "max_new_tokens": STEPS})
    before = spec_counts(speculating)
    on, off = (server.Generate(ask, timeout=TIMEOUT) for server in (speculating.stub, stub))
    if fields.get("n", 1) == 1:  # one completion alone: it proposed (n of them decode together: none)
        assert spec_counts(speculating)["draft"] > before["draft"]
    completions = lambda reply: (
        [(c.token_ids, c.text, c.finish_reason) for c in reply.completions]
        or [(reply.token_ids, reply.text, reply.finish_reason)]
    )
    assert completions(on) == completions(off)
    assert [p.token_id for p in on.logprobs] == [p.token_id for p in off.logprobs]
    assert [p.logprob for p in on.logprobs] == pytest.approx([p.logprob for p in off.logprobs], abs=1e-4)


def test_a_speculating_server_counts_its_proposals_and_what_it_kept(speculating, receiver):
    """In its metrics, and in a traced request's engine core span."""
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    traceparent = (("traceparent", f"00-{trace_id}-{parent}-01"),)
    speculating.stub.Generate(request(PROMPTS[0], max_new_tokens=STEPS), timeout=TIMEOUT, metadata=traceparent)
    (core,) = [span for span in receiver.wait_for(trace_id, {"engine_core"}) if span.name == "engine_core"]
    draft, kept = (core.attributes[f"attnserve.speculative.{name}_tokens"] for name in ("draft", "accepted"))
    assert draft > 0 and 0 <= kept <= draft
    counts = spec_counts(speculating)
    assert counts["draft"] > 0 and 0 <= counts["accepted"] <= counts["draft"]


def spec_counts(running) -> dict[str, float]:
    """A server's attnserve_spec_decode_{draft,accepted}_tokens_total, from its metrics endpoint."""
    url = f"http://127.0.0.1:{running.server.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=TIMEOUT).read().decode()
    return {
        name: float(re.search(rf"^attnserve_spec_decode_{name}_tokens_total (\S+)$", text, re.M).group(1))
        for name in ("draft", "accepted")
    }


def test_a_server_with_a_draft_model_streams_pytorchs_greedy_tokens_and_counts_them(
    tiny_model_dir, tiny_int8_model_dir, reference_model, model
):
    """`--speculative-config '{"model": DIR}'` with the engine core in its own process: its greedy tokens
    are PyTorch's, a seeded draw's are the in-process engine's without speculation, and its metrics
    count the draft's proposals."""
    config = f'{{"model": "{tiny_int8_model_dir}", "num_speculative_tokens": 3}}'
    running = start_server(tiny_model_dir, speculative_config=config, engine_core="process", metrics_port=0)
    try:
        for prompt in PROMPTS[:2]:
            expected = generate(reference_model, [encode(prompt)], max_new_tokens=STEPS, **BYTE_IDS)[0]
            messages = list(running.stub.GenerateStream(request(prompt, max_new_tokens=STEPS), timeout=TIMEOUT))
            assert [t for m in messages for t in m.token_ids] == expected
        (without,) = engine_events(model, SAMPLED[:1], None)
        fields = dict(max_new_tokens=STEPS, temperature=0.3, top_p=0.95, seed=11, logprobs=2)
        unary = running.stub.Generate(request(PROMPTS[0], **fields), timeout=TIMEOUT)
        assert list(unary.token_ids) == tokens_of(without)
        counts = spec_counts(running)
        assert 0 < counts["accepted"] <= counts["draft"]
    finally:
        running.stop()
