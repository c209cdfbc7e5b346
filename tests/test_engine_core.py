"""The engine core in a process of its own (`--engine-core process`, serve's default): the tokens of
the engine in the server's process, cancels and refusals across the boundary, and a killed core
ending what was in flight with UNAVAILABLE and the server with exit code 1 (its supervisor
restarts it). The rest of the suite drives `attnserve serve` subprocesses in this mode too
(start-up errors, drain on SIGTERM, TLS, the protobuf hosts)."""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

import grpc
import pytest
from fixtures_server import ServeProcess, request, start_server, wait_until

from attnserve.core.config import MAX_NICE
from attnserve.core.protocol import DeltaEvent
from attnserve.runtime.model_sessions import usable_cores
from attnserve.server.metrics import resident_bytes
from attnserve.server.test_switches import TEST_STEP_DELAY_VARIABLE
from attnserve.v1 import generation_pb2 as pb
from attnserve.v1 import generation_pb2_grpc as pb_grpc

PROMPTS = ["The list", "def parse(", "Return the", "x"]
SAMPLED = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "repetition_penalty": 1.1}
SLOW_STEP_MS = 30  # per engine step with a batch: a 100-token generation outlives the test's next moves


@pytest.fixture(scope="module")
def core(tiny_model_dir):
    running = start_server(tiny_model_dir, engine_core="process")
    yield running
    running.stop()


@pytest.fixture
def slow_core(tiny_model_dir, monkeypatch):
    """A core of one slot and a queue of one, each step slowed to SLOW_STEP_MS (its process reads the
    switch from the environment it inherits)."""
    monkeypatch.setenv(TEST_STEP_DELAY_VARIABLE, str(SLOW_STEP_MS))
    running = start_server(tiny_model_dir, engine_core="process", max_batch=1, max_queue=1)
    yield running
    running.stop()


def generate(stub, prompt: str, **fields) -> pb.GenerateResponse:
    return stub.Generate(request(prompt, **{"max_new_tokens": 24, **fields}), timeout=60)


def test_the_core_process_decodes_the_tokens_of_the_engine_in_the_servers_process(core, server):
    """Greedy and seeded sampling, unary and streamed: the same tokens and text in both modes."""
    assert core.server.engine.process.is_alive() and core.server.info.execution_provider == "CPUExecutionProvider"
    assert core.engine.napping is (usable_cores() > 1)  # one thread leaves a core free, where there are two
    for prompt in PROMPTS:
        for fields in ({}, {**SAMPLED, "seed": 7}):
            here, there = generate(server.stub, prompt, **fields), generate(core.stub, prompt, **fields)
            assert there.token_ids == here.token_ids and there.text == here.text, (prompt, fields)
            streamed = list(core.stub.GenerateStream(request(prompt, max_new_tokens=24, **fields), timeout=60))
            assert [t for m in streamed for t in m.token_ids] == list(here.token_ids)
            assert "".join(m.text for m in streamed) == here.text


def test_a_core_whose_threads_take_every_cpu_is_waited_for_not_napped_for_and_decodes_alike(tiny_model_dir, server):
    """Threads on every core (a large model's default): the receiver sleeps until each step comes
    (naps.py), and nothing is lost or late: the tokens of the server's process, streamed and unary."""
    every_core = start_server(tiny_model_dir, engine_core="process", threads=usable_cores())
    try:
        assert every_core.engine.napping is False
        for prompt in PROMPTS:
            here, there = generate(server.stub, prompt), generate(every_core.stub, prompt)
            assert there.token_ids == here.token_ids, prompt
            streamed = list(every_core.stub.GenerateStream(request(prompt, max_new_tokens=24), timeout=60))
            assert [t for m in streamed for t in m.token_ids] == list(here.token_ids)
    finally:
        every_core.stop()


def test_the_metrics_report_the_core_process_memory(core, server):
    """The core's resident memory is its own process's (a session and an arena: tens of MB), not the
    front end's; with the engine in a thread it is the server's process."""
    memory = lambda running: running.server.metrics.registry.get_sample_value("attnserve_engine_core_resident_bytes")
    core_pid = core.server.engine.pid
    assert abs(memory(core) - resident_bytes(core_pid)) < 2**20
    assert memory(core) > 10 * 2**20 and core_pid != os.getpid()
    assert abs(memory(server) - resident_bytes(os.getpid())) < 8 * 2**20


def thread_nices(pid: int) -> set[int]:
    """The nice value of each thread of process `pid` (/proc/PID/task/TID/stat, field 19)."""
    stats = (Path(f"/proc/{pid}/task") / tid / "stat" for tid in os.listdir(f"/proc/{pid}/task"))
    return {int(stat.read_text().rsplit(")", 1)[1].split()[16]) for stat in stats}


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads threads' priorities from /proc")
def test_the_core_process_and_its_threads_run_core_nice_below_the_front_end(core, tiny_model_dir):
    """--core-nice 5: every thread of the core's process, ONNX Runtime's intra-op threads among them,
    runs that much below the front end, which keeps its own priority; by default (0) the core runs
    beside it."""
    front = os.getpriority(os.PRIO_PROCESS, 0)
    assert thread_nices(core.server.engine.pid) == {front}
    lower = start_server(tiny_model_dir, engine_core="process", threads=2, core_nice=5)
    try:
        pid = lower.server.engine.pid
        assert len(os.listdir(f"/proc/{pid}/task")) > 2 and thread_nices(pid) == {min(front + 5, MAX_NICE)}
        assert generate(lower.stub, "The list").token_ids == generate(core.stub, "The list").token_ids
    finally:
        lower.stop()
    assert os.getpriority(os.PRIO_PROCESS, 0) == front


def test_the_cores_token_timings_reach_the_front_ends_metrics_once_per_token(core):
    """The core reports a step's token gaps in one observation (not one per token); the front end's
    histograms still count each token: one time to first token and 23 inter-token gaps for 24 tokens."""
    sample = lambda name: core.server.metrics.registry.get_sample_value(name) or 0.0
    names = ("attnserve_time_to_first_token_seconds_count", "attnserve_inter_token_latency_seconds_count")
    before = [sample(name) for name in names]
    reply = generate(core.stub, "The list")
    assert len(reply.token_ids) == 24 and reply.finish_reason == pb.FINISH_REASON_LENGTH
    assert [sample(name) - b for name, b in zip(names, before)] == [1, 23]


def test_logprobs_cross_the_boundary_as_the_servers_process_gives_them(core, server):
    entries = lambda logprobs: [(p.token_id, p.logprob, [t.token_id for t in p.top]) for p in logprobs]
    for fields in ({"logprobs": 3, "prompt_logprobs": 2}, {**SAMPLED, "seed": 5, "logprobs": 0}, {"max_new_tokens": 0}):
        fields = {**fields, "prompt_logprobs": 2} if fields.get("max_new_tokens") == 0 else fields
        here, there = generate(server.stub, "The list", **fields), generate(core.stub, "The list", **fields)
        assert there.token_ids == here.token_ids and len(there.logprobs) == len(there.token_ids)
        assert entries(there.logprobs) == entries(here.logprobs)
        assert entries(there.prompt_logprobs) == entries(here.prompt_logprobs)
        assert len(there.prompt_logprobs) == (8 if "prompt_logprobs" in fields else 0)  # BOS + 8 bytes, less one


def test_a_unary_calls_tokens_cross_the_boundary_once_and_a_streams_at_its_interval(core, monkeypatch):
    """The core holds a request's tokens as its caller would: a unary call's all in the message with its
    end, a stream of interval 8's in messages of 1, 8, 8 and the rest with the end; the same tokens."""
    carried: list[list[int]] = []  # per Step message with events: the token count of each of its deltas
    take = core.server.engine._take

    def counting(steps):
        carried.extend([len(e.token_ids) for _, e in step.events if isinstance(e, DeltaEvent)] for step in steps)
        take(steps)

    monkeypatch.setattr(core.server.engine, "_take", counting)
    reply = generate(core.stub, "The list")
    assert len(reply.token_ids) == 24 and [c for c in carried if c] == [[24]]
    carried.clear()
    streamed = list(core.stub.GenerateStream(request("The list", max_new_tokens=24, stream_interval_tokens=8)))
    assert [t for m in streamed for t in m.token_ids] == list(reply.token_ids)
    assert [c for c in carried if c] == [[1], [8], [8], [7]]


def test_seeded_requests_decode_alike_alone_and_in_a_batch_across_the_boundary(core):
    alone = {seed: generate(core.stub, "The list", **SAMPLED, seed=seed).token_ids for seed in range(4)}
    together: dict[int, list[int]] = {}

    def run(seed: int) -> None:
        together[seed] = generate(core.stub, "The list", **SAMPLED, seed=seed).token_ids

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert together == alone


def finished(running, reason: str) -> float:
    value = running.server.metrics.registry.get_sample_value("attnserve_generations_finished_total", {"reason": reason})
    return value or 0.0


def test_a_stop_string_ends_the_request_across_the_boundary_as_in_the_servers_process(core, server):
    """The text before the stop string and the tokens up to the one that completed it, as the engine
    in the server's process gives them; STOP, usage = the tokens given, streamed alike, counted as a
    stop (not a cancel) in the front end's metrics."""
    free = generate(core.stub, "The list", max_new_tokens=40)
    stop = free.text[6:9]
    stops_before, cancels_before = finished(core, "stop"), finished(core, "cancelled")
    here, there = (generate(running.stub, "The list", max_new_tokens=40, stop=[stop]) for running in (server, core))
    assert there.text == here.text == free.text[: free.text.index(stop)]
    assert there.finish_reason == pb.FINISH_REASON_STOP and there.token_ids == here.token_ids
    assert there.usage.completion_tokens == len(there.token_ids) < len(free.token_ids)
    assert list(there.token_ids) == list(free.token_ids[: len(there.token_ids)])
    streamed = list(core.stub.GenerateStream(request("The list", max_new_tokens=40, stop=[stop]), timeout=60))
    assert "".join(m.text for m in streamed) == there.text
    assert [t for m in streamed for t in m.token_ids] == list(there.token_ids)
    assert streamed[-1].finish_reason == pb.FINISH_REASON_STOP
    assert finished(core, "stop") == stops_before + 2 and finished(core, "cancelled") == cancels_before


def test_a_cancelled_stream_frees_its_slot_in_the_core(slow_core):
    """One slot: a cancelled 100-token stream ends CANCELLED in the core, and the next request gets
    the slot and all its tokens."""
    stream = slow_core.stub.GenerateStream(request("The list", max_new_tokens=100), timeout=60)
    assert next(stream).token_ids
    stream.cancel()
    wait_until(lambda: finished(slow_core, "cancelled") == 1, what="the core to end the cancelled request")
    wait_until(lambda: slow_core.engine.stats() == {"active": 0, "queued": 0}, what="the slot to free")
    after = slow_core.stub.Generate(request("The list", max_new_tokens=5), timeout=60)
    assert len(after.token_ids) == 5 and after.finish_reason == pb.FINISH_REASON_LENGTH


# A client that stops reading: HTTP/2 flow control holds the server's writes once its small window is full.
STALLED = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]


def test_a_client_that_stops_reading_is_cut_and_its_slot_freed_in_the_core(tiny_model_dir, monkeypatch):
    """Slow readers across the boundary: the front end's Handle cuts a stream whose client stopped
    reading once --stream-buffer-events deltas waited a second, its Cancel frees the slot in the core,
    and the call ends CANCELLED after --write-timeout, as with the engine in the server's process
    (tests/test_server_slow_reader.py)."""
    monkeypatch.setenv(TEST_STEP_DELAY_VARIABLE, "20")  # 120 tokens take 2.4 s: the cut comes first
    running = start_server(
        tiny_model_dir,
        engine_core="process",
        max_batch=1,
        stream_buffer_events=8,
        write_timeout=3.0,
    )
    calls = lambda: running.server.metrics.registry.get_sample_value(
        "attnserve_requests_total", {"method": "GenerateStream", "code": "CANCELLED"}
    )
    try:
        with grpc.insecure_channel(running.target, options=STALLED) as channel:
            stream = pb_grpc.TextGenerationStub(channel).GenerateStream(
                request("The ", max_new_tokens=120, request_id="x" * 100), timeout=60
            )
            wait_until(lambda: finished(running, "cancelled") == 1, 60, "the core to end the stalled request")
            wait_until(lambda: running.engine.stats() == {"active": 0, "queued": 0}, 60, "the slot to free")
            reply = running.stub.Generate(request("The list", max_new_tokens=5), timeout=60)
            assert len(reply.token_ids) == 5  # the one slot serves the next request
            wait_until(lambda: calls() == 1, 60, "the write timeout")
            with pytest.raises(grpc.RpcError) as caught:
                list(stream)
        assert caught.value.code() == grpc.StatusCode.CANCELLED
        assert "(--write-timeout)" in caught.value.details()
    finally:
        running.stop()


def test_a_cancelled_queued_request_leaves_nothing_in_flight(slow_core):
    """One slot: the second stream waits in the core's queue; cancelled there, it still ends in the
    front end's count (the core answers CANCELLED at once), so that the server goes idle and the
    queue's bound stays right."""
    running = slow_core.stub.GenerateStream(request("The list", max_new_tokens=100), timeout=60)
    assert next(running).token_ids  # it holds the one slot
    waiting = slow_core.stub.GenerateStream(request("x", max_new_tokens=100), timeout=60)
    assert waiting.initial_metadata()  # in the engine: queued behind the running one
    waiting.cancel()
    wait_until(lambda: finished(slow_core, "cancelled") == 1, what="the queued request to end CANCELLED")
    assert slow_core.engine.stats() == {"active": 1, "queued": 0}
    running.cancel()
    wait_until(lambda: slow_core.engine.stats() == {"active": 0, "queued": 0}, what="the server to go idle")


def test_a_full_queue_is_refused_by_the_front_end(slow_core):
    """One slot and a queue of one: the third request in flight gets RESOURCE_EXHAUSTED. (The two
    streams may reach the server in either order: gRPC gives no order between calls.)"""
    running = [slow_core.stub.GenerateStream(request("The list", max_new_tokens=100), timeout=60) for _ in range(2)]
    for call in running:  # whichever the server took first decodes, the other waits in the queue
        assert call.initial_metadata()  # sent once its request is in the engine
    with pytest.raises(grpc.RpcError) as refused:
        slow_core.stub.Generate(request("x", max_new_tokens=4), timeout=60)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-queue" in refused.value.details()
    for call in running:
        call.cancel()


def core_pid(lines: list[str]) -> int:
    """The engine core's process, as the server logs it at start-up."""
    (pid,) = [int(m.group(1)) for line in lines if (m := re.search(r"engine core ready in process (\d+)", line))]
    return pid


def test_a_killed_core_ends_every_stream_with_unavailable_and_the_server_exits_1(tiny_model_dir, monkeypatch):
    monkeypatch.setenv(TEST_STEP_DELAY_VARIABLE, str(SLOW_STEP_MS))
    served = ServeProcess("--model", str(tiny_model_dir), "--port", "0", "--provider", "cpu", "--threads", "1")
    try:
        assert served.port, "".join(served.lines)
        with grpc.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            stub = pb_grpc.TextGenerationStub(channel)
            streams = [stub.GenerateStream(request(p, max_new_tokens=100), timeout=60) for p in PROMPTS[:2]]
            for stream in streams:
                assert next(stream).token_ids
            os.kill(core_pid(served.lines), signal.SIGKILL)
            for stream in streams:
                with pytest.raises(grpc.RpcError) as ended:
                    list(stream)
                assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "the engine core died" in ended.value.details()
        code, output = served.wait()
    finally:
        served.kill()
    assert code == 1, output
    assert "attnserve serve: error: the engine core died (exit code -9)" in output


class FailingObserver:
    """Metrics that fail on the next step the front end takes from the core."""

    def __getattr__(self, hook):
        def fail(*arguments):
            raise RuntimeError(f"{hook} failed")

        return fail


def test_a_failed_receiver_ends_every_stream_with_unavailable_not_a_hang(slow_core):
    """Whatever breaks in the thread that takes the core's messages, the requests in flight end with
    UNAVAILABLE naming it and the server is marked dead (serve then exits 1), as for a dead core."""
    stream = slow_core.stub.GenerateStream(request("The list", max_new_tokens=100), timeout=60)
    assert next(stream).token_ids
    slow_core.engine.observer = FailingObserver()
    with pytest.raises(grpc.RpcError) as ended:
        list(stream)
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "the front end lost the engine core's messages (RuntimeError: on_" in ended.value.details()
    wait_until(lambda: slow_core.server.died == slow_core.engine.died, what="the server to be marked dead")
    wait_until(slow_core.server.stopped.is_set, what="the server to stop (set on its loop)")


def test_a_killed_front_end_stops_its_core_mid_stream(tiny_model_dir, monkeypatch):
    """The front end's end of the channel closes with its process: the core, mid-generation, stops
    instead of decoding for nobody (its engine thread's writes fail, its main thread reads the end)."""
    monkeypatch.setenv(TEST_STEP_DELAY_VARIABLE, str(SLOW_STEP_MS))
    served = ServeProcess("--model", str(tiny_model_dir), "--port", "0", "--provider", "cpu", "--threads", "1")
    try:
        assert served.port, "".join(served.lines)
        pid = core_pid(served.lines)
        with grpc.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            stream = pb_grpc.TextGenerationStub(channel).GenerateStream(request("x", max_new_tokens=100), timeout=60)
            assert next(stream).token_ids
            served.kill()
            wait_until(lambda: gone(pid), what="the core to exit")
    finally:
        served.kill()


def gone(pid: int) -> bool:
    """The process has exited (a zombie that nobody has reaped yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
