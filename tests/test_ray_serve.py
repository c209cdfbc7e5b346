"""attnserve on Ray Serve: `attnserve ray-serve` with a local Ray head on 127.0.0.1 and two replicas
of the tiny model behind Ray's gRPC proxy, against the direct in-process server over the same model.

Both replicas serve; greedy text, token ids, finish reasons and refusals equal the direct server's;
grpc.health.v1 and Ray's own Healthz answer; a replica killed (SIGKILL) under load loses only the
requests it had in flight, while the other's finish and new ones succeed. The Ray tests skip, saying
why, where ray cannot be imported (CI installs ray[serve]); the configuration tests need no Ray.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from attnserve.health.v1 import health_pb2, health_pb2_grpc
from attnserve.ray_serve.config import RayServeConfig
from attnserve.ray_serve.context import REPLICA_HEADER
from attnserve.server.test_switches import TEST_STEP_DELAY_VARIABLE
from attnserve.v1 import generation_pb2 as pb
from attnserve.v1 import generation_pb2_grpc as pb_grpc

try:
    import ray  # noqa: F401

    RAY_MISSING = ""
except ImportError as e:
    RAY_MISSING = f"ray cannot be imported here ({e}); pip install 'ray[serve]==2.60.0' (CI installs it)"

ROOT = Path(__file__).resolve().parents[1]
READY = "through Ray Serve's gRPC proxy"
PROMPTS = ["def parse_args(", "The list", "import os\n", "for key, value in"]
MAX_BATCH, MAX_QUEUE = 4, 8
# Replicas sleep 5 ms per engine step (test only), so that a generation of 96 tokens outlasts its
# trip through Ray's proxy on a busy machine too, and a killed replica has requests in flight.
STEP_DELAY = {TEST_STEP_DELAY_VARIABLE: "5"}


# Ports a Ray head binds by default: a port the OS hands out here may be one of them (52365, the
# dashboard agent's, lies in Linux's ephemeral range), and Ray binds it before Serve's proxy does.
RAY_DEFAULT_PORTS = frozenset({6379, 8000, 8265, 9000, 10001, 52365})


def free_port() -> int:
    """A port free now on 127.0.0.1 that the Ray head this test starts will not take for itself."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in RAY_DEFAULT_PORTS:
            return port


class RayServeProcess:
    """`attnserve ray-serve` in a session of its own (Ray's head and workers included); output to a file."""

    def __init__(self, model_dir: Path, log: Path, app: str, ready_timeout: float = 120.0):
        self.app, self.log, self.port, self.http_port = app, log, free_port(), free_port()
        args = [
            *("--model", str(model_dir), "--replicas", "2", "--app-name", app),
            *("--grpc-port", str(self.port), "--http-port", str(self.http_port)),
            *("--threads", "1", "--max-batch", str(MAX_BATCH), "--max-queue", str(MAX_QUEUE)),
            *("--replica-cpus", "0.5", "--drain-timeout", "5"),
        ]
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "attnserve.cli", "ray-serve", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0", **STEP_DELAY},
                start_new_session=True,
                cwd=ROOT,
            )
        end = time.monotonic() + ready_timeout
        while READY not in log.read_text():
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()
                pytest.fail(f"attnserve ray-serve did not get ready:\n{log.read_text()[-4000:]}")
            time.sleep(0.2)
        self.target = f"127.0.0.1:{self.port}"

    def replica_pids(self) -> list[int]:
        """Processes of this application's replicas (Ray names them ServeReplica:APP:DEPLOYMENT)."""
        ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
        return [int(line.split()[0]) for line in ps.splitlines() if f"ServeReplica:{self.app}:" in line]

    def stop(self) -> str:
        """SIGINT (the command removes its application and stops its head), then the whole session."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything of Ray's left in its session
        self.proc.wait(10)
        return self.log.read_text()


@pytest.fixture(scope="module")
def ray_serve(tiny_model_dir, tmp_path_factory):
    if RAY_MISSING:
        pytest.skip(RAY_MISSING)
    log = tmp_path_factory.mktemp("ray") / "ray-serve.log"
    running = RayServeProcess(tiny_model_dir, log, app=f"attnserve{os.getpid()}")
    yield running
    output = running.stop()
    assert "attnserve ray-serve: stopped" in output, output[-4000:]


@pytest.fixture(scope="module")
def ray_stub(ray_serve):
    with grpc.insecure_channel(ray_serve.target) as channel:
        yield pb_grpc.TextGenerationStub(channel)


def generate(stub, request: pb.GenerateRequest):
    """Generate's response and the replica that served it."""
    response, call = stub.Generate.with_call(request, timeout=30)
    return response, dict(call.trailing_metadata())[REPLICA_HEADER]


def stream(stub, request: pb.GenerateRequest) -> tuple[str, list[int], list[pb.GenerateStreamResponse]]:
    messages = list(stub.GenerateStream(request, timeout=30))
    return "".join(m.text for m in messages), [t for m in messages for t in m.token_ids], messages


def refusal(stub, method: str, request: pb.GenerateRequest) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        if method == "Generate":
            stub.Generate(request, timeout=30)
        else:
            list(stub.GenerateStream(request, timeout=30))
    return caught.value.code(), caught.value.details()


# ---- with Ray (the fixture skips, saying why, where ray does not import) ---------------------------


@pytest.mark.slow
def test_both_replicas_serve_and_describe_the_direct_model(ray_stub, server):
    replicas = set()
    for _ in range(40):
        info, call = ray_stub.GetModelInfo.with_call(pb.GetModelInfoRequest(), timeout=30)
        replicas.add(dict(call.trailing_metadata())[REPLICA_HEADER])
        if len(replicas) == 2:
            break
    assert len(replicas) == 2, f"40 calls reached only {replicas}"
    direct = server.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
    for name in ("model_name", "architecture", "vocab_size", "context_length", "kv_cache", "tokenizer"):
        assert getattr(info, name) == getattr(direct, name), name
    assert (info.limits.max_batch_size, info.limits.max_queue_size) == (MAX_BATCH, MAX_QUEUE)
    served = {generate(ray_stub, pb.GenerateRequest(prompt=p, max_new_tokens=8))[1] for p in PROMPTS * 4}
    assert served <= replicas


@pytest.mark.slow
@pytest.mark.parametrize("interval", [None, 1, 5])
def test_greedy_text_through_ray_equals_direct(ray_stub, server, interval):
    for prompt in PROMPTS:
        request = pb.GenerateRequest(prompt=prompt, max_new_tokens=40, stream_interval_tokens=interval)
        direct = server.stub.Generate(request, timeout=30)
        via_ray, _ = generate(ray_stub, request)
        assert (via_ray.text, list(via_ray.token_ids)) == (direct.text, list(direct.token_ids)), prompt
        counts = lambda r: (r.finish_reason, r.usage.prompt_tokens, r.usage.completion_tokens)
        assert counts(via_ray) == counts(direct)  # cached_tokens: each server's prefix cache has seen other prompts
        text, token_ids, messages = stream(ray_stub, request)
        assert (text, token_ids) == (direct.text, list(direct.token_ids)), prompt
        assert counts(messages[-1]) == counts(direct)
        if interval == 5:  # fewer, fuller messages: the first delta, then one per 5 tokens, then the final one
            assert len(messages) <= 2 + (len(token_ids) + 4) // 5, [len(m.token_ids) for m in messages]


@pytest.mark.slow
@pytest.mark.parametrize(
    "fields",
    [
        {"prompt": ""},
        {"prompt": "x", "top_p": 2.0},
        {"prompt": "x", "max_new_tokens": 100_000},
        {"prompt": "x", "stop": ["a" * 200]},
        {"prompt": "x", "prompt_token_ids": [1, 2]},
        {"prompt": "x", "stream_interval_tokens": 0},  # GenerateStream's only
    ],
    ids=["empty", "top_p", "max_new_tokens", "stop", "both_prompts", "stream_interval"],
)
def test_refusals_through_ray_equal_direct(ray_stub, server, fields):
    request = pb.GenerateRequest(**fields)
    for method in ("GenerateStream",) if "stream_interval_tokens" in fields else ("Generate", "GenerateStream"):
        direct = refusal(server.stub, method, request)
        assert direct[0] == grpc.StatusCode.INVALID_ARGUMENT, direct
        assert refusal(ray_stub, method, request) == direct, method


@pytest.mark.slow
def test_the_openai_api_through_rays_http_proxy_equals_direct(ray_serve, server):
    """Ray's HTTP proxy under /APP-NAME serves the replicas' OpenAI-compatible routes: OpenAI's client
    gets the direct server's greedy text, unary and streamed, and its refusals in OpenAI's shape."""
    import openai

    base = f"http://127.0.0.1:{ray_serve.http_port}/{ray_serve.app}/v1"
    name = server.server.info.model_name
    direct = server.stub.Generate(pb.GenerateRequest(prompt=PROMPTS[0], max_new_tokens=24), timeout=30)
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60) as client:
        reply = client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=24, temperature=0)
        chunks = client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=24, temperature=0, stream=True)
        streamed = "".join(chunk.choices[0].text for chunk in chunks)
        with pytest.raises(openai.BadRequestError) as error:
            client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=2, top_p=2)
        assert [m.id for m in client.models.list().data] == [name]
    assert reply.choices[0].text == direct.text == streamed
    assert reply.usage.completion_tokens == direct.usage.completion_tokens
    assert error.value.status_code == 400 and error.value.body["message"] == "top_p: 2 is outside (0, 1]"


def test_health_through_ray(ray_serve):
    with grpc.insecure_channel(ray_serve.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "attnserve.v1.TextGeneration"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=30)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.RpcError) as caught:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=30)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        # Ray's own API (ray.serve.RayServeAPIService), read as raw bytes: its messages hold one string field
        for method, answer in (("Healthz", b"success"), ("ListApplications", ray_serve.app.encode())):
            call = channel.unary_unary(f"/ray.serve.RayServeAPIService/{method}", lambda _: b"", lambda raw: raw)
            assert answer in call(b"", timeout=30), method


@dataclass
class Outcome:
    start: float
    end: float
    code: str
    replica: str | None


async def load(target: str, workers: int, seconds: float, kill) -> tuple[list[Outcome], float]:
    """`workers` back-to-back greedy streams for `seconds`; `kill()` runs after a third of it.

    Streams of 16 tokens a message: at one a message Ray's proxy is the bottleneck, and a replica
    may have finished every generation it was given (its messages waiting in Ray) when it dies."""
    outcomes: list[Outcome] = []
    t0 = time.monotonic()
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.TextGenerationStub(channel)

        async def worker(i: int) -> None:
            while time.monotonic() - t0 < seconds:
                start = time.monotonic()
                request = pb.GenerateRequest(prompt=PROMPTS[i % 4], max_new_tokens=96, stream_interval_tokens=16)
                call = stub.GenerateStream(request, timeout=30)
                try:
                    async for _ in call:
                        pass
                    replica = dict(await call.trailing_metadata())[REPLICA_HEADER]
                    outcomes.append(Outcome(start, time.monotonic(), "OK", replica))
                except grpc.RpcError as e:
                    outcomes.append(Outcome(start, time.monotonic(), e.code().name, None))

        async def killer() -> float:
            await asyncio.sleep(seconds / 3)
            kill()
            return time.monotonic()

        *_, killed_at = await asyncio.gather(*(worker(i) for i in range(workers)), killer())
    return outcomes, killed_at


@pytest.mark.slow
def test_killed_replica_loses_only_its_in_flight_requests(ray_serve):
    pids = ray_serve.replica_pids()
    assert len(pids) == 2, pids
    # 8 streams: about a batch on each replica before the kill, and room in one replica's batch and
    # queue (4 + 8) for all of them after it (12 left the survivor's queue full at times: QueueFull).
    outcomes, killed_at = asyncio.run(load(ray_serve.target, 8, 4.5, lambda: os.kill(pids[0], signal.SIGKILL)))
    failed = [o for o in outcomes if o.code != "OK"]
    later = [o for o in outcomes if o.start > killed_at + 0.5]
    before = {o.replica for o in outcomes if o.code == "OK" and o.end < killed_at}
    survivors = before & {o.replica for o in later}  # a replacement replica has a new id
    spanned = [o for o in outcomes if o.code == "OK" and o.replica in survivors and o.start < killed_at < o.end]
    report = "\n".join(f"{o.start - killed_at:+.3f} {o.end - killed_at:+.3f} {o.code} {o.replica}" for o in outcomes)
    assert len(before) == 2 and len(survivors) == 1, f"both replicas served, then one:\n{report}"
    assert failed, f"no request was in flight on the killed replica:\n{report}"
    assert all(o.start < killed_at < o.end + 0.05 for o in failed), f"a request not in flight failed:\n{report}"
    assert len(failed) <= MAX_BATCH + MAX_QUEUE, report
    assert spanned, f"the other replica's requests in flight at the kill must finish:\n{report}"
    assert later and all(o.code == "OK" for o in later), f"new requests must succeed:\n{report}"


# ---- without Ray: the command line ----------------------------------------------------------------


def parse(*argv: str) -> RayServeConfig:
    parser = argparse.ArgumentParser()
    RayServeConfig.add_cli_args(parser)
    return RayServeConfig.from_args(parser.parse_args(["--model", "models/x", *argv]))


def test_ray_serve_flags_reuse_the_servers():
    config = parse("--max-batch", "8", "--max-queue", "24", "--replicas", "3", "--stream-interval-tokens", "4")
    config.check()
    assert (config.replica.max_batch, config.replica.stream_interval_tokens) == (8, 4)
    options = config.deployment_options()
    assert options["max_ongoing_requests"] == 32 and options["num_replicas"] == 3
    assert options["graceful_shutdown_timeout_s"] == config.replica.drain_timeout
    assert "autoscaling_config" not in options


def test_autoscaling_on_ongoing_requests():
    config = parse("--max-batch", "8", "--replicas", "2", "--min-replicas", "1", "--max-replicas", "6")
    config.check()
    options = config.deployment_options()
    assert "num_replicas" not in options
    assert options["autoscaling_config"] == {
        "min_replicas": 1,
        "initial_replicas": 2,
        "max_replicas": 6,
        "target_ongoing_requests": 8.0,
    }


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--min-replicas", "1"), "--min-replicas needs --max-replicas"),
        (("--replicas", "5", "--max-replicas", "4"), "--min-replicas <= --replicas <= --max-replicas"),
        (("--grpc-port", "0"), "--grpc-port"),
        (("--grpc-port", "9000", "--http-port", "9000"), "must differ"),
        (("--stream-interval-tokens", "0"), "--stream-interval-tokens"),
    ],
)
def test_flags_that_cannot_work_are_refused(argv, message):
    with pytest.raises(ValueError, match=message):
        parse(*argv).check()


@pytest.mark.parametrize("value", ["auto", "0", "-2"])
def test_max_batch_is_a_number_of_requests_here(capsys, value):
    with pytest.raises(SystemExit) as refused:
        parse("--max-batch", value)
    assert refused.value.code == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith(
            f"argument --max-batch: {value!r}: give a number of requests (at least 1); auto is attnserve serve's, "
            "not Ray's (Ray sizes each replica's concurrency from this number)"
        )
    )


def test_ray_serve_imports_no_torch():
    code = (
        "import sys, attnserve.ray_serve.config, attnserve.ray_serve.context, attnserve.ray_serve.main\n"
        "try:\n    import attnserve.ray_serve.deployment\nexcept ImportError:\n    pass  # no ray here\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
