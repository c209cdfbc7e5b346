"""A served BPE model: greedy over gRPC equals PyTorch, streamed deltas never carry a cut character
or rewrite sent text, stop strings match across token boundaries, prompt_token_ids equal text."""

import grpc
import pytest
from fixtures_server import idle, start_server, wait_until

from attnserve.model.generate import generate
from attnserve.tokenizer import from_model_dir
from attnserve.tokenizer.bpe import BpeTokenizer
from attnserve.v1 import generation_pb2 as pb

TIMEOUT = 30
PROMPTS = ["The return statement", "def f(x):\n    return", "Καλημέρα κόσμε", "日本語 😀"]


@pytest.fixture(scope="module")
def bpe_server(tiny_bpe_model_dir):
    running = start_server(tiny_bpe_model_dir)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def tokenizer(tiny_bpe_model_dir) -> BpeTokenizer:
    from attnserve.runtime.contract import read_manifest

    return from_model_dir(tiny_bpe_model_dir, read_manifest(tiny_bpe_model_dir).tokenizer)


@pytest.fixture
def stub(bpe_server):
    yield bpe_server.stub
    wait_until(lambda: idle(bpe_server.engine), what="the BPE server to go idle")


def test_model_info_reports_the_bpe(stub, tokenizer):
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=TIMEOUT)
    assert (info.tokenizer.kind, info.tokenizer.vocab_size, info.vocab_size) == ("bpe", 512, 512)
    assert (info.tokenizer.bos_id, info.tokenizer.eos_id, info.tokenizer.pad_id) == (0, 1, 2)
    assert info.tokenizer.bos_prepended is False


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_over_grpc_equals_pytorch(stub, tokenizer, tiny_bpe_checkpoint, prompt):
    from attnserve.model.checkpoint import load_checkpoint

    model = load_checkpoint(tiny_bpe_checkpoint)
    ids = tokenizer.encode_prompt(prompt)
    expected = generate(model, [ids], max_new_tokens=40, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)[0]
    reply = stub.Generate(pb.GenerateRequest(prompt=prompt, max_new_tokens=40), timeout=TIMEOUT)
    assert list(reply.token_ids) == expected
    assert reply.text == tokenizer.decode(expected)
    assert reply.usage.prompt_tokens == len(ids) <= len(prompt.encode())


def test_streamed_deltas_are_whole_characters_and_join_to_the_unary_text(stub, tokenizer):
    # Hot sampling from a prompt of cut characters makes byte tokens that split multi-byte characters.
    prompt = "日本語 😀 Καλημέρα — naïve"
    assert any(tokenizer.decode([i]).endswith("\ufffd") for i in tokenizer.encode(prompt))
    cut_between_messages = 0
    for seed in range(8):
        fields = dict(prompt=prompt, max_new_tokens=60, temperature=2.5, seed=seed)
        unary = stub.Generate(pb.GenerateRequest(**fields), timeout=TIMEOUT)
        messages = list(stub.GenerateStream(pb.GenerateRequest(**fields), timeout=TIMEOUT))
        assert "".join(m.text for m in messages) == unary.text == tokenizer.decode(unary.token_ids)
        assert [t for m in messages for t in m.token_ids] == list(unary.token_ids)
        sent, ids = "", []
        for m in messages:
            sent, ids = sent + m.text, ids + list(m.token_ids)
            assert unary.text.startswith(sent)  # nothing sent is ever rewritten
            assert tokenizer.decode(ids).startswith(sent)  # nor sent ahead of its tokens
            cut_between_messages += tokenizer.decode(ids).endswith("\ufffd")  # a character cut here
    assert cut_between_messages > 0  # the test did meet characters cut between tokens


def two_token_stop(tokenizer: BpeTokenizer, ids: list[int]) -> tuple[str, int]:
    """A stop string made of the end of one generated token and the start of the next."""
    for k in range(1, len(ids) - 1):
        left, right = tokenizer.decode([ids[k]]), tokenizer.decode([ids[k + 1]])
        if len(left) >= 2 and len(right) >= 2 and left.isascii() and right.isascii():
            stop = left[-2:] + right[:2]
            before = tokenizer.decode(ids[: k + 2])
            if before.find(stop) == len(tokenizer.decode(ids[: k + 1])) - 2:
                return stop, k
    pytest.skip("no two neighbouring multi-character tokens in the greedy text")


def test_a_stop_string_across_two_tokens_stops_and_is_not_sent(stub, tokenizer):
    prompt = "The return statement"
    free = stub.Generate(pb.GenerateRequest(prompt=prompt, max_new_tokens=60), timeout=TIMEOUT)
    stop, k = two_token_stop(tokenizer, list(free.token_ids))
    req = pb.GenerateRequest(prompt=prompt, max_new_tokens=60, stop=[stop])
    unary = stub.Generate(req, timeout=TIMEOUT)
    messages = list(stub.GenerateStream(req, timeout=TIMEOUT))
    expected = tokenizer.decode(free.token_ids[: k + 2])
    expected = expected[: expected.find(stop)]
    assert unary.finish_reason == messages[-1].finish_reason == pb.FINISH_REASON_STOP
    assert unary.text == "".join(m.text for m in messages) == expected
    assert stop not in unary.text and list(unary.token_ids) == list(free.token_ids[: k + 2])


def test_prompt_token_ids_give_the_same_answer_as_the_text(stub, tokenizer):
    text = "Raise an exception"
    by_text = stub.Generate(pb.GenerateRequest(prompt=text, max_new_tokens=24), timeout=TIMEOUT)
    by_ids = stub.Generate(
        pb.GenerateRequest(prompt_token_ids=tokenizer.encode_prompt(text), max_new_tokens=24), timeout=TIMEOUT
    )
    assert (by_ids.text, list(by_ids.token_ids)) == (by_text.text, list(by_text.token_ids))
    assert by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens == len(tokenizer.encode_prompt(text))


@pytest.mark.parametrize(
    "fields, field, limit",
    [
        (dict(prompt_token_ids=[5, 512, 7]), "prompt_token_ids[1]", "512 is outside [0, 512)"),
        (dict(prompt_token_ids=[-1]), "prompt_token_ids[0]", "-1 is outside [0, 512)"),
        (dict(prompt="x", prompt_token_ids=[5]), "prompt_token_ids", "not both"),
        (dict(prompt_token_ids=[5] * 128), "prompt", "128 tokens, the limit is 127"),
        (dict(prompt="é" * 100_000), "prompt", "200000 UTF-8 bytes, more than any 127 tokens can hold"),
    ],
)
def test_bad_prompts_are_refused_naming_the_field(stub, fields, field, limit):
    with pytest.raises(grpc.RpcError) as error:
        stub.Generate(pb.GenerateRequest(max_new_tokens=1, **fields), timeout=TIMEOUT)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith(field + ":") and limit in error.value.details()


def test_bench_defaults_send_exact_prompt_lengths_without_a_warning(bpe_server, capsys):
    """`attnserve bench` with no prompt flag: --prompt-tokens ids per request on a BPE model, no notice."""
    import json

    from attnserve.cli import main

    args = ["bench", "--target", bpe_server.target, "--concurrency", "2", "--requests", "4"]
    status = main([*args, "--max-new-tokens", "4", "--prompt-tokens", "24", "--warmup", "0"])
    out, err = capsys.readouterr()
    assert status == 0, err
    report = json.loads(out.splitlines()[-1])
    (level,) = report["levels"]
    assert level["prompt_tokens"] == 4 * 24 and report["prompts"].startswith("token ids: exactly 24")
    assert "prompts are" not in err and "byte tokenizer" not in err
