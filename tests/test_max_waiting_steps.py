"""--max-waiting-steps served (engine.Engine._admits_now; the engine's own cases are tests/test_engine.py's):
an arrival that could start waits while fewer wait than decode, through either engine core."""

from __future__ import annotations

import threading

import pytest
from fixtures_server import request, start_server, wait_until

from attnserve.server.test_switches import TEST_STEP_DELAY_VARIABLE

LONG = 100  # tokens of each of the two long streams (the tiny model's context is 128)
STEP_MS = 20  # the engine's test brake a step: the streams are half way for a second, on a busy machine too


@pytest.mark.parametrize("engine_core", ["thread", "process"])
def test_an_arrival_waits_while_two_decode_as_max_waiting_steps_says(tiny_model_dir, engine_core, monkeypatch):
    """Two long streams decode; a short request arrives. With 1024 steps to wait (more than the streams
    last) and one waiting against two decoding, it starts only once they are done: it has not ended when
    they are half way (with 0 it would start at the next step: tests/test_engine.py holds both cases on
    the fake runner, step by step). Nothing is lost. Each step is braked (STEP_MS), so that the test's
    thread sees the half-way point before the streams end, however busy the machine."""
    monkeypatch.setenv(TEST_STEP_DELAY_VARIABLE, str(STEP_MS))
    running = start_server(tiny_model_dir, max_batch=4, engine_core=engine_core, max_waiting_steps=1024)
    received = {"a": 0, "b": 0}
    short_done, replies = threading.Event(), []

    def long(name: str) -> None:
        stream = running.stub.GenerateStream(request(f"long {name}", max_new_tokens=LONG, ignore_eos=True), timeout=60)
        for message in stream:
            received[name] += len(message.token_ids)

    def short() -> None:
        replies.append(running.stub.Generate(request("short", max_new_tokens=2, ignore_eos=True), timeout=60))
        short_done.set()

    try:
        longs = [threading.Thread(target=long, args=(name,)) for name in received]
        for thread in longs:
            thread.start()
        wait_until(lambda: min(received.values()) >= 1, what="both long streams' first tokens")
        waiting = threading.Thread(target=short)
        waiting.start()
        wait_until(lambda: min(received.values()) >= LONG // 2, what="both long streams half way")
        assert not short_done.is_set(), "the short request started while two decoded and it alone waited"
        for thread in [*longs, waiting]:
            thread.join(60)
        assert received == {"a": LONG, "b": LONG} and replies[0].usage.completion_tokens == 2
    finally:
        running.stop()
