#!/usr/bin/env python3
"""One grpc.health.v1 Check for a Kubernetes exec probe: exit 0 if SERVING, 1 otherwise.

The kubelet's own gRPC probe speaks plaintext only, so a pod whose server runs with --tls-cert
is probed by this script inside the container (deploy/components/tls). It needs grpcio, protobuf
and attnserve's own generated grpc.health.v1 code (attnserve.health), which the serving image has;
nothing else of attnserve is imported.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc

from attnserve.health.v1 import health_pb2, health_pb2_grpc


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attnserve-health-probe", description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True, help="the server's --port")
    p.add_argument("--host", default="127.0.0.1", help="address to probe (default: 127.0.0.1, this pod)")
    p.add_argument("--service", default="", help='health service name; "" is the whole server (default)')
    p.add_argument("--timeout", type=float, default=2.0, help="seconds the Check may take (default: 2)")
    p.add_argument("--tls-ca", default=None, help="PEM CA that signed the server's certificate (enables TLS)")
    p.add_argument(
        "--tls-server-name",
        "--server-name",  # its first name, kept for manifests written with it
        dest="server_name",
        default=None,
        help="a DNS name in the server's certificate (as generate's and bench's --tls-server-name)",
    )
    p.add_argument("--tls-cert", default=None, help="PEM client certificate, when the server wants mTLS")
    p.add_argument("--tls-key", default=None, help="PEM client key, with --tls-cert")
    return p


def open_channel(args: argparse.Namespace) -> grpc.Channel:
    target = f"{args.host}:{args.port}"
    if args.tls_ca is None:
        return grpc.insecure_channel(target)
    read = lambda path: Path(path).read_bytes() if path else None
    credentials = grpc.ssl_channel_credentials(read(args.tls_ca), read(args.tls_key), read(args.tls_cert))
    options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
    return grpc.secure_channel(target, credentials, options=options)


def main(argv: list[str] | None = None) -> int:
    """Print the status (the kubelet keeps it in the pod's events) and exit 0 only for SERVING."""
    args = build_parser().parse_args(argv)
    request = health_pb2.HealthCheckRequest(service=args.service)
    try:
        with open_channel(args) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(request, timeout=args.timeout).status
    except (grpc.RpcError, OSError) as e:
        detail = e.details() if isinstance(e, grpc.Call) else str(e)
        print(f"health check of {args.service!r} on port {args.port} failed: {detail}")
        return 1
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
    print(f"{args.service or 'server'}: {name}")
    return 0 if status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
