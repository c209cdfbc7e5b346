"""`attnserve ray-serve`'s settings: each replica's ServerConfig, and what Ray Serve needs besides.

The replica's flags are `attnserve serve`'s own, built from ServerConfig's fields (their defaults
and help written once, there); the flags that do not apply behind Ray's proxy (host, port, TLS,
token, metrics, reflection of the replica) are left out. Ray's settings follow the same pattern:
one field each, its help in the metadata. No ray import here.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
from dataclasses import dataclass, field, fields
from typing import Any

from ..flags import add_field_flags, flag, flag_name, shown
from ..server.config import ServerConfig

APP_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")  # --app-name: sent as `application` metadata
# ServerConfig fields that are `attnserve ray-serve` flags too, with the same meaning per replica.
REPLICA_FIELDS = (
    "model",
    "dtype",
    "quantize",
    "context_length",
    "export_cache",
    "provider",
    "threads",
    "intra_op_spinning",
    "logits_pass",
    "max_batch",
    "kv_cache_memory",
    "prefill_chunk",
    "prefix_cache",
    "prefix_cache_memory",
    "max_queue",
    "max_new_tokens_cap",
    "stream_interval_tokens",
    "stream_interval_ms",
    "drain_timeout",
    "otlp_traces_endpoint",
)


def cluster_address(text: str) -> bool:
    """--address: auto, or HOST:PORT of a head (ray://HOST:PORT for Ray Client)."""
    if text == "auto":
        return True
    host, _, port = text.removeprefix("ray://").rpartition(":")
    return bool(host) and port.isdigit() and 1 <= int(port) <= 65535


def ip_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def replica_batch(text: str) -> int:
    """--max-batch of a replica: a number of requests (at least 1)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a number of requests (at least 1); auto is attnserve serve's, not Ray's "
            "(Ray sizes each replica's concurrency from this number)"
        )
    return int(text)


@dataclass(frozen=True)
class RayServeConfig:
    """One Ray Serve application of attnserve; every field with help is an `attnserve ray-serve` flag."""

    replica: ServerConfig  # each replica's server; its host, port and TLS are unused (Ray's proxy listens)
    address: str | None = field(
        default=None,
        metadata=flag("Ray cluster to join: auto, or the head's HOST:PORT", unset="start a local head"),
    )
    node_ip_address: str = field(default="127.0.0.1", metadata=flag("the local head's IP address (without --address)"))
    grpc_port: int = field(
        default=9000, metadata=flag("port of Ray Serve's gRPC proxy, on every interface (Ray offers no host)")
    )
    http_port: int = field(
        default=8000, metadata=flag("port of Ray Serve's HTTP proxy, which Ray starts too (127.0.0.1; unused)")
    )
    app_name: str = field(
        default="attnserve",
        metadata=flag("Ray Serve application; clients send it as `application` metadata if there are several"),
    )
    replicas: int = field(
        default=1, metadata=flag("replicas, one engine each; with --max-replicas, the number to start with")
    )
    min_replicas: int | None = field(default=None, metadata=flag("autoscaling: fewest replicas", unset="--replicas"))
    max_replicas: int | None = field(
        default=None,
        metadata=flag("autoscale on ongoing requests between --min-replicas and this many", unset="no autoscaling"),
    )
    target_ongoing_requests: float | None = field(
        default=None, metadata=flag("autoscaling: ongoing requests per replica to aim at", unset="--max-batch")
    )
    replica_cpus: float = field(default=1.0, metadata=flag("CPUs Ray reserves for each replica (num_cpus)"))
    health_check_period: float = field(
        default=10.0, metadata=flag("seconds between Ray's health checks of each replica's engine")
    )
    reflection: bool = field(default=False, metadata=flag("enable gRPC server reflection on Ray's proxy"))

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        """The replica's flags from ServerConfig's fields, then Ray's from this class's. --max-batch
        takes a number here: Ray sizes each replica's concurrency from it, so `auto` (serve's) is not offered."""
        add_field_flags(parser, ServerConfig, tuple(name for name in REPLICA_FIELDS if name != "max_batch"))
        default = ServerConfig.max_batch  # the dataclass's class attribute is the field's default
        parser.add_argument(
            "--max-batch",
            type=replica_batch,
            default=default,
            metavar="N",
            help=f"requests each replica decodes together, one KV arena slot each (default: {default})",
        )
        add_field_flags(parser, cls)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RayServeConfig:
        """From add_cli_args' namespace."""
        replica = ServerConfig(
            **{name: getattr(args, name) for name in REPLICA_FIELDS},
            engine_core="thread",  # a replica is a Ray actor process: its engine runs in a thread of it
        )
        own = {f.name: getattr(args, f.name) for f in fields(cls) if "help" in f.metadata}
        return cls(replica=replica, **own)

    @property
    def max_ongoing_requests(self) -> int:
        """What one replica takes at once: a full batch and a full queue (Ray holds the rest)."""
        return self.replica.max_batch + self.replica.max_queue

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas is not None

    @property
    def fewest_replicas(self) -> int:
        """--min-replicas, which defaults to --replicas."""
        return self.replicas if self.min_replicas is None else self.min_replicas

    def check(self) -> None:
        """Raise ValueError with a one-line reason naming the first flag that cannot work, its value
        and what it may be (the replica's flags first, as `attnserve serve` checks them)."""
        self.replica.check()
        if self.replica.max_batch == 0:
            raise ValueError("--max-batch auto is not for Ray: give a number (max ongoing requests = batch + queue)")
        ports = "1 to 65535 (Ray's proxy does not report a port 0)"
        ranges: list[tuple[str, bool, str]] = [
            ("address", self.address is None or cluster_address(self.address), "auto or HOST:PORT"),
            ("node_ip_address", ip_address(self.node_ip_address), "an IP address (Ray takes no host name here)"),
            ("grpc_port", 1 <= self.grpc_port <= 65535, ports),
            ("http_port", 1 <= self.http_port <= 65535, ports),
            ("app_name", APP_NAME.fullmatch(self.app_name) is not None, "1 to 64 letters, digits, '.', '_' or '-'"),
            ("replicas", self.replicas >= 1, "at least 1"),
            ("min_replicas", self.min_replicas is None or self.min_replicas >= 0, "0 or more"),
            ("max_replicas", self.max_replicas is None or self.max_replicas >= 1, "at least 1"),
            (
                "target_ongoing_requests",
                self.target_ongoing_requests is None or self.target_ongoing_requests > 0,
                "positive",
            ),
            ("replica_cpus", self.replica_cpus >= 0, "0 or more"),
            ("health_check_period", self.health_check_period > 0, "positive"),
        ]
        for name, ok, allowed in ranges:
            if not ok:
                raise ValueError(f"{flag_name(name)} must be {allowed}, got {shown(getattr(self, name))}")
        if self.grpc_port == self.http_port:
            raise ValueError(f"--grpc-port and --http-port must differ, both are {self.grpc_port}")
        if self.min_replicas is not None and not self.autoscaling:
            raise ValueError("--min-replicas needs --max-replicas (autoscaling)")
        if self.max_replicas is not None and not self.fewest_replicas <= self.replicas <= self.max_replicas:
            raise ValueError(
                f"autoscaling needs --min-replicas <= --replicas <= --max-replicas, got {self.fewest_replicas} <= "
                f"{self.replicas} <= {self.max_replicas}"
            )

    def deployment_options(self) -> dict[str, Any]:
        """Keywords of Ray's serve.deployment for the replicas."""
        options: dict[str, Any] = {
            "max_ongoing_requests": self.max_ongoing_requests,
            "ray_actor_options": {"num_cpus": self.replica_cpus},
            "health_check_period_s": self.health_check_period,
            "graceful_shutdown_timeout_s": self.replica.drain_timeout,
        }
        if not self.autoscaling:
            options["num_replicas"] = self.replicas
            return options
        options["autoscaling_config"] = {
            "min_replicas": self.fewest_replicas,
            "initial_replicas": self.replicas,
            "max_replicas": self.max_replicas,
            "target_ongoing_requests": self.target_ongoing_requests or float(self.replica.max_batch),
        }
        return options
