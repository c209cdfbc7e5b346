"""One request fails alone, on a real server over the tiny model: an exception in one request's own work
ends that request with INTERNAL (a request id, no traceback) while every other stream of its busy batch
completes with what it gets alone, on a real gRPC channel; and the in-range beam search that once failed
every request in flight (num_beams 2, a length_penalty of -5 or -10 and enough tokens) is served beside the streams."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from fixtures_server import idle, request, start_server, wait_until

from attnserve.engine.sequence import Sequence

TIMEOUT = 120
PROMPTS = [f"def f{i}(x):" for i in range(10)]
TOKENS = 40


@pytest.fixture(scope="module")
def busy(tiny_model_dir):
    running = start_server(tiny_model_dir, max_batch=16)
    yield running
    running.stop()


def streamed(stub, prompt: str, **fields) -> list[int]:
    """A stream's token ids, read to its end."""
    fields = {"max_new_tokens": TOKENS, "min_new_tokens": TOKENS, **fields}
    return [t for message in stub.GenerateStream(request(prompt, **fields), timeout=TIMEOUT) for t in message.token_ids]


def test_hostile_beam_searches_beside_ten_streams_fail_nobody(busy):
    """Two beam searches whose hypotheses score below -1e9 (their log-probability times 40 ** 10) beside ten
    greedy streams and ten sampled ones: every call succeeds, each stream's tokens what it gets alone."""
    stub = busy.stub
    sampled = {"temperature": 0.8, "top_p": 0.95, "seed": 7}
    alone = [streamed(stub, p) for p in PROMPTS] + [streamed(stub, p, **sampled) for p in PROMPTS]
    hostile = request("class A:", num_beams=2, length_penalty=-10.0, max_new_tokens=TOKENS, min_new_tokens=TOKENS)
    with ThreadPoolExecutor(22) as pool:
        beams = [pool.submit(stub.Generate, hostile, timeout=TIMEOUT) for _ in range(2)]
        greedy = [pool.submit(streamed, stub, p) for p in PROMPTS]
        sampling = [pool.submit(streamed, stub, p, **sampled) for p in PROMPTS]
        together = [f.result() for f in greedy + sampling]
        replies = [f.result() for f in beams]
    assert together == alone
    for reply in replies:
        assert len(reply.token_ids) == TOKENS and reply.score < -1e9, (len(reply.token_ids), reply.score)
    wait_until(lambda: idle(busy.engine), what="the batch to empty")


def test_a_failure_injected_into_one_row_ends_it_with_internal_and_the_others_complete(busy, monkeypatch):
    """One sampled request's sampler raises at its fifth token, in a batch of 16 streams: it alone ends
    INTERNAL with its request id; the other 15 streams get what they get alone."""
    stub = busy.stub
    sampled = {"temperature": 0.8, "top_p": 0.95, "seed": 7}
    alone = [streamed(stub, p, **sampled) for p in PROMPTS[:5]] + [streamed(stub, p) for p in PROMPTS]
    calls = []

    def failing(real):
        """The sampler's side of a pick (on the host, or of the runner's batched pass): the victim's fifth fails."""

        def pick(self, row):
            if self.request.request_id == "victim":
                calls.append(1)
                if len(calls) >= 5:
                    raise ValueError("injected into one row's sampler")
            return real(self, row)

        return pick

    monkeypatch.setattr(Sequence, "pick", failing(Sequence.pick))
    monkeypatch.setattr(Sequence, "take_pick", failing(Sequence.take_pick))
    with ThreadPoolExecutor(16) as pool:
        victim = pool.submit(streamed, stub, "def victim():", request_id="victim", **sampled)
        others = [pool.submit(streamed, stub, p, **sampled) for p in PROMPTS[:5]]
        others += [pool.submit(streamed, stub, p) for p in PROMPTS]
        with pytest.raises(grpc.RpcError) as failed:
            victim.result()
        assert [f.result() for f in others] == alone
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert failed.value.details() == "internal error; request id victim"
    wait_until(lambda: idle(busy.engine), what="the batch to empty")
