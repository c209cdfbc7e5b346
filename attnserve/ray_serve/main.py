"""`attnserve ray-serve`: start (or join) Ray, serve attnserve on Ray Serve, wait for SIGTERM.

One command: a local Ray head on --node-ip-address (or the cluster at --address), Ray Serve with
its gRPC proxy on --grpc-port carrying attnserve.v1.TextGeneration and grpc.health.v1, and one
application of --replicas replicas (deployment.py), each with max ongoing requests = --max-batch
+ --max-queue, autoscaled on ongoing requests with --max-replicas. It returns once every replica
has warmed up, prints the address, and on SIGTERM or SIGINT removes the application (and the
local head it started); in-flight requests get --drain-timeout seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys
import threading
from pathlib import Path

from ..server.checkpoint_exports import CheckpointExportError, serving_export
from ..server.config import ServerConfig
from .config import RayServeConfig

PROG = "attnserve ray-serve"
# Ray's proxy builds its gRPC services with these, imported by name in its own process. It pickles
# each request to hand it to a replica: the generated classes live in the modules whose names protoc
# records in them (protos/generate.py), so pickle finds them by name.
SERVICER_FUNCTIONS = [
    "attnserve.v1.generation_pb2_grpc.add_TextGenerationServicer_to_server",
    "attnserve.health.v1.health_pb2_grpc.add_HealthServicer_to_server",
]
DEPLOYMENT_NAME = "TextGeneration"


def start_ray(config: RayServeConfig) -> None:
    """Join the cluster at --address, or start a local head; then Ray Serve with the gRPC proxy."""
    import ray
    from ray import serve
    from ray.serve.config import HTTPOptions, gRPCOptions

    if config.address:
        ray.init(address=config.address, logging_level=logging.WARNING)
    else:
        ray.init(  # "local": a new head, never a cluster found on this machine
            address="local",
            _node_ip_address=config.node_ip_address,
            include_dashboard=False,
            logging_level=logging.WARNING,
        )
    serve.start(
        http_options=HTTPOptions(host="127.0.0.1", port=config.http_port),
        grpc_options=gRPCOptions(
            port=config.grpc_port, grpc_servicer_functions=SERVICER_FUNCTIONS, enable_reflection=config.reflection
        ),
    )


def deploy(config: RayServeConfig) -> None:
    """Run the application and wait until every replica has warmed up."""
    from ray import serve

    from .deployment import TextGeneration

    deployment = serve.deployment(name=DEPLOYMENT_NAME, **config.deployment_options())(TextGeneration)
    model = str(Path(config.replica.model).resolve())  # replicas need not share this process's directory
    app = deployment.bind(dataclasses.replace(config.replica, model=model))
    serve.run(app, name=config.app_name, route_prefix=f"/{config.app_name}")  # Ray routes only apps with one


def stop(config: RayServeConfig) -> None:
    """Remove the application, its replicas draining first; then the local head, if this started one."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        return
    serve.delete(config.app_name)  # waits for each replica's in-flight requests, up to --drain-timeout
    if not config.address:
        serve.shutdown()
    ray.shutdown()


def describe_replicas(config: RayServeConfig) -> str:
    count = f"{config.replicas} replica{'s' if config.replicas != 1 else ''}"
    if not config.autoscaling:
        return count
    low = config.deployment_options()["autoscaling_config"]["min_replicas"]
    return f"{count} (autoscaled {low} to {config.max_replicas})"


def served_name(replica: ServerConfig) -> str:
    """The model's name as the replicas serve it: --served-model-name, else its folder's."""
    return replica.served_model_name or Path(replica.model).resolve().name


def wait_for_signal() -> None:
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    while not stopping.wait(1.0):
        pass


def main(args) -> int:
    """CLI entry of `attnserve ray-serve`."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = RayServeConfig.from_args(args)
        config.check()
        config.replica.check_files()
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    try:
        from ray.exceptions import RayError  # installed apart: the one-line answer below beats a traceback
    except ImportError:
        print(
            f"{PROG}: error: ray is not installed; pip install 'attnserve[cpu,ray]' "
            "([gpu,ray] on CUDA; ray[serve] 2.60.0)",
            file=sys.stderr,
        )
        return 2
    try:  # a Hugging Face checkpoint: its export, made once, which every replica loads
        config = dataclasses.replace(config, replica=serving_export(config.replica))
    except CheckpointExportError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    try:
        start_ray(config)
        deploy(config)
    except (RayError, RuntimeError, ConnectionError, ValueError, OSError) as e:  # Ray's reason; the local head stops
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        stop(config)
        return 2
    print(
        f"{PROG}: attnserve.v1 on 0.0.0.0:{config.grpc_port} through Ray Serve's gRPC proxy, application "
        f"{config.app_name}, {describe_replicas(config)} of {served_name(config.replica)}, "
        f"max {config.max_ongoing_requests} ongoing requests each",
        flush=True,
    )
    wait_for_signal()
    print(f"{PROG}: SIGTERM or SIGINT: removing the application", flush=True)
    stop(config)
    print(f"{PROG}: stopped", flush=True)
    return 0
