"""Automatic prefix caching on real servers over the tiny model (byte tokenizer, 128 positions): the
shared server (cache on, the default) against one started with --prefix-cache off.

A hit changes nothing a client sees but usage.cached_tokens: the same greedy and seeded tokens and
the same logprobs; only the rest of the prompt is prefilled (a counting spy on the arena's runs);
a small cache under pressure evicts and stays exact; concurrent prompts that are prefixes of each
other or diverge in the middle of a block stay exact; the size is in GetModelInfo and the metrics.
"""

from __future__ import annotations

import numpy as np
import pytest
from fixtures_server import idle, request, start_server, wait_until

from attnserve.runtime.prefix_blocks import BLOCK
from attnserve.v1 import generation_pb2 as pb

# Bytes of text; with BOS a prompt of PREAMBLE + question shares 1 + 100 tokens: 6 whole blocks.
PREAMBLE = "Return a new list with the items of the sequence sorted, and the keys of the dictionary it came from."[:100]
QUESTIONS = [" Then:", " What of it", " Why", " For x in"]  # under 12 bytes: no seventh whole block
TOKEN_BLOCK_BYTES = 2 * 2 * 4 * BLOCK * 16 * 4  # keys and values, 2 layers, 4 heads, 16 positions, head dim 16, fp32


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    running = start_server(tiny_model_dir, prefix_cache="off")
    yield running
    running.stop()


@pytest.fixture
def prefilled(server, monkeypatch):
    """Tokens each prompt run of the shared server's arena prefilled (a counting spy on its two prompt paths)."""
    decoder = server.engine.slots.decoder
    runs: list[int] = []
    prefill, extend = decoder.prefill, decoder.extend

    def counting_prefill(first, prompts):
        runs.extend(len(p) for p in prompts)
        return prefill(first, prompts)

    def counting_extend(slot, tokens):
        if decoder.arena.lengths[slot]:  # an empty slot's extend is a prefill (counted there)
            runs.append(len(tokens))
        return extend(slot, tokens)

    monkeypatch.setattr(decoder, "prefill", counting_prefill)
    monkeypatch.setattr(decoder, "extend", counting_extend)
    return runs


def generate(stub, prompt: str, **fields) -> pb.GenerateResponse:
    return stub.Generate(request(prompt, **{"max_new_tokens": 16, **fields}), timeout=60)


def logprobs(reply: pb.GenerateResponse) -> np.ndarray:
    return np.array([[p.logprob, *(t.logprob for t in p.top)] for p in reply.logprobs])


def assert_same_output(cached: pb.GenerateResponse, plain: pb.GenerateResponse) -> None:
    assert list(cached.token_ids) == list(plain.token_ids) and cached.text == plain.text
    assert cached.finish_reason == plain.finish_reason
    assert [[t.token_id for t in p.top] for p in cached.logprobs] == [
        [t.token_id for t in p.top] for p in plain.logprobs
    ]
    np.testing.assert_allclose(logprobs(cached), logprobs(plain), rtol=0, atol=1e-5)


def test_a_shared_100_token_prefix_is_copied_and_the_output_is_the_same(stub, plain, prefilled):
    first = generate(stub, PREAMBLE + "!", logprobs=3)
    assert first.usage.cached_tokens in (0, 6 * BLOCK)  # the shared server may have seen the preamble before
    prefilled.clear()
    for question in QUESTIONS:
        prompt = PREAMBLE + question
        for fields in ({"logprobs": 3}, {"logprobs": 2, "temperature": 0.8, "top_k": 20, "seed": 11}):
            hit, miss = generate(stub, prompt, **fields), generate(plain.stub, prompt, **fields)
            assert (hit.usage.cached_tokens, miss.usage.cached_tokens) == (6 * BLOCK, 0)
            assert hit.usage.prompt_tokens == miss.usage.prompt_tokens == 1 + len(prompt)
            assert_same_output(hit, miss)
    # only what follows the 96 cached tokens was prefilled: 1 + 100 + question - 96 each time
    assert prefilled == [5 + len(q) for q in QUESTIONS for _ in range(2)]


def test_a_hit_that_would_leave_one_token_leaves_a_block_and_one(stub, plain):
    """A 97-token prompt over the cached preamble's 6 blocks: 5 are copied and 17 tokens prefilled (a
    run of one token takes another attention path: arena_decoder.SHORTEST_PROMPT_RUN), and the output
    is the uncached server's."""
    generate(stub, PREAMBLE + "!")
    prompt = PREAMBLE[:96]  # with BOS, 6 blocks and one token
    hit, miss = generate(stub, prompt, logprobs=5), generate(plain.stub, prompt, logprobs=5)
    assert (hit.usage.cached_tokens, miss.usage.cached_tokens) == (5 * BLOCK, 0)
    assert_same_output(hit, miss)


def test_prompt_logprobs_are_prefilled_whole_and_equal_the_uncached(stub, plain):
    generate(stub, PREAMBLE + "?")
    prompt = PREAMBLE + QUESTIONS[0]
    hit, miss = (generate(s, prompt, prompt_logprobs=1) for s in (stub, plain.stub))
    assert hit.usage.cached_tokens == 0  # every position's logits are wanted: nothing is copied
    assert [p.token_id for p in hit.prompt_logprobs] == [p.token_id for p in miss.prompt_logprobs]
    np.testing.assert_allclose(
        [p.logprob for p in hit.prompt_logprobs], [p.logprob for p in miss.prompt_logprobs], rtol=0, atol=1e-5
    )


def test_a_small_cache_under_pressure_evicts_and_stays_exact(tiny_model_dir, plain):
    small = start_server(tiny_model_dir, prefix_cache_memory=8 * TOKEN_BLOCK_BYTES, metrics_port=0)
    try:
        info = small.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        assert info.prefix_cache_bytes == 8 * TOKEN_BLOCK_BYTES
        texts = [f"{n} {PREAMBLE[n * 7 :]}{PREAMBLE[: n * 7]}"[:81] for n in range(4)]  # 5 whole blocks each
        cached = []
        for prompt in [*texts, *texts[::-1], *texts]:
            hit, miss = generate(small.stub, prompt, logprobs=2), generate(plain.stub, prompt, logprobs=2)
            assert_same_output(hit, miss)
            cached.append(hit.usage.cached_tokens)
            held = small.server.metrics.prefix_held._value.get()
            assert held <= 8 * TOKEN_BLOCK_BYTES
        assert cached[:4] == [0, 0, 0, 0]
        assert cached[4] == 5 * BLOCK  # the last one stored is still there (82 tokens: all but the last 2 copied)
        assert 0 in cached[5:]  # 8 blocks do not hold 4 prompts of 5: some were evicted
    finally:
        small.stop()


def test_concurrent_prompts_that_overlap_partly_stay_exact(server, stub, plain):
    base = PREAMBLE[:80] + " and so on"
    prompts = [
        base,
        base[:40],  # a prefix of the others, ending mid-block
        base[:37] + "XYZ" + base[40:],  # diverges in the middle of the third block
        base[:64] + " else",  # shares four blocks
        base + " again",
        base[:47],  # exactly three blocks with BOS: the last one's logits must still be computed
    ]
    for _ in range(2):  # the second round finds what the first stored
        futures = [stub.Generate.future(request(p, max_new_tokens=12, logprobs=2), timeout=60) for p in prompts]
        replies = [f.result() for f in futures]
        for prompt, reply in zip(prompts, replies):
            assert_same_output(reply, generate(plain.stub, prompt, max_new_tokens=12, logprobs=2))
    assert [r.usage.cached_tokens for r in replies][-1] == 2 * BLOCK  # 48 tokens: never the last token's block
    assert all(r.usage.cached_tokens > 0 for r in replies)
    wait_until(lambda: idle(server.engine), what="the shared server to go idle")


def test_the_cache_size_is_in_get_model_info_and_the_metrics(server, stub, plain):
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.prefix_cache_bytes == info.kv_cache_bytes  # the default: as large as the arena
    assert plain.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).prefix_cache_bytes == 0
    metrics = server.server.metrics
    hits = metrics.prefix_lookups.labels(result="hit")._value.get()
    saved = metrics.prefix_saved._value.get()
    generate(stub, PREAMBLE + " counted")
    reply = generate(stub, PREAMBLE + " counted!")
    assert reply.usage.cached_tokens == 6 * BLOCK
    assert metrics.prefix_lookups.labels(result="hit")._value.get() >= hits + 1
    assert metrics.prefix_saved._value.get() >= saved + 6 * BLOCK
    assert 0 < metrics.prefix_held._value.get() <= info.prefix_cache_bytes
    assert metrics.prefix_cache_capacity._value.get() == info.prefix_cache_bytes
