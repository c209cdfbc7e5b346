"""Start-up, drain and shutdown: refuse to start with a one-line reason, drain on SIGTERM and exit 0,
health follows the server's state, and serving never imports torch."""

import asyncio
import logging
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading

import grpc
import pytest
from fixtures_server import ServeProcess, release_when, request, start_server, wait_until
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnserve.core.loading import StartupError
from attnserve.v1 import generation_pb2 as pb
from attnserve.v1 import generation_pb2_grpc as pb_grpc

TIMEOUT = 30
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def health_status(channel) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT).status


class LogSeen(logging.Handler):
    """Sets `seen` once a record whose message holds `text` is logged: a server's log line as an event."""

    def __init__(self, text: str):
        super().__init__()
        self.text, self.seen = text, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


def collect(stream, into: list) -> None:
    try:
        into.extend(stream)
    except grpc.RpcError as e:
        into.append(e)


def test_drain_refuses_new_calls_and_lets_the_stream_finish(tiny_model_dir):
    running = start_server(tiny_model_dir, drain_timeout=10.0)
    running.pacer.hold(when=lambda: running.engine.stats()["active"] == 1)  # the stream runs until released
    try:
        stream = running.stub.GenerateStream(request("draining", max_new_tokens=60), timeout=TIMEOUT)
        messages = [next(stream)]
        # the first token goes out just before the engine thread reaches the hold: on a busy machine
        # the drain below could otherwise run before the stream is held
        wait_until(running.pacer.held.is_set, what="the stream held before its second token")
        drained = asyncio.run_coroutine_threadsafe(running.server.drain(), running.loop)
        wait_until(lambda: health_status(running.channel) == NOT_SERVING, what="health NOT_SERVING")
        with pytest.raises(grpc.RpcError) as info:
            running.stub.Generate(request("too late", max_new_tokens=2), timeout=TIMEOUT)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "draining" in info.value.details()
        assert running.pacer.held.is_set()  # all of it while the stream was decoding
        running.pacer.release()
        messages += list(stream)
        drained.result(TIMEOUT)
    finally:
        running.stop()
    assert messages[-1].finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_EOS)
    assert "".join(m.text for m in messages) and messages[-1].usage.completion_tokens > 1


def test_drain_timeout_ends_in_flight_requests_as_cancelled(tiny_model_dir):
    """The engine is held after the stream's first token until the drain's timeout has passed and it
    cancels what is left (its warning is the event): the stream ends CANCELLED, not by its length."""
    running = start_server(tiny_model_dir, drain_timeout=0.2)
    timed_out = LogSeen("drain timeout")
    logging.getLogger("attnserve.server.app").addHandler(timed_out)
    try:
        running.pacer.hold()
        stream = running.stub.GenerateStream(request("too long to wait for", max_new_tokens=100), timeout=TIMEOUT)
        next(stream)
        release_when(running.pacer, timed_out.seen.is_set)
        running.call(running.server.drain())
        messages = list(stream)
    finally:
        logging.getLogger("attnserve.server.app").removeHandler(timed_out)
        running.stop()
    assert messages[-1].finish_reason == pb.FINISH_REASON_CANCELLED
    assert messages[-1].usage.completion_tokens < 100


def sigterm_and_read(server: ServeProcess, streams: list) -> tuple[int, str, list[list]]:
    """SIGTERM to `server` with `streams` in flight (each accepted first: decoding or queued), then every
    stream read to its end on a thread of its own (an RpcError ends its list): the exit code, the output,
    each stream's messages."""
    for stream in streams:
        assert dict(stream.initial_metadata())["x-request-id"]
    server.proc.send_signal(signal.SIGTERM)
    results: list[list] = [[] for _ in streams]
    readers = [threading.Thread(target=collect, args=(s, r)) for s, r in zip(streams, results)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(TIMEOUT)
    code, output = server.wait(TIMEOUT)
    return code, output, results


def test_sigterm_drains_in_flight_streams_and_exits_zero(tiny_model_dir):
    server = ServeProcess("--model", str(tiny_model_dir), "--port", "0", "--max-batch", "2", "--threads", "1")
    try:
        stub = pb_grpc.TextGenerationStub(grpc.insecure_channel(f"127.0.0.1:{server.port}"))
        streams = [
            stub.GenerateStream(request(f"in flight {i}", max_new_tokens=110), timeout=TIMEOUT) for i in range(8)
        ]
        code, output, results = sigterm_and_read(server, streams)
    finally:
        server.kill()
    assert code == 0, output
    in_flight = re.search(r"draining: (\d+) active and (\d+) queued", output)
    assert in_flight and int(in_flight.group(1)) + int(in_flight.group(2)) > 0, output
    assert "drained, exiting" in output
    for messages in results:
        assert not any(isinstance(m, grpc.RpcError) for m in messages), messages[-1]
        assert messages[-1].finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_EOS)


def refused(*args: str) -> str:
    """Start `attnserve serve` expecting it to refuse; its output."""
    proc = subprocess.run(
        [sys.executable, "-m", "attnserve.cli", "serve", *args], capture_output=True, text=True, timeout=120
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "Traceback" not in output, output
    return output.strip().splitlines()[-1]


def test_missing_model_directory_is_refused_in_one_line(tmp_path):
    line = refused("--model", str(tmp_path / "nope"), "--port", "0")
    assert line == f"attnserve serve: error: --model {tmp_path / 'nope'}: no such directory"


def test_tampered_model_is_refused_in_one_line(tiny_model_dir, tmp_path):
    bad = tmp_path / "tampered"
    shutil.copytree(tiny_model_dir, bad)
    data = bytearray((bad / "model.onnx").read_bytes())
    data[-1] ^= 0xFF
    (bad / "model.onnx").write_bytes(bytes(data))
    line = refused("--model", str(bad), "--port", "0")
    assert line.startswith("attnserve serve: error:") and "sha256" in line


def test_port_in_use_is_refused_in_one_line(tiny_model_dir):
    """Before the model loads, and with no gRPC core line before it (issue 27): the whole output is one line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "attnserve.cli", "serve", "--model", str(tiny_model_dir), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 2
    assert (proc.stdout + proc.stderr).splitlines() == [
        f"attnserve serve: error: --port {port}: cannot listen on 127.0.0.1:{port}: the port is in use"
    ]


def test_an_embedded_server_refuses_a_port_in_use_by_its_own_check(tiny_model_dir):
    """Server.start checks too (a Server embedded in code, or a port taken while the model loaded):
    StartupError in attnserve's words, before gRPC's core tries the port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(StartupError) as refused_start:
            start_server(tiny_model_dir, port=port)
    assert str(refused_start.value) == f"--port {port}: cannot listen on 127.0.0.1:{port}: the port is in use"


def test_bad_flag_combination_is_refused(tiny_model_dir):
    line = refused("--model", str(tiny_model_dir), "--tls-cert", "cert.pem")
    assert "--tls-cert and --tls-key go together" in line


NO_TORCH = """
import asyncio, sys
from attnserve.cli import main
try:
    main(["serve", "--help"])
except SystemExit:
    pass
from attnserve.server.app import Server
from attnserve.server.config import ServerConfig
from attnserve.v1 import generation_pb2 as pb

async def run():
    server = Server(ServerConfig(model=sys.argv[1], port=0, provider="cpu", threads=1))
    await server.start()
    reply = await server.engine.submit(__import__("attnserve.engine.domain", fromlist=["x"]).GenerationRequest(
        "t", (256, 104), 3)).next_events()
    await server.stop()
    return reply

asyncio.run(run())
assert "torch" not in sys.modules, "torch was imported"
print("ok")
"""


def test_serving_never_imports_torch(tiny_model_dir):
    proc = subprocess.run(
        [sys.executable, "-c", NO_TORCH, str(tiny_model_dir)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr


@pytest.mark.parametrize(("cap", "level"), [(500, "WARNING"), (256, "INFO")])  # 256: the default
def test_a_cap_beyond_the_context_is_said_at_start_up(tiny_model_dir, caplog, cap, level):
    """The tiny model's 128 positions leave 127 new tokens: a larger cap is lowered, in one line (a
    warning when the flag asked for it, information when it is the default)."""
    caplog.set_level("INFO", logger="attnserve.server")
    running = start_server(tiny_model_dir, max_new_tokens_cap=cap)
    try:
        info = running.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
        assert info.limits.max_new_tokens == 127
    finally:
        running.stop()
    said = [r for r in caplog.records if "--max-new-tokens-cap" in r.getMessage()]
    assert [(r.levelname, r.getMessage()) for r in said] == [
        (
            level,
            f"--max-new-tokens-cap {cap} is more than a 128-position context leaves: requests may ask for at most 127",
        )
    ]
