"""--api-server-count: front ends in parallel over one engine core, each on the same gRPC and HTTP
ports (SO_REUSEPORT). Real `attnserve serve` processes on 127.0.0.1, real clients on connections of
their own: calls reach every front end, decode the same tokens through each, SIGTERM drains them all,
and a front end that dies ends the server as the core's death does."""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.request

import grpc
import pytest
from fixtures_server import ServeProcess, request, wait_until
from test_server_lifecycle import refused, sigterm_and_read

from attnserve.server.test_switches import TEST_STEP_DELAY_VARIABLE
from attnserve.v1 import generation_pb2 as pb
from attnserve.v1 import generation_pb2_grpc as pb_grpc

TIMEOUT = 60
CONNECTIONS = 24  # the kernel hashes each to a front end: all 24 on one of 2 by chance is 2 in 2^24
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # this channel's connection is not shared


def serve(model_dir, *flags: str) -> ServeProcess:
    return ServeProcess("--model", str(model_dir), "--port", "0", "--threads", "1", *flags, ready_timeout=120)


def front_end_pids(server: ServeProcess) -> list[int]:
    found = re.search(r"front ends more serving \(processes \[([\d, ]+)\]\)", "".join(server.lines))
    assert found, "".join(server.lines)
    return [int(pid) for pid in found.group(1).split(",")]


def printed(server: ServeProcess, text: str) -> str:
    """The line of the server's start-up output that holds `text` (read on from where start-up stopped)."""
    while not any(text in line for line in server.lines):
        line = server.proc.stdout.readline()
        assert line, f"{text!r} never printed:\n" + "".join(server.lines)
        server.lines.append(line)
    return next(line for line in server.lines if text in line)


def metrics_ports(server: ServeProcess) -> list[int]:
    line = printed(server, "metrics on http")
    first = int(re.search(r":(\d+)/metrics", line).group(1))
    return [first] + [int(port) for port in re.findall(r"front end \d+'s on port (\d+)", line)]


def sample(port: int, name: str, **labels: str) -> float:
    """One sample of front end's /metrics at `port` (0.0 if it has none)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=TIMEOUT).read().decode()
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in text.splitlines():
        name_and_labels, _, value = line.rpartition(" ")
        if name_and_labels == (f"{name}{{{wanted}}}" if labels else name):
            return float(value)
    return 0.0


def streams_on_their_own_connections(server: ServeProcess) -> list:
    """CONNECTIONS // 2 streams of 100 tokens, each on a connection of its own (so on either front end)."""
    channels = [
        grpc.insecure_channel(f"127.0.0.1:{server.port}", options=OWN_CONNECTION) for _ in range(CONNECTIONS // 2)
    ]
    return [
        pb_grpc.TextGenerationStub(channel).GenerateStream(
            request(f"in flight {i}", max_new_tokens=100, ignore_eos=True), timeout=TIMEOUT
        )
        for i, channel in enumerate(channels)
    ]


def test_every_front_end_serves_the_same_port_and_decodes_through_the_one_core(tiny_model_dir):
    server = serve(tiny_model_dir, "--api-server-count", "2", "--metrics-port", "0", "--http-port", "0")
    try:
        assert len(front_end_pids(server)) == 1
        ports = metrics_ports(server)
        assert len(ports) == 2 and ports[0] != ports[1]
        texts, http_texts = set(), set()
        for _ in range(CONNECTIONS):
            with grpc.insecure_channel(f"127.0.0.1:{server.port}", options=OWN_CONNECTION) as channel:
                stub = pb_grpc.TextGenerationStub(channel)
                reply = stub.Generate(request("the same prompt", max_new_tokens=6, ignore_eos=True), timeout=TIMEOUT)
                assert reply.usage.completion_tokens == 6
                texts.add(reply.text)
        http = int(re.search(r"API on http://\S+:(\d+)/v1", printed(server, "API on http")).group(1))
        for _ in range(CONNECTIONS):  # urllib: a connection each
            fields = {"model": tiny_model_dir.name, "prompt": "the same prompt", "max_tokens": 6, "temperature": 0}
            body = json.dumps({**fields, "ignore_eos": True}).encode()
            call = urllib.request.Request(f"http://127.0.0.1:{http}/v1/completions", body)
            call.add_header("Content-Type", "application/json")
            answer = json.loads(urllib.request.urlopen(call, timeout=TIMEOUT).read())
            http_texts.add(answer["choices"][0]["text"])
        served = [sample(port, "attnserve_requests_total", method="Generate", code="OK") for port in ports]
        route = "/v1/completions"
        routed = [sample(port, "attnserve_http_requests_total", route=route, status="200") for port in ports]
        steps = [sample(port, "attnserve_step_batch_size_count") for port in ports]
        # every request's first token, whichever front end took it, in the first one's histogram
        first_tokens = lambda: sample(ports[0], "attnserve_time_to_first_token_seconds_count")
        wait_until(lambda: first_tokens() >= 2 * CONNECTIONS, TIMEOUT, "every request's time to first token")
        assert sample(ports[1], "attnserve_time_to_first_token_seconds_count") == 0
    finally:
        server.kill()
    assert len(texts) == 1 and len(http_texts) == 1, (texts, http_texts)  # greedy, whichever front end took it
    assert sum(served) == CONNECTIONS and min(served) > 0, served
    assert sum(routed) == CONNECTIONS and min(routed) > 0, routed
    assert steps[0] > 0 and steps[1] == 0, steps  # the engine's own series: the first front end's alone


def test_sigterm_drains_every_front_end_and_the_core_stops_after_them(tiny_model_dir):
    server = serve(tiny_model_dir, "--api-server-count", "2", "--max-batch", "2")
    try:
        (other,) = front_end_pids(server)
        code, output, results = sigterm_and_read(server, streams_on_their_own_connections(server))
    finally:
        server.kill()
    assert code == 0, output
    assert output.count("draining: ") == 2, output  # the first front end's line and the other's
    assert "attnserve.server.app (front end 1): draining: " in output, output  # the other's says its number
    assert "front end 1 left the engine core" in output and "drained, exiting" in output
    assert output.index("front end 1 left the engine core") < output.index("drained, exiting")
    for messages in results:
        assert not any(isinstance(m, grpc.RpcError) for m in messages), messages[-1]
        assert messages[-1].finish_reason == pb.FINISH_REASON_LENGTH
        assert messages[-1].usage.completion_tokens == 100
    with pytest.raises(ProcessLookupError):
        os.kill(other, 0)


def test_a_drain_that_times_out_cancels_what_each_front_end_had_in_flight_and_exits_zero(tiny_model_dir, monkeypatch):
    """Each front end's drain times out on its own and its abort ends its requests in the core: every
    stream, whichever front end took it, ends CANCELLED with its usage, none cut or left hanging."""
    monkeypatch.setenv(TEST_STEP_DELAY_VARIABLE, "20")  # 100 tokens take 2 s a batch: the drain's 0.3 s pass first
    server = serve(tiny_model_dir, "--api-server-count", "2", "--max-batch", "4", "--drain-timeout", "0.3")
    try:
        code, output, results = sigterm_and_read(server, streams_on_their_own_connections(server))
    finally:
        server.kill()
    assert code == 0, output
    assert output.count("drain timeout") == 2, output  # each front end's own
    for messages in results:
        assert not any(isinstance(m, grpc.RpcError) for m in messages), messages[-1]
        assert messages[-1].finish_reason == pb.FINISH_REASON_CANCELLED
        assert messages[-1].usage.completion_tokens < 100


def test_a_front_end_that_dies_ends_the_server_for_its_supervisor(tiny_model_dir):
    server = serve(tiny_model_dir, "--api-server-count", "3")
    try:
        others = front_end_pids(server)
        os.kill(others[1], signal.SIGKILL)
        code, output = server.wait(TIMEOUT)
    finally:
        server.kill()
    assert code == 1, output
    assert f"error: front end 2 (process {others[1]}) exited (exit code -9); the server restarts" in output
    for pid in others:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--api-server-count", "0"), "--api-server-count must be 1 to 64, got 0"),
        (("--api-server-count", "65"), "--api-server-count must be 1 to 64, got 65"),
        (
            ("--api-server-count", "2", "--engine-core", "thread"),
            "--api-server-count 2 needs --engine-core process: the front ends share one engine core of its own",
        ),
        (
            ("--api-server-count", "4", "--metrics-port", "65533"),
            "--metrics-port must be 0 to 65532 (with --api-server-count 4, front end i serves on it + i), got 65533",
        ),
    ],
)
def test_a_front_end_count_that_cannot_work_is_refused_in_one_line(tiny_model_dir, flags, said):
    assert refused("--model", str(tiny_model_dir), *flags) == f"attnserve serve: error: {said}"
