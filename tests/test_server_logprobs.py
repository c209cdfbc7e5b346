"""Token log-probabilities on a real server over the tiny model, against the PyTorch model it was
exported from: each generated token's logprob and its top alternatives are PyTorch's log-softmax of
the same positions (tempered when sampling), unary and streamed; asking for them changes no token."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from fixtures_server import request, start_server

from attnserve.tokenizer.utf8 import encode
from attnserve.v1 import generation_pb2 as pb

PROMPT = "def parse("
TOLERANCE = 1e-4  # float32 logits through ONNX Runtime against PyTorch's, in log-probability


def pytorch_logprobs(model, ids: list[int]) -> np.ndarray:
    """log-softmax of PyTorch's logits at every position of `ids` (T, V)."""
    import torch

    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]))
    return torch.log_softmax(logits[0].double(), dim=-1).numpy()


def test_greedy_logprobs_and_top_alternatives_are_pytorchs_log_softmax(stub, reference_model):
    reply = stub.Generate(request(PROMPT, max_new_tokens=12, logprobs=5), timeout=60)
    prompt = encode(PROMPT)
    expected = pytorch_logprobs(reference_model, prompt + list(reply.token_ids))
    assert [p.token_id for p in reply.logprobs] == list(reply.token_ids)
    for step, entry in enumerate(reply.logprobs):
        row = expected[len(prompt) - 1 + step]  # the position whose output is this token
        assert entry.logprob == pytest.approx(row[entry.token_id], abs=TOLERANCE)
        best = np.argsort(-row, kind="stable")[:5]
        assert [t.token_id for t in entry.top] == list(best)  # greedy: the token itself is the first
        assert [t.logprob for t in entry.top] == pytest.approx(row[best], abs=TOLERANCE)
        assert entry.top[0].token_id == entry.token_id
        if entry.token_id < 128:  # the byte tokenizer: an ASCII byte is its own text
            assert entry.text == chr(entry.token_id) and entry.top[0].text == entry.text


def test_streamed_logprobs_equal_the_unary_ones_and_zero_gives_the_tokens_own(stub):
    unary = stub.Generate(request(PROMPT, max_new_tokens=12, logprobs=3), timeout=60)
    messages = list(stub.GenerateStream(request(PROMPT, max_new_tokens=12, logprobs=3, stream_interval_tokens=4)))
    streamed = [p for m in messages for p in m.logprobs]
    assert [len(m.logprobs) for m in messages] == [len(m.token_ids) for m in messages]
    assert [(p.token_id, p.logprob, [t.token_id for t in p.top]) for p in streamed] == [
        (p.token_id, p.logprob, [t.token_id for t in p.top]) for p in unary.logprobs
    ]
    own = stub.Generate(request(PROMPT, max_new_tokens=12, logprobs=0), timeout=60)
    assert [p.logprob for p in own.logprobs] == [p.logprob for p in unary.logprobs]
    assert all(not p.top for p in own.logprobs)
    plain = stub.Generate(request(PROMPT, max_new_tokens=12), timeout=60)
    assert not plain.logprobs and plain.token_ids == unary.token_ids  # asking changes no token


def test_sampled_logprobs_are_of_the_tempered_distribution(stub, reference_model):
    """At temperature 2 the distribution is log_softmax(logits / 2): a seeded draw's tokens are the
    ones a request without logprobs gets, and each logprob is that distribution's."""
    fields = {"max_new_tokens": 8, "temperature": 2.0, "seed": 11}
    reply = stub.Generate(request(PROMPT, logprobs=2, **fields), timeout=60)
    assert reply.token_ids == stub.Generate(request(PROMPT, **fields), timeout=60).token_ids
    prompt = encode(PROMPT)
    import torch

    with torch.no_grad():
        logits, _ = reference_model(torch.tensor([prompt + list(reply.token_ids)]))
    tempered = torch.log_softmax(logits[0].double() / 2.0, dim=-1).numpy()
    for step, entry in enumerate(reply.logprobs):
        assert entry.logprob == pytest.approx(tempered[len(prompt) - 1 + step][entry.token_id], abs=TOLERANCE)


@pytest.mark.parametrize("value", [21, 1000])
def test_too_many_logprobs_is_invalid_argument_and_the_limit_is_in_get_model_info(stub, value):
    with pytest.raises(grpc.RpcError) as error:
        stub.Generate(request(PROMPT, max_new_tokens=4, logprobs=value), timeout=60)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == f"logprobs: {value} is outside [0, 20]"
    assert stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).limits.max_logprobs == 20


def test_the_python_client_and_attnserve_generate_return_the_logprobs(server, stub, capsys):
    """Client.generate and stream give TokenLogprob dataclasses (text included); `--json` prints them."""
    import json

    from attnserve.cli import main as cli_main
    from attnserve.clients.client import Client

    expected = stub.Generate(request(PROMPT, max_new_tokens=6, logprobs=2), timeout=60)
    with Client(server.target) as client:
        result = client.generate(PROMPT, max_new_tokens=6, logprobs=2)
        with client.stream(PROMPT, max_new_tokens=6, logprobs=2) as stream:
            deltas = list(stream)
        streamed = stream.result()
    pairs = [(p.token_id, p.logprob, p.text, [(t.token_id, t.text) for t in p.top]) for p in expected.logprobs]
    for got in (result.logprobs, streamed.logprobs, tuple(p for d in deltas for p in d.logprobs)):
        assert [(p.token_id, p.logprob, p.text, [(t.token_id, t.text) for t in p.top]) for p in got] == pairs
    assert (
        cli_main(
            ["generate", PROMPT, "--target", server.target, "--max-new-tokens", "6", "--logprobs", "2"] + ["--json"]
        )
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    assert [p["token_id"] for p in printed["logprobs"]] == list(expected.token_ids)
    assert [len(p["top"]) for p in printed["logprobs"]] == [2] * 6
    with Client(server.target) as client:
        scored = client.generate(TEXT, max_new_tokens=0, prompt_logprobs=1)
    assert scored.token_ids == () and [p.token_id for p in scored.prompt_logprobs] == encode(TEXT)[1:]
    assert all(len(p.top) == 1 for p in scored.prompt_logprobs)


TEXT = "The list of arguments is parsed."


def test_prompt_logprobs_are_pytorchs_log_likelihood_of_the_text_with_nothing_generated(stub, reference_model):
    reply = stub.Generate(request(TEXT, max_new_tokens=0, prompt_logprobs=3), timeout=60)
    ids = encode(TEXT)
    rows = pytorch_logprobs(reference_model, ids)
    assert not reply.token_ids and reply.finish_reason == pb.FINISH_REASON_LENGTH
    assert reply.usage.completion_tokens == 0 and reply.usage.prompt_tokens == len(ids)
    assert [p.token_id for p in reply.prompt_logprobs] == ids[1:]  # the first (BOS) has none
    for i, entry in enumerate(reply.prompt_logprobs, 1):
        assert entry.logprob == pytest.approx(rows[i - 1][ids[i]], abs=TOLERANCE)
        assert [t.token_id for t in entry.top] == list(np.argsort(-rows[i - 1], kind="stable")[:3])
    total = sum(p.logprob for p in reply.prompt_logprobs)
    assert total == pytest.approx(sum(rows[i - 1][ids[i]] for i in range(1, len(ids))), abs=len(ids) * TOLERANCE)


def score(stub, ids: list[int], after: int) -> float:
    """The log-likelihood the server gives the tokens of `ids` after its first `after` ones."""
    reply = stub.Generate(pb.GenerateRequest(prompt_token_ids=ids, max_new_tokens=0, prompt_logprobs=0), timeout=60)
    return sum(p.logprob for p in reply.prompt_logprobs[after - 1 :])


def test_a_client_scores_two_continuations_and_picks_the_likelier(stub, reference_model):
    """The model's own greedy continuation of a prompt against the same continuation with its last
    token the model's least likely one there: the server's scores rank them as PyTorch's
    log-likelihoods do, and the greedy one is the likelier (they differ only where greedy took the
    argmax, whatever the model is)."""
    prompt = encode(PROMPT)
    greedy = prompt + list(stub.Generate(request(PROMPT, max_new_tokens=10, ignore_eos=True), timeout=60).token_ids)
    unlikely = int(np.argmin(pytorch_logprobs(reference_model, greedy)[-2]))
    candidates = [greedy, greedy[:-1] + [unlikely]]
    scores = [score(stub, ids, len(prompt)) for ids in candidates]
    expected = []
    for ids in candidates:
        rows = pytorch_logprobs(reference_model, ids)
        expected.append(sum(rows[i - 1][ids[i]] for i in range(len(prompt), len(ids))))
    assert scores == pytest.approx(expected, abs=1e-3) and scores[0] > scores[1]


def test_prompt_logprobs_of_a_chunked_prompt_streamed_and_beside_generation(tiny_model_dir, stub):
    """A prompt prefilled in chunks of 8 gives the logprobs it gets in one run; asked with a generation,
    streamed, they come on the final message and the tokens are the ones generated without them."""
    whole = stub.Generate(request(TEXT, max_new_tokens=0, prompt_logprobs=2), timeout=60)
    running = start_server(tiny_model_dir, prefill_chunk=8)
    try:
        chunked = running.stub.Generate(request(TEXT, max_new_tokens=0, prompt_logprobs=2), timeout=60)
    finally:
        running.stop()
    entries = lambda reply: [(p.token_id, [t.token_id for t in p.top]) for p in reply.prompt_logprobs]
    assert entries(chunked) == entries(whole)
    assert [p.logprob for p in chunked.prompt_logprobs] == pytest.approx([p.logprob for p in whole.prompt_logprobs])
    messages = list(stub.GenerateStream(request(TEXT, max_new_tokens=6, prompt_logprobs=2), timeout=60))
    assert entries(messages[-1]) == entries(whole) and all(not m.prompt_logprobs for m in messages[:-1])
    plain = stub.Generate(request(TEXT, max_new_tokens=6), timeout=60)
    assert [t for m in messages for t in m.token_ids] == list(plain.token_ids)


def test_max_new_tokens_0_needs_prompt_logprobs(stub):
    with pytest.raises(grpc.RpcError) as error:
        stub.Generate(request(TEXT, max_new_tokens=0), timeout=60)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_new_tokens: 0 is outside [1, " in error.value.details()
    assert "0 only with prompt_logprobs" in error.value.details()
    with pytest.raises(grpc.RpcError) as error:
        stub.Generate(request(TEXT, max_new_tokens=0, prompt_logprobs=21), timeout=60)
    assert error.value.details() == "prompt_logprobs: 21 is outside [0, 20]"
