"""n completions of one prompt on a real server over the tiny model: the prompt is prefilled once and
its keys and values copied into the other slots; completion i samples with seed + i, so the n
completions are the n separate requests with those seeds; streamed and unary alike; refused above
the batch; a request waits for n free slots; a cancel frees all of them."""

from __future__ import annotations

import threading

import grpc
import pytest
from fixtures_server import idle, release_once_ended, request, start_server, wait_until

from attnserve.engine.domain import FinishReason
from attnserve.v1 import generation_pb2 as pb

PROMPT = "The list"
SAMPLED = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "max_new_tokens": 24}


def generate(stub, **fields) -> pb.GenerateResponse:
    return stub.Generate(request(PROMPT, **{"max_new_tokens": 24, **fields}), timeout=60)


@pytest.fixture
def prefills(server, monkeypatch):
    """Every prefill run of the shared server's arena: the prompts it took (a counting spy)."""
    decoder = server.engine.slots.decoder
    runs: list[list[list[int]]] = []
    prefill = decoder.prefill

    def counting(first, prompts):
        runs.append([list(p) for p in prompts])
        return prefill(first, prompts)

    monkeypatch.setattr(decoder, "prefill", counting)
    return runs


def test_n_seeded_completions_are_the_requests_with_seeds_s_to_s_plus_n_and_the_prompt_is_prefilled_once(
    stub, prefills
):
    reply = generate(stub, n=4, seed=70, **SAMPLED)
    assert [c.index for c in reply.completions] == [0, 1, 2, 3]
    assert len(prefills) == 1 and len(prefills[0]) == 1  # one run, one prompt, for four completions
    alone = [generate(stub, seed=70 + i, **SAMPLED) for i in range(4)]
    assert [list(c.token_ids) for c in reply.completions] == [list(a.token_ids) for a in alone]
    assert [c.text for c in reply.completions] == [a.text for a in alone]
    assert len({tuple(c.token_ids) for c in reply.completions}) > 1  # the seeds differ, so do the samples
    assert reply.text == alone[0].text and list(reply.token_ids) == list(alone[0].token_ids)
    assert reply.usage.completion_tokens == sum(c.completion_tokens for c in reply.completions)
    assert [c.finish_reason for c in reply.completions] == [a.finish_reason for a in alone]


def test_greedy_n_gives_n_identical_completions_streamed_as_unary(stub):
    reply = generate(stub, n=3)
    assert len({(c.text, tuple(c.token_ids)) for c in reply.completions}) == 1
    assert reply.completions[0].text == generate(stub).text
    messages = list(stub.GenerateStream(request(PROMPT, max_new_tokens=24, n=3, seed=5, temperature=0.9)))
    unary = generate(stub, n=3, seed=5, temperature=0.9)
    for index in range(3):
        mine = [m for m in messages if m.index == index]
        assert [t for m in mine for t in m.token_ids] == list(unary.completions[index].token_ids)
        assert "".join(m.text for m in mine) == unary.completions[index].text
        assert mine[-1].finish_reason != pb.FINISH_REASON_UNSPECIFIED  # each completion ends with its own
        assert all(m.finish_reason == pb.FINISH_REASON_UNSPECIFIED for m in mine[:-1])


def test_n_above_the_batch_is_refused_and_the_limit_is_in_get_model_info(stub):
    assert stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).limits.max_n == 8  # the shared server's batch
    for n in (0, 9):
        with pytest.raises(grpc.RpcError) as error:
            generate(stub, n=n)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.value.details() == f"n: {n} is outside [1, 8] (16, or the server's --max-batch if fewer)"


def test_a_request_waits_for_n_free_slots_and_a_cancel_frees_them_all(tiny_model_dir):
    """Two slots: an n=2 request waits while one runs, then gets both; a cancelled n=2 stream frees both."""
    running = start_server(tiny_model_dir, max_batch=2, max_queue=4)
    try:
        results: dict[str, pb.GenerateResponse] = {}
        one = request(PROMPT, max_new_tokens=60, ignore_eos=True)
        running.pacer.hold()  # the first request holds its slot until the pair waits
        first = threading.Thread(target=lambda: results.setdefault("one", running.stub.Generate(one)))
        first.start()
        wait_until(running.pacer.held.is_set, what="the first request to run")
        pair = threading.Thread(
            target=lambda: results.setdefault("pair", running.stub.Generate(request(PROMPT, max_new_tokens=8, n=2)))
        )
        pair.start()
        wait_until(lambda: running.engine.stats()["queued"] == 1, what="the n=2 request to wait")
        running.pacer.release()
        first.join(60)
        pair.join(60)
        assert len(results["pair"].completions) == 2 and results["one"].usage.completion_tokens == 60
        running.pacer.hold()  # the stream is cancelled before its 100 tokens, whatever the machine's speed
        stream = running.stub.GenerateStream(request(PROMPT, max_new_tokens=100, n=2))
        next(stream)
        wait_until(lambda: running.engine.stats()["active"] == 2, what="both completions to run")
        stream.cancel()
        release_once_ended(running)
        wait_until(lambda: idle(running.engine), what="both slots to be freed")
        assert [final.reason for final in running.pacer.finals[-2:]] == [FinishReason.CANCELLED] * 2
    finally:
        running.stop()


def test_n_across_the_core_process_and_through_the_clients_and_the_cli(server, tiny_model_dir, capsys):
    """The engine core in its own process gives the thread mode's completions; the Python client's
    result and stream carry them; `attnserve generate --n` prints each."""
    import json

    from attnserve.cli import main as cli_main
    from attnserve.clients.client import Client

    fields = {**SAMPLED, "seed": 3, "n": 3}
    here = generate(server.stub, **fields)
    core = start_server(tiny_model_dir, engine_core="process")
    try:
        there = generate(core.stub, **fields)
    finally:
        core.stop()
    assert [list(c.token_ids) for c in there.completions] == [list(c.token_ids) for c in here.completions]
    with Client(server.target) as client:
        result = client.generate(PROMPT, **fields)
        with client.stream(PROMPT, **fields) as stream:
            deltas = list(stream)
        streamed = stream.result()
    expected = [(c.index, c.text, tuple(c.token_ids)) for c in here.completions]
    assert [(c.index, c.text, c.token_ids) for c in result.completions] == expected
    assert [(c.index, c.text, c.token_ids) for c in streamed.completions] == expected
    assert {d.index for d in deltas} == {0, 1, 2} and streamed.usage.completion_tokens == here.usage.completion_tokens
    command = ["generate", PROMPT, "--target", server.target, "--max-new-tokens", "24", "--temperature", "0.9"]
    command += ["--top-k", "40", "--top-p", "0.95", "--seed", "3", "--n", "3"]
    assert cli_main(command) == 0
    assert capsys.readouterr().out == "".join(f"[{c.index}] {c.text}\n" for c in here.completions)
    assert cli_main([*command, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [c["token_ids"] for c in printed["completions"]] == [list(c.token_ids) for c in here.completions]
