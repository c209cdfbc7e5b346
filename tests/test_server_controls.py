"""The small controls of a generation (stop_token_ids, min_new_tokens, ignore_eos, logit_bias,
priority) on a real server over the tiny model: each changes the output or the order as the protocol
says, each bad value is refused naming the field and the limit, and each is counted in the metrics."""

from __future__ import annotations

import threading

import grpc
import pytest
from fixtures_server import request, start_server, wait_until

from attnserve.clients.client import Client
from attnserve.v1 import generation_pb2 as pb

PROMPT = "The list"


def generate(stub, **fields) -> pb.GenerateResponse:
    return stub.Generate(request(PROMPT, **{"max_new_tokens": 40, **fields}), timeout=60)


@pytest.fixture(scope="module")
def free(server):
    """The greedy completion with no control: what each control is measured against."""
    reply = generate(server.stub)
    assert reply.finish_reason == pb.FINISH_REASON_LENGTH and len(reply.token_ids) == 40
    return reply


def first_new(tokens) -> tuple[int, int]:
    """The last token of `tokens` (but for the last three) that is not among those before it, and its
    index: a stop at that token cuts the completion there. Chosen from what the model said, whatever
    it said (index 0 for a model that repeats one token, 3 for " the the the ...")."""
    index = max(i for i in range(len(tokens) - 3) if tokens[i] not in tokens[:i])
    return tokens[index], index


def test_a_stop_token_id_ends_the_completion_before_it_unary_and_streamed(stub, free):
    token, index = first_new(list(free.token_ids))
    reply = generate(stub, stop_token_ids=[token])
    assert list(reply.token_ids) == list(free.token_ids[:index]) and reply.finish_reason == pb.FINISH_REASON_STOP
    assert reply.usage.completion_tokens == index and free.text.startswith(reply.text)
    streamed = list(stub.GenerateStream(request(PROMPT, max_new_tokens=40, stop_token_ids=[token]), timeout=60))
    assert [t for m in streamed for t in m.token_ids] == list(reply.token_ids)
    assert "".join(m.text for m in streamed) == reply.text and streamed[-1].finish_reason == pb.FINISH_REASON_STOP


def test_min_new_tokens_masks_the_stop_ids_and_ignores_stop_strings_until_then(stub, free):
    token, index = first_new(list(free.token_ids))
    reply = generate(stub, stop_token_ids=[token], min_new_tokens=index + 3)
    assert token not in reply.token_ids[: index + 3] and len(reply.token_ids) >= index + 3
    assert list(reply.token_ids[:index]) == list(free.token_ids[:index])  # the same until the masked step
    stop = free.text[2:5]  # found early in the free text: without min_new_tokens it ends the completion there
    early = generate(stub, stop=[stop])
    assert early.finish_reason == pb.FINISH_REASON_STOP and len(early.token_ids) < 10
    late = generate(stub, stop=[stop], min_new_tokens=10)
    assert list(late.token_ids[:10]) == list(free.token_ids[:10]) and stop in late.text
    assert len(late.token_ids) >= 10 and late.text.startswith(free.text[: len(early.text) + len(stop)])


def test_logit_bias_bans_and_forces_tokens_greedy_included(stub, free):
    banned = generate(stub, logit_bias={free.token_ids[0]: -100.0})
    assert banned.token_ids[0] != free.token_ids[0]
    forced_id = ord("x")  # the byte tokenizer: id 120 is "x"
    forced = generate(stub, max_new_tokens=12, logit_bias={forced_id: 100.0})
    assert list(forced.token_ids) == [forced_id] * 12 and forced.text == "x" * 12
    assert generate(stub, logit_bias={forced_id: 0.0}).token_ids == free.token_ids  # a zero bias changes nothing


def test_ignore_eos_masks_eos_for_the_whole_generation(server, stub):
    eos = server.server.info.tokenizer.eos_id
    ends = generate(stub, logit_bias={eos: 100.0})  # EOS is the first token: the completion is empty
    assert ends.finish_reason == pb.FINISH_REASON_EOS and list(ends.token_ids) == []
    goes_on = generate(stub, max_new_tokens=20, logit_bias={eos: 100.0}, ignore_eos=True)
    assert goes_on.finish_reason == pb.FINISH_REASON_LENGTH and len(goes_on.token_ids) == 20
    assert eos not in goes_on.token_ids
    held = generate(stub, max_new_tokens=20, logit_bias={eos: 100.0}, min_new_tokens=5)
    assert held.finish_reason == pb.FINISH_REASON_EOS and len(held.token_ids) == 5  # EOS at the first chance


def test_a_higher_priority_is_admitted_first_and_equal_ones_in_arrival_order(tiny_model_dir):
    """One slot, held while four requests queue (priorities 0, 5, 0, 5 in that order): the engine ends
    them 5, 5, 0, 0, each pair in its arrival order; the running one is not preempted. Each asks for a
    length of its own (20 to 23 tokens, EOS ignored), so that its Final names it."""
    running = start_server(tiny_model_dir, max_batch=1, max_queue=8)
    lengths = {"a0": 20, "b5": 21, "c0": 22, "d5": 23}
    try:
        warmup = len(running.pacer.finals)
        running.pacer.hold()
        first_request = request(PROMPT, max_new_tokens=4, ignore_eos=True)
        first = threading.Thread(target=lambda: running.stub.Generate(first_request, timeout=60))
        first.start()
        wait_until(running.pacer.held.is_set, what="the first request to hold the slot")

        def call(name: str, priority: int) -> None:
            fields = {"max_new_tokens": lengths[name], "ignore_eos": True, "priority": priority}
            running.stub.Generate(request(PROMPT, request_id=name, **fields), timeout=60)

        callers = []
        for queued, (name, priority) in enumerate([("a0", 0), ("b5", 5), ("c0", 0), ("d5", 5)], 1):
            callers.append(threading.Thread(target=call, args=(name, priority)))
            callers[-1].start()
            wait_until(lambda n=queued: running.engine.stats()["queued"] == n, what=f"{queued} queued")
        running.pacer.release()
        for thread in (first, *callers):
            thread.join(60)
        ended = [final.usage.completion_tokens for final in running.pacer.finals[warmup:]]
    finally:
        running.stop()
    names = {length: name for name, length in lengths.items()}
    assert [names.get(n, n) for n in ended] == [4, "b5", "d5", "a0", "c0"]


BAD = [
    ({"stop_token_ids": [1] * 17}, "stop_token_ids: 17 ids, the limit is 16"),
    ({"stop_token_ids": [5, 259]}, "stop_token_ids[1]: 259 is outside [0, 259) (vocab_size 259)"),
    ({"min_new_tokens": 41}, "min_new_tokens: 41 is more than max_new_tokens 40"),
    ({"logit_bias": {i: 1.0 for i in range(301)}}, "logit_bias: 301 entries, the limit is 300"),
    ({"logit_bias": {300: 1.0}}, "logit_bias[300]: 300 is outside [0, 259) (vocab_size 259)"),
    ({"logit_bias": {7: -100.5}}, "logit_bias[7]: -100.5 is outside [-100, 100]"),
    ({"logit_bias": {7: float("nan")}}, "logit_bias[7]: nan is outside [-100, 100]"),
]


@pytest.mark.parametrize("fields, message", BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_controls_are_invalid_argument_naming_the_field_and_the_limit(stub, fields, message):
    with pytest.raises(grpc.RpcError) as error:
        generate(stub, **fields)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error.value.details() == message


def test_the_limits_are_in_get_model_info_and_each_control_is_counted(server, stub):
    limits = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).limits
    assert (limits.max_stop_token_ids, limits.max_logit_bias) == (16, 300)
    registry = server.server.metrics.registry
    count = lambda control: registry.get_sample_value("attnserve_request_controls_total", {"control": control}) or 0
    names = ("stop_token_ids", "min_new_tokens", "ignore_eos", "logit_bias", "priority")
    before = {name: count(name) for name in names}
    generate(stub, max_new_tokens=4, logit_bias={7: 1.0}, priority=3, ignore_eos=True)
    generate(stub, max_new_tokens=4)
    assert {name: count(name) - before[name] for name in names} == {
        "stop_token_ids": 0,
        "min_new_tokens": 0,
        "ignore_eos": 1,
        "logit_bias": 1,
        "priority": 1,
    }


def test_the_python_client_sends_the_controls(server, free):
    """GenerationParams' fields (a logit_bias mapping, stop ids, priority) reach the server as Generate's."""
    with Client(server.target) as client:
        forced = client.generate(PROMPT, max_new_tokens=6, logit_bias={ord("x"): 100}, priority=1)
        token, index = first_new(list(free.token_ids))
        stopped = client.generate(PROMPT, max_new_tokens=40, stop_token_ids=[token])
    assert forced.text == "x" * 6 and forced.finish_reason == "length"
    assert list(stopped.token_ids) == list(free.token_ids[:index]) and stopped.finish_reason == "stop"
