"""grpc.health.v1 as gRPC's own client (grpcio-health-checking's stubs) sees our servicer: Check,
Watch, unknown services, and NOT_SERVING for good once the server drains."""

import grpc
import pytest
from fixtures_server import start_server
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnserve.server.app import HEALTH_SERVICES

TIMEOUT = 30
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def test_check_answers_every_service_and_not_found_for_others(server):
    stub = health_pb2_grpc.HealthStub(server.channel)
    for service in HEALTH_SERVICES:
        assert stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT).status == SERVING
    with pytest.raises(grpc.RpcError) as error:
        stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=TIMEOUT)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND


def test_watch_sends_the_status_then_its_changes_through_the_drain(tiny_model_dir):
    running = start_server(tiny_model_dir, warmup=False)
    stub = health_pb2_grpc.HealthStub(running.channel)
    try:
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=HEALTH_SERVICES[1]), timeout=TIMEOUT)
        unknown = stub.Watch(health_pb2.HealthCheckRequest(service="later.Service"), timeout=TIMEOUT)
        assert next(watch).status == SERVING
        assert next(unknown).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        running.call(running.server.health.set("later.Service", SERVING))
        assert next(unknown).status == SERVING
        running.call(running.server.health.enter_graceful_shutdown())
        assert next(watch).status == NOT_SERVING
        running.call(running.server.health.set(HEALTH_SERVICES[1], SERVING))  # ignored once shutting down
        check = stub.Check(health_pb2.HealthCheckRequest(service=HEALTH_SERVICES[1]), timeout=TIMEOUT)
        assert check.status == NOT_SERVING
        watch.cancel()
        unknown.cancel()
    finally:
        running.stop()
