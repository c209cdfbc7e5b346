"""The server's configuration: one dataclass, built once from the command line, passed down whole."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class ServerConfig:
    model: str  # model directory written by `attnserve export`
    host: str = "127.0.0.1"  # interface to listen on ("0.0.0.0" for all)
    port: int = 50051  # 0: any free port (the bound one is printed)
    provider: str = "auto"  # auto | cuda | cpu; auto takes CUDA only if it really runs
    threads: int = 0  # ONNX Runtime intra-op threads; 0: all cores but one (for the event loop)
    max_batch: int = 16  # requests decoded together (continuous batching); 0: auto
    kv_cache_memory: int | None = None  # bytes the KV arena may take (None: max_batch decides)
    max_queue: int = 64  # requests waiting for a slot before RESOURCE_EXHAUSTED
    prefill_chunk: int = 256  # prompt tokens per prefill run (longer prompts go in chunks)
    max_new_tokens_cap: int = 256  # the largest max_new_tokens; clamped to context_length - 1
    metrics_port: int | None = None  # Prometheus /metrics on this port (0: any free port)
    reflection: bool = False  # gRPC server reflection (for grpcurl and friends)
    tls_cert: str | None = None  # PEM certificate chain: TLS when given with tls_key
    tls_key: str | None = None  # PEM private key
    tls_client_ca: str | None = None  # PEM CA bundle: mutual TLS, clients must present a cert
    auth_token_file: str | None = None  # file holding the bearer token clients must send
    drain_timeout: float = 30.0  # seconds in-flight requests get to finish on SIGTERM
    warmup: bool = True  # one short generation before health says SERVING

    @classmethod
    def from_args(cls, args) -> ServerConfig:
        """From argparse's namespace (the names of `attnserve serve`'s flags)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in names and v is not None})

    def check(self) -> None:
        """Raise ValueError with a one-line reason for flags that cannot work together."""
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
        if self.provider not in ("auto", "cuda", "cpu"):
            raise ValueError(f"--provider must be auto, cuda or cpu, not {self.provider!r}")
        if self.max_batch < 0:
            raise ValueError("--max-batch must be at least 1, or auto")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise ValueError("--kv-cache-memory must be a positive number of bytes")
        for name in ("max_queue", "max_new_tokens_cap", "prefill_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.drain_timeout < 0:
            raise ValueError("--drain-timeout must not be negative")


UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "KI": 2**10, "MI": 2**20, "GI": 2**30}


def parse_bytes(text: str) -> int:
    """ "536870912", "512M", "1.5G" or "512Mi" (SI and binary suffixes, an optional B) as bytes."""
    body = text.strip().upper().removesuffix("B")
    number = body.rstrip("KMGI")
    unit = body[len(number) :]
    if unit not in UNITS:
        raise ValueError(f"{text!r} is not a size: use bytes or a K, M, G (or Ki, Mi, Gi) suffix")
    try:
        return int(float(number) * UNITS[unit])
    except ValueError:
        raise ValueError(f"{text!r} is not a size: use bytes or a K, M, G (or Ki, Mi, Gi) suffix") from None


def parse_max_batch(text: str) -> int:
    """--max-batch: a positive count, or "auto" (0) for as many slots as --kv-cache-memory holds."""
    if text.strip().lower() == "auto":
        return 0
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"{text!r}: give a number of requests (at least 1) or auto")
    return int(text)
