"""`attnserve serve`: build the server, run it, drain it on SIGTERM.

Start-up: model directory (sha256-verified) -> ONNX Runtime session on the provider asked for ->
engine -> grpc.aio server with health (NOT_SERVING), optional reflection, TLS or mTLS, auth ->
a warm-up generation -> SERVING. Anything that prevents serving ends the process with a one-line
reason and a non-zero exit. SIGTERM: health NOT_SERVING, new calls UNAVAILABLE, in-flight
requests get --drain-timeout seconds to finish, then exit 0.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.runtime_version import VersionError

from ..core.loading import StartupError
from ..core.log_lines import configure_logging
from ..core.starting import StartedCore, start_core
from ..engine.domain import Final, GenerationRequest, StreamInterval
from ..engine.engine import EngineObserver
from ..health.v1 import health_pb2, health_pb2_grpc
from ..inference import grpc_service_pb2 as oip_pb
from ..inference import grpc_service_pb2_grpc as oip_grpc
from ..runtime.contract import ModelDirError
from ..runtime.model_sessions import ProviderError
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
from .health import NOT_SERVING, SERVING, HealthServicer
from .health import SERVICE as HEALTH_SERVICE
from .http_openai.door import HttpFacts, OpenAIFrontDoor
from .http_serving import HttpServer
from .metrics import Metrics
from .session.validation import RequestLimits
from .stats_log import StatsLog
from .test_switches import TEST_LEAK_VARIABLE, TEST_STEP_DELAY_VARIABLE, TestSwitches

if TYPE_CHECKING:
    from ..tracing.exporting import Tracing

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["TextGeneration"].full_name
HEALTH_SERVICES = ("", SERVICE, OIP_SERVICE)  # grpc.health.v1 answers for the server and each service
WARMUP_TIMEOUT_S = 120.0
# Why attnserve.v1 and Open Inference Protocol calls get UNAVAILABLE (health says NOT_SERVING then)
STARTING = "the server is starting (its warm-up generation runs); retry once its health says SERVING"
DRAINING = "the server is draining (shutting down); retry on another replica"
# While a connection has calls open, the server pings its client every KEEPALIVE_S and closes it when
# no answer comes within KEEPALIVE_TIMEOUT_S: a peer that vanished without closing TCP frees its calls.
KEEPALIVE_S, KEEPALIVE_TIMEOUT_S = 60, 20
NO_SWITCHES = TestSwitches()  # a server outside the tests


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
    """gRPC core's limits per connection: streams, age, and keepalive pings that find dead peers."""
    options = [
        ("grpc.so_reuseport", 0),
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


class Server:
    """One attnserve server: model session, engine, gRPC services and metrics."""

    def __init__(
        self,
        config: ServerConfig,
        observers: Sequence[Callable[[EngineObserver], EngineObserver]] = (),
        switches: TestSwitches = NO_SWITCHES,
    ):
        """Start the engine core; raises ModelDirError, ProviderError or StartupError. `observers` wrap
        the server's metrics as the engine's observer, innermost first (Ray Serve's step clock, a
        test's pacer): `observer` is the outermost; `switches` are a test's (test_switches.py)."""
        self.config = config
        self.token = read_token(config.auth_token_file) if config.auth_token_file else None
        self.metrics = Metrics()
        self.tracing = start_tracing(config.traces(), self.metrics)
        self.died: str | None = None  # why the engine core's process is gone
        self.loop: asyncio.AbstractEventLoop | None = None
        self.observer: EngineObserver = self.metrics
        for wrap in observers:
            self.observer = wrap(self.observer)
        core = start_core(
            config.core(),
            self.observer,
            config.stream_buffer_events,
            self._core_died,
            switches.step_delay_ms,
            self.tracing,
        )
        try:
            self._describe(core, switches)
        except BaseException:  # the core runs (a process, or a thread): a start-up that fails stops it
            core.engine.stop()
            self.metrics.close()
            if self.tracing is not None:
                self.tracing.shutdown()
            raise

    def _describe(self, core: StartedCore, switches: TestSwitches) -> None:
        """The started core's model: limits, model info, metrics and the call boundary."""
        config = self.config
        self.engine, self.tokenizer = core.engine, core.tokenizer
        self.max_batch = core.capacity
        self.kv_cache_bytes, self.prefix_cache_bytes = core.kv_cache_bytes, core.prefix_cache_bytes
        self.metrics.watch_core(core.pid)
        self.facts = facts = ModelFacts(
            core.model_dir, core.manifest, core.provider, core.provider_note, config.served_model_name
        )
        m = facts.manifest
        cap = min(config.max_new_tokens_cap, m.context_length - 1)
        if cap < config.max_new_tokens_cap:
            log.log(
                logging.INFO if config.max_new_tokens_cap == ServerConfig.max_new_tokens_cap else logging.WARNING,
                "--max-new-tokens-cap %d is more than a %d-position context leaves: requests may ask for at most %d",
                config.max_new_tokens_cap,
                m.context_length,
                cap,
            )
        self.limits = RequestLimits(
            m.context_length,
            m.vocab_size,
            cap,
            encoder_decoder=m.seq2seq,
            max_token_bytes=max(self.tokenizer.byte_lengths()),
            bos_prepended=self.tokenizer.add_bos,
            stream_interval=StreamInterval(config.stream_interval_tokens, config.stream_interval_ms),
            max_n=min(RequestLimits.max_n, self.max_batch),
        )
        self.metrics.describe_model(facts.name, facts.provider, m.dtype, m.quantization or "")
        self.metrics.kv_cache_bytes.set(self.kv_cache_bytes)
        self.metrics.prefix_cache_capacity.set(self.prefix_cache_bytes)
        log.info(
            "KV cache: %s, %d slots of %d positions, %s bytes; prefix cache %s bytes; engine core in a %s",
            m.kv_cache,
            self.max_batch,
            m.context_length,
            f"{self.kv_cache_bytes:,}",
            f"{self.prefix_cache_bytes:,}",
            config.engine_core,
        )
        self.info = model_info(
            facts,
            self.tokenizer,
            self.limits,
            self.max_batch,
            config.max_queue,
            self.kv_cache_bytes,
            self.prefix_cache_bytes,
        )
        self.health = HealthServicer()
        self.writes = WriteWatch(config.write_timeout)
        self.boundary = BoundaryInterceptor(
            self.metrics.count_request, self.metrics.track_in_flight, self.writes, switches.leak_bytes
        )
        self.traces = request_traces(self.tracing, facts.name, config.log_requests, config.log_format == "json")
        self.boundary.traces = self.traces
        self.handlers = PerMethod()  # the interceptors' handler of each method, built at its first call
        self.watchdog: asyncio.Task | None = None
        self.stats_task: asyncio.Task | None = None  # --log-stats-interval's
        if switches.leak_bytes:
            log.warning("TEST ONLY: every call leaks %d bytes ($%s)", switches.leak_bytes, TEST_LEAK_VARIABLE)
        if switches.step_delay_ms:
            log.warning(
                "TEST ONLY: every engine step sleeps %d ms ($%s)", switches.step_delay_ms, TEST_STEP_DELAY_VARIABLE
            )
        self.grpc: grpc.aio.Server | None = None
        self.http: HttpServer | None = None  # --http-port's OpenAI-compatible front door
        self.stopped = asyncio.Event()  # SIGTERM or SIGINT (serve() sets it), or the engine core died
        self.port = self.metrics_port = 0
        self.serving = False  # warmed up and not draining: health SERVING, the protocol's ServerReady

    def _core_died(self, why: str) -> None:
        """The engine core's process is gone (the client's receiver thread): stop serving; serve() exits 1."""
        self.died = why
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.stopped.set)

    async def start(self) -> None:
        """Bind, serve health as NOT_SERVING, warm up, then SERVING."""
        self.loop = asyncio.get_running_loop()
        auth = [AuthInterceptor(self.token)] if self.token else []
        interceptors = [self.handlers, self.boundary, *auth, DecodeInterceptor()]  # the outermost first
        self.grpc = server = grpc.aio.server(interceptors=interceptors, options=channel_options(self.config))
        pb_grpc.add_TextGenerationServicer_to_server(
            TextGenerationServicer(self.engine, self.limits, self.tokenizer, self.info), server
        )
        oip_grpc.add_GRPCInferenceServiceServicer_to_server(
            InferenceServicer(
                self.engine, self.limits, self.tokenizer, self.info, lambda: self.serving, self.metrics.count_request
            ),
            server,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        for service in HEALTH_SERVICES:
            await self.health.set(service, NOT_SERVING)
        if self.config.reflection:
            enable_reflection(server)
        self.port = self._bind(server)
        self.boundary.refusal = STARTING
        if self.config.http_port is not None:
            self.http = self._http_server()
        await server.start()
        if self.http is not None:
            await self.http.start()
        self.engine.start()
        self.watchdog = asyncio.create_task(self.writes.run())
        if self.config.log_stats_interval:
            stats_log = StatsLog(self.metrics, self.engine.stats, self.config.log_stats_interval)
            self.stats_task = asyncio.create_task(stats_log.run())
        if self.config.metrics_port is not None:
            try:
                self.metrics_port = self.metrics.serve(self.config.host, self.config.metrics_port)
            except OSError as e:
                raise StartupError(
                    f"cannot serve metrics on {self.config.host}:{self.config.metrics_port}: {e.strerror}"
                ) from None
        if self.config.warmup:
            self.metrics.counting = False  # the warm-up is not traffic: calls are refused until it ends
            try:
                await self.warm_up()
            finally:
                self.metrics.counting = True
        for service in HEALTH_SERVICES:
            await self.health.set(service, SERVING)
        self.boundary.refusal = None
        self.serving = True

    def _bind(self, server: grpc.aio.Server) -> int:
        config = self.config
        address = f"{config.host}:{config.port}"
        problem = listen_problem(config.host, config.port)
        if problem is not None:
            raise StartupError(problem)
        try:
            if config.tls_cert and config.tls_key:
                port = server.add_secure_port(
                    address, server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
                )
            else:
                port = server.add_insecure_port(address)
        except RuntimeError:
            port = 0
        if not port:
            raise StartupError(f"cannot listen on {address}: the port is in use or the address is not local")
        return port

    def front_door(self) -> OpenAIFrontDoor:
        """The OpenAI-compatible routes over this server's engine, limits, token, metrics and refusals
        (served on --http-port, or by a Ray Serve replica behind Ray's HTTP proxy)."""
        facts = HttpFacts(
            self.info.model_name,
            self.info.context_length,
            self.token,
            lambda: self.boundary.refusal,
            self.metrics.count_http,
            self.metrics.track_in_flight,
            self.config.http_max_body_bytes,
            int(time.time()),
            chat_template(self.facts.model_dir),
            self.traces,
        )
        return OpenAIFrontDoor(self.engine, self.limits, self.tokenizer, facts)

    def _http_server(self) -> HttpServer:
        """The OpenAI-compatible front door on --http-port, bound now (its TLS and token are gRPC's)."""
        config = self.config
        door = self.front_door()
        tls = (config.tls_cert, config.tls_key, config.tls_client_ca) if config.tls_cert and config.tls_key else None
        problem = listen_problem(config.host, config.http_port or 0, "--http-port")
        if problem is not None:
            raise StartupError(problem)
        try:
            return HttpServer(door.app, config.host, config.http_port or 0, tls, config.drain_timeout)
        except OSError as e:
            why = e.strerror or e
            raise StartupError(f"--http-port {config.http_port}: cannot listen on {config.host}: {why}") from None

    async def warm_up(self) -> None:
        """One short greedy generation through the engine: the session really runs."""
        request = GenerationRequest(
            "warm-up", tuple(self.tokenizer.encode_prompt("warm-up")), min(2, self.limits.max_new_tokens)
        )
        handle = self.engine.submit(request)
        t0 = time.perf_counter()
        while True:
            events = await asyncio.wait_for(handle.next_events(), WARMUP_TIMEOUT_S)
            if isinstance(events[-1], Exception):
                raise StartupError(f"warm-up generation failed: {events[-1]}")
            if isinstance(events[-1], Final):
                log.info("warm-up generation passed in %.0f ms", 1000 * (time.perf_counter() - t0))
                return

    async def drain(self) -> None:
        """Stop taking calls, let in-flight ones finish within --drain-timeout, then stop."""
        await self.health.enter_graceful_shutdown()
        self.serving = False
        self.boundary.refusal = DRAINING
        self.engine.close()
        log.info("draining: %(active)d active and %(queued)d queued requests to finish", self.engine.stats())
        deadline = time.monotonic() + self.config.drain_timeout
        while self.busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.busy():
            log.warning("drain timeout (%.1f s) passed; cancelling %s", self.config.drain_timeout, self.engine.stats())
            self.engine.abort()
        if self.grpc is not None:
            await self.grpc.stop(grace=max(1.0, deadline - time.monotonic()))
        if self.http is not None:
            await self.http.stop()
        self.close()

    async def stop(self) -> None:
        """Stop now: in-flight calls are cancelled."""
        if self.grpc is not None:
            await self.grpc.stop(grace=None)
        if self.http is not None:
            await self.http.stop(graceful=False)
        self.close()

    def busy(self) -> bool:
        stats = self.engine.stats()
        return bool(stats["active"] or stats["queued"])

    def close(self) -> None:
        for task in (self.watchdog, self.stats_task):
            if task is not None:
                task.cancel()
        self.engine.stop()
        self.metrics.close()
        if self.tracing is not None:
            self.tracing.shutdown()


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


def listen_problem(host: str, port: int, flag: str = "--port") -> str | None:
    """Why host:port cannot be listened on (in use, not local), found by binding a socket of our own
    first: gRPC's core would print an error line of its own before ours. The reason names the flag
    at fault: --host for an address that is not local, `flag` for a port in use. None if it can (or port 0)."""
    if port == 0:
        return None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        return f"--host {host}: cannot listen on {host}:{port}: {e.strerror}"
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds: a TIME_WAIT port is free
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"{flag} {port}: cannot listen on {host}:{port}: the port is in use"
            why = "the address is not local" if e.errno == errno.EADDRNOTAVAIL else e.strerror
            return f"--host {host}: cannot listen on {host}:{port}: {why}"
    return None


def startup_problem(config: ServerConfig) -> str | None:
    """What is wrong with `config` that is found before the model loads: a bad flag (ServerConfig.check),
    or a port of the server or of its metrics that cannot be listened on."""
    try:
        config.check()
        config.check_files()
    except ValueError as e:
        return str(e)
    problem = listen_problem(config.host, config.port)
    if problem is None and config.metrics_port:
        problem = listen_problem(config.host, config.metrics_port, "--metrics-port")
    if problem is None and config.http_port:
        problem = listen_problem(config.host, config.http_port, "--http-port")
    return problem


async def serve(config: ServerConfig, switches: TestSwitches = NO_SWITCHES) -> int:
    """Run until SIGTERM or SIGINT, then drain; the exit code."""
    server = None
    try:
        server = Server(config, switches=switches)
        await server.start()
    except (ModelDirError, ProviderError, StartupError) as e:
        if server is not None:
            await server.stop()
        print(f"attnserve serve: error: {e}", file=sys.stderr, flush=True)
        return 2
    except Exception as e:  # a bug, or a file nothing checked: logged whole, and nothing is left running
        log.error("start-up failed", exc_info=e)
        if server is not None:
            await server.stop()
        print(f"attnserve serve: error: start-up failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stopped.set)
    scheme = "grpcs" if config.tls_cert else "grpc"
    print(
        f"attnserve serve: listening on {config.host}:{server.port} ({scheme}), model "
        f"{server.info.model_name}, provider {server.facts.provider}, engine core in a {config.engine_core}",
        flush=True,
    )
    print(
        f"attnserve serve: KV cache {server.info.kv_cache}, {server.max_batch} slots of "
        f"{server.info.context_length} positions, {server.kv_cache_bytes / 2**20:.1f} MiB; prefix cache "
        + (f"{server.prefix_cache_bytes / 2**20:.1f} MiB" if server.prefix_cache_bytes else "off"),
        flush=True,
    )
    if server.metrics_port:
        print(f"attnserve serve: metrics on http://{config.host}:{server.metrics_port}/metrics", flush=True)
    if server.http is not None:
        scheme = "https" if config.tls_cert else "http"
        print(f"attnserve serve: OpenAI-compatible API on {scheme}://{config.host}:{server.http.port}/v1", flush=True)
    await server.stopped.wait()
    if server.died is not None:
        await server.stop()
        print(f"attnserve serve: error: {server.died}", file=sys.stderr, flush=True)
        return 1
    log.info("SIGTERM or SIGINT: draining (up to %.1f s)", config.drain_timeout)
    await server.drain()
    print("attnserve serve: drained, exiting", flush=True)
    return 0


def main(args) -> int:
    """CLI entry of `attnserve serve`."""
    try:
        config = ServerConfig.from_args(args)
        switches = TestSwitches.from_environ(os.environ)
    except ValueError as e:
        configure_logging("text")
        print(f"attnserve serve: error: {e}", file=sys.stderr)
        return 2
    configure_logging(config.log_format)  # the engine core's process: config.core().log_format
    problem = startup_problem(config)  # before the model loads: a busy port costs nothing
    if problem is not None:
        print(f"attnserve serve: error: {problem}", file=sys.stderr)
        return 2
    return asyncio.run(serve(config, switches))
