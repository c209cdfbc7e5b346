"""How a client reaches its servers: target parsing, round_robin, retries, TLS and the token.

One `ChannelConfig` builds both the sync and the asyncio channel, so `Client` and `AsyncClient`
connect identically; balancing and retries are one service config that gRPC carries out.
Knows nothing about the TextGeneration service's messages.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from .retry import RetryPolicy

DEFAULT_PORT = 50051
DEFAULT_TARGET = f"127.0.0.1:{DEFAULT_PORT}"

# Reconnect quickly after a server restarts (gRPC's defaults wait 1 s, then up to 120 s).
RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


@dataclass(frozen=True)
class TlsConfig:
    """Server verification (root CA) and, for mutual TLS, this client's certificate and key."""

    root_certificates: bytes | None = None  # PEM; None: the system's roots
    certificate_chain: bytes | None = None  # PEM client certificate (mTLS)
    private_key: bytes | None = None  # PEM client key (mTLS)
    server_name: str | None = None  # name to verify instead of the target's host

    @classmethod
    def from_files(
        cls,
        ca: str | Path | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        server_name: str | None = None,
    ) -> TlsConfig:
        """TlsConfig from PEM files; a client certificate needs its key and the other way round."""
        if (cert is None) != (key is None):
            raise ValueError("mutual TLS needs both a client certificate and its key")
        read = lambda path: Path(path).read_bytes() if path is not None else None
        return cls(read(ca), read(cert), read(key), server_name)

    def credentials(self) -> grpc.ChannelCredentials:
        """The gRPC channel credentials."""
        return grpc.ssl_channel_credentials(self.root_certificates, self.private_key, self.certificate_chain)


def split_host_port(address: str) -> tuple[str, int]:
    """ "host:port", "[v6]:port" or "host" (default port) -> (host, port)."""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        port = rest.removeprefix(":")
    elif address.count(":") == 1:
        host, _, port = address.partition(":")
    else:
        host, port = address, ""
    if not host:
        raise ValueError(f"target {address!r} has no host")
    try:
        number = int(port) if port else DEFAULT_PORT
    except ValueError:
        raise ValueError(f"target {address!r} has a port that is not a number") from None
    if not 1 <= number <= 65535:
        raise ValueError(f"target {address!r} has port {number}, outside 1 to 65535")
    return host, number


def _ip_version(host: str) -> int | None:
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return None


def _resolve(host: str, port: int) -> list[str]:
    """Literal IP addresses of a host name, as gRPC's ipv4:/ipv6: targets need them."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise ValueError(f"cannot resolve {host}: {error.strerror}") from None
    addresses = sorted({info[4][0] for info in infos if info[0] == socket.AF_INET})
    if not addresses:
        raise ValueError(f"{host} has no IPv4 address to balance over")
    return addresses


def parse_targets(target: str | Sequence[str]) -> tuple[str, str | None]:
    """A gRPC target for one or several servers, and the host name TLS should verify.

    A string with a scheme ("dns:///...", "ipv4:...", "unix:...") is used as given. Several
    servers ("h1:p1,h2:p2" or a list) become one "ipv4:" (or "ipv6:") target that round_robin
    balances over; host names among them are resolved once, here.
    """
    if isinstance(target, str):
        if "://" in target or target.split(":", 1)[0] in ("ipv4", "ipv6", "unix", "dns"):
            return target, None
        target = target.split(",")
    addresses = [t.strip() for t in target if t.strip()]
    if not addresses:
        raise ValueError("no target given")
    pairs = [split_host_port(t) for t in addresses]
    if len(pairs) == 1:
        host, port = pairs[0]
        return (f"[{host}]:{port}" if _ip_version(host) == 6 else f"{host}:{port}"), None
    return _multi_target(pairs)


def _multi_target(pairs: list[tuple[str, int]]) -> tuple[str, str | None]:
    names = [host for host, _ in pairs if _ip_version(host) is None]
    literal = [(ip, port) for host, port in pairs for ip in ([host] if _ip_version(host) else _resolve(host, port))]
    versions = {_ip_version(ip) for ip, _ in literal}
    if len(versions) != 1:
        raise ValueError("several targets must all be IPv4 or all be IPv6")
    if versions == {6}:
        return "ipv6:" + ",".join(f"[{ip}]:{port}" for ip, port in literal), None
    return "ipv4:" + ",".join(f"{ip}:{port}" for ip, port in literal), (names[0] if names else None)


@dataclass(frozen=True)
class ChannelConfig:
    """Everything needed to open a channel; built once per client."""

    target: str | Sequence[str] = DEFAULT_TARGET
    tls: TlsConfig | None = None  # None: plaintext
    token: str | None = None  # bearer token sent as `authorization` metadata
    options: tuple[tuple[str, object], ...] = ()  # extra gRPC channel arguments
    retry: RetryPolicy = RetryPolicy()  # which calls gRPC resends, and when
    timeout: float | None = None  # the calls' deadline in seconds: retries that cannot fit are dropped

    def service_config(self) -> str:
        """The channel's service config (JSON): round_robin over the targets, and the retry policy and
        its throttling."""
        config: dict[str, object] = {
            "loadBalancingConfig": [{"round_robin": {}}],
            "methodConfig": [self.retry.method_config(self.timeout)],
        }
        if (throttling := self.retry.throttling()) is not None:
            config["retryThrottling"] = throttling
        return json.dumps(config)

    def channel_args(self) -> tuple[str, list[tuple[str, object]]]:
        """The gRPC target and channel arguments: service config, fast reconnects, TLS name."""
        target, tls_name = parse_targets(self.target)
        args: list[tuple[str, object]] = [
            ("grpc.service_config", self.service_config()),
            ("grpc.enable_retries", int(self.retry.retries)),
            *RECONNECT_OPTIONS,
        ]
        server_name = (self.tls.server_name if self.tls else None) or tls_name
        if self.tls is not None and server_name:
            args.append(("grpc.ssl_target_name_override", server_name))
        args.extend(self.options)
        return target, args

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Metadata sent with every call."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def sync_channel(self) -> grpc.Channel:
        """A blocking channel."""
        target, args = self.channel_args()
        if self.tls is None:
            return grpc.insecure_channel(target, options=args)
        return grpc.secure_channel(target, self.tls.credentials(), options=args)

    def aio_channel(self) -> grpc.aio.Channel:
        """An asyncio channel (create it inside the event loop that uses it)."""
        target, args = self.channel_args()
        if self.tls is None:
            return grpc.aio.insecure_channel(target, options=args)
        return grpc.aio.secure_channel(target, self.tls.credentials(), options=args)


def read_token_file(path: str | Path) -> str:
    """A bearer token from a file (surrounding whitespace stripped); empty files are refused."""
    token = Path(path).read_text().strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token
