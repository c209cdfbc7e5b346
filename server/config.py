"""The server's configuration: one dataclass, built once from the command line, passed down whole."""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class ServerConfig:
    model: str                              # model directory written by `attnserve export`
    host: str = "127.0.0.1"                 # interface to listen on ("0.0.0.0" for all)
    port: int = 50051                       # 0: any free port (the bound one is printed)
    provider: str = "auto"                  # auto | cuda | cpu; auto takes CUDA only if it really runs
    threads: int = 0                        # ONNX Runtime intra-op threads; 0: all cores but one (for the event loop)
    max_batch: int = 16                     # requests decoded together (continuous batching)
    max_queue: int = 64                     # requests waiting for a slot before RESOURCE_EXHAUSTED
    max_new_tokens_cap: int = 256           # the largest max_new_tokens; clamped to context_length - 1
    metrics_port: int | None = None         # Prometheus /metrics on this port (0: any free port)
    reflection: bool = False                # gRPC server reflection (for grpcurl and friends)
    tls_cert: str | None = None             # PEM certificate chain: TLS when given with tls_key
    tls_key: str | None = None              # PEM private key
    tls_client_ca: str | None = None        # PEM CA bundle: mutual TLS, clients must present a cert
    auth_token_file: str | None = None      # file holding the bearer token clients must send
    drain_timeout: float = 30.0             # seconds in-flight requests get to finish on SIGTERM
    warmup: bool = True                     # one short generation before health says SERVING

    @classmethod
    def from_args(cls, args) -> "ServerConfig":
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
        for name in ("max_batch", "max_queue", "max_new_tokens_cap"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.drain_timeout < 0:
            raise ValueError("--drain-timeout must not be negative")
