"""The encoder-decoder served by the same server and API: the prompt is the source, greedy output
over gRPC equals PyTorch, batching sources of different lengths changes nothing, limits hold."""

import json
from functools import partial

import grpc
import pytest
from fixtures_server import idle, request, staggered, start_server, wait_until
from fixtures_train import SEQ2SEQ_IDS

from attnserve.clients import Client
from attnserve.model.generate import generate_seq2seq
from attnserve.tokenizer.utf8 import encode
from attnserve.v1 import generation_pb2 as pb

SOURCES = ["4021", "7", "1000000", "98765", "12", "300", "5555555", "86"]
TIMEOUT = 30


@pytest.fixture
def stub(seq2seq_server):
    yield seq2seq_server.stub
    wait_until(lambda: idle(seq2seq_server.engine), what="the seq2seq server to go idle")


def test_model_info_reports_the_encoder_decoder(stub):
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=TIMEOUT)
    assert (info.architecture, info.n_layers, info.n_encoder_layers) == ("encoder-decoder", 2, 2)
    assert info.context_length == 64
    assert info.limits.max_prompt_tokens == 64 and info.limits.max_new_tokens == 63
    # 8 slots of self-attention keys/values and of the source's cross keys/values:
    # 2 x (8 slots x 2 layers x 2 x 2 heads x 64 positions x 16 x fp32)
    assert (info.kv_cache, info.kv_cache_bytes) == ("arena", 2 * 8 * 2 * 2 * 2 * 64 * 16 * 4)
    assert info.prefix_cache_bytes == 0  # a source is no prefix of the decoder's: no prefix cache


@pytest.mark.parametrize("source", SOURCES[:4])
def test_greedy_over_grpc_equals_pytorch(stub, seq2seq_model, source):
    reply = stub.Generate(request(source, max_new_tokens=40), timeout=TIMEOUT)
    expected = generate_seq2seq(seq2seq_model, [encode(source)], 40, **SEQ2SEQ_IDS)[0]
    assert list(reply.token_ids) == expected and len(expected) > 2
    assert reply.text == bytes(expected).decode("utf-8", errors="replace")
    assert reply.usage.prompt_tokens == len(encode(source))
    assert reply.finish_reason == (pb.FINISH_REASON_LENGTH if len(expected) == 40 else pb.FINISH_REASON_EOS)


def test_concurrent_sources_of_different_lengths_each_get_what_they_get_alone(stub, seq2seq_server):
    alone = {s: stub.Generate(request(s, max_new_tokens=48), timeout=TIMEOUT).token_ids for s in SOURCES}
    calls = [partial(stub.Generate, request(s, max_new_tokens=48), timeout=TIMEOUT) for s in SOURCES]
    together = [reply.token_ids for reply in staggered(seq2seq_server, calls, steps_apart=3)]  # join mid-flight
    assert [list(t) for t in together] == [list(alone[s]) for s in SOURCES]


def test_stream_concatenates_to_the_unary_text(stub):
    req = request("4021", max_new_tokens=40)
    unary = stub.Generate(req, timeout=TIMEOUT)
    messages = list(stub.GenerateStream(req, timeout=TIMEOUT))
    assert "".join(m.text for m in messages) == unary.text
    assert [t for m in messages for t in m.token_ids] == list(unary.token_ids)
    assert messages[-1].finish_reason == unary.finish_reason


def test_source_limits_name_the_field_and_the_limit(stub):
    with pytest.raises(grpc.RpcError) as error:
        stub.Generate(request("9" * 64, max_new_tokens=8), timeout=TIMEOUT)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == "prompt: 65 tokens (BOS included), the limit is 64 (the encoder's context_length)"
    # A source uses the encoder's context, not the decoder's: the longest source still gets 63 new tokens.
    reply = stub.Generate(request("9" * 63, max_new_tokens=63), timeout=TIMEOUT)
    assert reply.usage.prompt_tokens == 64 and 0 < reply.usage.completion_tokens <= 63


def test_the_python_client_reaches_it(seq2seq_server, seq2seq_model):
    with Client(seq2seq_server.target, timeout=TIMEOUT) as client:
        assert client.model_info().architecture == "encoder-decoder"
        result = client.generate("98765", max_new_tokens=30)
        streamed = "".join(chunk.text for chunk in client.stream("98765", max_new_tokens=30))
    assert list(result.token_ids) == generate_seq2seq(seq2seq_model, [encode("98765")], 30, **SEQ2SEQ_IDS)[0]
    assert streamed == result.text


def test_bench_drives_it(seq2seq_server, capsys):
    from attnserve.cli import main

    status = main(
        [
            "bench",
            "--target",
            seq2seq_server.target,
            "--concurrency",
            "1,4",
            "--requests",
            "4",
            "--prompt-tokens",
            "8",
            "--max-new-tokens",
            "16",
            "--warmup",
            "1",
        ]
    )
    out, err = capsys.readouterr()
    assert status == 0, err
    report = json.loads(out.splitlines()[-1])
    assert report["model"]["architecture"] == "encoder-decoder"
    for level in report["levels"]:
        assert (level["completed"], level["errors"]) == (4, {})
        assert level["output_tokens"] == level["reported_completion_tokens"] > 0


def test_sources_arriving_at_different_steps_through_fewer_slots_equal_pytorch(tiny_seq2seq_model_dir, seq2seq_model):
    """10 sources through a 4-slot arena, each arriving while others decode: slots are refilled by
    moves (self-attention and cross segment alike), and every answer is PyTorch's alone."""
    sources = [*SOURCES, "42", "999999"]
    running = start_server(tiny_seq2seq_model_dir, max_batch=4)
    try:
        calls = [partial(running.stub.Generate, request(s, max_new_tokens=48), timeout=TIMEOUT) for s in sources]
        got = [reply.token_ids for reply in staggered(running, calls, steps_apart=6)]
    finally:
        running.stop()
    assert [list(g) for g in got] == generate_seq2seq(seq2seq_model, [encode(s) for s in sources], 48, **SEQ2SEQ_IDS)


def test_n_completions_logprobs_and_controls_on_an_encoder_decoder(stub, seq2seq_model):
    """n copies the self-attention and the cross keys/values of the source's slot; logprobs come with
    each token; a stop id ends a translation; prompt_logprobs (its source is not predicted) is refused."""
    expected = generate_seq2seq(seq2seq_model, [encode("4021")], 20, **SEQ2SEQ_IDS)[0]
    reply = stub.Generate(request("4021", max_new_tokens=20, n=3, logprobs=1), timeout=TIMEOUT)
    assert [list(c.token_ids) for c in reply.completions] == [expected] * 3
    assert [len(c.logprobs) for c in reply.completions] == [len(expected)] * 3
    assert all(p.top[0].token_id == p.token_id for p in reply.logprobs)  # greedy: the token is the likeliest
    stopped = stub.Generate(request("4021", max_new_tokens=20, stop_token_ids=[expected[2]]), timeout=TIMEOUT)
    cut = expected.index(expected[2])
    assert list(stopped.token_ids) == expected[:cut] and stopped.finish_reason == pb.FINISH_REASON_STOP
    with pytest.raises(grpc.RpcError) as error:
        stub.Generate(request("4021", max_new_tokens=0, prompt_logprobs=1), timeout=TIMEOUT)
    assert error.value.details() == (
        "prompt_logprobs: an encoder-decoder's prompt is its source, which its decoder does not predict"
    )
