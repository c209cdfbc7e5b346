"""Several servers: round_robin spreads calls over them; calls retry across a server's restart."""

import asyncio
import threading
import time

import pytest
from fixtures_server import calls, request, start_server, wait_until

from attnserve.clients import NO_RETRY, AsyncClient, Client, RetryPolicy, Unavailable

PROMPT = "for key in "
PATIENT = RetryPolicy(max_attempts=40, initial_backoff=0.05, max_backoff=0.25)  # about 8 s


def served(server, method: str = "Generate") -> float:
    """Calls of `method` that server answered OK."""
    return calls(server, method, "OK")


@pytest.fixture
def two_servers(tiny_model_dir):
    servers = [start_server(tiny_model_dir) for _ in range(2)]
    yield servers
    for running in servers:
        running.stop()


@pytest.mark.parametrize("form", ["comma", "list"])
def test_round_robin_sends_calls_to_every_server(two_servers, form):
    targets = [s.target for s in two_servers]
    with Client(",".join(targets) if form == "comma" else targets, timeout=5) as client:
        for _ in range(40):  # round_robin picks among connected servers
            client.generate(PROMPT, max_new_tokens=2)
            if all(served(s) >= 3 for s in two_servers):
                break
    wait_until(lambda: all(served(s) >= 3 for s in two_servers), timeout=2, what="both servers to have served 3 calls")


def test_async_round_robin_spreads_concurrent_streams(two_servers):
    async def main():
        async with AsyncClient([s.target for s in two_servers], timeout=5) as client:
            for _ in range(10):
                await asyncio.gather(*(client.stream(PROMPT, max_new_tokens=2).result() for _ in range(4)))
                if all(served(s, "GenerateStream") >= 4 for s in two_servers):
                    return

    asyncio.run(main())
    wait_until(
        lambda: all(served(s, "GenerateStream") >= 4 for s in two_servers),
        timeout=2,
        what="both servers to have served 4 streams",
    )


def restart_later(model_dir, port: int, delay: float, out: list) -> threading.Thread:
    """Start a server on `port` after `delay` seconds, in the background."""

    def run():
        time.sleep(delay)
        out.append(start_server(model_dir, port=port))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_unary_calls_and_streams_retry_across_a_restart(tiny_model_dir):
    first = start_server(tiny_model_dir)
    port, restarted = first.server.port, []
    with Client(first.target, timeout=15, retry=PATIENT) as client:
        before = client.generate(PROMPT, max_new_tokens=4)
        first.stop()
        with Client(first.target, timeout=2, retry=NO_RETRY) as impatient, pytest.raises(Unavailable):
            impatient.generate(PROMPT, max_new_tokens=4)
        thread = restart_later(tiny_model_dir, port, 0.5, restarted)
        try:
            t0 = time.monotonic()
            after = client.generate(PROMPT, max_new_tokens=4)
            assert time.monotonic() - t0 >= 0.3  # it waited for the restart
            wait_until(lambda: served(restarted[0]) == 1, timeout=2, what="the call's count")
            thread.join(5)
            restarted.pop().stop()
            thread = restart_later(tiny_model_dir, port, 0.5, restarted)
            t0 = time.monotonic()
            streamed = client.stream(PROMPT, max_new_tokens=4).result()  # no token before
            assert time.monotonic() - t0 >= 0.3
            wait_until(lambda: served(restarted[0], "GenerateStream") == 1, timeout=2, what="the stream's count")
            info = client.model_info()
        finally:
            thread.join(5)
            for running in restarted:
                running.stop()
    assert after.token_ids == before.token_ids == streamed.token_ids
    assert info.vocab_size == 259


def test_a_stream_is_not_retried_once_tokens_arrived(tiny_model_dir):
    """The server stops while the engine is held after the stream's first token."""
    running = start_server(tiny_model_dir)
    running.pacer.hold()
    try:
        with Client(running.target, timeout=15, retry=PATIENT) as client:
            stream = client.stream(PROMPT, max_new_tokens=100)
            first = next(stream)
            running.call(running.server.grpc.stop(grace=None))  # the server goes away mid-stream
            with pytest.raises(Unavailable):  # a resent stream would wait for a server: DEADLINE_EXCEEDED at 15 s
                list(stream)  # replaying the tokens would duplicate them
    finally:
        running.stop()
    assert first.token_ids


@pytest.mark.parametrize(("bucket", "most_attempts"), [(10, 1.2), (1000, 5.0)])
def test_a_draining_server_gets_about_one_attempt_a_call_not_five(tiny_model_dir, bucket, most_attempts):
    """Every call refused with UNAVAILABLE (the server drains behind a request it holds): the retries
    stop once the bucket is half empty, 1.1 attempts a call over 40 calls, where a bucket too big to
    empty lets each call take its five."""
    running = start_server(tiny_model_dir, drain_timeout=30)
    running.pacer.hold()
    held = threading.Thread(target=lambda: running.stub.Generate(request(PROMPT, max_new_tokens=8), timeout=60))
    held.start()
    wait_until(running.pacer.held.is_set, what="the engine to hold the request")
    draining = asyncio.run_coroutine_threadsafe(running.server.drain(), running.loop)
    wait_until(lambda: running.server.boundary.refusal is not None, what="the server to drain")
    quick = RetryPolicy(initial_backoff=0.01, max_backoff=0.01, throttle_tokens=bucket)
    try:
        with Client(running.target, timeout=5, retry=quick) as client:
            for _ in range(40):
                with pytest.raises(Unavailable, match="draining"):
                    client.generate(PROMPT, max_new_tokens=2)
        attempts = calls(running, "Generate", "UNAVAILABLE") / 40
    finally:
        running.pacer.release()
        draining.result(30)  # the held request finished; the server stopped
        held.join(10)
        running.loop.call_soon_threadsafe(running.loop.stop)
        running.thread.join(10)
    assert attempts <= most_attempts
    assert attempts > most_attempts - 0.2  # the bucket decides: 44 attempts, or all 200
