"""TLS, mutual TLS and bearer-token auth accept the right client and reject the others; metrics
parse, move, and leave the start-up warm-up out; calls before SERVING get UNAVAILABLE; reflection
lists and describes the services; on CUDA the session and the KV cache live on the GPU."""

import urllib.request

import grpc
import pytest
from fixtures_server import idle, request, start_server, wait_until
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from attnserve.v1 import generation_pb2 as pb
from attnserve.v1 import generation_pb2_grpc as pb_grpc

TIMEOUT = 30


def generate_over(channel):
    return pb_grpc.TextGenerationStub(channel).Generate(request("secure", max_new_tokens=3), timeout=5)


def test_tls_accepts_a_client_that_trusts_the_ca_and_rejects_others(tiny_model_dir, pki):
    folder, files = pki
    running = start_server(tiny_model_dir, tls_cert=str(folder / "server.crt"), tls_key=str(folder / "server.key"))
    try:
        trusted = grpc.secure_channel(running.target, grpc.ssl_channel_credentials(files["ca"]))
        assert generate_over(trusted).usage.completion_tokens >= 0
        for channel in (
            grpc.insecure_channel(running.target),
            grpc.secure_channel(running.target, grpc.ssl_channel_credentials(files["stranger"])),
        ):
            with pytest.raises(grpc.RpcError) as info:
                generate_over(channel)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        running.stop()


def test_mutual_tls_requires_a_client_certificate_from_the_ca(tiny_model_dir, pki):
    folder, files = pki
    running = start_server(
        tiny_model_dir,
        tls_cert=str(folder / "server.crt"),
        tls_key=str(folder / "server.key"),
        tls_client_ca=str(folder / "ca"),
    )
    try:
        with_cert = grpc.ssl_channel_credentials(files["ca"], files["client.key"], files["client.crt"])
        assert generate_over(grpc.secure_channel(running.target, with_cert)).usage.completion_tokens >= 0
        with pytest.raises(grpc.RpcError) as info:
            generate_over(grpc.secure_channel(running.target, grpc.ssl_channel_credentials(files["ca"])))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        running.stop()


def test_bearer_token_is_required_except_for_health(tiny_model_dir, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    running = start_server(tiny_model_dir, auth_token_file=str(token_file), reflection=True)
    try:
        stub = running.stub
        reply = stub.Generate(
            request("authorized", max_new_tokens=3),
            timeout=TIMEOUT,
            metadata=[("authorization", "Bearer s3cret-token")],
        )
        assert reply.usage.completion_tokens >= 0
        for metadata in ([], [("authorization", "Bearer wrong")], [("authorization", "s3cret-token")]):
            with pytest.raises(grpc.RpcError) as info:
                stub.Generate(request("who?", max_new_tokens=3), timeout=TIMEOUT, metadata=metadata)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "s3cret" not in info.value.details()
        with pytest.raises(grpc.RpcError) as info:
            list(stub.GenerateStream(request("who?", max_new_tokens=3), timeout=TIMEOUT))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        health = health_pb2_grpc.HealthStub(running.channel).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        running.stop()


def test_each_methods_handler_is_built_once_and_unknown_methods_are_not_kept(server):
    """The interceptors' wrapped handler of a method is built at its first call and reused (the
    token check above still runs on every call); a method the server does not serve is UNIMPLEMENTED
    and leaves nothing behind, whatever names a client sends."""
    server.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=TIMEOUT)
    handlers = server.server.handlers.handlers
    kept = handlers["/attnserve.v1.TextGeneration/GetModelInfo"]
    server.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=TIMEOUT)
    assert handlers["/attnserve.v1.TextGeneration/GetModelInfo"] is kept
    before = set(handlers)
    for name in ("Nope", "Nope2"):
        unknown = server.channel.unary_unary(f"/attnserve.v1.TextGeneration/{name}")
        with pytest.raises(grpc.RpcError) as info:
            unknown(b"", timeout=TIMEOUT)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert set(handlers) == before


def scrape(port: int) -> dict:
    """name{labels} -> value of every sample on /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_metrics_parse_and_move(stub, server):
    port = server.server.metrics_port
    before = scrape(port)
    for _ in range(3):
        reply = stub.Generate(request("count me", max_new_tokens=5), timeout=TIMEOUT)
    after = scrape(port)
    ok = ("attnserve_requests_total", (("code", "OK"), ("method", "Generate")))
    assert after[ok] - before.get(ok, 0) == 3
    prompt = ("attnserve_prompt_tokens_total", ())
    assert after[prompt] - before.get(prompt, 0) == 3 * reply.usage.prompt_tokens
    assert after[("process_resident_memory_bytes", ())] > 10 * 2**20  # the standard process_* metrics
    assert after[("attnserve_generated_tokens_total", ())] > before.get(("attnserve_generated_tokens_total", ()), 0)
    for histogram in (
        "attnserve_time_to_first_token_seconds",
        "attnserve_request_latency_seconds",
        "attnserve_inter_token_latency_seconds",
        "attnserve_step_batch_size",
    ):
        assert after[(f"{histogram}_count", ())] > before.get((f"{histogram}_count", ()), 0), histogram
    assert ("attnserve_queue_depth", ()) in after and ("attnserve_batch_size", ()) in after
    wait_until(lambda: idle(server.engine), what="the engine to go idle")
    assert scrape(port)[("attnserve_batch_size", ())] == 0  # an empty batch reads 0, not its last size
    info = [labels for (name, labels) in after if name == "attnserve_model_info"]
    assert info and ("execution_provider", "CPUExecutionProvider") in info[0]


TRAFFIC = (
    "attnserve_generated_tokens_total",
    "attnserve_time_to_first_token_seconds_count",
    "attnserve_inter_token_latency_seconds_count",
    "attnserve_request_latency_seconds_count",
    "attnserve_step_batch_size_count",
)


def test_the_start_up_warm_up_is_not_traffic(tiny_model_dir):
    """A fresh server (its warm-up generation run) shows no generation in its metrics; the first call does."""
    running = start_server(tiny_model_dir, metrics_port=0)
    try:
        fresh = scrape(running.server.metrics_port)
        running.stub.Generate(request("the first", max_new_tokens=3), timeout=TIMEOUT)
        wait_until(lambda: idle(running.engine), what="the engine to go idle")
        after = scrape(running.server.metrics_port)
    finally:
        running.stop()
    finished = lambda samples: sum(
        v for (name, _), v in samples.items() if name == "attnserve_generations_finished_total"
    )
    assert finished(fresh) == 0 and all(fresh.get((name, ()), 0) == 0 for name in TRAFFIC)
    assert finished(after) == 1 and all(after[(name, ())] > 0 for name in TRAFFIC)


def test_calls_while_starting_get_unavailable_and_health_still_answers(server):
    from attnserve.inference import grpc_service_pb2 as oip
    from attnserve.inference import grpc_service_pb2_grpc as oip_grpc
    from attnserve.server.app import STARTING

    server.server.boundary.refusal = STARTING  # as during start(), until the warm-up has passed
    try:
        with pytest.raises(grpc.RpcError) as refused:
            server.stub.Generate(request("too early", max_new_tokens=2), timeout=TIMEOUT)
        health = health_pb2_grpc.HealthStub(server.channel).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
        live = oip_grpc.GRPCInferenceServiceStub(server.channel).ServerLive(oip.ServerLiveRequest(), timeout=TIMEOUT)
    finally:
        server.server.boundary.refusal = None
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert refused.value.details() == STARTING
    assert health.status == health_pb2.HealthCheckResponse.SERVING and live.live
    server.stub.Generate(request("now", max_new_tokens=2), timeout=TIMEOUT)  # served again


def test_reflection_lists_and_describes_every_service(tiny_model_dir):
    """grpcurl's view: each listed service resolves to its methods, the Open Inference Protocol and
    health included (their generated code builds its descriptors in pools of its own)."""
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    running = start_server(tiny_model_dir, reflection=True)
    try:
        database = ProtoReflectionDescriptorDatabase(running.channel)
        services = set(database.get_services())
        pool = DescriptorPool(database)
        methods = {name: {m.name for m in pool.FindServiceByName(name).methods} for name in services}
        request = pool.FindMessageTypeByName("inference.ModelInferRequest")
    finally:
        running.stop()
    assert services == {
        "attnserve.v1.TextGeneration",
        "inference.GRPCInferenceService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    }
    assert {"Generate", "GenerateStream", "GetModelInfo"} <= methods["attnserve.v1.TextGeneration"]
    assert {"ModelInfer", "ModelStreamInfer", "ServerLive"} <= methods["inference.GRPCInferenceService"]
    assert methods["grpc.health.v1.Health"] == {"Check", "Watch"}
    assert "raw_input_contents" in request.fields_by_name
