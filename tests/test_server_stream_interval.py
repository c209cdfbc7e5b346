"""The stream interval through a server: fewer, fuller messages, the same text, the first delta and the end
never held (the engine holds the tokens between messages: tests/test_engine.py tests its rule)."""

import grpc
import pytest
from fixtures_server import request, start_server

TIMEOUT = 30  # far below the 60 s time bounds used here: a held-back end would run past it
NEW_TOKENS = 40


def stream(stub, **fields):
    messages = list(stub.GenerateStream(request("The server", max_new_tokens=NEW_TOKENS, **fields), timeout=TIMEOUT))
    *body, final = messages
    assert final.finish_reason and not final.token_ids
    text = "".join(m.text for m in messages)
    return [len(m.token_ids) for m in body], text, final


def test_interval_sends_fewer_messages_with_the_same_text(server, stub):
    server.pacer.lockstep = True  # a step at a time, so that every step is a message without an interval
    every, text, final = stream(stub)
    paced, paced_text, paced_final = stream(stub, stream_interval_tokens=8)
    assert paced_text == text and paced_final.usage == final.usage
    assert sum(paced) == sum(every) == final.usage.completion_tokens
    assert paced[0] == every[0]  # the first delta is not held back
    assert all(n >= 8 for n in paced[1:-1]), paced  # between the first and the last: full messages
    assert len(paced) < len(every) and len(paced) <= 2 + NEW_TOKENS // 8


def test_the_end_is_never_held_back_by_the_interval(server, stub):
    """Tokens and time bounds far beyond the generation: the rest goes out as soon as it ends."""
    # In lockstep: unpaced, on a busy machine the whole generation sometimes ended before the
    # handler read its first event (13-17 of 300 streams under load), and then there is no
    # "first delta" to send apart.
    server.pacer.lockstep = True
    counts, text, final = stream(stub, stream_interval_tokens=100, stream_interval_ms=60_000)
    assert counts[0] >= 1 and sum(counts) == final.usage.completion_tokens
    assert len(counts) == 2  # the first delta at once, everything else together at the end
    assert text == stream(stub)[1]


def test_time_bound_sends_while_tokens_are_slow(server, stub):
    server.pacer.delay = 0.01  # wall time is the subject: 10 ms or more per step, the 40 tokens take 0.4 s or more
    counts, _, final = stream(stub, stream_interval_tokens=100, stream_interval_ms=100)
    assert sum(counts) == final.usage.completion_tokens == NEW_TOKENS
    assert 3 <= len(counts) < NEW_TOKENS, counts  # sent every 100 ms, not every step, not only at the end


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"stream_interval_tokens": 0}, "stream_interval_tokens: 0 is outside [1, "),
        ({"stream_interval_tokens": 100_000}, "stream_interval_tokens: 100000 is outside [1, "),
        ({"stream_interval_ms": 60_001}, "stream_interval_ms: 60001 is outside [0, 60000]"),
    ],
)
def test_bad_intervals_are_invalid_argument_naming_the_field(stub, fields, message):
    with pytest.raises(grpc.RpcError) as error:
        list(stub.GenerateStream(request("x", **fields), timeout=TIMEOUT))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith(message), error.value.details()


def test_server_default_interval_applies_and_is_reported(tiny_model_dir):
    from attnserve.v1 import generation_pb2 as pb

    running = start_server(tiny_model_dir, stream_interval_tokens=5, warmup=False)
    running.pacer.lockstep = True  # a step at a time, so that every step is a message without an interval
    try:
        limits = running.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=TIMEOUT).limits
        assert (limits.stream_interval_tokens, limits.stream_interval_ms) == (5, 0)
        counts, _, _ = stream(running.stub)
        assert all(n >= 5 for n in counts[1:-1]) and len(counts) <= 2 + NEW_TOKENS // 5, counts
        every, _, _ = stream(running.stub, stream_interval_tokens=1)  # a request's own interval wins
        assert len(every) > len(counts)
    finally:
        running.stop()
