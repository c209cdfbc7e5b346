"""The quantized exports served (tests/fixtures_export.py: the trained tiny model in int4, MatMulNBits
blocks of 32, and in int8, activations quantized row by row): greedy tokens over gRPC are the arena
driver's own on the same directory, alone and in one batch, and a prefix-cache hit changes nothing
but usage.cached_tokens. onnxruntime-genai's check of the same directories is in tests/test_genai.py."""

from __future__ import annotations

import threading

import pytest
from fixtures_server import start_server

from attnserve.runtime.contract import read_manifest
from attnserve.runtime.ort_decoder import OrtDecoder
from attnserve.tokenizer import from_model_dir
from attnserve.v1 import generation_pb2 as pb

PREAMBLE = "Return a new list with the items of the sequence sorted, and the"  # 4 whole blocks with BOS
PROMPTS = [PREAMBLE + ending for ending in (" Then:", " Why", " For x in", "")]
NEW_TOKENS = 24


@pytest.fixture(scope="module", params=["int4", "int8"])
def quantized(request):
    """(the model directory, its server)."""
    model_dir = request.getfixturevalue(f"tiny_{request.param}_model_dir")
    running = start_server(model_dir)
    yield model_dir, running
    running.stop()


def generate(stub, prompt: str) -> pb.GenerateResponse:
    request = pb.GenerateRequest(prompt=prompt, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    return stub.Generate(request, timeout=60)


def test_served_quantized_tokens_are_the_arena_drivers_alone_batched_and_from_the_prefix_cache(quantized):
    model_dir, server = quantized
    tokenizer = from_model_dir(model_dir, read_manifest(model_dir).tokenizer)
    driver = OrtDecoder(model_dir)
    expected = [driver.greedy([tokenizer.encode_prompt(p)], NEW_TOKENS)[0].tolist() for p in PROMPTS]
    alone = [generate(server.stub, prompt) for prompt in PROMPTS]  # the preamble is cached after the first
    batched: dict[int, pb.GenerateResponse] = {}
    threads = [
        threading.Thread(target=lambda i=i: batched.__setitem__(i, generate(server.stub, PROMPTS[i])))
        for i in range(len(PROMPTS))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [list(reply.token_ids) for reply in alone] == expected
    assert [list(batched[i].token_ids) for i in range(len(PROMPTS))] == expected
    assert alone[0].usage.cached_tokens == 0 and all(reply.usage.cached_tokens > 0 for reply in alone[1:])
