"""What a Server is built of, each part one function of the configuration and the started engine core's
facts: the engine's observer chain, the request limits, the call boundary and the gRPC interceptor chain,
the servicers, the listening socket's options and credentials, tracing. Nothing here binds, starts or
serves: app.py's Server calls these in order at start-up and runs what they return.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.runtime_version import VersionError

from ..core.loading import StartupError
from ..core.starting import StartedCore
from ..engine.domain import StreamInterval
from ..engine.engine import EngineCalls, EngineObserver
from ..health.v1 import health_pb2, health_pb2_grpc
from ..inference import grpc_service_pb2 as oip_pb
from ..inference import grpc_service_pb2_grpc as oip_grpc
from ..runtime.contract import Manifest
from ..tokenizer import Tokenizer
from ..tokenizer.chat_template import ChatTemplate, ChatTemplateError, read_chat_template
from ..tracing.current import LoggedTraces, Traces
from ..tracing.settings import TraceSettings
from ..v1 import generation_pb2 as pb
from ..v1 import generation_pb2_grpc as pb_grpc
from .config import ServerConfig
from .grpc_boundary.auth import AuthInterceptor
from .grpc_boundary.boundary import BoundaryInterceptor
from .grpc_boundary.per_method import PerMethod
from .grpc_boundary.request_bytes import DecodeInterceptor
from .grpc_boundary.slow_readers import WriteWatch
from .grpc_oip.servicer import SERVICE as OIP_SERVICE
from .grpc_oip.servicer import InferenceServicer
from .grpc_v1.model_info import ModelFacts, model_info
from .grpc_v1.servicer import TextGenerationServicer
from .health import SERVICE as HEALTH_SERVICE
from .health import HealthServicer
from .metrics import Metrics
from .session.validation import RequestLimits

if TYPE_CHECKING:
    from ..tracing.exporting import Tracing

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["TextGeneration"].full_name
# While a connection has calls open, the server pings its client every KEEPALIVE_S and closes it when
# no answer comes within KEEPALIVE_TIMEOUT_S: a peer that vanished without closing TCP frees its calls.
KEEPALIVE_S, KEEPALIVE_TIMEOUT_S = 60, 20


def observer_chain(metrics: Metrics, observers: Sequence[Callable[[EngineObserver], EngineObserver]]) -> EngineObserver:
    """The engine's observer: the server's metrics wrapped by each of `observers`, innermost first."""
    observer: EngineObserver = metrics
    for wrap in observers:
        observer = wrap(observer)
    return observer


def model_facts(core: StartedCore, served_name: str | None) -> ModelFacts:
    """The started core's model, as GetModelInfo and the metrics tell it (--served-model-name its name)."""
    return ModelFacts(core.model_dir, core.manifest, core.provider, core.provider_note, served_name)


def model_description(facts: ModelFacts, core: StartedCore, limits: RequestLimits, max_queue: int) -> pb.ModelInfo:
    """GetModelInfo's answer: the model, its provider, the arena the core holds and the request limits."""
    return model_info(
        facts, core.tokenizer, limits, core.capacity, max_queue, core.kv_cache_bytes, core.prefix_cache_bytes
    )


def request_limits(config: ServerConfig, manifest: Manifest, tokenizer: Tokenizer, capacity: int) -> RequestLimits:
    """What a request may ask of this model and server (every door validates against them)."""
    cap = min(config.max_new_tokens_cap, manifest.context_length - 1)
    if cap < config.max_new_tokens_cap:
        log.log(
            logging.INFO if config.max_new_tokens_cap == ServerConfig.max_new_tokens_cap else logging.WARNING,
            "--max-new-tokens-cap %d is more than a %d-position context leaves: requests may ask for at most %d",
            config.max_new_tokens_cap,
            manifest.context_length,
            cap,
        )
    return RequestLimits(
        manifest.context_length,
        manifest.vocab_size,
        cap,
        encoder_decoder=manifest.seq2seq,
        max_token_bytes=max(tokenizer.byte_lengths()),
        bos_prepended=tokenizer.add_bos,
        stream_interval=StreamInterval(config.stream_interval_tokens, config.stream_interval_ms),
        max_n=min(RequestLimits.max_n, capacity),
    )


def report_core(metrics: Metrics, facts: ModelFacts, core: StartedCore, engine_core: str) -> None:
    """Tell the metrics and the log what the started core holds: its process, model and memory."""
    m = facts.manifest
    metrics.watch_core(core.pid)
    metrics.describe_model(facts.name, facts.provider, m.dtype, m.quantization or "")
    metrics.kv_cache_bytes.set(core.kv_cache_bytes)
    metrics.prefix_cache_capacity.set(core.prefix_cache_bytes)
    log.info(
        "KV cache: %s, %d slots of %d positions, %s bytes; prefix cache %s bytes; engine core in a %s",
        m.kv_cache,
        core.capacity,
        m.context_length,
        f"{core.kv_cache_bytes:,}",
        f"{core.prefix_cache_bytes:,}",
        engine_core,
    )


def call_boundary(metrics: Metrics, writes: WriteWatch, traces: Traces | None) -> BoundaryInterceptor:
    """Every gRPC call's error mapping, counting and refusals (grpc_boundary/boundary.py); Ray Serve's
    replicas enter it directly."""
    boundary = BoundaryInterceptor(metrics.count_request, metrics.track_in_flight, writes)
    boundary.traces = traces
    return boundary


def interceptor_chain(
    handlers: PerMethod,
    boundary: BoundaryInterceptor,
    token: str | None,
    extra: Sequence[grpc.aio.ServerInterceptor] = (),
) -> list[grpc.aio.ServerInterceptor]:
    """The gRPC interceptors, the outermost first: each method's handler built once, the boundary, the
    token check, `extra` (code embedding a Server: a test's leak, test_switches.py), tolerant decoding."""
    auth = [AuthInterceptor(token)] if token else []
    return [handlers, boundary, *auth, *extra, DecodeInterceptor()]


@dataclass(frozen=True)
class Servicers:
    """The gRPC front doors' servicers, over one engine (grpc_v1/, grpc_oip/)."""

    v1: TextGenerationServicer
    oip: InferenceServicer


def servicers(
    engine: EngineCalls,
    limits: RequestLimits,
    tokenizer: Tokenizer,
    info: pb.ModelInfo,
    ready: Callable[[], bool],
    count: Callable[[str, str], None],
) -> Servicers:
    """attnserve.v1's and the Open Inference Protocol's servicers; `ready` is the protocol's ServerReady,
    `count` counts its health calls."""
    return Servicers(
        TextGenerationServicer(engine, limits, tokenizer, info),
        InferenceServicer(engine, limits, tokenizer, info, ready, count),
    )


def add_servicers(server: grpc.aio.Server, doors: Servicers, health: HealthServicer) -> None:
    pb_grpc.add_TextGenerationServicer_to_server(doors.v1, server)
    oip_grpc.add_GRPCInferenceServiceServicer_to_server(doors.oip, server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)


def read_token(path: str) -> str:
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise StartupError(f"--auth-token-file {path}: {e.strerror}") from None
    if not token:
        raise StartupError(f"--auth-token-file {path} is empty")
    return token


def server_credentials(cert_file: str, key_file: str, client_ca_file: str | None) -> grpc.ServerCredentials:
    """TLS from --tls-cert/--tls-key; with --tls-client-ca, clients must present a certificate (mTLS)."""
    try:
        key, cert = Path(key_file).read_bytes(), Path(cert_file).read_bytes()
        ca = Path(client_ca_file).read_bytes() if client_ca_file else None
    except OSError as e:
        raise StartupError(f"TLS file {e.filename}: {e.strerror}") from None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def enable_reflection(server: grpc.aio.Server) -> None:
    """--reflection: grpcio-reflection, imported only here, so that a host whose copy cannot import
    (its generated code follows one protobuf major version) serves without it."""
    try:
        from grpc_reflection.v1alpha import reflection, reflection_pb2
    except (ImportError, VersionError) as e:
        raise StartupError(f"--reflection needs grpcio-reflection, which does not import here: {e}") from None
    names = (SERVICE, OIP_SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME)
    protocols = (pb, oip_pb, health_pb2, reflection_pb2)
    reflection.enable_server_reflection(names, server, pool=descriptor_pool_of(protocols))


def descriptor_pool_of(modules: tuple[ModuleType, ...]) -> descriptor_pool.DescriptorPool:
    """One pool with every generated module's file, for reflection to describe each service it lists:
    attnserve.v1 lives in protobuf's default pool, the Open Inference Protocol and health in pools of
    their own (protos/generate.py says why), which the reflection servicer would not see."""
    pool = descriptor_pool.DescriptorPool()
    for module in modules:
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    return pool


def channel_options(config: ServerConfig) -> list[tuple[str, int]]:
    """gRPC core's limits per connection: streams, age, and keepalive pings that find dead peers. The port
    is shared only among --api-server-count's front ends (SO_REUSEPORT), never by chance with another server."""
    options = [
        ("grpc.so_reuseport", int(config.api_server_count > 1)),
        ("grpc.max_concurrent_streams", config.max_concurrent_streams),
        ("grpc.keepalive_time_ms", KEEPALIVE_S * 1000),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_S * 1000),
    ]
    if config.max_connection_age is not None:
        options += [
            ("grpc.max_connection_age_ms", int(config.max_connection_age * 1000)),
            ("grpc.max_connection_age_grace_ms", int(config.drain_timeout * 1000)),
        ]
    return options


def start_tracing(settings: TraceSettings | None, metrics: Metrics) -> Tracing | None:
    """This process's tracing (None: off, and OpenTelemetry is not imported)."""
    if settings is None:
        return None
    from ..tracing.exporting import Tracing

    return Tracing(settings, "front_end", metrics.spans_dropped.labels(process="front_end").inc)


def request_traces(
    tracing: Tracing | None, model: str, log_requests: bool = False, log_ids: bool = False
) -> Traces | None:
    """What opens each call's trace at the doors: its span (tracing on), wrapped in a LoggedTrace where
    the logs want the call: its line as it ends (`log_requests`), or its ids in JSON lines (`log_ids`;
    a span has them already). None where nothing wants it: a call then costs nothing."""
    traces: Traces | None = None
    if tracing is not None:
        from ..tracing.request import RequestTraces

        traces = RequestTraces(tracing, model)
    if log_requests or (log_ids and traces is None):
        return LoggedTraces(traces, log_requests)
    return traces


def chat_template(model_dir: Path) -> ChatTemplate | None:
    """The model directory's chat template, for /v1/chat/completions; StartupError if it does not compile."""
    try:
        return read_chat_template(model_dir)
    except ChatTemplateError as e:
        raise StartupError(f"{model_dir / 'tokenizer_config.json'}: {e}") from None
